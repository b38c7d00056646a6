"""Teacher quality benchmark: teacher settings side by side on human-labelled dialogues.

    fastvista eval teacher-quality -c configs/synth/teacher_vllm_cpu.yaml \\
        --variants configs/eval/teacher_ablation.yaml --source vista \\
        -i $DATA/vista_human_dev.json --out runs/teacher_quality

Every variant runs on one engine (built once) into OUT/NAME/labelled.jsonl (resumable; the call
cache answers what an earlier run asked). Per variant: turn accuracy against the human decision
(and per source; with VISTA's decision and with the attribution reading of the same labels) and
VISTA's precision, recall and F1 with hallucinated as positive beside turn macro-F1, claim accuracy
and macro-F1 (one for one on gold claims, aligned otherwise),
calls, tokens and seconds per turn. Variants with label scores on gold claims also get
out-of-fold figures with fitted thresholds (`synth.calibrate`), and the settings fitted on all
of them are written to OUT/NAME/fitted.yaml. Prints a markdown table; writes quality.json and quality.md.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import yaml
from pydantic import ValidationError

from fastvista.evaluation.compare import against_gold
from fastvista.config import DataSelection, check_name, load_config, table_data
from fastvista.llm import fingerprint, make_backend
from fastvista.records_io import read_scored
from fastvista.scheduler import Schedule, check_resume, folder_lock, run_reporting_failures
from fastvista.schema import Dialogue
from fastvista.synth import calibrate
from fastvista.synth.pipeline import TeacherConfig, label_dialogue
from fastvista.synth.prompts import PROMPTS_VERSION
from fastvista.synth.run import SynthConfig


def provenance(teacher: TeacherConfig, weights: dict) -> dict:
    """What decides a variant's labels: results made otherwise are refused on resume."""
    return {"prompts_version": PROMPTS_VERSION, "weights": weights, "teacher": teacher.model_dump(mode="json")}


def teacher_of(base: TeacherConfig, *settings: dict, where: str) -> TeacherConfig:
    """The base teacher with `settings` over it; a bad key or value names the variant and data set."""
    try:
        return TeacherConfig.model_validate({**base.model_dump(), **{k: v for s in settings for k, v in s.items()}})
    except ValidationError as e:
        raise ValueError(f"{where}: {e}") from None


def check_cell(folder: Path, teacher: TeacherConfig, dialogues: list[Dialogue], weights: dict, where: str) -> None:
    """What a cell would stop on hours into a run, checked before any engine starts: a turn
    without the human claims `gold_claims` needs, and earlier results made with other settings
    or from another version of a dialogue."""
    if teacher.gold_claims:
        missing = next(((d.id, i) for d in dialogues for i in d.scored_indices()
                        if not (d.turns[i].gold and d.turns[i].gold.claims is not None)), None)
        if missing:
            raise ValueError(f"{where}: {missing[0]} turn {missing[1]} has no human claims, which gold_claims needs")
    check_resume(folder / "labelled.jsonl", provenance(teacher, weights), dialogues)


