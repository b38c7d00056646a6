"""Assemble `report.md` from the evaluation's JSON outputs: agreement with the teacher, accuracy
against human labels (each scorer beside the trivial baselines, with VISTA's precision, recall
and F1 of hallucinated turns), and the measured speedup.

    fastvista eval report --agreement runs/eval/agreement.json \\
        --gold student=runs/eval/gold_student.json --gold teacher=runs/eval/gold_teacher.json \\
        --speed runs/speed/speed.json --usage teacher=runs/teacher/summary.json \\
        --usage student=runs/scored/summary.json --out runs/report.md
"""

from __future__ import annotations

import json
from pathlib import Path


def _ci(block: dict, key: str = "pearson") -> str:
    value, ci = block.get(key), block.get(f"{key}_ci95")
    if value is None:
        return "n/a"
    return f"{value:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{value:.3f}"


def agreement_section(a: dict) -> list[str]:
    claims = a["claims"]
    labels = claims["labels_on_aligned"]
    return [
        "## Agreement with the teacher",
        "",
        f"{a['turns']['usable']} turns matched ({a['turns']['only_teacher']} of the teacher's turns have no result from the scorer).",
        "",
        "| measure | value |",
        "|---|---|",
        f"| turn score, Pearson [95% CI] | {_ci(a['turn_score'])} |",
        f"| turn score, Spearman [95% CI] | {_ci(a['turn_score'], 'spearman')} |",
        f"| dialogue score, Pearson [95% CI] | {_ci(a['dialogue_score'])} |",
        f"| system score, Pearson ({len(a['system_score']['systems'])} systems) | {_ci(a['system_score'])} |",
        f"| hallucinated decision: agreement / Cohen's kappa | {a['hallucinated_decision']['agreement']} / {a['hallucinated_decision']['kappa']} |",
        f"| claims: recall / precision of alignment | {claims['recall']} / {claims['precision']} |",
        f"| aligned claims: label accuracy / macro-F1 | {labels['accuracy']} / {labels['macro_f1']} |",
        f"| claims per turn, Pearson | {_ci(claims['claim_count_correlation'])} |",
        "",
    ]


def _get(block: dict, key: str):
    """A figure of a block; "–" where it is undefined (no turns) or absent (a gold.json written
    before that figure was reported)."""
    value = block.get(key)
    return "–" if value is None else value


DECISION_HEADER = "accuracy | precision | recall | F1 (halluc. +) | macro-F1 | always halluc. acc / F1 | always faithful"


def decision_cells(a: dict) -> str:
    """A `metrics.accuracy` block as the cells under DECISION_HEADER, shared by report.md and the
    benchmark table so both show turn decisions the same way."""
    return " | ".join([*(str(_get(a, k)) for k in ("accuracy", "precision", "recall", "f1", "macro_f1")),
                       f"{_get(a, 'always_hallucinated')} / {_get(a, 'always_hallucinated_f1')}", str(_get(a, "always_faithful"))])


def gold_section(golds: dict[str, dict]) -> list[str]:
    sources = sorted({s for g in golds.values() for s in g["turn_accuracy_by_source"]})
    lines = ["## Accuracy against human labels (hallucinated or not, per turn)", "",
             "Precision, recall and F1 take hallucinated as the positive class (VISTA's evaluator); "
             "macro-F1 averages the F1 of both classes (of the one, where only one occurs).", "",
             f"| source | scorer | n | {DECISION_HEADER} |", "|" + "---|" * 10]
    for s in sources:
        lines += [f"| {s} | {name} | {g['turn_accuracy_by_source'][s]['n']} | {decision_cells(g['turn_accuracy_by_source'][s])} |"
                  for name, g in golds.items() if s in g["turn_accuracy_by_source"]]
    lines += [f"| **all** | {name} | {g['turn_accuracy']['n']} | {decision_cells(g['turn_accuracy'])} |" for name, g in golds.items()]
    claim_rows = [(n, g["claims"]) for n, g in golds.items() if "claims" in g]
    if claim_rows:
        lines += ["", "Claims against human claims (VISTA's re-annotation):", "",
                  "| scorer | recall | precision | label accuracy | macro-F1 |", "|---|---|---|---|---|"]
        lines += [f"| {n} | {c['recall']} | {c['precision']} | {c['labels_on_aligned']['accuracy']} | {c['labels_on_aligned']['macro_f1']} |" for n, c in claim_rows]
    return lines + [""]


