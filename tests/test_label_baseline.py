"""The label baseline learns what a claim's words and its overlap with the reference say about
the teacher's label, and is scored on claims it never saw."""

import random

import pytest

from fastvista.evaluation.label_baseline import label_baseline, labelled_claims
from fastvista.labels import Label
from fastvista.schema import Claim
from fastvista.single_pass import render_messages, render_target, render_user_message

REFERENCE = "The river Avon flows through Bath. The bridge was built in 1774."


def example(i, claims):
    user = render_user_message([], REFERENCE, [("user", "Tell me about Bath.")], " ".join(t for t, _ in claims))
    return {"dialogue_id": f"d{i}", "prompt": render_messages(user),
            "completion": [{"role": "assistant", "content": render_target([Claim(text=t, label=l) for t, l in claims])}]}


def planted(n, seed):
    """Opinions are OUT_OF_SCOPE, facts the reference holds VERIFIED, other facts LACKING_EVIDENCE."""
    rng = random.Random(seed)
    kinds = [(lambda w: f"I really love {w} walks.", Label.OUT_OF_SCOPE), (lambda w: "The river Avon flows through Bath.", Label.VERIFIED),
             (lambda w: f"The {w} tower was built in 1902.", Label.LACKING_EVIDENCE)]
    words = ["long", "quiet", "city", "old", "green", "stone"]
    return [example(i, [(make(rng.choice(words)), label) for make, label in rng.sample(kinds, 2)]) for i in range(n)]


def test_a_planted_rule_is_learned_and_scored_on_unseen_claims():
    report = label_baseline(planted(60, seed=0), planted(20, seed=1))
    assert report["claims"] == {"train": 120, "validation": 40}
    assert report["accuracy"] == 1.0 and report["majority_accuracy"] < 0.5
    assert set(report["f1"]) == {"OUT_OF_SCOPE", "VERIFIED", "LACKING_EVIDENCE"}


def test_claims_are_read_with_their_reference_and_a_set_without_claims_is_refused():
    [row, _] = labelled_claims(planted(1, seed=2))
    assert row["reference"] == REFERENCE and "Tell me about Bath." in row["history"]
    empty = [example(0, [])]  # NONE: a turn without claims
    with pytest.raises(ValueError, match="no labelled claims"):
        label_baseline(empty, planted(5, seed=3))
