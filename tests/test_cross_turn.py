"""The cross-turn probe: facts stated early, a later turn that contradicts, retracts, restates or
adds to them, with the fact taken out of the later turn's reference."""

import json
import random

from typer.testing import CliRunner

from fastvista.cli import app
from fastvista.evaluation.baselines.judge import JudgeConfig
from fastvista.evaluation.cross_turn import (TYPES, contradiction, cross_turn_report, cross_turn_table, fact_sentences,
                                             probe_dialogues, repeats, sentences)
from fastvista.evaluation.scorers import EvalConfig, machine_for
from fastvista.protocol import drive
from fastvista.records_io import write_jsonl
from fastvista.schema import Claim, Dialogue, Gold, ScoredDialogue, Turn, TurnResult
from tests.fake_openai import FakeOpenAI
from tests.scripted import ScriptedBackend

REF_A = ("Lighthouse (tower): A lighthouse is a tower designed to emit light from a system of lamps and lenses. "
         "The tallest lighthouse in the harbour was built in 1902 by the city engineers of the port. "
         "Its keeper lived there.")
REF_B = ("Harbour (port): The harbour was dredged in 1955 to let larger ships of the fleet enter it. "
         "The tallest lighthouse in the harbour was built in 1902 by the city engineers of the port. "
         "Ferries cross the harbour every hour between the two piers of the old town.")


def dialogue(scored_turns: int = 3) -> Dialogue:
    turns = []
    for n in range(scored_turns):
        turns.append(Turn(role="user", text=f"Tell me more, part {n}."))
        turns.append(Turn(role="assistant", text=f"Sure, here is part {n} of what I know", reference=REF_A if n == 0 else REF_B))
    return Dialogue(id="d1", source="topical_chat/test_freq", turns=turns)


def test_sentences_keep_initials_and_split_a_lost_space():
    assert sentences("It opened in the U.S. in 1933 and won. Michael B. Jordan starred.") == [
        "It opened in the U.S. in 1933 and won.", "Michael B. Jordan starred."]
    assert sentences("It was in an area of interest.In antiquity there was none.")[1] == "In antiquity there was none."
    assert sentences("Dr. Dre produced it in No. 1 form. It sold well.") == ["Dr. Dre produced it in No. 1 form.", "It sold well."]


def test_fact_sentences_drop_the_title_and_parentheses_and_need_something_to_contradict():
    facts = fact_sentences("Chess (game): Chess (a board game) is played by two players on a board of sixty four squares. "
                           "It was played in 1500 by the court of the king in the old palace. Who plays it today, then?")
    assert facts == ["Chess is played by two players on a board of sixty four squares."]  # the pronoun-led one is not self-contained


def test_a_contradiction_moves_the_year_not_the_day_and_negates_without_a_number():
    rng = random.Random(0)
    text, (old, new) = contradiction("The company was founded on 23 September 1889 by a card maker in the city.", rng)
    assert old == "1889" and new != "1889" and 7 <= abs(int(new) - 1889) <= 23 and "23 September" in text
    text, changed = contradiction("Chess is believed to have originated in India before the seventh century.", rng)
    assert text.startswith("Chess is not believed") and changed == ["is", "is not"]
    assert contradiction("Sharks can sense electric fields in the water around them at night.", rng)[0].startswith("Sharks cannot")


def test_no_contradiction_that_could_still_hold():
    rng = random.Random(0)
    # a bound or a scope: a changed number may still be true, so only a main verb can be negated
    assert contradiction("The trilogy was released between 1999 and 2005 to mixed reactions.", rng)[1] == ["was", "was not"]
    assert fact_sentences("Game (x): The series has sold over 5 billion copies across the whole wide world.") == []
    # the main verb, never one inside a relative clause
    assert fact_sentences("Text (x): The concept has changed over time to include texts that are spoken or sung.") == []
    assert fact_sentences("Chess (game): People can only watch the game from the stands of the old hall in town.") == []
    assert fact_sentences("Chess (game): Some shoes are worn by players of the game in the old hall in town.") == []
    assert fact_sentences("Game (x): With sales of over five hundred copies in the shop, it is the best seller here.") == []
    assert fact_sentences("Film (x): The film was released in 1999 by the largest studio in the whole city.") == []
