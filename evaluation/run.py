"""`fastvista eval run --scorer NAME`: any scorer on any dialogue file; results, skipped inputs,
a summary and the accuracy against human labels where the data have them. Resumable."""

from __future__ import annotations

import json
from pathlib import Path

from fastvista.config import DataSelection, selected
from fastvista.infer.run import check_student_format
from fastvista.scheduler import locked_folder, read_failed, run_to_folder
from fastvista.summary import summarise
from fastvista.evaluation.compare import against_gold
from fastvista.evaluation.scorers import EvalConfig, backend_factory, machine_for


@locked_folder
def main(tree: dict, out_dir: Path, skip_bad: bool = False, progress: bool = True) -> dict:
    data = DataSelection.model_validate(tree.pop("data", None) or {})
    config = EvalConfig.model_validate(tree)
    out_dir.mkdir(parents=True, exist_ok=True)
    dialogues, skipped = selected(data, skip_bad)
    if config.scorer == "student" and config.backend is not None:
        check_student_format(config.backend, config.student)
    machine = machine_for(config)
    provenance = {**config.provenance(), "data": data.model_dump()}
    scored, run_report = run_to_folder(dialogues, machine, backend_factory(config), out_dir / "results.jsonl",
                                       skipped, provenance, config.max_active, progress, config.scorer, config.schedule)
    summary = {**summarise(scored), **run_report}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    gold = against_gold(scored, failed=read_failed(out_dir))
    if gold["turns"]["labelled"]:
        (out_dir / "gold.json").write_text(json.dumps(gold, indent=2))
        summary["gold"] = gold
    return summary
