"""The teacher's ablation table, as the VISTA paper tabulates it: the full pipeline against no
history, no accumulation (no knowledge store), zero-shot and both off, on several data sets, one
engine for all.

    fastvista eval ablation -c configs/eval/vista_ablation.yaml -o runs/ablation

Each (data set, variant) cell is `fastvista eval teacher-quality`'s measurement
(OUT/DATA/VARIANT/labelled.jsonl, resumable, the call cache shared): turn accuracy and VISTA's
precision, recall and F1 with hallucinated as positive, claim accuracy (with the humans' claims
where a data set sets `gold_claims`), calls and prompt tokens per turn. On the cross-turn probe
(`data/probes/cross_turn.jsonl.gz`) each cell also holds the share of right decisions per probe
version. Writes ablation.json and ablation.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

from fastvista.config import DataSelection, load_config, load_dialogues
from fastvista.evaluation.cross_turn import TYPES, cross_turn_report
from fastvista.evaluation.teacher_quality import measure
from fastvista.llm import BackendConfig, fingerprint, make_backend
from fastvista.records_io import RecordError, read_scored, to_json_line
from fastvista.synth.pipeline import TeacherConfig


class AblationData(DataSelection):
    teacher: dict = {}  # what this data set needs in every variant (e.g. gold_claims: true); never a switch
    skip_bad: bool = False  # go on past bad records (FaithDial's CSVs hold empty rows), each reported in OUT/DATA/skipped.jsonl


class AblationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    synth_config: str  # the teacher's config: backend and the full pipeline's settings
    variants: dict[str, dict]  # name -> teacher settings over the full pipeline's
    data: dict[str, AblationData]

    @model_validator(mode="after")
    def data_sets_leave_the_switches_to_the_variants(self):
        for name in [*self.variants, *self.data]:  # each is a folder name
            if not re.fullmatch(r"\w[\w ,.+-]*", name) or ".." in name:
                raise ValueError(f"name {name!r}: letters, digits, spaces and , . + - only (it names a folder)")
        switches = {"history", "accumulate", "few_shot"} | {k for v in self.variants.values() for k in v}
        for name, data in self.data.items():
            clash = switches & set(data.teacher)
            if clash:
                raise ValueError(f"data set {name!r} sets {', '.join(sorted(clash))}, which the variants switch: "
                                 "a row named 'full' would not be the full teacher")
        return self


COLUMNS = (("turn acc", "turn_accuracy"), ("F1 (halluc. +)", "turn_f1"), ("claim acc", "claim_accuracy"),
           ("calls/turn", "calls_per_turn"), ("prompt tok/turn", "prompt_tokens_per_turn"))


def table(cells: dict[str, dict[str, dict]]) -> str:
    """One row per variant; per data set its columns (the probe's: right decisions per version)."""
    variants = list(dict.fromkeys(v for rows in cells.values() for v in rows))
    header, keys = ["variant"], []
    for data, rows in cells.items():
        probe = any("probe" in r for r in rows.values())
        for label, key in COLUMNS:
            header.append(f"{data}: {label}")
            keys.append((data, key))
        if probe:
            for kind in TYPES:
                header.append(f"{data}: {kind} right")
                keys.append((data, ("probe", kind)))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for v in variants:
        values = []
        for data, key in keys:
            row = cells[data].get(v, {})
            value = row.get("probe", {}).get(key[1], {}).get("correct_decision_share") if isinstance(key, tuple) else row.get(key)
            values.append("-" if value is None else str(value))
        lines.append(f"| {v} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def main(cfg: AblationConfig, out: Path, overrides: list[str] | None = None, backend_factory=None) -> dict:
    """Every variant on every data set; `backend_factory` replaces the config's engine (tests)."""
    tree = load_config(cfg.synth_config, overrides or [])
    backend_config = BackendConfig.model_validate(tree["backend"])
    weights = {} if backend_factory else fingerprint(backend_config)
    backend = None

    def shared_backend():
        nonlocal backend
        backend = backend or (backend_factory or (lambda: make_backend(backend_config)))()
        return backend

    cells: dict[str, dict[str, dict]] = {}
    for data_name, data in cfg.data.items():
        skipped: list[RecordError] = []
        dialogues = load_dialogues(data, skipped if data.skip_bad else None)
        if skipped:
            (out / data_name).mkdir(parents=True, exist_ok=True)
            (out / data_name / "skipped.jsonl").write_text("".join(to_json_line(e.as_dict()) for e in skipped))
        cells[data_name] = {}
        for name, settings in cfg.variants.items():
            teacher = TeacherConfig.model_validate({**tree.get("teacher", {}), **settings, **data.teacher})
            row = measure(name, teacher, dialogues, shared_backend, weights, out / data_name, folds=5)
            probe = cross_turn_report(read_scored(out / data_name / name / "labelled.jsonl", {d.id for d in dialogues}))
            if probe:
                row["probe"] = probe
            if skipped:
                row["skipped_records"] = len(skipped)
            cells[data_name][name] = row
            (out / "ablation.json").write_text(json.dumps({"model": backend_config.model, "config": cfg.model_dump(), "cells": cells}, indent=2))
    text = table(cells)
    (out / "ablation.md").write_text(text + "\n")
    print(text)
    return cells
