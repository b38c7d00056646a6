import numpy as np
import pytest

from fastvista.labels import UNVERIFIABLE_CLASSES, Label
from fastvista.synth import calibrate
from fastvista.synth.pipeline import TeacherConfig, decide


def synthetic(n_turns: int = 40, seed: int = 0) -> calibrate.Claims:
    """Three claims a turn; gold VERIFIED exactly when P(VERIFIED) > 0.7, else the class the model
    ranks first."""
    rng = np.random.default_rng(seed)
    n = 3 * n_turns
    pv = rng.uniform(0, 1, n)
    probs = rng.dirichlet(np.ones(4), n)
    gold = np.where(pv > 0.7, 0, 1 + probs.argmax(axis=1))
    turn = np.repeat(np.arange(n_turns), 3)
    unsafe = np.isin(gold, calibrate._UNSAFE)
    gold_turn = np.zeros(n_turns, dtype=bool)
    np.logical_or.at(gold_turn, turn, unsafe)
    return calibrate.Claims(pv, np.log(probs), np.zeros(n, dtype=bool), gold, gold.copy(), turn, gold_turn,
                            [f"d{t // 2}" for t in range(n_turns)])


def test_array_decisions_equal_the_pipelines_decision():
    c = synthetic()
    c.speaker[::5] = True
    bias = {Label.CONTRADICTED: -1.0, Label.ABSTENTION: 0.5}
    cfg = TeacherConfig(verify_threshold=0.35, class_bias=bias)
    labels = calibrate.decide_all(c, 0.35, bias)
    for k in range(len(c.gold)):
        classes = {l: float(np.exp(c.log_classes[k, j])) for j, l in enumerate(UNVERIFIABLE_CLASSES)}
        assert calibrate.ORDER[labels[k]] is decide(c.p_verified[k], classes, bool(c.speaker[k]), cfg)


def test_fit_recovers_the_threshold_that_separates_verified_claims():
    c = synthetic()
    threshold, _ = calibrate.fit(c)
    assert 0.65 <= threshold <= 0.75
    fitted = calibrate.figures(c, calibrate.decide_all(c, threshold, {}))
    plain = calibrate.figures(c, calibrate.decide_all(c, 0.5, {}))
    assert fitted["claim_accuracy"] > plain["claim_accuracy"]


def test_cross_validation_decides_each_fold_with_settings_from_the_others():
    c = synthetic(60)
    figures, settings = calibrate.cross_validate(c, folds=3)
    assert len(settings) == 3 and figures["claims"] == len(c.gold) and figures["turns"] == 60
    assert all(0.6 <= s["threshold"] <= 0.8 for s in settings)
    # a model without signal cannot be made to look good out of fold
    noise = synthetic(60, seed=1)
    noise.p_verified = np.random.default_rng(2).uniform(0, 1, len(noise.gold))
    noise.log_classes = np.log(np.random.default_rng(3).dirichlet(np.ones(4), len(noise.gold)))
    out_of_fold, _ = calibrate.cross_validate(noise, folds=3)
    in_sample = calibrate.figures(noise, calibrate.decide_all(noise, *calibrate.fit(noise)))
    assert out_of_fold["claim_accuracy"] < in_sample["claim_accuracy"]


def test_claims_of_refuses_a_run_whose_claims_are_not_the_humans():
    from fastvista.schema import Claim, Dialogue, Gold, GoldClaim, ScoredDialogue, Turn, TurnResult

    gold = Gold(label="faithful", claims=[GoldClaim(text="A is B.", label="VERIFIED")])
    dialogue = Dialogue(id="x", turns=[Turn(role="assistant", text="A is B.", gold=gold)])
    result = TurnResult(index=0, claims=[Claim(text="A is C.", label="VERIFIED")], score=1.0, no_claims=False, hallucinated=False)
    with pytest.raises(ValueError, match="not a gold_claims run"):
        calibrate.claims_of([ScoredDialogue(id="x", source="s", score=1.0, turns=[result], dialogue=dialogue)])
