"""Scorers side by side on human-labelled dialogues, one engine for all of them:

    fastvista eval benchmark -c configs/eval/baselines_vllm_cpu.yaml \\
        --scorer q2 --scorer factscore --scorer judge \\
        --data q2=runs/eval_inputs/q2.jsonl@120 --data begin=runs/eval_inputs/begin_dev.jsonl@240 \\
        --out runs/baselines

`NAME=FILE@N` scores a seeded random sample of N dialogues of a JSONL file (all without @N); a
cross-turn probe file (`fastvista data cross-turn-probe`) is taken whole, as a sample would break
its groups of four versions. Every data set and scorer setting is checked before the engine starts,
and the one engine serves every scorer (the student through its LoRA adapter).
Per scorer and data set: turn accuracy (all and per source), precision, recall and F1 with
hallucinated as positive and macro-F1, beside always-hallucinated (accuracy and F1), how well
the turn score separates faithful from hallucinated turns (mean scores, ROC AUC), calls, tokens
and seconds per turn. Q2's run also gives the `Q2 w/o NLI` row (kept in each turn's details).
Results go to OUT/SCORER/NAME/results.jsonl (resumable: results made with other weights, prompts
or settings are refused, not mixed in), the dialogues that failed to OUT/SCORER/NAME/failed.jsonl
(counted per row; the same command tries them again); benchmark.json and benchmark.md.
Scorers on their own engines (the teacher's model and the student's) are run one after the other
into one folder: each run keeps the earlier runs' rows measured on the same dialogues, and where the
teacher and the student both scored a set the table gives the student's accuracy minus the teacher's.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

from fastvista.evaluation.compare import against_gold, turns_right
from fastvista.evaluation.cross_turn import probe_turn
from fastvista.evaluation.metrics import accuracy, paired_accuracy_gap, separation
from fastvista.evaluation.report import DECISION_HEADER, decision_cells
from fastvista.evaluation.scorers import SCORERS, EvalConfig, adapter_of, backend_factory, machine_for
from fastvista.config import DataSelection, check_name, load_config, table_data
from fastvista.records_io import read_scored, write_json
from fastvista.infer.run import check_student_format
from fastvista.scheduler import check_resume, folder_lock, run_reporting_failures
from fastvista.schema import Dialogue
from fastvista.selection import sample


def figures(scored, wall: float | None, failed: int) -> dict:
    turns = [t for d in scored for t in d.turns]
    gold = against_gold(scored)

    def per_turn(values, digits):  # None when every dialogue failed
        return round(statistics.mean(values), digits) if values else None

    return {
        "turns": len(turns),
        "failed_dialogues": failed,
        "turn_accuracy": gold["turn_accuracy"],
        "by_source": {s: v["accuracy"] for s, v in gold["turn_accuracy_by_source"].items()},
        "always_hallucinated_by_source": {s: v["always_hallucinated"] for s, v in gold["turn_accuracy_by_source"].items()},
        "separation": gold["score_separation"],
        "calls_per_turn": per_turn([t.usage.calls for t in turns], 2),
        "prompt_tokens_per_turn": per_turn([t.usage.prompt_tokens for t in turns], 1),
        "completion_tokens_per_turn": per_turn([t.usage.completion_tokens for t in turns], 1),
        "seconds_per_turn": round(wall / len(turns), 3) if wall else None,
        "errors": sum(len(t.errors) for t in turns),
    }


def without_nli(scored, threshold: float) -> dict:
    """Q2 w/o NLI from the same run: token-F1 scores kept in each turn's details."""
    pairs = [(t.details["q2_no_nli"], d.dialogue.turns[t.index].gold.label == "hallucinated")
             for d in scored for t in d.turns if t.details and d.dialogue.turns[t.index].gold]
    return {"turn_accuracy": accuracy([s < threshold for s, _ in pairs], [g for _, g in pairs]),
            "separation": separation([s for s, _ in pairs], [g for _, g in pairs])}


def data_digest(dialogues) -> str:
    """What a row was measured on, content and human labels included: rows side by side must share it."""
    return hashlib.sha256("\n".join(sorted(d.model_dump_json() for d in dialogues)).encode()).hexdigest()[:12]


