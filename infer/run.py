"""`fastvista score`: the student scores dialogue files; results JSONL, summary and reports."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fastvista.config import DataSelection, selected
from fastvista.contract import FILE, FormatMismatch, StudentFormat, check_format, read_format
from fastvista.llm import BackendConfig, fingerprint, make_checked_backend
from fastvista.scheduler import Schedule, locked_folder, run_to_folder
from fastvista.schema import ScoredDialogue
from fastvista.summary import summarise
from fastvista.infer.report import write_html
from fastvista.infer.student import StudentConfig, check_answer_budget, score_dialogue
from fastvista.models import repository_root, resolve_model

DEFAULT_CONFIG = repository_root() / "configs" / "score" / "shipped_student_cpu.yaml"  # the shipped student


class ScoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: BackendConfig
    student: StudentConfig = Field(default_factory=StudentConfig)
    max_active: int = 256  # dialogues whose next turns form one wave (or are in flight at once)
    schedule: Schedule = "waves"  # continuous: each dialogue's next turn leaves as its last returns (no waves; vllm or openai)

    @model_validator(mode="after")
    def _adapter_loaded_is_used(self):
        """An adapter loaded but not the one scoring would leave the base model scoring, silently."""
        adapters = self.backend.lora_adapters
        if adapters and self.student.adapter not in adapters:
            raise ValueError(f"backend.lora_adapters loads {sorted(adapters)} but student.adapter is {self.student.adapter!r}: "
                             f"set --set student.adapter={sorted(adapters)[0]} (or load no adapter)")
        return self

    @model_validator(mode="after")
    def _answer_budget_fits(self):
        if self.backend.kind != "openai":  # a server's context is its own (`fastvista serve --max-model-len`)
            check_answer_budget(self.student, self.backend.max_model_len)
        return self


def student_folder(backend: BackendConfig, adapter: str | None) -> str | None:
    """The folder whose `format.json` records the student these settings score: the adapter's,
    the merged model's, or the folder a server on this machine serves the name from (a server
    elsewhere cannot be read); None where it is not known."""
    if backend.kind == "openai":
        from fastvista.llm.openai_backend import served_folders

        return served_folders(backend).get(adapter or backend.model)
    if adapter:
        return backend.lora_adapters.get(adapter)  # an unknown adapter: the backend's check names it
    folder = resolve_model(backend.model)
    return folder if Path(folder).is_dir() else None


def check_student_format(backend: BackendConfig, cfg: StudentConfig) -> None:
    """Refuse a student trained with another format than these settings: the `format.json` beside
    its adapter (which must have one) or beside its merged model (a model folder without one is a
    base model, scored as it is). A served student is checked where it is served: `fastvista
    serve` refuses an adapter without its format."""
    folder = student_folder(backend, cfg.adapter)
    trained = read_format(folder) if folder else None
    if trained is None:
        if folder and cfg.adapter and backend.kind != "openai":
            raise FormatMismatch(f"the adapter {folder} records no student format ({FILE}): it was trained before formats "
                                 "were recorded, or is not a student; train it again with train/sft.py")
        return
    served = f" (served as {cfg.adapter or backend.model})" if backend.kind == "openai" else ""
    check_format(trained, cfg.student_format(), f"{folder}{served}")


def rendering(fmt: StudentFormat | None) -> dict:
    """The student settings a recorded format fixes (none for a base model: the defaults)."""
    return {k: getattr(fmt, k) for k in ("history_turns", "max_store_claims", "layout", "answer")} if fmt else {}


def trained_rendering(model: str) -> dict:
    """The student settings merged weights were trained with (their format.json), for the
    benchmarks that time a student in its own format."""
    folder = Path(resolve_model(model))
    return rendering(read_format(folder) if folder.is_dir() else None)


def as_trained(backend: BackendConfig, cfg: StudentConfig) -> StudentConfig:
    """These settings in the rendering the student was trained with, read from its format.json
    (live use given no settings). A served student whose format cannot be read (a server
    elsewhere, or one not answering) is refused: scored in a guessed format, it would read wrong."""
    folder = student_folder(backend, cfg.adapter)
    fmt = read_format(folder) if folder else None
    if fmt is None and backend.kind == "openai":
        raise FormatMismatch(f"the format of the student served as {cfg.adapter or backend.model} at {backend.base_url} cannot be "
                             "read (a server elsewhere, or one not answering): give its settings, "
                             "LiveScorer(backend, StudentConfig(answer=...)) as its format.json records them")
    return StudentConfig.model_validate({**cfg.model_dump(), **rendering(fmt)})


@locked_folder
def main(tree: dict, out_dir: Path, skip_bad: bool = False, progress: bool = True) -> tuple[dict, list[ScoredDialogue]]:
    data = DataSelection.model_validate(tree.pop("data", None) or {})
    config = ScoreConfig.model_validate(tree)
    out_dir.mkdir(parents=True, exist_ok=True)
    dialogues, skipped = selected(data, skip_bad)
    check_student_format(config.backend, config.student)
    backend = make_checked_backend(config.backend, [config.student.adapter])
    constrained = backend.supports_constraints and config.student.constrain
    provenance = {"model": config.backend.model, "weights": fingerprint(config.backend), "backend": config.backend.kind,
                  "student": config.student.model_dump(), "constrained": constrained, "data": data.model_dump()}
    scored, run_report = run_to_folder(
        dialogues, lambda d: score_dialogue(d, config.student, constrained), lambda: backend,
        out_dir / "results.jsonl", skipped, provenance, config.max_active, progress, "student",
        config.schedule,
    )
    summary = {**summarise(scored), **run_report}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    write_html(scored, out_dir / "report.html")
    return summary, scored
