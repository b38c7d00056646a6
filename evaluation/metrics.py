"""Small pure metric functions. Unknown or missing labels stay explicit: they are counted and
reported, never silently dropped."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from fastvista.labels import Label

LABELS = [l.value for l in Label]


def correlation(x: Sequence[float], y: Sequence[float], n_boot: int = 1000, seed: int = 0) -> dict:
    """Pearson and Spearman with bootstrap 95% intervals (resampling pairs)."""
    from scipy.stats import pearsonr, spearmanr

    x, y = np.asarray(x, float), np.asarray(y, float)
    result = {"n": int(len(x))}
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {**result, "pearson": None, "spearman": None, "note": "fewer than 3 pairs or a constant series"}
    rng = np.random.default_rng(seed)
    for name, fn in (("pearson", lambda a, b: pearsonr(a, b)[0]), ("spearman", lambda a, b: spearmanr(a, b)[0])):
        boots = []
        for _ in range(n_boot):
            idx = rng.integers(0, len(x), len(x))
            if np.ptp(x[idx]) > 0 and np.ptp(y[idx]) > 0:
                boots.append(fn(x[idx], y[idx]))
        result[name] = round(float(fn(x, y)), 4)
        result[f"{name}_ci95"] = [round(float(v), 4) for v in np.percentile(boots, [2.5, 97.5])] if boots else None
    return result


def decision_agreement(a: Sequence[bool], b: Sequence[bool]) -> dict:
    """Agreement and Cohen's kappa of two binary decisions (hallucinated or not)."""
    from sklearn.metrics import cohen_kappa_score

    a, b = list(map(bool, a)), list(map(bool, b))
    if not a:
        return {"n": 0, "agreement": None, "kappa": None}
    kappa = cohen_kappa_score(a, b) if len(set(a) | set(b)) > 1 else 1.0
    return {"n": len(a), "agreement": round(sum(x == y for x, y in zip(a, b)) / len(a), 4), "kappa": round(float(kappa), 4)}


def paired_accuracy_gap(a_right: Sequence[bool], b_right: Sequence[bool], n_boot: int = 2000, seed: int = 0) -> dict:
    """A's accuracy minus B's on the same items (each item right or wrong for both), with a
    bootstrap 95% interval resampling items, so the pairing narrows it."""
    a, b = np.asarray(a_right, float), np.asarray(b_right, float)
    if len(a) != len(b):
        raise ValueError(f"paired accuracy: {len(a)} items against {len(b)}")
    if not len(a):
        return {"n": 0, "gap": None, "ci95": None}
    diff = a - b
    rng = np.random.default_rng(seed)
    boots = [diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(n_boot)]
    return {"n": int(len(a)), "gap": round(float(diff.mean()), 4), "ci95": [round(float(v), 4) for v in np.percentile(boots, [2.5, 97.5])]}


def accuracy(predicted: Sequence[bool], gold: Sequence[bool]) -> dict:
    """Turn decisions (True: hallucinated) against human labels: accuracy, and precision, recall
    and F1 with hallucinated as the positive class, as VISTA's released evaluator reports them, so
    figures can be set beside the paper's; macro-F1 over the classes present in gold or
    predictions (sklearn's default, as `label_report`); and the trivial baselines beside them:
    always hallucinated (accuracy = the positive share; F1 with precision = that share, recall 1)
    and always faithful. Where a ratio has a zero denominator (no hallucinated turn predicted, or
    none in gold) it counts 0, sklearn's zero_division=0; with no turns every figure is None."""
    from sklearn.metrics import f1_score, precision_recall_fscore_support

    n = len(gold)
    keys = ("accuracy", "precision", "recall", "f1", "macro_f1", "always_hallucinated", "always_hallucinated_f1", "always_faithful")
    if n == 0:
        return {"n": 0, **dict.fromkeys(keys)}
    predicted, gold = list(map(bool, predicted)), list(map(bool, gold))
    precision, recall, f1, _ = precision_recall_fscore_support(gold, predicted, average="binary", pos_label=True, zero_division=0)
    positives = sum(gold)
    figures = {
        "accuracy": sum(p == g for p, g in zip(predicted, gold)) / n,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "macro_f1": f1_score(gold, predicted, average="macro", zero_division=0),
        "always_hallucinated": positives / n,
        "always_hallucinated_f1": f1_score(gold, [True] * n, average="binary", pos_label=True, zero_division=0),
        "always_faithful": 1 - positives / n,
    }
    return {"n": n, **{k: round(float(figures[k]), 4) for k in keys}}


def separation(scores: Sequence[float], hallucinated: Sequence[bool]) -> dict:
    """How well a turn score separates faithful from hallucinated turns: the mean score of each
    and the ROC AUC of a low score as the sign of a hallucination (0.5: no separation)."""
    from sklearn.metrics import roc_auc_score

    faithful = [s for s, h in zip(scores, hallucinated) if not h]
    bad = [s for s, h in zip(scores, hallucinated) if h]
    result = {"mean_faithful": round(float(np.mean(faithful)), 4) if faithful else None,
              "mean_hallucinated": round(float(np.mean(bad)), 4) if bad else None, "roc_auc": None}
    if faithful and bad:
        result["roc_auc"] = round(float(roc_auc_score(list(hallucinated), [-s for s in scores])), 4)
    return result


def label_report(predicted: Sequence[str], gold: Sequence[str]) -> dict:
    """Accuracy, macro-F1 over the five labels, per-label F1 and the confusion matrix (rows gold)."""
    from sklearn.metrics import confusion_matrix, f1_score

    if not gold:
        return {"n": 0, "accuracy": None, "macro_f1": None}
    present = [l for l in LABELS if l in set(gold) | set(predicted)]
    per_label = f1_score(gold, predicted, labels=present, average=None, zero_division=0)
    return {
        "n": len(gold),
        "accuracy": round(sum(p == g for p, g in zip(predicted, gold)) / len(gold), 4),
        "macro_f1": round(float(np.mean(per_label)), 4),
        "f1": {l: round(float(f), 4) for l, f in zip(present, per_label)},
        "labels": LABELS,
        "confusion": confusion_matrix(gold, predicted, labels=LABELS).tolist(),
        "gold_counts": dict(Counter(gold)),
        "predicted_counts": dict(Counter(predicted)),
    }


_WORD = re.compile(r"\w+")


def tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def token_f1(a: str, b: str) -> float:
    """Token F1 between two claims (their word tokens, case aside): how claims are aligned."""
    ta, tb = tokens(a), tokens(b)
    common = sum((Counter(ta) & Counter(tb)).values())
    if not ta or not tb or common == 0:
        return 0.0
    precision, recall = common / len(ta), common / len(tb)
    return 2 * precision * recall / (precision + recall)


def align(predicted: Sequence[str], reference: Sequence[str], similarity: np.ndarray, threshold: float) -> list[tuple[int, int]]:
    """One-to-one alignment of claims maximising total similarity (Hungarian), keeping pairs whose
    similarity reaches `threshold`. `similarity[i, j]` compares predicted i with reference j."""
    from scipy.optimize import linear_sum_assignment

    if not len(predicted) or not len(reference):
        return []
    rows, cols = linear_sum_assignment(-similarity)
    return [(int(i), int(j)) for i, j in zip(rows, cols) if similarity[i, j] >= threshold]


def token_f1_matrix(predicted: Sequence[str], reference: Sequence[str]) -> np.ndarray:
    return np.array([[token_f1(p, r) for r in reference] for p in predicted]).reshape(len(predicted), len(reference))
