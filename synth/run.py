"""`fastvista synth`: label dialogues with the teacher, write labelled dialogues, the student's
training set, the skipped inputs with reasons, and a summary. Resumable."""

from __future__ import annotations

import json
import time
from pathlib import Path
from pydantic import BaseModel, ConfigDict, Field

from fastvista.config import DataSelection, load_dialogues
from fastvista.llm import BackendConfig, make_backend
from fastvista.records_io import RecordError, to_json_line, write_jsonl
from fastvista.schema import ScoredDialogue
from fastvista.single_pass import HISTORY_TURNS
from synth.pipeline import TeacherConfig, label_dialogue
from synth.prompts import PROMPTS_VERSION
from fastvista.scheduler import run
from fastvista.summary import summarise
from synth.training_set import training_examples


class SynthConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: BackendConfig
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    max_active: int = 256  # dialogues advanced together; their pending calls form one batch
    student_history_turns: int = HISTORY_TURNS


def main(tree: dict, out_dir: Path, skip_bad: bool = False, progress: bool = True) -> dict:
    data = DataSelection.model_validate(tree.pop("data", None) or {})
    config = SynthConfig.model_validate(tree)
    out_dir.mkdir(parents=True, exist_ok=True)
    skipped: list[RecordError] = []
    dialogues = load_dialogues(data, skipped if skip_bad else None)
    provenance = {
        "teacher_model": config.backend.model,
        "backend": config.backend.kind,
        "prompts_version": PROMPTS_VERSION,
        "teacher": config.teacher.model_dump(),
        "data": data.model_dump(),
    }
    (out_dir / "config.json").write_text(json.dumps({**config.model_dump(), "data": data.model_dump()}, indent=2))
    labelled_path = out_dir / "labelled.jsonl"
    started = time.perf_counter()
    stats = run(
        dialogues,
        lambda d: label_dialogue(d, config.teacher),
        lambda: make_backend(config.backend),
        labelled_path,
        max_active=config.max_active,
        total=len(dialogues),
        provenance=provenance,
        progress=progress,
        desc="teacher",
    )
    wanted = {d.id for d in dialogues}
    scored = [
        s
        for line in labelled_path.read_text(encoding="utf-8").splitlines()
        if (s := ScoredDialogue.model_validate_json(line)).id in wanted
    ]
    examples = [e for s in scored for e in training_examples(s, config.student_history_turns)]
    write_jsonl(out_dir / "train.jsonl", examples)
    skipped_records = [e.as_dict() for e in skipped] + [
        {"id": i, "reason": "duplicate id: labelled once"} for i in stats.duplicates
    ]
    with open(out_dir / "skipped.jsonl", "w", encoding="utf-8") as f:
        f.writelines(to_json_line(r) for r in skipped_records)
    summary = {
        **summarise(scored),
        "training_examples": len(examples),
        "inputs_skipped": len(skipped_records),
        "this_run": {**stats.__dict__, "duplicates": len(stats.duplicates), "wall_seconds": round(time.perf_counter() - started, 2)},
        "provenance": provenance,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
