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


def load_skipping(source, path, **options):
    """(records, (line, field) of each skipped record); without --skip-bad the first bad record
    must stop the load as that RecordError, never as another exception."""
    skipped = []
    records = list(load(source, path, skipped, **options))
    with pytest.raises(RecordError) as raised:
        list(load(source, path, **options))
    assert str(raised.value) == str(skipped[0])
    return records, [(e.line, e.field) for e in skipped]


def test_dialfact_reports_every_malformed_line_and_loads_the_rest(tmp_path):
    good = json.loads((FIX / "dialfact/testsmall.jsonl").read_text().splitlines()[0])
    bad = [42, "a string", [1, 2], {k: v for k, v in good.items() if k != "response_label"}, {**good, "context": "hi"},
           {**good, "context": [1]}, {**good, "evidence_list": [["title", "url"]]}, {**good, "evidence_list": {"a": "b"}},
           {**good, "response": 5}, {k: v for k, v in good.items() if k != "id"}, {**good, "response_label": ["SUPPORTS"]}]
    path = tmp_path / "dialfact.jsonl"
    path.write_bytes(b"\n".join([json.dumps(good).encode(), *(json.dumps(b).encode() for b in bad), b'{"id": "\xff"}']))
    records, skipped = load_skipping("dialfact", path)
    assert [d.id for d in records] == [f"dialfact-{good['id']}"]
    assert skipped == [(2, None), (3, None), (4, None), (5, "response_label"), (6, "context"), (7, "context"),
                       (8, "evidence_list"), (9, "evidence_list"), (10, "response"), (11, "id"), (12, "response_label"), (13, None)]


def test_vista_names_the_list_index_of_every_malformed_conversation(tmp_path):
    [good] = json.loads((FIX / "vista_sample.json").read_text())
    turn = {"role": "user", "utterance": "hi"}
    bad = [5, "text", ["a turn as a string"], [{"role": "user"}], [{**turn, "human_claims": "none"}],
           [{**turn, "human_claims": [{"claim_text": "x"}]}], [{**turn, "utterance": 3}]]
    path = tmp_path / "vista.json"
    path.write_text(json.dumps([good, *bad]))
    records, skipped = load_skipping("vista", path)
    assert [d.system for d in records] == ["FaithDial"]
    assert skipped == [(None, "[1]"), (None, "[2]"), (None, "[3][0]"), (None, "[4][0].utterance"),
                       (None, "[5][0].human_claims"), (None, "[6][0].human_claims[0]"), (None, "[7][0].text")]


def test_topical_chat_names_the_id_of_every_malformed_conversation(tmp_path):
    conversations = json.loads((FIX / "topical_chat/conversations/valid_freq.json").read_text())
    [(good_id, good)] = conversations.items()
    turn = {"agent": "agent_1", "message": "hi"}
    bad = {"number": 5, "content_text": {"content": "abc"}, "turn_text": {"content": ["hi"]}, "no_message": {"content": [{"agent": "agent_1"}]},
           "message_number": {"content": [{**turn, "message": 7}]}, "sources_number": {"content": [{**turn, "knowledge_source": 3}]}}
    reading = json.loads((FIX / "topical_chat/reading_sets/pre-build/valid_freq.json").read_text())
    for folder, data in [("conversations", {good_id: good, **bad}), ("reading_sets/pre-build", {**reading, **{k: {} for k in bad}})]:
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "valid_freq.json").write_text(json.dumps(data))
    (tmp_path / "src/wiki").mkdir(parents=True)
    (tmp_path / "src/wiki/wiki.json").write_text((FIX / "topical_chat/src/wiki/wiki.json").read_text())
    records, skipped = load_skipping("topical_chat", tmp_path / "conversations/valid_freq.json")
    assert [d.id for d in records] == [f"topical_chat-valid_freq-{good_id}"]
    assert skipped == [(None, "number"), (None, "content_text.content"), (None, "turn_text.content[0]"), (None, "no_message.content[0]"),
                       (None, "message_number.content[0]"), (None, "sources_number.content[0].knowledge_source")]


def test_topical_chat_reading_set_of_the_wrong_shape_is_a_record_error(tmp_path):
    for folder, data in [("conversations", {"c": {"content": [{"agent": "agent_2", "message": "hi", "knowledge_source": ["FS1"]}]}}),
                         ("reading_sets/pre-build", {"c": {"agent_2": []}}), ("src/wiki", {"shortened_wiki_lead_section": []})]:
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / ("wiki.json" if folder == "src/wiki" else "valid_freq.json")).write_text(json.dumps(data))
    with pytest.raises(RecordError, match="shortened_wiki_lead_section.*expected an object"):
        list(load("topical_chat", tmp_path / "conversations/valid_freq.json"))
    (tmp_path / "src/wiki/wiki.json").write_text("{}")
    _, skipped = load_skipping("topical_chat", tmp_path / "conversations/valid_freq.json")
    assert skipped == [(None, "c")]  # the reading set of agent_2 is a list: the guard still names the conversation


