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
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

from fastvista.config import DataSelection, check_name, table_data
from fastvista.evaluation.cross_turn import TYPES, cross_turn_report
from fastvista.evaluation.teacher_quality import check_cell, measure, synth_config, teacher_of
from fastvista.llm import fingerprint, make_backend
from fastvista.records_io import read_scored, write_jsonl
from fastvista.scheduler import folder_lock, read_failed
from fastvista.schema import Dialogue
from fastvista.synth.pipeline import TeacherConfig


class AblationData(DataSelection):
    teacher: dict = {}  # what this data set needs in every variant (e.g. gold_claims: true); never a switch
    skip_bad: bool = False  # go on past bad records (FaithDial's CSVs hold empty rows); all left out is in OUT/DATA/skipped.jsonl


class AblationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    synth_config: str  # the teacher's config: backend, the full pipeline's settings, max_active
    synth_overrides: list[str] = []  # keys of the synth config, e.g. [backend.cache=FILE, max_active=24]
    variants: dict[str, dict]  # name -> teacher settings over the full pipeline's
    data: dict[str, AblationData]

    @model_validator(mode="after")
    def data_sets_leave_the_switches_to_the_variants(self):
        for name in self.variants:
            check_name(name, "variant")
        for name in self.data:
            check_name(name, "data set")
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
    """One data set's run: its dialogues, what it leaves out (bad records, dropped dialogues), and
    per variant the settings or the earlier variant it equals by construction."""
    dialogues: list[Dialogue]
    left_out: list[dict]
    teachers: dict[str, TeacherConfig] = field(default_factory=dict)
    same_as: dict[str, tuple[str, str]] = field(default_factory=dict)  # variant -> (variant it equals, why)


def plan(cfg: AblationConfig, base: TeacherConfig, weights: dict, out: Path) -> dict[str, Plan]:
    """Every data set loaded and every cell checked (`check_cell`) before any engine starts: a
    bad path, record or setting, an empty set, an id twice, a turn without the human claims
    `gold_claims` needs, or earlier results made otherwise is an error now, not hours in."""
    plans = {}
    for data_name, data in cfg.data.items():
        p = plans[data_name] = Plan(*table_data(data, data_name, data.skip_bad))
        effective: dict[str, TeacherConfig] = {}
        for name, settings in cfg.variants.items():
            where = f"data set {data_name!r}, variant {name!r}"
            teacher = teacher_of(base, settings, data.teacher, where=where)
            moot = moot_switches(teacher, p.dialogues)
            canonical = teacher.model_copy(update={k: TeacherConfig.model_fields[k].default for k in moot})
            twin = next((v for v, c in effective.items() if c == canonical), None)
            if twin:
                changed = [k for k in moot if getattr(teacher, k) != getattr(p.teachers[twin], k)]
                p.same_as[name] = (twin, "; ".join(moot[k] for k in changed) or "the same settings")
                continue
            effective[name] = canonical
            p.teachers[name] = teacher
            check_cell(out / data_name / name, teacher, p.dialogues, weights, where)
    return plans


SHOWN = (("n", "gold_turns"), ("failed", "failed_dialogues"), ("left out", "left_out_inputs"), ("turn acc", "turn_accuracy"), ("precision", "turn_precision"),
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
    synth = synth_config(cfg.synth_config, cfg.synth_overrides)
    weights = {} if backend_factory else fingerprint(synth.backend)
    plans = plan(cfg, synth.teacher, weights, out)
    backend = None

    def shared_backend():
        nonlocal backend
        backend = backend or (backend_factory or (lambda: make_backend(synth.backend)))()
        return backend

    cells: dict[str, dict[str, dict]] = {}

    def write() -> None:  # after every cell, so a stopped run leaves tables of what it finished
        (out / "ablation.json").write_text(json.dumps({"model": synth.backend.model, "config": cfg.model_dump(), "cells": cells}, indent=2))
        (out / "ablation.md").write_text(table(cells) + "\n")

    for data_name, p in plans.items():
        write_jsonl(out / data_name / "skipped.jsonl", p.left_out)
        cells[data_name] = {}
        for name in cfg.variants:
            if name in p.same_as:
                twin, why = p.same_as[name]
                cells[data_name][name] = {"same_as": twin, "why": why}
                continue
            folder = out / data_name / name
            row = measure(name, p.teachers[name], p.dialogues, shared_backend, weights, out / data_name, folds=5,
                          max_active=synth.max_active, schedule=synth.schedule)
            probe = cross_turn_report(read_scored(folder / "labelled.jsonl", {d.id for d in p.dialogues}), read_failed(folder))
            if probe:
                row["probe"] = probe
            row["left_out_inputs"] = len(p.left_out)
            cells[data_name][name] = row
            write()
    write()
    print(table(cells))
    return cells


def failures(cells: dict[str, dict[str, dict]]) -> list[str]:
    """The cells with dialogues that could not be labelled (each cell's failed.jsonl says why)."""
    return [f"{data}/{name}: {row['failed_dialogues']}" for data, rows in cells.items() for name, row in rows.items()
            if row.get("failed_dialogues")]