def test_each_usable_dialogue_gives_four_versions_whose_probe_turn_only_memory_can_judge():
    probes, skipped = probe_dialogues([dialogue(), dialogue(scored_turns=1).model_copy(update={"id": "short"})], seed=0)
    assert len(probes) == 4 and sum(skipped.values()) == 1
    assert {p.id for p in probes} == {f"d1#{kind}" for kind in TYPES}
    for p in probes:
        probe = p.turns[-1]
        meta = probe.meta
        fact_turn = p.turns[meta["fact_turn"]]
        assert fact_turn.text.endswith(meta["fact"]) and fact_turn.text.startswith("Sure, here is part 0 of what I know.")
        assert meta["fact"] in REF_A  # the fact is its turn's own reference sentence
        assert not any(repeats(s, meta["fact"]) for s in sentences(probe.reference))  # the probe's reference lacks it
        scored = p.scored_indices()
        assert scored == [meta["fact_turn"], len(p.turns) - 1]  # the turns between are context only
        label, hallucinated = TYPES[meta["probe"]]
        assert probe.gold.claims[0].label.value == label and probe.gold.label == ("hallucinated" if hallucinated else "faithful")
        if meta["probe"] == "unsupported":
            other = meta["unsupported_fact"]
            assert not any(repeats(t.text, other) for t in p.turns[:-1]) and not any(repeats(s, other) for s in sentences(probe.reference))
        if meta["probe"] == "contradict":
            old, new = meta["changed"]
            assert new in probe.text and probe.text != meta["fact"]


def scored(kind: str, hallucinated: bool, labels: list[str], scored_turns: int = 3) -> ScoredDialogue:
    """A result on the probe of `dialogue(scored_turns)`, whose fact turn is 2 * (scored_turns - 1) turns before its probe turn."""
    [probe] = [p for p in probe_dialogues([dialogue(scored_turns)], seed=0)[0] if p.id.endswith(f"#{kind}")]
    claims = [Claim(text="x", label=label) for label in labels]
    last = TurnResult(index=len(probe.turns) - 1, claims=claims, score=0.0, no_claims=not claims, hallucinated=hallucinated)
    first = TurnResult(index=probe.turns[-1].meta["fact_turn"], claims=[], score=1.0, no_claims=True, hallucinated=True)
    return ScoredDialogue(id=f"{probe.id}{hallucinated}{len(labels)}", source="x", turns=[first, last], dialogue=probe)


def test_the_report_counts_detections_and_false_alarms_on_the_probe_turn_only():
    results = [scored("contradict", True, ["CONTRADICTED"]), scored("contradict", False, ["VERIFIED"]),
               scored("restate", False, ["VERIFIED"]), scored("restate", True, ["LACKING_EVIDENCE"]),
               scored("restate", False, [])]
    report = cross_turn_report(results, failed=[{"id": "d1#restate", "reason": "x"}])
    assert report["contradict"]["flagged_share"] == 0.5 and report["contradict"]["correct_decision_share"] == 0.5
    assert report["restate"]["n"] == 3 and report["restate"]["correct_decision_share"] == round(2 / 3, 4)
    assert report["restate"]["no_claim_turns"] == 1 and report["contradict"]["claim_labels"] == {"CONTRADICTED": 1, "VERIFIED": 1}
    assert report["restate"]["without_result"] == 1 and "abstain" not in report


def test_the_report_finds_the_probe_turn_by_its_meta_even_in_a_cut_dialogue():
    cut = scored("contradict", True, ["CONTRADICTED"])
    cut.turns.pop()  # a scorer that stopped after the fact turn: the fact turn is no probe turn
    report = cross_turn_report([cut])
    assert report["contradict"]["n"] == 0 and report["contradict"]["without_result"] == 1
    assert report["contradict"]["correct_decision_share"] is None


def test_scorers_side_by_side_show_correct_decisions_and_expected_labels_per_version():
    memory = cross_turn_report([scored("contradict", True, ["CONTRADICTED"]), scored("restate", False, ["VERIFIED"])])
    forgetful = cross_turn_report([scored("contradict", True, ["LACKING_EVIDENCE"]), scored("restate", True, ["LACKING_EVIDENCE"])])
    assert memory["contradict"]["expected_label_share"] == 1.0 and forgetful["contradict"]["expected_label_share"] == 0.0
    table = cross_turn_table({"teacher": memory, "no accumulation": forgetful})
    assert "| teacher | 1.00 / 1.00 (n=1) | - | 1.00 / 1.00 (n=1) | - | 0 |" in table
    assert "| no accumulation | 1.00 / 0.00 (n=1) | - | 0.00 / 0.00 (n=1) | - | 0 |" in table

    # a scorer that decides turns without claims (the judge, Q2, as its results' provenance says): no expected-label share, not 0
    judged = [scored("contradict", True, []), scored("restate", True, [])]
    for result in judged:
        result.provenance = {"scorer": "judge", "settings": {"history_turns": 8}}
    judge = cross_turn_report(judged)
    assert cross_turn_report([scored("contradict", True, [])])["contradict"]["expected_label_share"] == 0.0  # a claim scorer found none
    assert judge["contradict"]["expected_label_share"] is None and judge["contradict"]["correct_decision_share"] == 1.0
    assert "| judge | 1.00 / - (n=1) | - | 0.00 / - (n=1) | - | 0 |" in cross_turn_table({"judge": judge})