def test_begin_tsv_bad_byte_costs_its_line_alone(tmp_path):
    header, *rows = (FIX / "begin/begin_dev_wow.tsv").read_bytes().splitlines()
    broken = rows[1].replace(b"\tgpt2\t", b"\tgp\xfft2\t") if b"\tgpt2\t" in rows[1] else b"gp\xfft2" + rows[1][4:]
    missing = b"\t".join(rows[2].split(b"\t")[:-1])  # no begin_label
    unknown = rows[2].rsplit(b"\t", 1)[0] + b"\tSomewhat"
    path = tmp_path / "begin_dev_wow.tsv"
    path.write_bytes(b"\n".join([header, rows[0], broken, missing, unknown]) + b"\n")
    records, skipped = load_skipping("begin", path)
    assert [d.system for d in records] == ["t5"]
    assert skipped == [(3, "model_name"), (4, "begin_label"), (5, "begin_label")]


def test_faithdial_bad_byte_inside_a_quoted_multiline_field_names_its_own_line(tmp_path):
    path = tmp_path / "gold" / "wow.csv"
    path.parent.mkdir()
    path.write_bytes(b'evidence,history,response,BEGIN\n'
                     b'"Ev one.",hi,Resp one.,Entailment\n'
                     b'"Ev two,\nsecond line \xc3( bad",hi,Resp two.,Entailment\n'
                     b'"Ev three.",hi,,Entailment\n'
                     b'"Ev four.",hi,Resp four.,Maybe\n'
                     b'"Ev five.",hi,Resp five.,Hallucination\n')
    records, skipped = load_skipping("faithdial", path)
    assert [d.turns[-1].text for d in records] == ["Resp one.", "Resp five."]
    assert [d.id for d in records] == ["faithdial-gold-wow-00002", "faithdial-gold-wow-00007"]
    assert skipped == [(4, "evidence"), (5, "response"), (6, "BEGIN")]


def test_q2_and_ais_bad_bytes_and_bad_rows_are_skipped_with_their_lines(tmp_path):
    header, *rows = (FIX / "q2/cross_annotation.csv").read_bytes().splitlines()
    path = tmp_path / "cross_annotation.csv"
    path.write_bytes(b"\n".join([header, rows[0], b"\xff" + rows[0], rows[0].rsplit(b",", 1)[0] + b",2"]) + b"\n")
    records, skipped = load_skipping("q2", path)
    assert [d.system for d in records] == ["dodeca", "memnet", "dodeca"]
    assert skipped == [(3, ""), (4, "memnet_label")]

    header, *rows = (FIX / "ais/ann_wow.csv").read_bytes().splitlines()
    episodes = [{"dialog": [{"speaker": "1_Apprentice", "text": "hi"}, {"speaker": "0_Wizard", "text": "w"}]}] * 700
    episodes[43] = {"dialog": ["a turn as a string", "another"]}
    wow = tmp_path / "wow.json"
    wow.write_text(json.dumps(episodes))
    path = tmp_path / "ann_wow.csv"
    path.write_bytes(b"\n".join([header, rows[0], rows[1], rows[0].replace(b"wow-controlled_t5", b"wow-\xe2\x82")]) + b"\n")
    records, skipped = load_skipping("ais", path, wow_file=str(wow))
    assert [d.system for d in records] == ["wow-controlled_t5"]
    assert skipped == [(3, "ex-idx"), (4, "model-name")]



def test_topical_chat_both_agents_scores_every_turn_against_its_own_reading_set():
    path = FIX / "topical_chat/conversations/valid_freq.json"
    [agent_1], [agent_2], [both] = (load("topical_chat", path, assistant=a) for a in ("agent_1", "agent_2", "both"))
    assert [t.role for t in both.turns] == ["assistant"] * 8 and both.id == agent_2.id + "#both"
    assert [t.meta["agent"] for t in both.turns[:2]] == ["agent_1", "agent_2"]
    assert both.scored_indices() == sorted(agent_1.scored_indices() + agent_2.scored_indices())
    for t, t_1, t_2 in zip(both.turns, agent_1.turns, agent_2.turns):
        own = t_1 if t_1.role == "assistant" else t_2  # each turn keeps its own agent's reference
        assert (t.reference, t.score) == (own.reference, own.score)
    with pytest.raises(ValueError, match="agent_1, agent_2 or both"):
        list(load("topical_chat", path, assistant="agent_3"))
