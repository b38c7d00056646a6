"""`fastvista score`: the student scores dialogue files; results JSONL, summary and reports."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from fastvista.config import DataSelection, load_dialogues
from fastvista.llm import BackendConfig, make_backend
from fastvista.records_io import RecordError, to_json_line
from fastvista.scheduler import run
from fastvista.schema import ScoredDialogue
from fastvista.summary import summarise
from infer.report import write_html
from infer.student import StudentConfig, score_dialogue


class ScoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: BackendConfig
    student: StudentConfig = Field(default_factory=StudentConfig)
    max_active: int = 256  # dialogues whose next turns form one wave


def main(tree: dict, out_dir: Path, skip_bad: bool = False, progress: bool = True) -> dict:
    data = DataSelection.model_validate(tree.pop("data", None) or {})
    config = ScoreConfig.model_validate(tree)
    out_dir.mkdir(parents=True, exist_ok=True)
    skipped: list[RecordError] = []
    dialogues = load_dialogues(data, skipped if skip_bad else None)
    backend = make_backend(config.backend)
    constrained = backend.supports_constraints and config.student.constrain
    provenance = {"model": config.backend.model, "adapters": config.backend.lora_adapters, "backend": config.backend.kind,
                  "student": config.student.model_dump(), "constrained": constrained, "data": data.model_dump()}
    results_path = out_dir / "results.jsonl"
    started = time.perf_counter()
    stats = run(
        dialogues, lambda d: score_dialogue(d, config.student, constrained), lambda: backend, results_path,
        max_active=config.max_active, total=len(dialogues), provenance=provenance, progress=progress, desc="student",
    )
    wanted = {d.id for d in dialogues}
    scored = [s for line in results_path.read_text(encoding="utf-8").splitlines() if (s := ScoredDialogue.model_validate_json(line)).id in wanted]
    with open(out_dir / "skipped.jsonl", "w", encoding="utf-8") as f:
        f.writelines(to_json_line(r) for r in [e.as_dict() for e in skipped] + [{"id": i, "reason": "duplicate id: scored once"} for i in stats.duplicates])
    wall = time.perf_counter() - started
    summary = {
        **summarise(scored),
        "inputs_skipped": len(skipped) + len(stats.duplicates),
        "this_run": {**stats.__dict__, "duplicates": len(stats.duplicates), "wall_seconds": round(wall, 2)},
        "provenance": provenance,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    write_html(scored, out_dir / "report.html")
    return summary
