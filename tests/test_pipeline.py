import math
from pathlib import Path

import pytest

from fastvista.labels import Label
from fastvista.schema import Dialogue, Gold, GoldClaim, Turn
from fastvista.single_pass import SYSTEM_PROMPT, parse_output, split_sections
from fastvista.synth import prompts
from fastvista.synth.pipeline import TeacherConfig, about_speaker, decide, label_dialogue, parse_claims, parse_class, parse_verification
from fastvista.protocol import drive as run_machine
from fastvista.protocol import ScoringFailed
from fastvista.scheduler import run
from fastvista.llm import Completion
from fastvista.memory import stores_before
from fastvista.contract import StudentFormat
from fastvista.synth.training_set import training_examples
from tests.scripted import ScriptedBackend

FORMAT = StudentFormat(history_turns=8, max_store_claims=64)

REF1 = "The Louvre is in Paris. The Louvre opened in 1793."
REF2 = "The Mona Lisa hangs in the Louvre."


def museum_dialogue(i: int = 0) -> Dialogue:
    """Dialogues differ by `i` in every prompt the teacher writes, so no two share a call."""
    return Dialogue(
        id=f"d{i}",
        system="sys-a" if i % 2 else "sys-b",
        knowledge_init=["Paris is in France."],
        turns=[
            Turn(role="user", text=f"Tell me about the Louvre, part {i}?"),
            # 3 claims: verified, out of scope (I ...), lacking evidence
            Turn(role="assistant", text="The Louvre is in Paris. I love it. The Louvre has a glass pyramid.", reference=f"{REF1} It has {i + 2} wings."),
            Turn(role="user", text="And the Mona Lisa?"),
            # 3 claims: verified from the reference, verified from the store (turn 1), contradicted
            Turn(role="assistant", text="The Mona Lisa hangs in the Louvre. The Louvre is in Paris. The Louvre is not open on Tuesdays.", reference=f"{REF2} {i}"),
            Turn(role="user", text="Thanks"),
            Turn(role="assistant", text="Do you want more?", reference=f"{REF2} {i}"),  # a question: no claim
            Turn(role="assistant", text="Context only.", score=False),
        ],
    )


def drive(dialogue, cfg, backend):
    return run_machine(label_dialogue(dialogue, cfg), backend)


def test_labels_store_and_call_counts():
    backend = ScriptedBackend()
    result = drive(museum_dialogue(), TeacherConfig(), backend)
    t1, t2, t3 = result.turns
    assert [t.index for t in result.turns] == [1, 3, 5]
    assert [c.label for c in t1.claims] == [Label.VERIFIED, Label.OUT_OF_SCOPE, Label.LACKING_EVIDENCE]
    assert [c.label for c in t2.claims] == [Label.VERIFIED, Label.VERIFIED, Label.CONTRADICTED]
    assert t3.claims == [] and t3.no_claims and t3.score == 1.0
    # calls per turn = 1 + claims not about the speaker (verify) + claims (classify)
    assert t1.usage.calls == 1 + 2 + 3
    assert t2.usage.calls == 1 + 3 + 3
    assert t3.usage.calls == 1
    assert result.usage.calls == len(backend.requests) == 14
    assert [c.about_speaker for c in t1.claims] == [None, True, None]
    # the store grows with VERIFIED and OUT_OF_SCOPE claims only
    assert t1.store_added == ["The Louvre is in Paris.", "I love it."]
    assert t2.store_added == ["The Mona Lisa hangs in the Louvre."]
    assert stores_before(["Paris is in France."], [t1, t2])[1] == ["Paris is in France.", "The Louvre is in Paris.", "I love it."]
    assert t1.hallucinated and t2.hallucinated and not t3.hallucinated
    assert result.score == (2 + 2) / 6  # micro-average over the 6 claims


