from fastvista.labels import Label, parse_label
from fastvista.scoring import dialogue_score, is_hallucinated, is_unattributed, system_scores, turn_score

V, O, A, C, L = Label.VERIFIED, Label.OUT_OF_SCOPE, Label.ABSTENTION, Label.CONTRADICTED, Label.LACKING_EVIDENCE


def test_turn_score_counts_safe_claims():
    assert turn_score([V, O, A, C]) == 0.75
    assert turn_score([C, L]) == 0.0
    assert turn_score([]) == 1.0


def test_hallucinated_iff_contradicted_or_lacking():
    assert not is_hallucinated([V, O, A])
    assert is_hallucinated([V, L])
    assert is_hallucinated([C])
    assert not is_hallucinated([])


def test_attribution_reading_needs_every_claim_verified():
    assert not is_unattributed([V, V])
    # an opinion is safe for VISTA but not attributed to the knowledge
    assert is_unattributed([V, O]) and not is_hallucinated([V, O])
    assert is_unattributed([Label.ABSTENTION])
    assert is_unattributed([])  # nothing stated, nothing attributed


def test_dialogue_score_is_a_micro_average_over_claims():
    # macro over turns would be (1.0 + 0.25) / 2 = 0.625; micro over claims is 2/5
    assert dialogue_score([[V], [V, C, L, L]]) == 0.4
    assert dialogue_score([]) is None  # no scored turn: nothing was checked, no score
    assert dialogue_score([[], []]) == 1.0  # turns that state nothing are safe


def test_system_scores_pool_claims_of_all_dialogues_of_a_system():
    scores = system_scores([("a", [[V, C]]), ("a", [[V, V]]), ("b", [[L]])])
    assert scores == {"a": 0.75, "b": 0.0}


def test_parse_label_reads_human_spellings():
    assert parse_label("verifiable") is V
    assert parse_label("Out of scope") is O
    assert parse_label("lacking-evidence") is L
    assert parse_label("CONTRADICTED") is C
    assert Label.ABSTENTION.safe and not Label.CONTRADICTED.safe
    try:
        parse_label("maybe")
    except ValueError as e:
        assert "maybe" in str(e)
    else:
        raise AssertionError("unknown label accepted")
