"""`fastvista synth`: label dialogues with the teacher, write labelled dialogues, the student's
training set, the skipped inputs with reasons, and a summary. Resumable."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from fastvista.config import DataSelection, selected
from fastvista.contract import StudentFormat
from fastvista.llm import BackendConfig, fingerprint, make_checked_backend
from fastvista.records_io import write_jsonl
from fastvista.scheduler import Schedule, locked_folder, run_to_folder
from fastvista.single_pass import HISTORY_TURNS
from fastvista.summary import summarise
from fastvista.synth.pipeline import TeacherConfig, label_dialogue
from fastvista.synth.prompts import PROMPTS_VERSION
from fastvista.synth.training_set import training_examples, window_examples


class SynthConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: BackendConfig
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    max_active: int = 256  # dialogues advanced together; their pending calls form one batch
    schedule: Schedule = "waves"  # continuous: each dialogue's next call leaves as its last returns (no waves; vllm or openai)
    student_history_turns: int = HISTORY_TURNS
    # also write train_window.jsonl for a dialogue-level student scoring this many turns a call (0: no)
    student_window_turns: int = 4


@locked_folder
def main(tree: dict, out_dir: Path, skip_bad: bool = False, progress: bool = True) -> dict:
    data = DataSelection.model_validate(tree.pop("data", None) or {})
    config = SynthConfig.model_validate(tree)
    out_dir.mkdir(parents=True, exist_ok=True)
    dialogues, skipped = selected(data, skip_bad)
    provenance = {
        "teacher_model": config.backend.model,
        "weights": fingerprint(config.backend),
        "backend": config.backend.kind,
        "prompts_version": PROMPTS_VERSION,
        "teacher": config.teacher.model_dump(),
        "data": data.model_dump(),
    }
    (out_dir / "config.json").write_text(json.dumps({**config.model_dump(), "data": data.model_dump()}, indent=2))
    scored, run_report = run_to_folder(
        dialogues, lambda d: label_dialogue(d, config.teacher), lambda: make_checked_backend(config.backend, [None]),
        out_dir / "labelled.jsonl", skipped, provenance, config.max_active, progress, "teacher",
        config.schedule,
    )
    per_turn = StudentFormat(history_turns=config.student_history_turns, max_store_claims=config.teacher.max_store_claims)
    examples = [e for s in scored for e in training_examples(s, per_turn)]
    write_jsonl(out_dir / "train.jsonl", examples)
    if config.student_window_turns > 1:
        window = StudentFormat(history_turns=per_turn.history_turns, max_store_claims=per_turn.max_store_claims,
                               turns_per_call=config.student_window_turns)
        write_jsonl(out_dir / "train_window.jsonl", [e for s in scored for e in window_examples(s, window)])
    summary = {**summarise(scored), "training_examples": len(examples), **run_report}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