def test_second_turn_sees_the_first_turns_store_and_history():
    backend = ScriptedBackend()
    drive(museum_dialogue(), TeacherConfig(), backend)
    verify_turn2 = [r for r in backend.requests if r.messages[0]["content"] == prompts.VERIFY_SYSTEM][2]
    sections = split_sections(verify_turn2.messages[-1]["content"], prompts.SECTIONS)
    assert "The Louvre is in Paris." in sections["[KNOWLEDGE STORE]"]
    assert sections["[REFERENCE]"] == f"{REF2} 0"
    decompose_turn2 = [r for r in backend.requests if r.messages[0]["content"] == prompts.DECOMPOSE_SYSTEM][1]
    history = split_sections(decompose_turn2.messages[-1]["content"], prompts.SECTIONS)["[HISTORY]"]
    assert history.split("\n") == ["User: Tell me about the Louvre, part 0?", "Assistant: The Louvre is in Paris. I love it. The Louvre has a glass pyramid.", "User: And the Mona Lisa?"]
    assert len(decompose_turn2.messages) == 1 + 2 * 6 + 1  # system, six examples, the query


def test_ablation_no_accumulate_keeps_the_initial_store():
    backend = ScriptedBackend()
    result = drive(museum_dialogue(), TeacherConfig(accumulate=False), backend)
    assert all(t.store_added == [] for t in result.turns)
    assert all(s == ["Paris is in France."] for s in stores_before(["Paris is in France."], result.turns))
    # without the store, "The Louvre is in Paris." in turn 2 is no longer verified
    assert result.turns[1].claims[1].label is Label.LACKING_EVIDENCE


def test_ablation_no_history_and_zero_shot():
    backend = ScriptedBackend()
    drive(museum_dialogue(), TeacherConfig(history=False, few_shot=0), backend)
    for r in backend.requests:
        assert len(r.messages) == 2  # system and query, no examples
        if r.messages[0]["content"] == prompts.DECOMPOSE_SYSTEM:
            assert split_sections(r.messages[-1]["content"], prompts.SECTIONS)["[HISTORY]"] == "none"


def test_few_shot_n_takes_n_examples_everywhere():
    backend = ScriptedBackend()
    drive(museum_dialogue(), TeacherConfig(few_shot=2), backend)
    assert {len(r.messages) for r in backend.requests} == {1 + 2 * 2 + 1}


def test_unreadable_answers_are_retried_then_fail_the_dialogue():
    backend = ScriptedBackend()
    d = Dialogue(id="g", turns=[Turn(role="assistant", text="GARBLE is a word.", reference="x")])
    with pytest.raises(ScoringFailed, match=r"turn 0: claim 'GARBLE is a word.': no readable label \(verify: .*classify: "):
        drive(d, TeacherConfig(retries=2), backend)
    assert len(backend.requests) == 1 + 3 + 3  # decomposition, then each label question asked three times
    retried = [r for r in backend.requests if r.temperature > 0]
    assert {r.seed for r in retried} == {1, 2}


class CutBackend(ScriptedBackend):
    """Answers every decomposition as if cut at max_tokens."""

    def generate(self, requests):
        return [c.model_copy(update={"finish_reason": "length", "text": c.text[:12]}) if r.messages[0]["content"] == prompts.DECOMPOSE_SYSTEM
                else c for r, c in zip(requests, super().generate(requests))]


def test_a_decomposition_cut_at_max_tokens_is_retried_then_fails_never_a_claim():
    backend = CutBackend()
    with pytest.raises(ScoringFailed, match="decompose: answer cut at max_tokens=320"):
        drive(museum_dialogue(), TeacherConfig(retries=1), backend)
    assert len(backend.requests) == 2  # one retry, no claim labelled


def test_a_backend_error_fails_the_dialogue_at_once_without_sampling():
    class Down(ScriptedBackend):
        def generate(self, requests):
            self.requests.extend(requests)
            return [Completion(text="", error="APIConnectionError: connection refused") for _ in requests]

    backend = Down()
    with pytest.raises(ScoringFailed, match="turn 1: backend: APIConnectionError"):
        drive(museum_dialogue(), TeacherConfig(retries=2), backend)
    assert len(backend.requests) == 1 and backend.requests[0].temperature == 0.0


