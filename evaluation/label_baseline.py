"""How learnable the teacher's labels are: a linear classifier that reads one claim (its words,
and how many of them the reference and the history hold) and predicts the label the teacher
gave it, trained on the student's training claims and scored on its validation claims.

    fastvista eval label-baseline runs/corpus_split/train.jsonl runs/corpus_split/validation.jsonl

A student that labels the same claims worse than this has not learned what its data teach (too
few steps, too little weight on the label), rather than facing labels too noisy to learn. The
classifier sees the teacher's claims, so it says nothing about decomposition.
"""

from __future__ import annotations

import re
from collections import Counter

from fastvista.contract import BEFORE_OPTIONS
from fastvista.single_pass import parse_output, split_sections

_WORD = re.compile(r"[a-z0-9]+")


def labelled_claims(examples: list[dict]) -> list[dict]:
    """One row per claim of each example's answer: its text and label, the turn's reference and history."""
    rows = []
    for e in examples:
        sections = split_sections(e["prompt"][-1]["content"])
        for claim in parse_output(e["completion"][-1]["content"], {**BEFORE_OPTIONS, **(e.get("format") or {})}["answer"]):
            rows.append({"text": claim.text, "label": claim.label.value,
                         "reference": sections.get("[REFERENCE]", ""), "history": sections.get("[HISTORY]", "")})
    return rows


def _overlap(text: str, other: str) -> float:
    words = set(_WORD.findall(text.lower()))
    return len(words & set(_WORD.findall(other.lower()))) / max(1, len(words))


def _numeric(rows: list[dict]):
    import numpy as np

    return np.array([[_overlap(r["text"], r["reference"]), _overlap(r["text"], r["history"]), len(r["text"].split()) / 20]
                     for r in rows])


def label_baseline(train: list[dict], validation: list[dict]) -> dict:
    """Fit on the training claims, report accuracy, macro-F1 and per-label F1 on the validation
    claims beside the majority label's accuracy."""
    from scipy.sparse import csr_matrix, hstack
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score

    fit, held = labelled_claims(train), labelled_claims(validation)
    if not fit or not held:
        raise ValueError("no labelled claims to fit or to score: give the student's train.jsonl and validation.jsonl")
    words = TfidfVectorizer(ngram_range=(1, 2), min_df=2)
    x_fit = hstack([words.fit_transform([r["text"] for r in fit]), csr_matrix(_numeric(fit))])
    x_held = hstack([words.transform([r["text"] for r in held]), csr_matrix(_numeric(held))])
    truth = [r["label"] for r in held]
    predicted = LogisticRegression(max_iter=2000, C=3.0).fit(x_fit, [r["label"] for r in fit]).predict(x_held)
    majority, count = Counter(r["label"] for r in fit).most_common(1)[0]
    labels = sorted(set(truth))
    return {
        "claims": {"train": len(fit), "validation": len(held)},
        "validation_labels": dict(Counter(truth)),
        "accuracy": round(accuracy_score(truth, predicted), 4),
        "macro_f1": round(f1_score(truth, predicted, labels=labels, average="macro", zero_division=0), 4),
        "f1": dict(zip(labels, (round(v, 4) for v in f1_score(truth, predicted, labels=labels, average=None, zero_division=0)))),
        "majority_label": majority,
        "majority_accuracy": round(sum(t == majority for t in truth) / len(truth), 4),
    }
