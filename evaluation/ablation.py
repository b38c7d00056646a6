"""The teacher's ablation table, as the VISTA paper tabulates it: the full pipeline against no
history, no accumulation (no knowledge store), zero-shot and both off, on several data sets, one
engine for all.

    fastvista eval ablation -c configs/eval/vista_ablation.yaml -o runs/ablation

Each (data set, variant) cell is `fastvista eval teacher-quality`'s measurement
(OUT/DATA/VARIANT/labelled.jsonl and failed.jsonl, resumable, the call cache shared): turn
accuracy and VISTA's precision, recall and F1 with hallucinated as positive beside macro-F1 and
the always-hallucinated baseline, claim accuracy (with the humans' claims where a data set sets
`gold_claims`), calls and prompt tokens per turn. On the cross-turn probe
(`data/probes/cross_turn.jsonl.gz`) each cell also holds the share of right decisions per probe
version. A variant that cannot change a data set's labels (see `moot_switches`) is not run there:
its row says n/a and which variant it equals. Everything is checked (data, settings, earlier
results) before the engine starts. Writes ablation.json and ablation.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

from fastvista.config import DataSelection, load_config, load_dialogues
from fastvista.evaluation.cross_turn import TYPES, cross_turn_report
from fastvista.evaluation.teacher_quality import check_resumable, measure
from fastvista.llm import BackendConfig, fingerprint, make_backend
from fastvista.records_io import RecordError, read_scored, to_json_line
from fastvista.scheduler import folder_lock, read_failed
from fastvista.schema import Dialogue
from fastvista.synth.pipeline import TeacherConfig


class AblationData(DataSelection):
    teacher: dict = {}  # what this data set needs in every variant (e.g. gold_claims: true); never a switch
    skip_bad: bool = False  # go on past bad records (FaithDial's CSVs hold empty rows), each reported in OUT/DATA/skipped.jsonl


class AblationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    synth_config: str  # the teacher's config: backend, the full pipeline's settings, max_active
    synth_overrides: list[str] = []  # keys of the synth config, e.g. [backend.cache=FILE, max_active=24]
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


def moot_switches(teacher: TeacherConfig, dialogues: list[Dialogue]) -> dict[str, str]:
    """Switches that cannot change these labels, each with why: history only shapes the
    decomposition, which gold claims skip; the store only reaches later scored turns."""
    moot = {}
    if teacher.gold_claims:
        moot["history"] = "history only shapes claim decomposition, and gold claims are not decomposed"
    if all(len(d.scored_indices()) <= 1 for d in dialogues):
        moot["accumulate"] = "no dialogue scores more than one turn, so no scored turn sees an accumulated claim"
    return moot


@dataclass
class Plan:
    """One data set's run: its dialogues, its bad records, and per variant the settings or the
    earlier variant it equals by construction."""
    dialogues: list[Dialogue]
    skipped: list[RecordError]
    teachers: dict[str, TeacherConfig] = field(default_factory=dict)
    same_as: dict[str, tuple[str, str]] = field(default_factory=dict)  # variant -> (variant it equals, why)


def plan(cfg: AblationConfig, base: dict, weights: dict, out: Path) -> dict[str, Plan]:
    """Every data set loaded and every cell's settings checked, before any engine starts: a bad
    path, record or setting, a turn without the human claims `gold_claims` needs, or earlier
    results made with other settings is an error now, not hours into the run."""
    plans = {}
    for data_name, data in cfg.data.items():
        skipped: list[RecordError] = []
        dialogues = load_dialogues(data, skipped if data.skip_bad else None)
        p = plans[data_name] = Plan(dialogues, skipped)
        effective: dict[str, TeacherConfig] = {}
        for name, settings in cfg.variants.items():
            teacher = TeacherConfig.model_validate({**base, **settings, **data.teacher})
            if teacher.gold_claims:
                missing = next(((d.id, i) for d in dialogues for i in d.scored_indices()
                                if not (d.turns[i].gold and d.turns[i].gold.claims is not None)), None)
                if missing:
                    raise ValueError(f"data set {data_name!r}: {missing[0]} turn {missing[1]} has no human claims, "
                                     "which gold_claims needs")
            moot = moot_switches(teacher, dialogues)
            canonical = teacher.model_copy(update={k: TeacherConfig.model_fields[k].default for k in moot})
            twin = next((v for v, c in effective.items() if c == canonical), None)
            if twin:
                changed = [k for k in moot if getattr(teacher, k) != getattr(p.teachers[twin], k)]
                p.same_as[name] = (twin, "; ".join(moot[k] for k in changed) or "the same settings")
                continue
            effective[name] = canonical
            p.teachers[name] = teacher
            check_resumable(out / data_name / name / "labelled.jsonl", teacher, weights)
    return plans


SHOWN = (("n", "turns"), ("failed", "failed_dialogues"), ("turn acc", "turn_accuracy"), ("precision", "turn_precision"),
         ("recall", "turn_recall"), ("F1 (halluc. +)", "turn_f1"), ("macro-F1", "turn_macro_f1"),
         ("always halluc. acc / F1", "always_hallucinated"), ("claim acc", "claim_accuracy"),
         ("calls/turn", "calls_per_turn"), ("prompt tok/turn", "prompt_tokens_per_turn"))


def value(row: dict, key) -> str:
    if "same_as" in row:
        return "n/a"
    if isinstance(key, tuple):  # a probe version's right decisions
        found = row.get("probe", {}).get(key[1], {}).get("correct_decision_share")
    elif key == "always_hallucinated":
        found = None if row.get(key) is None else f"{row[key]} / {row.get('always_hallucinated_f1')}"
    else:
        found = row.get(key)
    return "-" if found is None else str(found)


def table(cells: dict[str, dict[str, dict]]) -> str:
    """One table per data set, one row per variant (the probe's: right decisions per version),
    then the variants each set could not tell apart."""
    parts = []
    for data, rows in cells.items():
        keys = [key for _, key in SHOWN] + [("probe", kind) for kind in TYPES if any("probe" in r for r in rows.values())]
        header = [label for label, _ in SHOWN] + [f"{key[1]} right" for key in keys[len(SHOWN):]]
        lines = [f"### {data}", "", "| variant | " + " | ".join(header) + " |", "|" + "---|" * (len(header) + 1)]
        lines += [f"| {v} | " + " | ".join(value(r, k) for k in keys) + " |" for v, r in rows.items()]
        lines += [f"\nn/a: {v} = {r['same_as']} by construction ({r['why']})." for v, r in rows.items() if "same_as" in r]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def main(cfg: AblationConfig, out: Path, backend_factory=None) -> dict:
    """Every variant on every data set under the folder's lock; `backend_factory` replaces the
    config's engine (tests)."""
    with folder_lock(out):
        return ablation(cfg, out, backend_factory)


def ablation(cfg: AblationConfig, out: Path, backend_factory=None) -> dict:
    tree = load_config(cfg.synth_config, cfg.synth_overrides)
    backend_config = BackendConfig.model_validate(tree["backend"])
    weights = {} if backend_factory else fingerprint(backend_config)
    plans = plan(cfg, tree.get("teacher", {}), weights, out)
    backend = None

    def shared_backend():
        nonlocal backend
        backend = backend or (backend_factory or (lambda: make_backend(backend_config)))()
        return backend

    cells: dict[str, dict[str, dict]] = {}
    for data_name, p in plans.items():
        if p.skipped:
            (out / data_name).mkdir(parents=True, exist_ok=True)
            (out / data_name / "skipped.jsonl").write_text("".join(to_json_line(e.as_dict()) for e in p.skipped))
        cells[data_name] = {}
        for name in cfg.variants:
            if name in p.same_as:
                twin, why = p.same_as[name]
                cells[data_name][name] = {"same_as": twin, "why": why}
                continue
            folder = out / data_name / name
            row = measure(name, p.teachers[name], p.dialogues, shared_backend, weights, out / data_name, folds=5,
                          max_active=tree.get("max_active", 256))
            probe = cross_turn_report(read_scored(folder / "labelled.jsonl", {d.id for d in p.dialogues}), read_failed(folder))
            if probe:
                row["probe"] = probe
            if p.skipped:
                row["skipped_records"] = len(p.skipped)
            cells[data_name][name] = row
            (out / "ablation.json").write_text(json.dumps({"model": backend_config.model, "config": cfg.model_dump(), "cells": cells}, indent=2))
    (out / "ablation.json").write_text(json.dumps({"model": backend_config.model, "config": cfg.model_dump(), "cells": cells}, indent=2))
    text = table(cells)
    (out / "ablation.md").write_text(text + "\n")
    print(text)
    return cells


def failures(cells: dict[str, dict[str, dict]]) -> list[str]:
    """The cells with dialogues that could not be labelled (each cell's failed.jsonl says why)."""
    return [f"{data}/{name}: {row['failed_dialogues']}" for data, rows in cells.items() for name, row in rows.items()
            if row.get("failed_dialogues")]