def test_parsers_read_what_small_models_write():
    assert parse_claims("Claims:\n- A is B.\n2) C is D.\n* A is B.") == ["A is B.", "C is D."]
    assert parse_claims("NONE.") == []
    assert parse_verification("Answer: UNVERIFIABLE") is False
    assert parse_verification("verified.") is True
    assert parse_verification("Not verified") is False
    assert parse_class("lacking evidence") is Label.LACKING_EVIDENCE
    assert parse_class("Out-of-scope, since") is Label.OUT_OF_SCOPE


def test_scheduler_batches_across_dialogues_and_writes_each_once(tmp_path: Path):
    backend = ScriptedBackend()
    dialogues = [museum_dialogue(i) for i in range(5)] + [museum_dialogue(2)]  # one duplicate id
    stats = run(dialogues, lambda d: label_dialogue(d, TeacherConfig()), lambda: backend, tmp_path / "out.jsonl", progress=False)
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert len(lines) == 5 and stats.labelled == 5 and stats.duplicates == ["d2"]
    # every round sends the pending calls of all five dialogues together
    assert backend.batches[0] == 5 and max(backend.batches) == 5 * 6
    # rounds: decompose, then verify and classify together, for two turns; then one decomposition
    assert stats.rounds == len(backend.batches) == 5