def test_each_version_is_split_by_whether_the_fact_turn_is_within_the_judges_history():
    near = scored("contradict", True, ["CONTRADICTED"], scored_turns=5)  # the fact turn 8 turns back
    far = scored("contradict", False, ["LACKING_EVIDENCE"], scored_turns=6)  # 10 turns back
    assert JudgeConfig().history_turns == 8
    # the judge's history holds the fact turn at a gap of 8, not at 10
    for result, seen in ((near, True), (far, False)):
        backend = ScriptedBackend()
        drive(machine_for(EvalConfig(scorer="judge"))(result.dialogue), backend)
        history = backend.requests[-1].messages[-1]["content"].split("[HISTORY]")[1].split("[TURN]")[0]
        assert (result.dialogue.turns[-1].meta["fact"] in history) is seen
    report = cross_turn_report([near, far])
    assert report["contradict"]["n"] == 2 and report["contradict"]["by_gap"] == {
        "gap <= 8": {"n": 1, "flagged_share": 1.0, "correct_decision_share": 1.0, "expected_label_share": 1.0},
        "gap > 8": {"n": 1, "flagged_share": 0.0, "correct_decision_share": 0.0, "expected_label_share": 0.0}}
    lines = cross_turn_table({"teacher": report}).splitlines()
    assert lines[2:] == ["| teacher | 0.50 / 0.50 (n=2) | - | - | - | 0 |", "| teacher, gap <= 8 | 1.00 / 1.00 (n=1) | - | - | - | - |",
                         "| teacher, gap > 8 | 0.00 / 0.00 (n=1) | - | - | - | - |"]
    # the window is the one the results were scored with; a judge's shares of claim labels are "-" (it gives none)
    for result in (near, far):
        result.provenance = {"scorer": "judge", "settings": {"history_turns": 10}}
    wider = cross_turn_report([near, far])["contradict"]
    assert wider["by_gap"]["gap <= 10"]["n"] == 2 and wider["by_gap"]["gap > 10"]["n"] == 0 and wider["expected_label_share"] is None


def test_the_benchmark_takes_the_probe_whole_and_eval_cross_turn_reads_its_failures(tmp_path):
    from fastvista.scheduler import read_failed

    probes = probe_dialogues([dialogue()], seed=0)[0]
    restate = probes[list(TYPES).index("restate")]
    restate.turns[-1].text = "GARBLE " + restate.turns[-1].text  # the judge cannot read it: this dialogue fails
    write_jsonl(tmp_path / "probe.jsonl", probes)
    write_jsonl(tmp_path / "toy.jsonl", [Dialogue(id="t", turns=[Turn(role="assistant", text="Hi.", reference="x", gold=Gold(label="faithful"))])])
    with FakeOpenAI() as server:
        config = tmp_path / "c.yaml"
        config.write_text(f"backend: {{kind: openai, model: scripted, base_url: '{server.url}', api_key_env: HOME}}\n")
        args = ["eval", "benchmark", "-c", str(config), "--scorer", "judge", "--out", str(tmp_path / "b"), "--data", f"toy={tmp_path / 'toy.jsonl'}"]
        sampled = CliRunner().invoke(app, [*args, "--data", f"probe={tmp_path / 'probe.jsonl'}@2"])
        assert sampled.exit_code == 2 and f"{tmp_path / 'probe.jsonl'} holds cross-turn probe dialogues" in sampled.output
        assert f"cat {tmp_path / 'probe.jsonl'} | head -n 4 > probe_1.jsonl" in sampled.output
        assert sum(server.received.values()) == 0 and [p.name for p in (tmp_path / "b").iterdir()] == [".lock"]  # checked before the first data set ran
        whole = CliRunner().invoke(app, [*args, "--data", f"probe={tmp_path / 'probe.jsonl'}"])
        assert whole.exit_code == 3 and "judge on probe: 1" in whole.output
    assert [f["id"] for f in read_failed(tmp_path / "b/judge/probe")] == ["d1#restate"]
    shown = CliRunner().invoke(app, ["eval", "cross-turn", str(tmp_path / "b/judge/probe/results.jsonl")])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.output)
    assert report["restate"]["n"] == 0 and report["restate"]["without_result"] == 1
    assert report["contradict"]["n"] == 1 and report["contradict"]["expected_label_share"] is None  # the judge gives no claims