def earlier_rows(out: Path, sets: dict, scorers: set) -> dict:
    """The rows earlier runs of this folder measured, except those this run measures again, so that
    scorers on their own engines (the teacher's model, the student's) end in one table. On a set of
    this run, a row made on other dialogues or labels, or whose results are gone, is dropped with a
    message, never shown beside this run's rows."""
    path = out / "benchmark.json"
    if not path.exists():
        return {}
    try:
        earlier = json.loads(path.read_text())["results"]
        rows_by_set = {name: dict(rows) for name, rows in earlier.items()}
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a table this version wrote ({e!r}); delete it to start the table afresh "
                         "(the results folders are kept, and resumed)") from None
    kept = {}
    for name, rows in rows_by_set.items():
        for scorer, row in rows.items():
            base = scorer.removesuffix(" w/o NLI")  # Q2's derived row goes with its run
            if name not in sets:
                kept.setdefault(name, {})[scorer] = row
            elif base in scorers:
                continue  # measured again now
            elif not isinstance(row, dict) or rows.get(base, {}).get("dialogues") != data_digest(sets[name]):
                print(f"benchmark: the earlier {scorer} row on {name} is not shown: it was measured on other dialogues or labels")
            elif not (out / base / name / "results.jsonl").exists():
                print(f"benchmark: the earlier {scorer} row on {name} is not shown: {out / base / name / 'results.jsonl'} is gone")
            else:
                kept.setdefault(name, {})[scorer] = row
    return kept


def student_vs_teacher(out: Path, results: dict, sets: dict) -> dict:
    """Per data set of this run that the teacher and the student both scored whole, on the same
    dialogues: the student's turn accuracy minus the teacher's on the very same turns, with a paired
    bootstrap interval (the student issue asks for it within 0.05)."""
    gaps = {}
    for data, dialogues in sets.items():
        teacher, student = results.get(data, {}).get("teacher"), results.get(data, {}).get("student")
        if not (teacher and student):
            continue
        if teacher["failed_dialogues"] or student["failed_dialogues"]:
            print(f"benchmark: no student-teacher gap on {data}: dialogues failed (teacher {teacher['failed_dialogues']}, "
                  f"student {student['failed_dialogues']})")
            continue
        ids = {d.id for d in dialogues}
        right = {scorer: turns_right(read_scored(out / scorer / data / "results.jsonl", ids)) for scorer in ("teacher", "student")}
        turns = sorted(right["teacher"].keys() & right["student"].keys())
        gaps[data] = {**paired_accuracy_gap([right["student"][k] for k in turns], [right["teacher"][k] for k in turns]),
                      "student_accuracy": student["turn_accuracy"]["accuracy"], "teacher_accuracy": teacher["turn_accuracy"]["accuracy"]}
    return gaps


def table(results: dict) -> str:
    lines = [f"| data | scorer | n | failed dialogues | {DECISION_HEADER} | score AUC | mean score faithful / halluc. | calls/turn | "
             "tokens/turn | s/turn |", "|" + "---|" * 16]

    def cell(x):
        return "-" if x is None else x

    for data, by_scorer in results.items():
        for name, r in by_scorer.items():
            acc, sep = r["turn_accuracy"], r["separation"]
            tokens = None if r.get("calls_per_turn") is None else round(r["prompt_tokens_per_turn"] + r["completion_tokens_per_turn"], 1)
            lines.append(f"| {data} | {name} | {acc['n']} | {cell(r.get('failed_dialogues'))} | {decision_cells(acc)} | {sep['roc_auc']} | "
                         f"{sep['mean_faithful']} / {sep['mean_hallucinated']} | {cell(r.get('calls_per_turn'))} | {cell(tokens)} | "
                         f"{r.get('seconds_per_turn') or '-'} |")
    return "\n".join(lines)


def gap_lines(gaps: dict) -> list[str]:
    return [f"{data}: student turn accuracy {g['student_accuracy']:.3f} vs teacher {g['teacher_accuracy']:.3f} on the same {g['n']} turns; "
            f"student minus teacher {g['gap']:+.3f} [95% CI {g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}]"
            for data, g in gaps.items() if g["n"] and g["student_accuracy"] is not None and g["teacher_accuracy"] is not None]


def parse_data(item: str) -> tuple[str, str, int | None]:
    """NAME=FILE[@N], refused with the item named when it does not read."""
    name, _, rest = item.partition("=")
    path, _, n = rest.partition("@")
    if not name or not path or (n and not (n.isdigit() and int(n) > 0)):
        raise ValueError(f"--data {item!r}: give NAME=FILE.jsonl, or NAME=FILE.jsonl@N for a sample of N >= 1 dialogues")
    check_name(name, f"--data {item!r}: data set")
    return name, path, int(n) if n else None