def test_training_examples_use_the_single_pass_format_and_teacher_store():
    result = drive(museum_dialogue(), TeacherConfig(), ScriptedBackend())
    examples = training_examples(result, FORMAT)
    assert [e["turn_index"] for e in examples] == [1, 3, 5]
    second = examples[1]
    assert second["prompt"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    sections = split_sections(second["prompt"][1]["content"])
    assert sections["[KNOWLEDGE STORE]"].split("\n") == ["1. Paris is in France.", "2. The Louvre is in Paris.", "3. I love it."]
    assert sections["[TURN]"] == museum_dialogue().turns[3].text
    parsed = parse_output(second["completion"][0]["content"])
    assert [(c.text, c.label) for c in parsed] == [(c.text, c.label) for c in result.turns[1].claims]
    assert examples[2]["completion"][0]["content"] == "NONE"


def test_rerunning_a_finished_run_starts_no_engine_and_writes_nothing(tmp_path: Path):
    out = tmp_path / "out.jsonl"
    run([museum_dialogue(i) for i in range(3)], lambda d: label_dialogue(d, TeacherConfig()), ScriptedBackend, out, progress=False)
    before = out.read_text()

    def no_engine():
        raise AssertionError("engine started for a finished run")

    stats = run([museum_dialogue(i) for i in range(3)], lambda d: label_dialogue(d, TeacherConfig()), no_engine, out, progress=False)
    assert (stats.resumed, stats.labelled) == (3, 0) and out.read_text() == before


def test_a_torn_last_line_is_cut_and_its_dialogue_labelled_again(tmp_path: Path):
    out = tmp_path / "out.jsonl"
    run([museum_dialogue(i) for i in range(2)], lambda d: label_dialogue(d, TeacherConfig()), ScriptedBackend, out, progress=False)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text(lines[0] + lines[1][: len(lines[1]) // 2])  # killed in the middle of a write
    stats = run([museum_dialogue(i) for i in range(2)], lambda d: label_dialogue(d, TeacherConfig()), ScriptedBackend, out, progress=False)
    assert (stats.resumed, stats.labelled) == (1, 1)
    assert out.read_text().splitlines(keepends=True) == lines


def test_resuming_with_other_settings_is_refused(tmp_path: Path):
    out = tmp_path / "out.jsonl"
    machine = lambda d: label_dialogue(d, TeacherConfig())  # noqa: E731
    run([museum_dialogue(0)], machine, ScriptedBackend, out, provenance={"teacher": {"few_shot": 6}, "data": {"limit": 1}}, progress=False)
    # another data selection with the same method resumes
    stats = run([museum_dialogue(0), museum_dialogue(1)], machine, ScriptedBackend, out, provenance={"teacher": {"few_shot": 6}, "data": {"limit": 2}}, progress=False)
    assert (stats.resumed, stats.labelled) == (1, 1)
    with pytest.raises(ValueError, match="other settings"):
        run([museum_dialogue(0)], machine, ScriptedBackend, out, provenance={"teacher": {"few_shot": 0}}, progress=False)


class FirstTokenBackend(ScriptedBackend):
    """Answers like ScriptedBackend, with first-token log-probabilities that put `p_verified` on
    VERIFIED and the class mass given in `classes`, as tokens an engine would show."""

    def __init__(self, p_verified: float, classes: dict[str, float]):
        super().__init__()
        self.p_verified, self.classes = p_verified, classes

    def generate(self, requests):
        from fastvista.llm import TokenLogprob

        completions = super().generate(requests)
        for r, c in zip(requests, completions):
            if r.messages[0]["content"] == prompts.VERIFY_SYSTEM:
                top = {"VER": math.log(self.p_verified), " UN": math.log(1 - self.p_verified)}
            elif r.messages[0]["content"] == prompts.CLASSIFY_SYSTEM:
                top = {token: math.log(p) for token, p in self.classes.items()} | {"Sure": math.log(0.01)}
            else:
                continue
            c.logprobs = [TokenLogprob(token=max(top, key=top.get), logprob=max(top.values()), top=top)]
        return completions


CLASS_TOKENS = {"OUT": 0.05, "CON": 0.5, "L": 0.4, "AB": 0.04}


def _single_claim(text: str) -> Dialogue:
    return Dialogue(id="one", turns=[Turn(role="assistant", text=text, reference="Unrelated text.")])


def test_label_scores_decide_by_threshold_and_bias_and_keep_the_distributions():
    d = _single_claim("The bridge opened in 1932.")
    plain = drive(d, TeacherConfig(), FirstTokenBackend(0.4, CLASS_TOKENS)).turns[0].claims[0]
    assert plain.label is Label.CONTRADICTED and plain.confidence == pytest.approx(0.5 / 0.99, abs=1e-3)
    assert plain.probabilities["VERIFIED"] == pytest.approx(0.4)
    assert set(plain.probabilities) == {"VERIFIED", "OUT_OF_SCOPE", "CONTRADICTED", "LACKING_EVIDENCE", "ABSTENTION"}
    lowered = TeacherConfig(verify_threshold=0.3, class_bias={"CONTRADICTED": -1.0})
    assert drive(d, lowered, FirstTokenBackend(0.4, CLASS_TOKENS)).turns[0].claims[0].label is Label.VERIFIED
    biased = TeacherConfig(class_bias={"CONTRADICTED": -1.0})
    assert drive(d, biased, FirstTokenBackend(0.4, CLASS_TOKENS)).turns[0].claims[0].label is Label.LACKING_EVIDENCE
    # decide() on the stored distributions gives the label the run gave
    stored = {Label(k): v for k, v in plain.probabilities.items() if k != "VERIFIED"}
    assert decide(plain.probabilities["VERIFIED"], stored, False, biased) is Label.LACKING_EVIDENCE


def test_text_mode_ignores_log_probabilities():
    claim = drive(_single_claim("The bridge opened in 1932."), TeacherConfig(label_scores=False), FirstTokenBackend(0.9, CLASS_TOKENS)).turns[0].claims[0]
    assert claim.label is Label.LACKING_EVIDENCE  # the scripted text, not the 0.9 of the log-probabilities
    assert claim.probabilities == {"VERIFIED": 0.0, "LACKING_EVIDENCE": 1.0}


def test_speaker_claims_skip_verification_and_take_only_two_classes():
    backend = FirstTokenBackend(0.99, {"CON": 0.6, "AB": 0.3, "OUT": 0.1})
    claim = drive(_single_claim("I have seen that bridge."), TeacherConfig(), backend).turns[0].claims[0]
    assert claim.about_speaker and claim.label is Label.ABSTENTION
    assert not any(r.messages[0]["content"] == prompts.VERIFY_SYSTEM for r in backend.requests)
    off = drive(_single_claim("I have seen that bridge."), TeacherConfig(speaker_claims=False), FirstTokenBackend(0.99, CLASS_TOKENS))
    assert off.turns[0].claims[0].label is Label.VERIFIED
    assert [about_speaker(t) for t in ("The wizard loves jazz.", "The assistant's cat is old.", "I'm unsure.", "Italy is big.", "Assistants help.")] == [True, True, True, False, False]


def test_votes_ask_each_question_in_several_example_orders_and_average():
    backend = FirstTokenBackend(0.4, CLASS_TOKENS)
    claim = drive(_single_claim("The bridge opened in 1932."), TeacherConfig(votes=3, few_shot=3), backend).turns[0].claims[0]
    verify = [r for r in backend.requests if r.messages[0]["content"] == prompts.VERIFY_SYSTEM]
    assert len(verify) == 3 and len({r.messages[1]["content"] for r in verify}) == 3  # each order opens differently
    assert {r.messages[-1]["content"] for r in verify} == {verify[0].messages[-1]["content"]}
    assert claim.probabilities["VERIFIED"] == pytest.approx(0.4)


def test_gold_claims_replace_decomposition():
    gold = Gold(label="hallucinated", claims=[GoldClaim(text="The Louvre is in Paris.", label="VERIFIED"), GoldClaim(text="It is pink.", label="LACKING_EVIDENCE")])
    d = Dialogue(id="g", turns=[Turn(role="assistant", text="whatever", reference=REF1, gold=gold)])
    backend = ScriptedBackend()
    result = drive(d, TeacherConfig(gold_claims=True), backend)
    assert [c.text for c in result.turns[0].claims] == ["The Louvre is in Paris.", "It is pink."]
    assert not any(r.messages[0]["content"] == prompts.DECOMPOSE_SYSTEM for r in backend.requests)
    with pytest.raises(ValueError, match="no human claims"):
        drive(Dialogue(id="n", turns=[Turn(role="assistant", text="x")]), TeacherConfig(gold_claims=True), backend)


def test_window_examples_carry_the_teachers_labels_and_store():
    from fastvista.window_pass import WINDOW_SYSTEM_PROMPT, parse_window_output
    from fastvista.synth.training_set import window_examples

    result = drive(museum_dialogue(), TeacherConfig(), ScriptedBackend())
    first, second = window_examples(result, FORMAT.model_copy(update={'turns_per_call': 2}))
    assert first["prompt"][0]["content"] == WINDOW_SYSTEM_PROMPT and first["id"] == "d0#1-3"
    parsed = parse_window_output(first["completion"][0]["content"], 2)
    assert [[(c.text, c.label) for c in t] for t in parsed] == [[(c.text, c.label) for c in t.claims] for t in result.turns[:2]]
    store_block = second["prompt"][1]["content"].split("[HISTORY]")[0]
    assert all(c in store_block for c in stores_before(result.dialogue.knowledge_init, result.turns)[2])
    # a window with a turn the teacher could not label is left out whole
    result.turns[0].errors = ["claim 1: verify: unreadable"]
    assert [e["id"] for e in window_examples(result, FORMAT.model_copy(update={'turns_per_call': 2}))] == ["d0#5-5"]


def test_the_parse_check_reads_each_example_as_its_student_answers():
    """A window example's answer holds one block per marked turn, with room for all of them; a
    per-turn reader would refuse every right window answer."""
    from fastvista.synth.training_set import window_examples
    from fastvista.text import FormatError
    from fastvista.train.report import answer_reader

    result = drive(museum_dialogue(), TeacherConfig(), ScriptedBackend())
    window = window_examples(result, FORMAT.model_copy(update={'turns_per_call': 2}))[0]
    per_turn = training_examples(result, FORMAT)[0]
    read, budget = answer_reader(window)
    assert budget == 512 and len(read(window["completion"][0]["content"])) == 2
    with pytest.raises(FormatError):
        read(window["completion"][0]["content"].split("[TURN 2]")[0])  # a block missing
    read, budget = answer_reader(per_turn)
    assert budget == 256 and read(per_turn["completion"][0]["content"]) == parse_output(per_turn["completion"][0]["content"])
    with pytest.raises(ValueError, match="no marked turn"):
        answer_reader({**per_turn, "format": window["format"]})
    with pytest.raises(ValueError, match="does not record its format"):
        answer_reader({**per_turn, "format": None})
