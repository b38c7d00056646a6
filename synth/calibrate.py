"""Fit the teacher's decision settings (`verify_threshold`, `class_bias`) on claims that humans
labelled, from the label distributions a `label_scores` run stored, without relabelling.

The fit maximises claim accuracy plus turn accuracy over a small grid. `cross_validate` fits on
all dialogues but one fold and decides the held-out fold, so the figures it reports were never
seen by the settings that produced them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import f1_score

from fastvista.labels import UNVERIFIABLE_CLASSES, Label
from fastvista.schema import ScoredDialogue
from fastvista.synth.pipeline import DECISION_ORDER, decide_many

ORDER = DECISION_ORDER  # label index used in the arrays below
_UNSAFE = [ORDER.index(Label.CONTRADICTED), ORDER.index(Label.LACKING_EVIDENCE)]
GRID = {
    "threshold": [round(float(x), 2) for x in np.arange(0.05, 0.96, 0.05)],
    Label.CONTRADICTED: [-8.0, -4.0, -2.0, -1.0, 0.0, 1.0],
    Label.LACKING_EVIDENCE: [-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0],
    Label.ABSTENTION: [-2.0, -1.0, 0.0, 1.0, 2.0],
}


@dataclass
class Claims:
    """Every gold-labelled claim of a run as arrays: P(VERIFIED) (NaN where not asked), log class
    probabilities, speaker flags, gold and predicted label index, turn index, and per turn the
    gold decision."""

    p_verified: np.ndarray
    log_classes: np.ndarray
    speaker: np.ndarray
    gold: np.ndarray
    predicted: np.ndarray
    turn: np.ndarray
    gold_hallucinated: np.ndarray
    dialogue_of_turn: list[str]

    def subset(self, turns: np.ndarray) -> "Claims":
        keep = np.isin(self.turn, turns)
        renumber = {t: k for k, t in enumerate(turns)}
        return Claims(self.p_verified[keep], self.log_classes[keep], self.speaker[keep], self.gold[keep], self.predicted[keep],
                      np.array([renumber[t] for t in self.turn[keep]], dtype=int), self.gold_hallucinated[turns],
                      [self.dialogue_of_turn[t] for t in turns])


def claims_of(scored: list[ScoredDialogue]) -> Claims:
    """Arrays from a gold-claims run (claims in the humans' order, one for one)."""
    pv, logq, speaker, gold, predicted, turn, gold_turn, owner = [], [], [], [], [], [], [], []
    for d in scored:
        for t in d.turns:
            g = d.dialogue.turns[t.index].gold
            if g is None or g.claims is None or g.label is None:
                continue
            if [c.text for c in t.claims] != [c.text for c in g.claims]:
                raise ValueError(f"{d.id} turn {t.index}: claims differ from the human claims (not a gold_claims run)")
            for c, h in zip(t.claims, g.claims):
                probs = c.probabilities or {c.label.value: 1.0}
                pv.append(probs.get("VERIFIED", np.nan))
                logq.append([np.log(probs.get(l.value, 0.0) + 1e-9) for l in UNVERIFIABLE_CLASSES])
                speaker.append(bool(c.about_speaker))
                gold.append(ORDER.index(h.label))
                predicted.append(ORDER.index(c.label))
                turn.append(len(gold_turn))
            gold_turn.append(g.label == "hallucinated")
            owner.append(d.id)
    return Claims(np.array(pv, dtype=float), np.array(logq, dtype=float).reshape(-1, 4), np.array(speaker, dtype=bool),
                  np.array(gold, dtype=int), np.array(predicted, dtype=int), np.array(turn, dtype=int), np.array(gold_turn, dtype=bool), owner)


def decide_all(c: Claims, threshold: float, bias: dict[Label, float]) -> np.ndarray:
    """The teacher's decision (`synth.pipeline.decide_many`) for every claim: indices into ORDER."""
    return decide_many(c.p_verified, c.log_classes, c.speaker, threshold, bias)


def turn_decisions(c: Claims, labels: np.ndarray) -> np.ndarray:
    hallucinated = np.zeros(len(c.gold_hallucinated), dtype=bool)
    np.logical_or.at(hallucinated, c.turn, np.isin(labels, _UNSAFE))
    return hallucinated


def figures(c: Claims, labels: np.ndarray) -> dict:
    present = sorted(set(c.gold) | set(labels))
    return {
        "claims": int(len(labels)),
        "turns": int(len(c.gold_hallucinated)),
        "claim_accuracy": round(float((labels == c.gold).mean()), 4),
        "macro_f1": round(float(f1_score(c.gold, labels, labels=present, average="macro", zero_division=0)), 4),
        "turn_accuracy": round(float((turn_decisions(c, labels) == c.gold_hallucinated).mean()), 4),
        "predicted_counts": {ORDER[i].value: int((labels == i).sum()) for i in range(len(ORDER))},
    }


def fit(c: Claims) -> tuple[float, dict[Label, float]]:
    """The grid point with the best claim accuracy + turn accuracy (ties: the first, i.e. the
    smallest biases and threshold)."""
    best, best_value = None, -1.0
    classes = [l for l in GRID if l != "threshold"]
    for values in itertools.product(*(GRID[l] for l in classes)):
        bias = dict(zip(classes, values))
        for threshold in GRID["threshold"]:
            labels = decide_all(c, threshold, bias)
            value = (labels == c.gold).mean() + (turn_decisions(c, labels) == c.gold_hallucinated).mean()
            if value > best_value + 1e-12:
                best, best_value = (threshold, bias), value
    return best


def cross_validate(c: Claims, folds: int = 5, seed: int = 0) -> tuple[dict, list[dict]]:
    """Out-of-fold figures: dialogues are split into folds; each fold is decided with settings
    fitted on the others. Returns the figures and the settings of each fold."""
    dialogues = sorted(set(c.dialogue_of_turn))
    rng = np.random.default_rng(seed)
    fold_of = {d: k % folds for k, d in enumerate(rng.permutation(dialogues))}
    labels = np.empty(len(c.gold), dtype=int)
    settings = []
    for k in range(folds):
        held = np.array([t for t, d in enumerate(c.dialogue_of_turn) if fold_of[d] == k], dtype=int)
        train = np.array([t for t, d in enumerate(c.dialogue_of_turn) if fold_of[d] != k], dtype=int)
        threshold, bias = fit(c.subset(train))
        settings.append({"threshold": threshold, "class_bias": {l.value: b for l, b in bias.items()}})
        labels[np.isin(c.turn, held)] = decide_all(c.subset(held), threshold, bias)
    return figures(c, labels), settings