def measure(name: str, teacher: TeacherConfig, dialogues, backend_factory, weights: dict, out: Path, folds: int,
            max_active: int = 256, schedule: Schedule = "waves") -> dict:
    """One variant labelled (resumed) into OUT/NAME/labelled.jsonl, its failures with reasons in
    OUT/NAME/failed.jsonl (tried again by the next run), and its figures. A variant whose every
    dialogue failed is a row of its failures, not a crash of the table."""
    path = out / name / "labelled.jsonl"
    stats = run_reporting_failures(dialogues, lambda d: label_dialogue(d, teacher), backend_factory, path, max_active=max_active,
                                   total=len(dialogues), provenance=provenance(teacher, weights), desc=name, schedule=schedule)
    scored = read_scored(path, {d.id for d in dialogues})
    turns = [t for d in scored for t in d.turns]
    if not turns:
        return {"settings": teacher.model_dump(mode="json"), "turns": 0, "failed_dialogues": len(stats.failed)}
    gold = against_gold(scored, failed=stats.failed)
    attribution = against_gold(scored, reading="attribution", failed=stats.failed)
    decisions = gold["turn_accuracy"]
    row = {
        "settings": teacher.model_dump(mode="json"),
        "turns": len(turns),
        "gold_turns": decisions["n"],
        "failed_dialogues": len(stats.failed),
        "turn_accuracy": decisions["accuracy"],
        # VISTA's metric: hallucinated is the positive class (see evaluation.metrics.accuracy).
        **{f"turn_{k}": decisions[k] for k in ("precision", "recall", "f1", "macro_f1")},
        "always_hallucinated": decisions["always_hallucinated"],
        "always_hallucinated_f1": decisions["always_hallucinated_f1"],
        "turn_accuracy_by_source": {s: v["accuracy"] for s, v in gold["turn_accuracy_by_source"].items()},
        "always_hallucinated_by_source": {s: v["always_hallucinated"] for s, v in gold["turn_accuracy_by_source"].items()},
        # The same labels read as attribution (BEGIN's definition; see evaluation.compare.decision).
        "attribution_turn_accuracy": attribution["turn_accuracy"]["accuracy"],
        "attribution_turn_accuracy_by_source": {s: v["accuracy"] for s, v in attribution["turn_accuracy_by_source"].items()},
        "calls_per_turn": round(statistics.mean(t.usage.calls for t in turns), 2),
        "prompt_tokens_per_turn": round(statistics.mean(t.usage.prompt_tokens for t in turns), 1),
        "completion_tokens_per_turn": round(statistics.mean(t.usage.completion_tokens for t in turns), 1),
        # Wall time only means something when this run labelled every turn itself; the engine's start is not a turn's.
        "seconds_per_turn": (round((stats.wall_seconds - stats.engine_start_seconds) / len(turns), 2)
                             if stats.labelled == len(scored) and stats.cached_calls == 0 else None),
        "errors": sum(len(t.errors) for t in turns),
    }
    if teacher.gold_claims:
        claims = calibrate.claims_of(scored)
        row.update({k: v for k, v in calibrate.figures(claims, claims.predicted).items() if k != "turns"})
        if teacher.label_scores:
            row["calibrated_cv"], row["fold_settings"] = calibrate.cross_validate(claims, folds)
            threshold, bias = calibrate.fit(claims)
            row["fitted_on_all"] = {"verify_threshold": threshold, "class_bias": {l.value: b for l, b in bias.items()}}
            (out / name / "fitted.yaml").write_text(yaml.safe_dump(row["fitted_on_all"], sort_keys=False))
    elif "claims" in gold:
        report = gold["claims"]["labels_on_aligned"]
        row.update(claim_accuracy=report["accuracy"], macro_f1=report["macro_f1"], claim_recall=gold["claims"]["recall"],
                   claim_precision=gold["claims"]["precision"])
    return row


