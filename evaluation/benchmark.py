"""Scorers side by side on human-labelled dialogues, one engine for all of them:

    fastvista eval benchmark -c configs/eval/baselines_vllm_cpu.yaml \\
        --scorer q2 --scorer factscore --scorer judge \\
        --data q2=runs/eval_inputs/q2.jsonl@120 --data begin=runs/eval_inputs/begin_dev.jsonl@240 \\
        --out runs/baselines

`NAME=FILE@N` scores a seeded random sample of N dialogues of a JSONL file (all without @N).
Per scorer and data set: turn accuracy (all and per source), precision, recall and F1 with
hallucinated as positive and macro-F1, beside always-hallucinated (accuracy and F1), how well
the turn score separates faithful from hallucinated turns (mean scores, ROC AUC), calls, tokens
and seconds per turn. Q2's run also gives the `Q2 w/o NLI` row (kept in each turn's details).
Results go to OUT/SCORER/NAME/results.jsonl (resumable); benchmark.json and benchmark.md.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from fastvista.evaluation.compare import against_gold
from fastvista.evaluation.metrics import accuracy, separation
from fastvista.evaluation.report import DECISION_HEADER, decision_cells
from fastvista.evaluation.scorers import SCORERS, EvalConfig, backend_factory, machine_for
from fastvista.config import DataSelection, load_config, load_dialogues
from fastvista.records_io import read_scored
from fastvista.scheduler import run


def figures(scored, wall: float | None) -> dict:
    turns = [t for d in scored for t in d.turns]
    gold = against_gold(scored)
    return {
        "turns": len(turns),
        "turn_accuracy": gold["turn_accuracy"],
        "by_source": {s: v["accuracy"] for s, v in gold["turn_accuracy_by_source"].items()},
        "always_hallucinated_by_source": {s: v["always_hallucinated"] for s, v in gold["turn_accuracy_by_source"].items()},
        "separation": gold["score_separation"],
        "calls_per_turn": round(statistics.mean(t.usage.calls for t in turns), 2),
        "prompt_tokens_per_turn": round(statistics.mean(t.usage.prompt_tokens for t in turns), 1),
        "completion_tokens_per_turn": round(statistics.mean(t.usage.completion_tokens for t in turns), 1),
        "seconds_per_turn": round(wall / len(turns), 3) if wall else None,
        "errors": sum(len(t.errors) for t in turns),
    }


def without_nli(scored, threshold: float) -> dict:
    """Q2 w/o NLI from the same run: token-F1 scores kept in each turn's details."""
    pairs = [(t.details["q2_no_nli"], d.dialogue.turns[t.index].gold.label == "hallucinated")
             for d in scored for t in d.turns if t.details and d.dialogue.turns[t.index].gold]
    return {"turn_accuracy": accuracy([s < threshold for s, _ in pairs], [g for _, g in pairs]),
            "separation": separation([s for s, _ in pairs], [g for _, g in pairs])}


def table(results: dict) -> str:
    lines = [f"| data | scorer | n | {DECISION_HEADER} | score AUC | mean score faithful / halluc. | calls/turn | tokens/turn | s/turn |",
             "|" + "---|" * 15]
    for data, by_scorer in results.items():
        for name, r in by_scorer.items():
            acc, sep = r["turn_accuracy"], r["separation"]
            tokens = round(r["prompt_tokens_per_turn"] + r["completion_tokens_per_turn"], 1) if "calls_per_turn" in r else "-"
            lines.append(f"| {data} | {name} | {acc['n']} | {decision_cells(acc)} | {sep['roc_auc']} | "
                         f"{sep['mean_faithful']} / {sep['mean_hallucinated']} | {r.get('calls_per_turn', '-')} | {tokens} | {r.get('seconds_per_turn') or '-'} |")
    return "\n".join(lines)


def parse_data(item: str) -> tuple[str, str, int | None]:
    name, _, rest = item.partition("=")
    path, _, n = rest.partition("@")
    return name, path, int(n) if n else None


def main(config_path: str, scorers: list[str], data: list[str], out: Path, overrides: list[str] | None = None) -> dict:
    """Every scorer on every data set (NAME=FILE.jsonl[@N]), one engine; a table of their figures."""
    unknown = sorted(set(scorers) - set(SCORERS))
    if unknown:
        raise ValueError(f"unknown scorer {unknown[0]!r}: one of {', '.join(SCORERS)}")
    tree = load_config(config_path, overrides or [])
    tree.pop("data", None)
    backend = None

    def shared_backend():
        nonlocal backend
        backend = backend or backend_factory(config)()
        return backend

    results: dict = {}
    for item in data:
        name, path, n = parse_data(item)
        dialogues = load_dialogues(DataSelection(input=path, sample=n), None)
        for scorer in scorers:
            config = EvalConfig.model_validate({**tree, "scorer": scorer})
            results_file = out / scorer / name / "results.jsonl"
            provenance = {"scorer": scorer, "model": config.backend.model if config.backend else None, "settings": config.settings()}
            start = time.perf_counter()
            stats = run(dialogues, machine_for(config), shared_backend, results_file, max_active=config.max_active,
                        total=len(dialogues), provenance=provenance, desc=f"{scorer} on {name}")
            wall = time.perf_counter() - start if stats.labelled == len(dialogues) and stats.cached_calls == 0 else None
            scored = read_scored(results_file, {d.id for d in dialogues})
            results.setdefault(name, {})[scorer] = figures(scored, wall)
            if scorer == "q2":
                results[name]["q2 w/o NLI"] = without_nli(scored, config.q2.threshold)
            out.mkdir(parents=True, exist_ok=True)
            (out / "benchmark.json").write_text(json.dumps({"config": config_path, "results": results}, indent=2))
    text = table(results)
    (out / "benchmark.md").write_text(text + "\n")
    print(text)
    return results

