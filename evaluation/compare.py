"""Compare scorers: a scorer against the teacher (agreement) and against human labels (accuracy).

Turns are matched by (dialogue id, turn index). Turns missing from one side (a dialogue one
scorer could not score is in its failed.jsonl) are counted, not dropped silently.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from itertools import combinations

import numpy as np

from fastvista.schema import ScoredDialogue, TurnResult
from fastvista.scoring import is_unattributed, system_scores
from fastvista.evaluation.metrics import (accuracy, align, correlation, decision_agreement, label_report, paired_accuracy_gap,
                                         separation, token_f1_matrix)

Similarity = Callable[[Sequence[str], Sequence[str]], np.ndarray]


def _turns(scored: list[ScoredDialogue]) -> dict[tuple[str, int], TurnResult]:
    return {(d.id, t.index): t for d in scored for t in d.turns}


def claim_agreement(pairs: list[tuple[list, list]], similarity: Similarity, threshold: float) -> dict:
    """Align predicted claims to reference claims turn by turn; recall, precision, label report."""
    aligned_pred, aligned_ref = [], []
    n_pred = n_ref = 0
    for predicted, reference in pairs:
        n_pred, n_ref = n_pred + len(predicted), n_ref + len(reference)
        if not predicted or not reference:
            continue
        matrix = similarity([c.text for c in predicted], [c.text for c in reference])
        for i, j in align(predicted, reference, matrix, threshold):
            aligned_pred.append(predicted[i].label.value)
            aligned_ref.append(reference[j].label.value)
    counts = ([len(p) for p, _ in pairs], [len(r) for _, r in pairs])
    return {
        "claims_predicted": n_pred,
        "claims_reference": n_ref,
        "aligned": len(aligned_ref),
        "recall": round(len(aligned_ref) / n_ref, 4) if n_ref else None,
        "precision": round(len(aligned_pred) / n_pred, 4) if n_pred else None,
        "labels_on_aligned": label_report(aligned_pred, aligned_ref),
        "claim_count_correlation": correlation(*counts, n_boot=200),
        "threshold": threshold,
    }


def claim_sources(mine: dict, theirs: dict, keys: list, similarity: Similarity, threshold: float) -> dict:
    """Where a scorer's claims come from: its own turn's teacher claims (aligned one to one, as
    recall counts them); its own turn again (not aligned, yet reaching `threshold` against one of
    them: a repeat or a split); another turn of the same dialogue (reaching `threshold` against a
    teacher claim of another turn, and closer to it than to any of its own turn's: a claim written
    for the wrong turn, the way a dialogue-level pass that does not keep its turns apart fails);
    or neither. One similarity matrix a dialogue."""
    teacher_turns, scorer_turns = defaultdict(list), defaultdict(list)
    for d, i in theirs:
        teacher_turns[d].append(i)
    for d, i in keys:
        scorer_turns[d].append(i)
    counts = dict.fromkeys(("own_turn", "own_turn_again", "another_turn", "neither"), 0)
    for d, indices in scorer_turns.items():
        predicted = [(i, c.text) for i in indices for c in mine[d, i].claims]
        reference = [(j, c.text) for j in teacher_turns[d] for c in theirs[d, j].claims]
        if not predicted:
            continue
        matrix = similarity([t for _, t in predicted], [t for _, t in reference]) if reference else np.zeros((len(predicted), 0))
        pred_turn, ref_turn = np.array([i for i, _ in predicted]), np.array([j for j, _ in reference], dtype=int)
        for i in indices:
            rows, own, other = np.flatnonzero(pred_turn == i), np.flatnonzero(ref_turn == i), np.flatnonzero(ref_turn != i)
            mine_own = matrix[np.ix_(rows, own)]
            aligned = {rows[k] for k, _ in align(rows, own, mine_own, threshold)}
            for k, row in enumerate(rows):
                own_best = mine_own[k].max(initial=0.0)
                other_best = matrix[row, other].max(initial=0.0)
                bucket = ("own_turn" if row in aligned else "another_turn" if other_best >= threshold and other_best > own_best
                          else "own_turn_again" if own_best >= threshold else "neither")
                counts[bucket] += 1
    total = sum(counts.values())
    return {**counts, "another_turn_share": round(counts["another_turn"] / total, 4) if total else None, "threshold": threshold}


def agreement(scorer: list[ScoredDialogue], teacher: list[ScoredDialogue], similarity: Similarity = token_f1_matrix, threshold: float = 0.5) -> dict:
    """How closely `scorer` agrees with the teacher on the same dialogues."""
    mine, theirs = _turns(scorer), _turns(teacher)
    both = sorted(set(mine) & set(theirs))
    usable = both
    dialogues = {d.id: d for d in scorer}
    teacher_dialogues = {d.id: d for d in teacher}
    shared = sorted(set(dialogues) & set(teacher_dialogues))
    scored_both = [i for i in shared if dialogues[i].score is not None and teacher_dialogues[i].score is not None]

    def systems(side: dict) -> dict:
        return system_scores((side[i].system, [[c.label for c in t.claims] for t in side[i].turns]) for i in shared)

    sys_a, sys_b = systems(dialogues), systems(teacher_dialogues)
    names = sorted(sys_a, key=str)
    return {
        "turns": {"matched": len(both), "usable": len(usable), "only_scorer": len(set(mine) - set(theirs)),
                  "only_teacher": len(set(theirs) - set(mine))},
        "turn_score": correlation([mine[k].score for k in usable], [theirs[k].score for k in usable]),
        "dialogue_score": correlation([dialogues[i].score for i in scored_both], [teacher_dialogues[i].score for i in scored_both]),
        "system_score": {"systems": {str(s): [round(sys_a[s], 4), round(sys_b[s], 4)] for s in names},
                         **correlation([sys_a[s] for s in names], [sys_b[s] for s in names], n_boot=200)},
        "hallucinated_decision": decision_agreement([mine[k].hallucinated for k in usable], [theirs[k].hallucinated for k in usable]),
        "claims": claim_agreement([(mine[k].claims, theirs[k].claims) for k in usable], similarity, threshold),
        "claim_sources": claim_sources(mine, theirs, usable, similarity, threshold),
    }


READINGS = ("vista", "attribution")


def decision(turn: TurnResult, reading: str) -> bool:
    """A turn's "hallucinated" decision: VISTA's (the scorer's own), or the attribution reading of
    its claim labels (`is_unattributed`) for benchmarks that label attribution, such as BEGIN."""
    if reading == "vista":
        return turn.hallucinated
    if reading == "attribution":
        return is_unattributed([c.label for c in turn.claims])
    raise ValueError(f"unknown reading {reading!r}: one of {', '.join(READINGS)}")


def against_gold(scored: list[ScoredDialogue], similarity: Similarity = token_f1_matrix, threshold: float = 0.5, reading: str = "vista",
                 failed: list[dict] | None = None) -> dict:
    """Accuracy of a scorer's turn decisions (and, where humans wrote claims, its claim labels).
    `reading` says how claim labels become the turn decision (see `decision`). Dialogues whose
    scoring failed (`failed`, from failed.jsonl) have no decisions: they are counted beside."""
    by_source: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    scores: list[tuple[float, bool]] = []
    claim_pairs, unlabelled = [], 0
    for d in scored:
        for t in d.turns:
            if human_label(d, t) is None:
                unlabelled += 1
                continue
            gold = d.dialogue.turns[t.index].gold
            by_source[d.source].append((decision(t, reading), gold.label == "hallucinated"))
            scores.append((t.score, gold.label == "hallucinated"))
            if gold.claims is not None:
                claim_pairs.append((t.claims, gold.claims))
    every = [p for pairs in by_source.values() for p in pairs]
    result = {
        "turns": {"labelled": len(every), "unlabelled": unlabelled, "failed_dialogues": len(failed or [])},
        "reading": reading,
        "turn_accuracy": accuracy([p for p, _ in every], [g for _, g in every]),
        "turn_accuracy_by_source": {s: accuracy([p for p, _ in v], [g for _, g in v]) for s, v in sorted(by_source.items())},
        "score_separation": separation([s for s, _ in scores], [g for _, g in scores]),
    }
    if claim_pairs:
        result["claims"] = claim_agreement(claim_pairs, similarity, threshold)
    return result



def human_label(d: ScoredDialogue, t: TurnResult) -> str | None:
    """The human label of a scored turn ("faithful", "hallucinated" or None), from the dialogue
    its results file carries; a turn index outside that dialogue is an error, not a guess."""
    if not 0 <= t.index < len(d.dialogue.turns):
        raise ValueError(f"dialogue {d.id}: a result for turn {t.index}, which its dialogue ({len(d.dialogue.turns)} turns) does not have")
    gold = d.dialogue.turns[t.index].gold
    return gold.label if gold is not None else None


def turns_right(scored: list[ScoredDialogue], reading: str = "vista") -> dict[tuple[str, int], bool]:
    """Each human-labelled turn of `scored`, by (dialogue id, turn index): is the scorer's decision
    the human's?"""
    return {(d.id, t.index): decision(t, reading) == (label == "hallucinated")
            for d in scored for t in d.turns if (label := human_label(d, t)) is not None}


def label_shares_by_gold(scored: list[ScoredDialogue], keys: set) -> dict:
    """Where a scorer puts each label on the turns `keys`: how many claims it wrote on the turns
    humans call faithful and on those they call hallucinated, and each label's share of them. A
    scorer can say a label as often as another and still on the wrong turns: its counts do not
    show that, these shares do."""
    counts = {"faithful": Counter(), "hallucinated": Counter()}
    for d in scored:
        for t in d.turns:
            if (d.id, t.index) in keys:
                counts[human_label(d, t)].update(c.label.value for c in t.claims)
    return {side: {"claims": sum(c.values()), "counts": dict(sorted(c.items())),
                   "shares": {label: round(n / sum(c.values()), 4) for label, n in sorted(c.items())}}
            for side, c in counts.items()}


def paired_gold(scorers: dict[str, list[ScoredDialogue]], reading: str = "vista", failed: dict[str, int] | None = None) -> dict:
    """Scorers against the same human labels on the turns that every one of them scored: each one's
    accuracy there, each pair's gap (the first named minus the second) with a bootstrap 95% interval
    that resamples those turns with both decisions kept together (turns both get right, or both wrong,
    add no difference), and each one's label shares by human label.
    The files must hold the same dialogues: a turn whose text or human label differs between them,
    or a dialogue given twice in one file, is an error. Turns some scorer lacks (its dialogue failed,
    another sample), unlabelled turns and failed dialogues (`failed`, counts from failed.jsonl) are
    counted, not compared."""
    if len(scorers) < 2:
        raise ValueError(f"paired comparison: {len(scorers)} scorer given; at least two are needed")
    seen = {}
    for name, scored in scorers.items():
        ids = Counter(d.id for d in scored)
        if twice := [i for i, n in ids.items() if n > 1]:
            raise ValueError(f"paired comparison: {name} holds dialogue {twice[0]} {ids[twice[0]]} times ({len(twice)} dialogues "
                             "given more than once): one result per dialogue")
        for d in scored:
            for t in d.turns:
                if (label := human_label(d, t)) is None:
                    continue
                turn = (d.dialogue.turns[t.index].text, label)
                first, theirs = seen.setdefault((d.id, t.index), (name, turn))
                if theirs != turn:
                    what = f"human label {theirs[1]} against {label}" if theirs[1] != label else "its text"
                    raise ValueError(f"paired comparison: dialogue {d.id} turn {t.index} differs between {first} and {name} "
                                     f"({what}): the files hold different data")
    right = {name: turns_right(scored, reading) for name, scored in scorers.items()}
    if empty := [name for name, r in right.items() if not r]:
        raise ValueError(f"paired comparison: {', '.join(empty)} scored no human-labelled turn")
    keys = sorted(set.intersection(*(set(r) for r in right.values())))
    if not keys:
        raise ValueError("paired comparison: no human-labelled turn was scored by every scorer")
    return {
        "turns": {"compared": len(keys),
                  "left_out": {name: len(r) - len(keys) for name, r in right.items()},
                  "unlabelled": {name: sum(len(d.turns) for d in scored) - len(right[name]) for name, scored in scorers.items()},
                  "failed_dialogues": {name: (failed or {}).get(name, 0) for name in scorers}},
        "reading": reading,
        "accuracy": {name: round(sum(r[k] for k in keys) / len(keys), 4) for name, r in right.items()},
        "paired_gaps": {f"{a} - {b}": paired_accuracy_gap([right[a][k] for k in keys], [right[b][k] for k in keys])
                        for a, b in combinations(scorers, 2)},
        "label_shares": {name: label_shares_by_gold(scored, set(keys)) for name, scored in scorers.items()},
    }


def paired_table(report: dict) -> str:
    """`paired_gold`'s report as Markdown: what was compared and left out, accuracies, each label's
    share of the claims on faithful / hallucinated turns (- where a side has no claim), and gaps."""
    turns, shares = report["turns"], report["label_shares"]
    labels = sorted({label for by_side in shares.values() for side in by_side.values() for label in side["shares"]})

    def share(side: dict, label: str) -> str:
        return f"{side['counts'].get(label, 0) / side['claims']:.1%}" if side["claims"] else "-"

    lines = [f"{turns['compared']} human-labelled turns scored by every scorer ({report['reading']} reading); left out: "
             + "; ".join(f"{name} {turns['left_out'][name]} turns, {turns['unlabelled'][name]} unlabelled, "
                         f"{turns['failed_dialogues'][name]} failed dialogues" for name in report["accuracy"]), "",
             "| scorer | accuracy | claims faithful / halluc. |" + "".join(f" {label} faithful / halluc. |" for label in labels),
             "|---|---|---|" + "---|" * len(labels)]
    for name, acc in report["accuracy"].items():
        by_side = shares[name]
        cells = "".join(f" {share(by_side['faithful'], label)} / {share(by_side['hallucinated'], label)} |" for label in labels)
        lines.append(f"| {name} | {acc:.3f} | {by_side['faithful']['claims']} / {by_side['hallucinated']['claims']} |{cells}")
    lines += ["", "| pair (first minus second) | accuracy gap [95% CI, paired] | turns |", "|---|---|---|"]
    for pair, gap in report["paired_gaps"].items():
        lines.append(f"| {pair} | {gap['gap']:+.3f} [{gap['ci95'][0]:+.3f}, {gap['ci95'][1]:+.3f}] | {gap['n']} |")
    return "\n".join(lines)