def table(rows: dict) -> str:
    lines = ["| variant | failed dialogues | turn acc | precision | recall | F1 (halluc. +) | turn macro-F1 | turn acc, attribution reading | "
             "claim acc | claim macro-F1 | calls/turn | prompt tok/turn | s/turn |", "|" + "---|" * 13]

    def fmt(x):
        return "-" if x is None else x

    for name, r in rows.items():
        if not r["turns"]:
            lines.append(f"| {name} | {r['failed_dialogues']} (all) |" + " - |" * 11)
            continue
        lines.append(f"| {name} | {r['failed_dialogues']} | {fmt(r['turn_accuracy'])} | {fmt(r['turn_precision'])} | {fmt(r['turn_recall'])} | "
                     f"{fmt(r['turn_f1'])} | {fmt(r['turn_macro_f1'])} | {r['attribution_turn_accuracy']} | {fmt(r.get('claim_accuracy'))} | "
                     f"{fmt(r.get('macro_f1'))} | {r['calls_per_turn']} | {r['prompt_tokens_per_turn']} | {fmt(r['seconds_per_turn'])} |")
        if "calibrated_cv" in r:  # synth.calibrate reports out-of-fold turn accuracy only
            cv = r["calibrated_cv"]
            lines.append(f"| {name} + calibrated (out-of-fold) | {r['failed_dialogues']} | {cv['turn_accuracy']} | - | - | - | - | - | "
                         f"{cv['claim_accuracy']} | {cv['macro_f1']} | {r['calls_per_turn']} | {r['prompt_tokens_per_turn']} | {fmt(r['seconds_per_turn'])} |")
    scored = [r for r in rows.values() if r["turns"]]
    if not scored:
        return "\n".join(lines)
    for name, r in rows.items():  # the baseline of each variant's own turns (they differ when failures do)
        if r["turns"]:
            lines.append(f"\n{name}: always-hallucinated turn accuracy / F1 {r['always_hallucinated']} / {r['always_hallucinated_f1']} "
                         f"over {r['gold_turns']} turns with a human label")
    first = scored[0]
    if len(first["turn_accuracy_by_source"]) > 1:
        lines += ["", "| variant | reading | " + " | ".join(first["turn_accuracy_by_source"]) + " |",
                  "|---|---|" + "---|" * len(first["turn_accuracy_by_source"])]
        lines.append("| always hallucinated | - | " + " | ".join(str(v) for v in first["always_hallucinated_by_source"].values()) + " |")
        for name, r in rows.items():
            for reading, key in (("vista", "turn_accuracy_by_source"), ("attribution", "attribution_turn_accuracy_by_source")):
                if r["turns"]:
                    lines.append(f"| {name} | {reading} | " + " | ".join(str(r[key].get(s, "-")) for s in first["turn_accuracy_by_source"]) + " |")
    return "\n".join(lines)


def synth_config(path: str, overrides: list[str]) -> SynthConfig:
    """The teacher's synth config with its overrides, every key checked (a typo is an error, not
    a table made with other settings); its data section, if any, is the caller's to choose."""
    tree = load_config(path, overrides)
    tree.pop("data", None)
    try:
        return SynthConfig.model_validate(tree)
    except ValidationError as e:
        raise ValueError(f"{path}: {e}") from None


def read_variants(path: Path) -> dict[str, dict]:
    """The variants file: a mapping of names to teacher settings, refused with the file named."""
    variants = yaml.safe_load(Path(path).read_text())
    if not isinstance(variants, dict) or not variants or not all(isinstance(v, dict) for v in variants.values()):
        raise ValueError(f"{path}: give variants as a mapping of names to teacher settings (e.g. `full: {{}}`)")
    for name in variants:
        check_name(name, f"{path}: variant")
    return variants


def main(config: str, variants_file: Path, data: DataSelection, out: Path, only: list[str] | None = None, folds: int = 5,
         overrides: list[str] | None = None) -> dict:
    """Each variant of `variants_file` (teacher settings over the config's) on `data`, one engine,
    under the output folder's lock; every variant's settings and earlier results checked first."""
    synth = synth_config(config, overrides or [])
    variants = read_variants(variants_file)
    unknown = set(only or []) - set(variants)
    if unknown:
        raise ValueError(f"no such variant in {variants_file}: {', '.join(sorted(unknown))}")
    dialogues, _ = table_data(data, data.input)
    weights = fingerprint(synth.backend)
    teachers = {name: teacher_of(synth.teacher, settings, where=f"{variants_file}: variant {name!r}")
                for name, settings in variants.items() if not only or name in only}
    backend = None

    def shared_backend():
        nonlocal backend
        backend = backend or make_backend(synth.backend)
        return backend

    rows = {}
    with folder_lock(out):
        for name, teacher in teachers.items():
            check_cell(out / name, teacher, dialogues, weights, f"variant {name!r}")
        for name, teacher in teachers.items():
            rows[name] = measure(name, teacher, dialogues, shared_backend, weights, out, folds, synth.max_active, synth.schedule)
            (out / "quality.json").write_text(json.dumps({"model": synth.backend.model, "input": data.input, "variants": rows}, indent=2))
            (out / "quality.md").write_text(table(rows) + "\n")
    print(table(rows))
    return rows
