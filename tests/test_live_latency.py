import threading

import pytest

from fastvista.evaluation.live_latency import LiveLatencyConfig, level, main, replay
from fastvista.infer.live import DialogueState, LiveTeacher
from fastvista.protocol import ScoringFailed, drive
from fastvista.synth.pipeline import TeacherConfig, label_dialogue
from tests.scripted import ScriptedBackend
from tests.test_pipeline import museum_dialogue


@pytest.mark.parametrize("accumulate", [True, False])
def test_live_teacher_scores_each_turn_as_the_batch_teacher_does(accumulate):
    cfg = TeacherConfig(accumulate=accumulate)
    d = museum_dialogue()
    teacher, state, results = LiveTeacher(ScriptedBackend(), cfg), DialogueState(store=list(d.knowledge_init)), []
    for index, turn in enumerate(d.turns):
        if index in d.scored_indices():
            result, state = teacher.score(state, turn.text, turn.reference)
            results.append(result)
        else:
            state = state.with_turn(turn.role, turn.text)
    batch = drive(label_dialogue(d, cfg), ScriptedBackend())
    assert [r.model_dump() for r in results] == [r.model_dump() for r in batch.turns]
    assert state.history == [(t.role, t.text) for t in d.turns]
    assert ("The Louvre is in Paris." in state.store) is accumulate


class Recorder:
    """A live scorer that records the state it is given; fails on a turn whose text says FAIL."""

    config = TeacherConfig()  # its store bound

    def __init__(self, barrier: threading.Barrier | None = None):
        self.seen, self.barrier = [], barrier

    def score(self, state, text, reference=None):
        if self.barrier:
            self.barrier.wait(timeout=10)  # passes only when every session is scoring at once
        self.seen.append((state, text))
        if "FAIL" in text:
            raise ScoringFailed("backend: APIConnectionError")
        from fastvista.memory import turn_result

        result, store = turn_result(len(state.history), [], state.store, 64)
        return result, DialogueState(store=store, history=[*state.history, ("assistant", text)])


def test_replay_times_every_scored_turn_with_the_history_a_guard_keeps():
    d, scorer = museum_dialogue(), Recorder()
    run = replay(scorer, d)
    assert run["failed"] is None and len(run["seconds"]) == len(d.scored_indices()) == 3
    assert all(s >= 0 for s in run["seconds"])
    # the third scored turn (index 5) sees every earlier turn, user and assistant
    state, text = scorer.seen[2]
    assert text == d.turns[5].text and state.history == [(t.role, t.text) for t in d.turns[:5]]
    assert state.store == ["Paris is in France."]


def test_a_failed_turn_ends_its_session_which_is_reported_and_none_of_it_timed():
    d = museum_dialogue()
    d.turns[3].text = "FAIL here."
    scorer = Recorder()
    run = replay(scorer, d)
    assert len(scorer.seen) == 2 and run["seconds"] == []  # the turn before the failure was scored, not timed
    assert run["failed"] == "turn 3: ScoringFailed: backend: APIConnectionError"
    result = level(Recorder(), [d, museum_dialogue(1)], sessions=2)
    assert result["timed_turns"] == 3
    assert result["failed_sessions"] == [{"dialogue": "d0", "reason": run["failed"]}]


def test_the_live_teacher_refuses_settings_it_cannot_use():
    with pytest.raises(ValueError, match="gold_claims"):
        LiveTeacher(ScriptedBackend(), TeacherConfig(gold_claims=True))


def test_sessions_run_at_once_and_every_level_scores_every_dialogue():
    dialogues = [museum_dialogue(i) for i in range(4)]
    result = level(Recorder(threading.Barrier(4)), dialogues, sessions=4)  # would time out unless 4 run at once
    assert result["timed_turns"] == 12 and result["failed_sessions"] == []
    assert result["p50_s"] <= result["p95_s"] <= result["max_s"]


def test_bad_settings_are_refused_before_any_server_starts(tmp_path):
    from fastvista.records_io import write_jsonl

    write_jsonl(tmp_path / "two.jsonl", [museum_dialogue(0), museum_dialogue(1)])
    data = {"input": str(tmp_path / "two.jsonl")}
    with pytest.raises(ValueError, match="sessions"):
        main(LiveLatencyConfig(student_model="x", data=data, sessions=[0]), tmp_path / "out")
    with pytest.raises(ValueError, match="8 at once need as many dialogues"):
        main(LiveLatencyConfig(student_model="x", data=data, sessions=[1, 8]), tmp_path / "out")
    (tmp_path / "teacher.yaml").write_text("teacher: {few_shot: 2}\n")
    with pytest.raises(ValueError, match="backend.model is missing"):
        main(LiveLatencyConfig(student_model="x", data=data, sessions=[2], scorers=["teacher"], teacher_config=str(tmp_path / "teacher.yaml")),
             tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before anything was written
    with pytest.raises(ValueError):
        LiveLatencyConfig(student_model="x", data=data, scorers=["judge"])