def load_data(items: list[str]) -> dict[str, list[Dialogue]]:
    """Every data set (NAME=FILE.jsonl[@N]) read and checked (`table_data`) before any engine
    starts, so a bad last item fails at once rather than after hours of scoring. The cross-turn
    probe holds four versions of each base dialogue (consecutive lines): a random sample would
    break those groups."""
    sets = {}
    for item in items:
        name, path, n = parse_data(item)
        if name in sets:
            raise ValueError(f"--data {item!r}: the name {name!r} is given twice")
        dialogues, _ = table_data(DataSelection(input=path), name)
        if n is not None and any(probe_turn(d) for d in dialogues):
            lines = max(4, n - n % 4)
            raise ValueError(f"{path} holds cross-turn probe dialogues, four versions of each base dialogue: @{n} would sample "
                             f"them apart. Use the whole file, or cut its first lines into a file first "
                             f"(e.g. `{'zcat' if path.endswith('.gz') else 'cat'} {path} | head -n {lines} > probe_{lines // 4}.jsonl`)")
        sets[name] = sample(dialogues, n) if n is not None else dialogues
    return sets


def main(config_path: str, scorers: list[str], data: list[str], out: Path, overrides: list[str] | None = None) -> dict:
    """Every scorer on every data set (NAME=FILE.jsonl[@N]), one engine, under the output folder's
    lock; a table of their figures. Rows with failed dialogues say so (`failed_dialogues`); a
    second run scores only those."""
    with folder_lock(out):
        return benchmark(config_path, scorers, data, out, overrides)


def benchmark(config_path: str, scorers: list[str], data: list[str], out: Path, overrides: list[str] | None) -> dict:
    unknown = sorted(set(scorers) - set(SCORERS))
    if unknown:
        raise ValueError(f"unknown scorer {unknown[0]!r}: one of {', '.join(SCORERS)}")
    tree = load_config(config_path, overrides or [])
    tree.pop("data", None)
    configs = {scorer: EvalConfig.model_validate({**tree, "scorer": scorer}) for scorer in scorers}
    sets = load_data(data)
    if "student" in configs and configs["student"].backend is not None:
        check_student_format(configs["student"].backend, configs["student"].student)
    for name, dialogues in sets.items():  # earlier results made otherwise are refused now, not after hours of scoring
        for scorer, config in configs.items():
            check_resume(out / scorer / name / "results.jsonl", config.provenance(), dialogues)
    # One backend section serves every scorer (the config's): the engine is built from it once,
    # checked for every adapter the scorers ask for.
    build = backend_factory(configs[scorers[0]], [adapter_of(c) for c in configs.values()])
    backend = None

    def shared_backend():
        nonlocal backend
        backend = backend or build()
        return backend

    results = earlier_rows(out, sets, set(configs))
    earlier_gaps = json.loads((out / "benchmark.json").read_text()).get("student_minus_teacher", {}) if results else {}
    for name, dialogues in sets.items():
        for scorer, config in configs.items():
            folder = out / scorer / name
            stats = run_reporting_failures(dialogues, machine_for(config), shared_backend, folder / "results.jsonl",
                                           max_active=config.max_active, total=len(dialogues), provenance=config.provenance(),
                                           desc=f"{scorer} on {name}", schedule=config.schedule)
            # wall time means something only when this run scored every dialogue itself; the engine's start is not a turn's
            wall = stats.wall_seconds - stats.engine_start_seconds if stats.labelled == len(dialogues) and stats.cached_calls == 0 else None
            scored = read_scored(folder / "results.jsonl", {d.id for d in dialogues})
            results.setdefault(name, {})[scorer] = {**figures(scored, wall, len(stats.failed)), "dialogues": data_digest(dialogues),
                                                    "config": config_path, "model": config.backend.model if config.backend else None}
            if scorer == "q2":
                results[name]["q2 w/o NLI"] = without_nli(scored, config.q2.threshold)
            write_json(out / "benchmark.json", {"results": results})
    gaps = {**{k: v for k, v in earlier_gaps.items() if k not in sets}, **student_vs_teacher(out, results, sets)}
    write_json(out / "benchmark.json", {"results": results, "student_minus_teacher": gaps})
    text = "\n".join([table(results), *([""] + gap_lines(gaps) if gaps else [])])
    (out / "benchmark.md").write_text(text + "\n")
    print(text)
    return results
