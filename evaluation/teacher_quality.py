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
import time
from pathlib import Path

import yaml

from fastvista.evaluation.compare import against_gold
from fastvista.config import DataSelection, load_config, load_dialogues
from fastvista.llm import BackendConfig, fingerprint, make_backend
from fastvista.records_io import read_scored
from fastvista.scheduler import finished, folder_lock, run
from fastvista.synth import calibrate
from fastvista.synth.pipeline import TeacherConfig, label_dialogue
from fastvista.synth.prompts import PROMPTS_VERSION


def provenance(teacher: TeacherConfig, weights: dict) -> dict:
    """What decides a variant's labels: results made otherwise are refused on resume."""
    return {"prompts_version": PROMPTS_VERSION, "weights": weights, "teacher": teacher.model_dump(mode="json")}


def check_resumable(path: Path, teacher: TeacherConfig, weights: dict) -> None:
    """Refuse, before any engine starts, earlier results in `path` made with other settings."""
    finished(path, provenance(teacher, weights))


def measure(name: str, teacher: TeacherConfig, dialogues, backend_factory, weights: dict, out: Path, folds: int,
            max_active: int = 256) -> dict:
    """One variant labelled (resumed) into OUT/NAME/labelled.jsonl, its failures with reasons in
    OUT/NAME/failed.jsonl (tried again by the next run), and its figures."""
    path = out / name / "labelled.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(path.parent / "failed.jsonl", "w", encoding="utf-8") as failed_out:
        stats = run(dialogues, lambda d: label_dialogue(d, teacher), backend_factory, path, max_active=max_active,
                    total=len(dialogues), provenance=provenance(teacher, weights), desc=name, failed_out=failed_out)
    wall = time.perf_counter() - start
    scored = read_scored(path, {d.id for d in dialogues})
    turns = [t for d in scored for t in d.turns]
    if not turns:
        raise RuntimeError(f"{name}: no dialogue was scored ({len(stats.failed)} failed, e.g. {stats.failed[:1]})")
    gold = against_gold(scored, failed=stats.failed)
    attribution = against_gold(scored, reading="attribution", failed=stats.failed)
    decisions = gold["turn_accuracy"]
    row = {
        "settings": teacher.model_dump(mode="json"),
        "turns": len(turns),
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
        # Wall time only means something when this run labelled every turn itself.
        "seconds_per_turn": round(wall / len(turns), 2) if stats.labelled == len(scored) and stats.cached_calls == 0 else None,
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
    lines = ["| variant | turn acc | precision | recall | F1 (halluc. +) | turn macro-F1 | turn acc, attribution reading | claim acc | "
             "claim macro-F1 | calls/turn | prompt tok/turn | s/turn |", "|" + "---|" * 12]

    def fmt(x):
        return "-" if x is None else x

    for name, r in rows.items():
        lines.append(f"| {name} | {fmt(r['turn_accuracy'])} | {fmt(r['turn_precision'])} | {fmt(r['turn_recall'])} | {fmt(r['turn_f1'])} | "
                     f"{fmt(r['turn_macro_f1'])} | {r['attribution_turn_accuracy']} | {fmt(r.get('claim_accuracy'))} | {fmt(r.get('macro_f1'))} | "
                     f"{r['calls_per_turn']} | {r['prompt_tokens_per_turn']} | {fmt(r['seconds_per_turn'])} |")
        if "calibrated_cv" in r:  # synth.calibrate reports out-of-fold turn accuracy only
            cv = r["calibrated_cv"]
            lines.append(f"| {name} + calibrated (out-of-fold) | {cv['turn_accuracy']} | - | - | - | - | - | {cv['claim_accuracy']} | {cv['macro_f1']} | "
                         f"{r['calls_per_turn']} | {r['prompt_tokens_per_turn']} | {fmt(r['seconds_per_turn'])} |")
    first = next(iter(rows.values()))
    lines.append(f"\nalways-hallucinated turn accuracy / F1: {first['always_hallucinated']} / {first['always_hallucinated_f1']} over {first['turns']} turns")
    if len(first["turn_accuracy_by_source"]) > 1:
        lines += ["", "| variant | reading | " + " | ".join(first["turn_accuracy_by_source"]) + " |",
                  "|---|---|" + "---|" * len(first["turn_accuracy_by_source"])]
        lines.append("| always hallucinated | - | " + " | ".join(str(v) for v in first["always_hallucinated_by_source"].values()) + " |")
        for name, r in rows.items():
            for reading, key in (("vista", "turn_accuracy_by_source"), ("attribution", "attribution_turn_accuracy_by_source")):
                lines.append(f"| {name} | {reading} | " + " | ".join(str(r[key].get(s, "-")) for s in first["turn_accuracy_by_source"]) + " |")
    return "\n".join(lines)


def main(config: str, variants_file: Path, data: DataSelection, out: Path, only: list[str] | None = None, folds: int = 5,
         overrides: list[str] | None = None) -> dict:
    """Each variant of `variants_file` (teacher settings over the config's) on `data`, one engine,
    under the output folder's lock; every variant's settings and earlier results checked first."""
    tree = load_config(config, overrides or [])
    backend_config = BackendConfig.model_validate(tree["backend"])
    variants = yaml.safe_load(Path(variants_file).read_text())
    unknown = set(only or []) - set(variants)
    if unknown:
        raise ValueError(f"no such variant in {variants_file}: {', '.join(sorted(unknown))}")
    dialogues = load_dialogues(data, None)
    weights = fingerprint(backend_config)
    teachers = {name: TeacherConfig.model_validate({**tree.get("teacher", {}), **settings})
                for name, settings in variants.items() if not only or name in only}
    backend = None

    def shared_backend():
        nonlocal backend
        backend = backend or make_backend(backend_config)
        return backend

    rows = {}
    with folder_lock(out):
        for name, teacher in teachers.items():
            check_resumable(out / name / "labelled.jsonl", teacher, weights)
        for name, teacher in teachers.items():
            rows[name] = measure(name, teacher, dialogues, shared_backend, weights, out, folds, tree.get("max_active", 256))
            (out / "quality.json").write_text(json.dumps({"model": backend_config.model, "input": data.input, "variants": rows}, indent=2))
    (out / "quality.md").write_text(table(rows) + "\n")
    print(table(rows))
    return rows