def weights(speed: dict) -> str:
    """What the speed rows share: one engine on the same weights, or one engine kind, each on its own."""
    own = speed.get("settings", {}).get("teacher_model")
    return f"same engine kind, the teacher on its own weights ({own})" if own else "same engine, same weights"


def speed_section(s: dict) -> list[str]:
    from fastvista.evaluation.speed import table

    return [f"## Speed ({weights(s)}, same dialogues)", "", table(s), "",
            f"**Speedup: {s['speedup']}x** ({s['best_student']} over {s['strongest_teacher_name']}, turns/s).", ""]


def usage_section(summaries: dict[str, dict]) -> list[str]:
    """Counted work per turn of real runs (e.g. a large teacher behind an endpoint against the
    student): what a user pays in calls and tokens, whatever the hardware."""
    lines = ["## Work per turn, counted", "", "| run | turns | calls/turn | prompt tokens/turn | completion tokens/turn |", "|---|---|---|---|---|"]
    for name, s in summaries.items():
        lines.append(f"| {name} | {s['scored_turns']} | {s['calls_per_turn']} | {s['prompt_tokens_per_turn']} | {s['completion_tokens_per_turn']} |")
    return lines + [""]


def headline_section(agreement: dict | None, golds: dict[str, dict], speed: dict | None) -> list[str]:
    """The few figures a reader wants first."""
    rows = ["## Headline", "", "| measure | value |", "|---|---|"]
    if agreement:
        d = agreement["hallucinated_decision"]
        rows.append(f"| agreement with the teacher: hallucinated decision (n={d['n']}) / Cohen's kappa | {d['agreement']} / {d['kappa']} |")
        rows.append(f"| agreement with the teacher: turn score Pearson | {_ci(agreement['turn_score'])} |")
    for name, g in golds.items():
        a = g["turn_accuracy"]
        rows.append(f"| {name} against human labels (n={a['n']}): accuracy / F1 (hallucinated +) / macro-F1; always hallucinated: accuracy / F1 | "
                    f"{_get(a, 'accuracy')} / {_get(a, 'f1')} / {_get(a, 'macro_f1')}; {_get(a, 'always_hallucinated')} / {_get(a, 'always_hallucinated_f1')} |")
    if speed:
        turns = speed["configurations"][speed["best_student"]]["turns"]
        rows.append(f"| speedup: {speed['best_student']} over {speed['strongest_teacher_name']} ({weights(speed)}, {turns} turns) | **{speed['speedup']}x** |")
    return rows + [""]


def main(out: Path, agreement_file: Path | None = None, gold: list[str] = (), speed_file: Path | None = None,
         usage: list[str] = (), headline_only: bool = False) -> str:
    """The report (markdown) from the evaluation's JSON outputs; NAME=FILE pairs for gold and usage."""
    golds = {name: json.loads(Path(p).read_text()) for name, p in (g.split("=", 1) for g in gold)}
    agreement = json.loads(Path(agreement_file).read_text()) if agreement_file else None
    speed = json.loads(Path(speed_file).read_text()) if speed_file else None
    headline = headline_section(agreement, golds, speed)
    lines = ["# fastvista evaluation report", "", *headline]
    if agreement:
        lines += agreement_section(agreement)
    if golds:
        lines += gold_section(golds)
    if speed:
        lines += speed_section(speed)
    if usage:
        lines += usage_section({name: json.loads(Path(p).read_text()) for name, p in (u.split("=", 1) for u in usage)})
    text = "\n".join(lines)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print("\n".join(headline) + f"\nfull report: {out}" if headline_only else text)
    return text

