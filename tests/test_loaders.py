import json
from pathlib import Path

import pytest

from fastvista.labels import Label
from fastvista.loaders import load
from fastvista.records_io import RecordError

FIX = Path(__file__).parent / "fixtures"


def assistant(d):
    [turn] = [t for t in d.turns if t.scored]
    return turn


def test_begin_maps_attribution_labels_and_systems():
    wow = list(load("begin", FIX / "begin/begin_dev_wow.tsv"))
    assert [d.system for d in wow] == ["t5", "gpt2", "doha"]
    assert [assistant(d).gold.label for d in wow] == ["faithful", "hallucinated", "faithful"]
    first = wow[0]
    assert first.source == "begin/wow" and first.turns[0].role == "user"
    assert assistant(first).reference.startswith("originally an industrial pigment")
    cmu = list(load("begin", FIX / "begin/begin_dev_cmu.tsv"))
    generic = [d for d in cmu if assistant(d).gold.original == "Generic"]
    assert generic and assistant(generic[0]).gold.label == "faithful"


def test_faithdial_gold_and_model_files():
    gold = list(load("faithdial", FIX / "faithdial/gold/wow.csv"))
    assert len(gold) == 5
    assert [assistant(d).gold.original for d in gold][:3] == ["Entailment", "Partial Hallucination", "Hallucination"]
    for d in gold:
        turn = assistant(d)
        assert turn.gold.label == ("hallucinated" if "Hallucination" in turn.gold.original else "faithful")
    assert {d.system for d in gold} == {"gold"} and gold[0].source == "faithdial/wow"
    ctrl = list(load("faithdial", FIX / "faithdial/CTRL/ctrl_processed_cmu.csv"))
    assert {d.system for d in ctrl} == {"ctrl"} and ctrl[0].source == "faithdial/cmu"
    for d in ctrl:
        turn = assistant(d)
        assert turn.gold.label == ("hallucinated" if "hallucination" in turn.gold.original else "faithful")


def test_q2_file_name_gives_label_and_cross_annotation_gives_two_systems():
    inconsistent = list(load("q2", FIX / "q2/dodeca_inconsistent.csv"))
    assert len(inconsistent) == 3
    assert all(d.system == "dodeca" and assistant(d).gold.label == "hallucinated" for d in inconsistent)
    cross = list(load("q2", FIX / "q2/cross_annotation.csv"))
    assert [d.system for d in cross] == ["dodeca", "memnet", "dodeca", "memnet"]
    assert len({assistant(d).text for d in cross[:2]}) == 2


def test_dialfact_history_alternates_and_ends_with_the_user():
    dialogues = list(load("dialfact", FIX / "dialfact/testsmall.jsonl"))
    d = dialogues[0]
    assert d.turns[-2].role == "user" and d.turns[-1].role == "assistant"
    assert [t.role for t in d.turns[:-1]] == ["user" if (len(d.turns) - 1 - i) % 2 else "assistant" for i in range(len(d.turns) - 1)]
    assert len(d.scored_indices()) == 1  # history turns are context
    assert assistant(d).gold.label == "faithful" and "1997 broadcast" in assistant(d).reference


def test_ais_needs_the_wow_file_and_joins_it(tmp_path):
    with pytest.raises(RecordError, match="wow_file"):
        list(load("ais", FIX / "ais/ann_wow.csv"))
    episodes = [{"dialog": [{"speaker": "1_Apprentice", "text": "hi"}, {"speaker": "0_Wizard", "text": "w", "checked_sentence": {"k": "Water is wet."}}]} for _ in range(700)]
    episodes[43]["dialog"][1]["speaker"] = "1_Apprentice"  # ex-idx 43:1 now points at the wrong speaker
    wow = tmp_path / "wow.json"
    wow.write_text(json.dumps(episodes))
    skipped = []
    dialogues = list(load("ais", FIX / "ais/ann_wow.csv", skipped, wow_file=str(wow)))
    assert len(dialogues) == 2 and len(skipped) == 1
    assert skipped[0].field == "ex-idx" and skipped[0].line == 3
    d = dialogues[0]
    assert d.turns[0].text == "hi" and assistant(d).reference == "Water is wet."
    assert assistant(d).gold.label == "faithful" and d.system == "wow-controlled_t5"


def test_topical_chat_resolves_wiki_sections_and_marks_unreferenced_turns():
    [d] = load("topical_chat", FIX / "topical_chat/conversations/valid_freq.json")
    assistants = [t for t in d.turns if t.role == "assistant"]
    assert len(assistants) == 4  # agent_2 by default
    assert all(t.meta["knowledge_source"] for t in d.turns)
    assert assistants[0].reference.startswith("Football: ") and assistants[0].scored
    [as_agent_1] = load("topical_chat", FIX / "topical_chat/conversations/valid_freq.json", assistant="agent_1")
    first = as_agent_1.turns[0]
    # AS1 (an article) cannot be resolved offline, FS1 and FS3 can
    assert first.role == "assistant" and first.reference.count("\n") == 1


def test_vista_maps_human_claims_and_context_turns():
    [d] = load("vista", FIX / "vista_sample.json")
    assert d.system == "FaithDial" and d.source == "vista/faithdial"
    assert d.scored_indices() == [1, 5]
    assert d.turns[3].reference is None and not d.turns[3].scored
    gold = d.turns[1].gold
    assert gold.label == "faithful" and [c.label for c in gold.claims] == [Label.OUT_OF_SCOPE, Label.VERIFIED]
    assert d.turns[5].gold.claims[0].label is Label.CONTRADICTED


def test_unknown_source_and_missing_file_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown source"):
        list(load("nope", tmp_path))
    with pytest.raises(RecordError, match="no such file"):
        list(load("begin", tmp_path / "missing.tsv"))
