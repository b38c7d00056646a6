import json
import math
from pathlib import Path

import numpy as np
import pytest

from fastvista.evaluation.compare import against_gold, agreement
from fastvista.evaluation.metrics import accuracy, align, correlation, decision_agreement, label_report, paired_accuracy_gap, token_f1
from fastvista.labels import Label
from fastvista.protocol import drive

from fastvista.infer.student import StudentConfig, score_dialogue
from fastvista.synth.pipeline import TeacherConfig, label_dialogue
from tests.scripted import ScriptedBackend, ScriptedStudent
from tests.test_pipeline import museum_dialogue


def test_correlation_with_bootstrap_interval():
    x = np.arange(20.0)
    r = correlation(x, 2 * x + 1)
    assert r["pearson"] == 1.0 and r["spearman"] == 1.0 and r["pearson_ci95"] == [1.0, 1.0]
    noisy = correlation(x, x + np.random.default_rng(0).normal(0, 5, 20))
    assert noisy["pearson_ci95"][0] < noisy["pearson"] < noisy["pearson_ci95"][1]
    assert correlation([1, 1, 1], [1, 2, 3])["pearson"] is None


def test_kappa_is_zero_for_chance_and_one_for_identity():
    assert decision_agreement([True, False, True, False], [True, False, True, False])["kappa"] == 1.0
    chance = decision_agreement([True, True, False, False], [True, False, True, False])
    assert chance["agreement"] == 0.5 and chance["kappa"] == 0.0


def test_alignment_is_one_to_one_and_thresholded():
    predicted = ["The Louvre is in Paris.", "It has a pyramid.", "Cats sleep."]
    reference = ["The Louvre is located in Paris.", "The Louvre has a glass pyramid."]
    sim = np.array([[token_f1(p, r) for r in reference] for p in predicted])
    pairs = align(predicted, reference, sim, threshold=0.3)
    assert sorted(pairs) == [(0, 0), (1, 1)]
    assert align(predicted, reference, sim, threshold=0.99) == []


def test_label_report_keeps_every_label_in_the_confusion_matrix():
    report = label_report(["VERIFIED", "CONTRADICTED", "VERIFIED"], ["VERIFIED", "LACKING_EVIDENCE", "VERIFIED"])
    assert report["accuracy"] == round(2 / 3, 4)
    assert len(report["confusion"]) == 5 and sum(map(sum, report["confusion"])) == 3
    assert report["f1"]["VERIFIED"] == 1.0 and report["f1"]["CONTRADICTED"] == 0.0
    assert math.isclose(report["macro_f1"], 1 / 3, abs_tol=1e-4)  # three labels present


# 3 true positives, 1 false positive, 2 false negatives, 4 true negatives (True: hallucinated)
GOLD = [True] * 3 + [False] + [True] * 2 + [False] * 4
PREDICTED = [True] * 3 + [True] + [False] * 2 + [False] * 4


def test_turn_decisions_get_vistas_metric_with_hallucinated_as_positive():
    assert accuracy(PREDICTED, GOLD) == {
        "n": 10, "accuracy": 0.7,
        "precision": 0.75, "recall": 0.6, "f1": 0.6667,  # 3/4, 3/5, 2*3/(2*3+1+2)
        "macro_f1": 0.697,  # faithful F1 2*4/(2*4+2+1) = 8/11; (2/3 + 8/11) / 2
        "always_hallucinated": 0.5, "always_hallucinated_f1": 0.6667,  # precision 0.5, recall 1
        "always_faithful": 0.5,
    }
    # the baseline's F1 is 2p/(1+p) for a positive share p
    assert accuracy([False] * 10, [True] * 3 + [False] * 7)["always_hallucinated_f1"] == round(2 * 0.3 / 1.3, 4)


def test_turn_metric_on_no_turns_and_on_one_class_gold():
    assert accuracy([], []) == {"n": 0, **dict.fromkeys(["accuracy", "precision", "recall", "f1", "macro_f1", "always_hallucinated",
                                                          "always_hallucinated_f1", "always_faithful"])}
    # no hallucinated turn anywhere: precision, recall and F1 count 0; macro-F1 averages the one class present
    right = accuracy([False, False], [False, False])
    assert (right["accuracy"], right["precision"], right["recall"], right["f1"], right["macro_f1"]) == (1.0, 0.0, 0.0, 0.0, 1.0)
    assert right["always_hallucinated"] == right["always_hallucinated_f1"] == 0.0
    false_alarm = accuracy([True, False], [False, False])  # both classes present: faithful F1 2/3, hallucinated 0
    assert false_alarm["precision"] == false_alarm["f1"] == 0.0 and false_alarm["macro_f1"] == 0.3333
    all_bad = accuracy([True, False], [True, True])
    assert (all_bad["precision"], all_bad["recall"], all_bad["always_hallucinated_f1"]) == (1.0, 0.5, 1.0)


def gold_report(predicted, gold, by_source: dict[str, slice]) -> dict:
    """What `against_gold` writes for turn decisions, from decisions and labels."""
    return {"turn_accuracy": accuracy(predicted, gold),
            "turn_accuracy_by_source": {s: accuracy(predicted[cut], gold[cut]) for s, cut in by_source.items()}}


def test_report_shows_vistas_metric_for_every_scorer_and_source(tmp_path):

    from fastvista.evaluation import report

    (tmp_path / "student.json").write_text(json.dumps(gold_report(PREDICTED, GOLD, {"a": slice(0, 4), "b": slice(4, 10)})))
    # another scorer, on source b only, right on every turn
    (tmp_path / "teacher.json").write_text(json.dumps(gold_report(GOLD[4:], GOLD[4:], {"b": slice(0, 6)})))
    text = report.main(tmp_path / "r.md", gold=[f"student={tmp_path / 'student.json'}", f"teacher={tmp_path / 'teacher.json'}"])
    assert ("| source | scorer | n | accuracy | precision | recall | F1 (halluc. +) | macro-F1 | always halluc. acc / F1 | always faithful |\n"
            "|---|---|---|---|---|---|---|---|---|---|") in text
    assert "| a | student | 4 | 0.75 | 0.75 | 1.0 | 0.8571 | 0.4286 | 0.75 / 0.8571 | 0.25 |" in text  # one false alarm
    assert "| b | student | 6 | 0.6667 | 0.0 | 0.0 | 0.0 | 0.4 | 0.3333 / 0.5 | 0.6667 |" in text  # misses both bad turns
    assert "| b | teacher | 6 | 1.0 | 1.0 | 1.0 | 1.0 | 1.0 | 0.3333 / 0.5 | 0.6667 |" in text
    assert "| a | teacher |" not in text
    assert "| **all** | student | 10 | 0.7 | 0.75 | 0.6 | 0.6667 | 0.697 | 0.5 / 0.6667 | 0.5 |" in text
    assert ("| student against human labels (n=10): accuracy / F1 (hallucinated +) / macro-F1; always hallucinated: accuracy / F1 "
            "| 0.7 / 0.6667 / 0.697; 0.5 / 0.6667 |") in text


def test_teacher_quality_tabulates_vistas_metric(tmp_path):
    from fastvista.evaluation import teacher_quality
    from fastvista.schema import Gold

    # the scripted teacher calls turns 1 and 3 hallucinated, turn 5 (a question) faithful
    dialogues = []
    for i, labels in enumerate(["HHF", "HFF", "FFH", "HHH"]):
        d = museum_dialogue(i)
        for index, label in zip((1, 3, 5), labels):
            d.turns[index].gold = Gold(label="hallucinated" if label == "H" else "faithful")
        dialogues.append(d)
    row = teacher_quality.measure("full", TeacherConfig(), dialogues, ScriptedBackend, {}, tmp_path, 5)
    # 5 true positives, 3 false positives, 2 false negatives, 2 true negatives
    assert (row["turn_accuracy"], row["turn_precision"], row["turn_recall"], row["turn_f1"]) == (0.5833, 0.625, 0.7143, 0.6667)
    assert row["turn_macro_f1"] == round((10 / 15 + 4 / 9) / 2, 4)
    assert (row["always_hallucinated"], row["always_hallucinated_f1"]) == (0.5833, round(14 / 19, 4))
    text = teacher_quality.table({"full": row})
    assert text.startswith("| variant | failed dialogues | turn acc | precision | recall | F1 (halluc. +) | turn macro-F1 | turn acc, attribution reading |")
    assert "| full | 0 | 0.5833 | 0.625 | 0.7143 | 0.6667 | 0.5556 | 0.5833 | - | - |" in text
    assert "full: always-hallucinated turn accuracy / F1 0.5833 / 0.7368 over 12 turns with a human label" in text


def test_student_against_teacher_on_the_same_dialogues():
    dialogues = [museum_dialogue(i) for i in range(6)]
    teacher = [drive(label_dialogue(d, TeacherConfig()), ScriptedBackend()) for d in dialogues]
    student = [drive(score_dialogue(d, StudentConfig(), True), ScriptedStudent()) for d in dialogues]
    report = agreement(student, teacher)
    assert report["turns"]["matched"] == report["turns"]["usable"] == 18
    claims = report["claims"]
    # both split turns into the same sentences: every claim aligns
    assert claims["recall"] == claims["precision"] == 1.0
    # the scripted student never says CONTRADICTED where the teacher does (1 claim per dialogue)
    assert claims["labels_on_aligned"]["accuracy"] == round(1 - 6 / claims["aligned"], 4)
    assert report["hallucinated_decision"]["agreement"] == 1.0
    self_report = agreement(teacher, teacher)
    assert self_report["claims"]["labels_on_aligned"]["accuracy"] == 1.0


def test_claims_written_for_another_turn_are_told_apart_from_claims_of_no_turn():
    dialogues = [museum_dialogue(i) for i in range(3)]
    teacher = [drive(label_dialogue(d, TeacherConfig()), ScriptedBackend()) for d in dialogues]
    # a scorer that writes turn 1's claims for turn 3 (they share one sentence), repeats turn 1's
    # first claim (which turn 3 also says) in turn 1, and writes one claim of no turn for turn 5
    mixed_up = []
    for scored in teacher:
        first, second, third = scored.turns
        stray = first.claims[0].model_copy(update={"text": "Cats sleep fifteen hours a day."})
        mixed_up.append(scored.model_copy(update={"turns": [first.model_copy(update={"claims": [*first.claims, first.claims[0]]}),
                                                             second.model_copy(update={"claims": first.claims}),
                                                             third.model_copy(update={"claims": [stray]})]}))
    report = agreement(mixed_up, teacher)
    sources = report["claim_sources"]
    # per dialogue: turn 1's three claims and the shared sentence in turn 3 are aligned with their own
    # turn; the repeat matches its own turn as well as turn 3, so it stays its own turn's; "I love it."
    # and the pyramid are turn 1's, written for turn 3; the cat is no turn's
    assert (sources["own_turn"], sources["own_turn_again"], sources["another_turn"], sources["neither"]) == (3 * 4, 3 * 1, 3 * 2, 3 * 1)
    assert sources["own_turn"] == report["claims"]["aligned"] and sources["another_turn_share"] == round(6 / 24, 4)
    itself = agreement(teacher, teacher)["claim_sources"]
    assert itself["another_turn"] == itself["neither"] == itself["own_turn_again"] == 0
    assert itself["own_turn"] == sum(len(t.claims) for d in teacher for t in d.turns)


def test_against_gold_counts_unlabelled_turns():
    d = museum_dialogue(0)
    d.turns[1].gold = None
    from fastvista.schema import Gold, GoldClaim

    d.turns[3].gold = Gold(label="hallucinated", claims=[GoldClaim(text="The Mona Lisa hangs in the Louvre.", label=Label.VERIFIED)])
    d.turns[5].gold = Gold(label="hallucinated")
    scored = drive(label_dialogue(d, TeacherConfig()), ScriptedBackend())
    report = against_gold([scored], failed=[{"id": "d9", "reason": "backend: down"}])
    assert report["turns"] == {"labelled": 2, "unlabelled": 1, "failed_dialogues": 1}
    assert report["turn_accuracy"]["accuracy"] == 0.5  # turn 3 hallucinated (right), turn 5 faithful (wrong)
    assert report["claims"]["recall"] == 1.0 and report["claims"]["labels_on_aligned"]["accuracy"] == 1.0
    # read as attribution, turn 5 (no claim) is not attributed: right for a benchmark like BEGIN
    attribution = against_gold([scored], reading="attribution")
    assert attribution["turn_accuracy"]["accuracy"] == 1.0 and attribution["reading"] == "attribution"
    with pytest.raises(ValueError, match="unknown reading"):
        against_gold([scored], reading="strict")


def test_embedding_similarity_prefers_paraphrases():
    from fastvista.evaluation.embedding import embedding_matrix

    sim = embedding_matrix(["The Louvre is located in Paris."], ["The museum called the Louvre is in Paris, France.", "Cats sleep fifteen hours a day."])
    assert sim.shape == (1, 2) and sim[0, 0] > 0.6 > sim[0, 1]


def test_report_tabulates_agreement_gold_and_speed(tmp_path):

    from fastvista.evaluation import report

    dialogues = [museum_dialogue(i) for i in range(6)]
    teacher = [drive(label_dialogue(d, TeacherConfig()), ScriptedBackend()) for d in dialogues]
    student = [drive(score_dialogue(d, StudentConfig(), True), ScriptedStudent()) for d in dialogues]
    a = agreement(student, teacher)
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "g.json").write_text(json.dumps(against_gold(teacher)))
    def row(turns_per_second, calls):
        return {"turns": 18, "calls_per_turn": calls, "prompt_tokens_per_turn": 10, "completion_tokens_per_turn": 2, "rounds": 7,
                "wall_seconds": 18 / turns_per_second, "turns_per_second": turns_per_second}

    speed = {"engine": "e", "dialogues": 6, "speedup": 3.5, "best_student": "student", "strongest_teacher_name": "teacher",
             "strongest_teacher": 2.0, "configurations": {"teacher": row(2.0, 4.0), "teacher, no prefix cache": row(0.5, 4.0),
                                                          "student": row(7.0, 1.0)}}
    (tmp_path / "s.json").write_text(json.dumps(speed))
    text = report.main(tmp_path / "r.md", tmp_path / "a.json", [f"teacher={tmp_path / 'g.json'}"], tmp_path / "s.json")
    assert f"| {a['hallucinated_decision']['agreement']} / {a['hallucinated_decision']['kappa']} |" in text
    assert f"| {a['claims']['labels_on_aligned']['accuracy']} / {a['claims']['labels_on_aligned']['macro_f1']} |" in text
    assert "**Speedup: 3.5x**" in text and (tmp_path / "r.md").read_text() == text
    # each configuration against the strongest teacher and against the plain one
    assert "| student | 18 | 1.0 | 10 | 2 | 7 | 2.5714285714285716 | 7.0 | 3.50x | 14.00x |" in text
    headline = report.main(tmp_path / "h.md", speed_file=tmp_path / "s.json", headline_only=True)
    assert "| speedup: student over teacher (same engine, same weights, 18 turns) | **3.5x** |" in headline
    (tmp_path / "s.json").write_text(json.dumps({**speed, "settings": {"teacher_model": "big-teacher"}}))  # each on its own weights
    headline = report.main(tmp_path / "h.md", speed_file=tmp_path / "s.json", headline_only=True)
    assert "(same engine kind, the teacher on its own weights (big-teacher), 18 turns) | **3.5x** |" in headline


def test_forced_windows_ask_for_exactly_the_per_turn_claims():
    import re

    from fastvista.llm import Completion
    from fastvista.evaluation.speed import forced_windows, literal_regex
    from fastvista.infer.student import score_dialogue as student_machine
    from tests.test_student import long_chat

    per_turn = drive(student_machine(long_chat(), StudentConfig(), True), ScriptedStudent())
    claims = {(per_turn.id, t.index): t.claims for t in per_turn.turns}

    class Echo:
        """Answers each forced request with the one text its regex allows."""

        def __init__(self):
            self.requests = []

        def generate(self, requests):
            self.requests += requests
            return [Completion(text=re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), r.regex), completion_tokens=9) for r in requests]

    echo = Echo()
    result = drive(forced_windows(long_chat(), 2, claims, 8), echo)
    assert len(echo.requests) == 2 and all(re.fullmatch(r.regex, re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), r.regex)) for r in echo.requests)
    assert [[(c.text, c.label) for c in t.claims] for t in result.turns] == [[(c.text, c.label) for c in t.claims] for t in per_turn.turns]
    assert [t.store_added for t in result.turns] == [t.store_added for t in per_turn.turns] and not any(t.errors for t in result.turns)
    assert [t.usage.completion_tokens for t in result.turns] == [9, 0, 9, 0]
    assert re.fullmatch(literal_regex("a.b (c) | [d]\n"), "a.b (c) | [d]\n") and not re.fullmatch(literal_regex("a.b"), "axb")


def _speed_setup(tmp_path, monkeypatch, **settings):
    """A speed run on scripted engines: the student's on its weights, the teacher's on its own."""
    from fastvista.evaluation import speed
    from fastvista.records_io import write_jsonl
    from tests.scripted import ScriptedBackend, ScriptedStudent

    data = tmp_path / "dialogues.jsonl"
    write_jsonl(data, [museum_dialogue(i) for i in range(3)])
    teacher_config = tmp_path / "teacher.yaml"
    teacher_config.write_text("teacher: {label_scores: false}\n")
    student, teacher = tmp_path / "student", tmp_path / "teacher"
    student.mkdir(), teacher.mkdir()
    started = []

    def engine(model, args, **changes):
        started.append(Path(model).name)
        return (ScriptedStudent if model == str(student) else ScriptedBackend)()

    monkeypatch.setattr(speed, "engine", engine)
    own_teacher = {} if settings.get("served") else {"teacher_model": str(teacher)}  # served rows share the student's weights
    return speed, started, speed.SpeedConfig(model=str(student), data={"input": str(data)}, teacher_config=str(teacher_config),
                                             skip_plain=True, **own_teacher, **settings)


def test_speed_refuses_a_row_whose_base_row_is_missing_before_any_engine_starts(tmp_path, monkeypatch):
    speed, started, cfg = _speed_setup(tmp_path, monkeypatch, only=["teacher", "student + n-gram"])
    with pytest.raises(ValueError, match="'student \\+ n-gram' replays or repeats the answers of 'student'"):
        speed.main(cfg, tmp_path / "out")
    assert started == [] and not (tmp_path / "out" / "speed.json").exists()


def test_speed_drops_kept_rows_that_replayed_answers_measured_again(tmp_path, monkeypatch):
    """The prefill rows replay the student row's answers: when the student row is measured again,
    the prefill rows kept from before describe answers that are gone, and are dropped."""
    speed, started, cfg = _speed_setup(tmp_path, monkeypatch, only=["teacher", "student", speed_rows()[0]])
    first = speed.main(cfg, tmp_path / "out")
    assert list(first["configurations"]) == ["teacher", "student", speed_rows()[0]]
    again = speed.main(cfg.model_copy(update={"only": ["student"]}), tmp_path / "out")
    assert list(again["configurations"]) == ["teacher", "student"]
    assert again["configurations"]["teacher"] == first["configurations"]["teacher"]


def test_speed_keeps_no_row_that_this_version_no_longer_measures(tmp_path, monkeypatch):
    """A row renamed or retired since speed.json was written describes settings no row has now."""
    import json

    speed, started, cfg = _speed_setup(tmp_path, monkeypatch, only=["teacher", "student"])
    first = speed.main(cfg, tmp_path / "out")
    stored = json.loads((tmp_path / "out" / "speed.json").read_text())
    stored["configurations"]["student, a retired row"] = first["configurations"]["student"]
    (tmp_path / "out" / "speed.json").write_text(json.dumps(stored))
    again = speed.main(cfg.model_copy(update={"only": [speed.ENDED]}), tmp_path / "out")
    assert list(again["configurations"]) == ["teacher", "student", speed.ENDED]
    assert again["configurations"][speed.ENDED]["identical"]["turns"] == first["configurations"]["student"]["turns"]


def speed_rows():
    from fastvista.evaluation.speed import PREFILL, PREFILL_REFERENCE_FIRST

    return PREFILL, PREFILL_REFERENCE_FIRST


def test_speed_measures_a_served_row_behind_its_server(tmp_path, monkeypatch):
    from contextlib import contextmanager

    speed, started, cfg = _speed_setup(tmp_path, monkeypatch, served=True, only=["student, served, waves"])
    from tests.scripted import ScriptedStudent

    resets, server = [], []

    @contextmanager
    def running(cmd, url, log, **kwargs):
        server.append(url)
        yield None

    monkeypatch.setattr(speed, "running", running)
    monkeypatch.setattr(speed, "reset_prefix_cache", resets.append)
    monkeypatch.setattr(speed, "make_backend", lambda config: ScriptedStudent())
    with pytest.raises(ValueError, match="speed.json holds 'student, served, waves', and the ratios need a teacher row"):  # no ratio yet
        speed.main(cfg, tmp_path / "out")
    kept = json.loads((tmp_path / "out" / "speed.json").read_text())["configurations"]
    assert list(kept) == ["student, served, waves"] and kept["student, served, waves"]["turns"] == 9
    assert server == resets == [f"http://127.0.0.1:{cfg.port}/v1"] and started == []


def test_prompts_alone_replays_the_students_very_prompts_for_one_token():
    from fastvista.evaluation.speed import prompts_alone
    from fastvista.infer.student import score_dialogue as student_machine
    from tests.test_student import long_chat

    student = ScriptedStudent()
    per_turn = drive(student_machine(long_chat(), StudentConfig(), True), student)
    recorded = {(per_turn.id, t.index): t for t in per_turn.turns}
    replay = ScriptedStudent()
    result = drive(prompts_alone(long_chat(), recorded, StudentConfig()), replay)
    # the store grows from the recorded answers, so every prompt is the one the student saw
    assert [r.messages for r in replay.requests] == [r.messages for r in student.requests]
    assert all(r.max_tokens == 1 and r.regex is None for r in replay.requests)
    assert [t.claims for t in result.turns] == [t.claims for t in per_turn.turns]


def test_prefill_alone_reference_first_reorders_the_very_same_sections():
    """The layout row times the same prompts in another order: same sections, same text, the
    reference first, so two consecutive turns citing one passage share a longer prefix."""
    from fastvista.evaluation.prefix_reuse import LAYOUTS
    from fastvista.evaluation.speed import REFERENCE_FIRST, prompts_alone
    from fastvista.infer.student import score_dialogue as student_machine
    from fastvista.single_pass import SECTIONS, split_sections
    from tests.test_student import long_chat

    per_turn = drive(student_machine(long_chat(), StudentConfig(), True), ScriptedStudent())
    recorded = {(per_turn.id, t.index): t for t in per_turn.turns}
    today, reordered = ScriptedStudent(), ScriptedStudent()
    drive(prompts_alone(long_chat(), recorded, StudentConfig()), today)
    drive(prompts_alone(long_chat(), recorded, StudentConfig(), LAYOUTS[REFERENCE_FIRST][0]), reordered)
    assert len(today.requests) == len(reordered.requests) == 4
    for a, b in zip(today.requests, reordered.requests):
        assert a.messages[0] == b.messages[0] and b.max_tokens == 1
        assert b.messages[1]["content"].startswith("[REFERENCE]") and a.messages[1]["content"].startswith("[KNOWLEDGE STORE]")
        assert split_sections(a.messages[1]["content"]) == split_sections(b.messages[1]["content"])
        assert set(split_sections(b.messages[1]["content"])) == set(SECTIONS)


def test_the_speed_benchmark_times_a_student_in_the_format_its_weights_record(tmp_path):
    """A compact-format student is timed with its own prompts: the format.json beside its merged
    weights sets the rendering, and its prompts alone are those it was trained on."""
    from fastvista.contract import StudentFormat, write_format
    from fastvista.evaluation.speed import REFERENCE_FIRST, prompts_alone
    from fastvista.infer.run import trained_rendering
    from fastvista.evaluation.prefix_reuse import LAYOUTS
    from fastvista.single_pass import SYSTEM_PROMPTS
    from tests.test_student import long_chat

    write_format(tmp_path, StudentFormat(history_turns=4, max_store_claims=32, layout="reference-first", answer="coded"))
    rendering = trained_rendering(str(tmp_path))
    assert rendering == {"history_turns": 4, "max_store_claims": 32, "layout": "reference-first", "answer": "coded"}
    assert trained_rendering(str(tmp_path / "a-base-model")) == {}
    per_turn = drive(score_dialogue(long_chat(), StudentConfig(), True), ScriptedStudent())
    recorded = {(per_turn.id, t.index): t for t in per_turn.turns}
    coded, reordered = ScriptedStudent(), ScriptedStudent()
    drive(prompts_alone(long_chat(), recorded, StudentConfig(**{**rendering, "history_turns": 8})), coded)
    drive(prompts_alone(long_chat(), recorded, StudentConfig(), LAYOUTS[REFERENCE_FIRST][0]), reordered)
    for a, b in zip(coded.requests, reordered.requests, strict=True):
        assert a.messages[0]["content"] == SYSTEM_PROMPTS["coded"] and a.messages[1] == b.messages[1]


def test_a_paired_gap_is_the_difference_of_accuracies_and_pairing_narrows_its_interval():
    student = [True] * 40 + [False] * 60
    same_turns = paired_accuracy_gap(student, student)
    assert same_turns["gap"] == 0 and same_turns["ci95"] == [0, 0]  # right and wrong on the same turns: no doubt about the gap
    teacher = [True] * 50 + [False] * 50
    gap = paired_accuracy_gap(student, teacher)
    assert gap["n"] == 100 and gap["gap"] == pytest.approx(-0.10) and gap["ci95"][0] < -0.10 < gap["ci95"][1] < 0
    with pytest.raises(ValueError, match="100 items against 99"):
        paired_accuracy_gap(student, teacher[:99])


def test_speed_stops_each_engine_before_the_next_and_keeps_the_rows_a_later_failure_would_lose(tmp_path, monkeypatch):
    """Two engines at once do not fit a small machine: each row's engine starts after the last
    one stopped. A row that fails (here the third engine cannot start) loses none measured
    before it, and `--only` runs the rest into the same table."""
    from fastvista.evaluation import speed
    from fastvista.records_io import write_jsonl
    from tests.scripted import ScriptedBackend, ScriptedStudent

    data = tmp_path / "dialogues.jsonl"
    write_jsonl(data, [museum_dialogue(i) for i in range(3)])
    teacher_config = tmp_path / "teacher.yaml"
    teacher_config.write_text("teacher: {label_scores: false}\n")
    student, teacher = tmp_path / "student", tmp_path / "teacher"
    student.mkdir(), teacher.mkdir()
    events, memory_left = [], {"engines": 2}

    def engine(model, args, **changes):
        if memory_left["engines"] == 0:
            raise RuntimeError("not enough memory for another engine")
        memory_left["engines"] -= 1
        backend = (ScriptedStudent if model == str(student) else ScriptedBackend)()
        backend.close = lambda: events.append(("stop", Path(model).name))
        if "speculative" in changes:  # a drafting engine counts its drafts, as vLLM's does
            counts = iter([{"draft_tokens": 5, "accepted_tokens": 1}, {"draft_tokens": 45, "accepted_tokens": 31}])
            backend.speculation = lambda: next(counts)  # read before the row and after it
        events.append(("start", Path(model).name))
        return backend

    monkeypatch.setattr(speed, "engine", engine)
    cfg = speed.SpeedConfig(model=str(student), teacher_model=str(teacher), data={"input": str(data)}, teacher_config=str(teacher_config),
                            skip_plain=True, only=["teacher", "student", "student + n-gram"])
    with pytest.raises(RuntimeError, match="another engine"):
        speed.main(cfg, tmp_path / "out")
    assert events == [("start", "teacher"), ("stop", "teacher"), ("start", "student"), ("stop", "student")]
    kept = json.loads((tmp_path / "out" / "speed.json").read_text())
    assert list(kept["configurations"]) == ["teacher", "student"] and kept["configurations"]["student"]["turns"] == 9
    assert kept["speedup"] == round(kept["configurations"]["student"]["turns_per_second"] / kept["configurations"]["teacher"]["turns_per_second"], 2)

    memory_left["engines"] = 1
    result = speed.main(cfg.model_copy(update={"only": ["student + n-gram"]}), tmp_path / "out")
    assert list(result["configurations"]) == ["teacher", "student", "student + n-gram"]
    assert result["configurations"]["teacher"] == kept["configurations"]["teacher"]  # kept, not measured again
    assert result["configurations"]["student + n-gram"]["identical"]["identical"] == 9
    assert "30 of 40 drafted tokens accepted (0.75); outputs identical to greedy without drafting on 9 of 9 turns" \
        in (tmp_path / "out" / "speed.md").read_text()


def test_a_speed_row_keeps_each_failed_dialogue_with_its_reason_and_one_that_scored_nothing_has_no_speed(tmp_path, monkeypatch):
    """A dialogue the teacher cannot read fails closed: the row's rate counts the turns it scored,
    and the row's failures file names the dialogue and why. A row that scored nothing has no speed."""
    from fastvista.records_io import write_jsonl

    def read_jsonl(path):
        return [json.loads(line) for line in path.read_text().splitlines()]

    speed, started, cfg = _speed_setup(tmp_path, monkeypatch, only=["teacher", "student"])
    garbled = museum_dialogue(2)
    garbled.turns[1].text = "The GARBLE is loud."
    write_jsonl(Path(cfg.data.input), [museum_dialogue(0), museum_dialogue(1), garbled])
    result = speed.main(cfg, tmp_path / "out")
    row = result["configurations"]["teacher"]
    assert row["failed_dialogues"] == 1 and row["turns"] == 6 and result["rows_with_failed_dialogues"] == {"teacher": 1}
    assert "Not comparable: teacher failed 1 dialogue(s) closed" in (tmp_path / "out" / "speed.md").read_text()
    [failure] = read_jsonl(Path(row["failures"]))
    assert failure["id"] == "d2" and "I cannot say" in failure["reason"]
    write_jsonl(Path(cfg.data.input), [garbled])
    with pytest.raises(speed.NothingScored, match="teacher: no dialogue was scored .*all in .*teacher.failed.jsonl"):
        speed.main(cfg.model_copy(update={"only": ["teacher"]}), tmp_path / "out2")
    assert [f["id"] for f in read_jsonl(tmp_path / "out2" / "teacher.failed.jsonl")] == ["d2"]


def test_a_row_measured_again_that_fails_leaves_no_figure_of_its_earlier_run(tmp_path, monkeypatch):
    """Measuring a row again replaces its files: if the new run scores nothing, speed.json must not
    keep the old figures beside them (the other rows stay)."""
    from fastvista.llm import Completion
    from tests.scripted import ScriptedBackend

    speed, started, cfg = _speed_setup(tmp_path, monkeypatch, only=["teacher", "student"])
    speed.main(cfg, tmp_path / "out")

    class Down(ScriptedBackend):  # a backend reports a failed call in the completion, after its own retries
        def generate(self, requests):
            return [Completion(text="", error="server down") for _ in requests]

    monkeypatch.setattr(speed, "engine", lambda model, args, **changes: Down())
    with pytest.raises(speed.NothingScored):
        speed.main(cfg.model_copy(update={"only": ["teacher"]}), tmp_path / "out")
    kept = json.loads((tmp_path / "out" / "speed.json").read_text())
    assert list(kept["configurations"]) == ["student"] and "speedup" not in kept
    assert not (tmp_path / "out" / "speed.md").exists()
    reasons = [json.loads(line)["reason"] for line in (tmp_path / "out" / "teacher.failed.jsonl").read_text().splitlines()]
    assert len(reasons) == 3 and all("server down" in r for r in reasons)


def test_a_row_that_replays_answers_whose_file_is_gone_is_refused_before_any_engine_starts(tmp_path, monkeypatch):
    speed, started, cfg = _speed_setup(tmp_path, monkeypatch, only=["teacher", "student"])
    first = speed.main(cfg, tmp_path / "out")
    Path(first["configurations"]["student"]["results"]).unlink()
    del started[:]
    with pytest.raises(ValueError, match="replays or repeats the answers of 'student'"):
        speed.main(cfg.model_copy(update={"only": [speed_rows()[0]]}), tmp_path / "out")
    assert started == []


def _human_labelled_scores():
    """Three museum dialogues scored by the scripted teacher, with human labels on their three
    scored turns: turn 1 faithful (the teacher calls it hallucinated: wrong), turn 3 hallucinated
    (right), turn 5 faithful (no claim, not hallucinated: right)."""
    from fastvista.schema import Gold

    scored = []
    for i in range(3):
        d = museum_dialogue(i)
        for index, label in ((1, "faithful"), (3, "hallucinated"), (5, "faithful")):
            d.turns[index].gold = Gold(label=label)
        scored.append(drive(label_dialogue(d, TeacherConfig()), ScriptedBackend()))
    return scored


def _flipped(scored, keep: int):
    """A scorer deciding the opposite on every turn, saying VERIFIED for every claim, that scored
    only the first `keep` dialogues (the others failed)."""
    return [d.model_copy(update={"turns": [t.model_copy(update={"hallucinated": not t.hallucinated,
                                                                 "claims": [c.model_copy(update={"label": Label.VERIFIED}) for c in t.claims]})
                                            for t in d.turns]}) for d in scored[:keep]]


def test_paired_gold_compares_scorers_on_the_turns_all_scored_and_shows_where_each_label_goes():
    from fastvista.evaluation.compare import paired_gold, paired_table

    teacher = _human_labelled_scores()
    report = paired_gold({"teacher": teacher, "flipped": _flipped(teacher, keep=2)}, failed={"flipped": 1})
    assert report["turns"] == {"compared": 6, "left_out": {"teacher": 3, "flipped": 0}, "unlabelled": {"teacher": 0, "flipped": 0},
                               "failed_dialogues": {"teacher": 0, "flipped": 1}}
    assert report["accuracy"] == {"teacher": round(4 / 6, 4), "flipped": round(2 / 6, 4)}
    gap = report["paired_gaps"]["teacher - flipped"]
    assert gap["n"] == 6 and gap["gap"] == pytest.approx(2 / 6, abs=1e-4) and gap["ci95"][0] <= gap["gap"] <= gap["ci95"][1]
    # the teacher's faithful turns hold turn 1's verified, out-of-scope and lacking claims (turn 5 has none);
    # its hallucinated turns hold turn 3's two verified claims and a contradicted one
    shares = report["label_shares"]["teacher"]
    third = round(1 / 3, 4)
    assert shares["faithful"] == {"claims": 6, "counts": {"LACKING_EVIDENCE": 2, "OUT_OF_SCOPE": 2, "VERIFIED": 2},
                                  "shares": {"LACKING_EVIDENCE": third, "OUT_OF_SCOPE": third, "VERIFIED": third}}
    assert shares["hallucinated"] == {"claims": 6, "counts": {"CONTRADICTED": 2, "VERIFIED": 4},
                                      "shares": {"CONTRADICTED": third, "VERIFIED": round(2 / 3, 4)}}
    assert report["label_shares"]["flipped"]["faithful"] == {"claims": 6, "counts": {"VERIFIED": 6}, "shares": {"VERIFIED": 1.0}}
    table = paired_table(report)
    assert "| teacher - flipped | +0.333 [" in table and "flipped 0 turns, 0 unlabelled, 1 failed dialogues" in table
    assert "| flipped | 0.333 | 6 / 6 | 0.0% / 0.0% | 0.0% / 0.0% | 0.0% / 0.0% | 100.0% / 100.0% |" in table


def test_paired_gold_shows_no_share_where_a_scorer_wrote_no_claim():
    from fastvista.evaluation.compare import paired_gold, paired_table

    teacher = _human_labelled_scores()
    silent = [d.model_copy(update={"turns": [t.model_copy(update={"claims": []}) for t in d.turns]}) for d in teacher]
    report = paired_gold({"teacher": teacher, "silent": silent})
    nothing = {"claims": 0, "counts": {}, "shares": {}}
    assert report["label_shares"]["silent"] == {"faithful": nothing, "hallucinated": nothing}
    assert "| silent | 0.667 | 0 / 0 | - / - | - / - | - / - | - / - |" in paired_table(report)


def test_paired_gold_refuses_what_it_cannot_pair():
    from fastvista.evaluation.compare import paired_gold
    from fastvista.schema import Gold

    teacher = _human_labelled_scores()
    with pytest.raises(ValueError, match="at least two"):
        paired_gold({"teacher": teacher})
    with pytest.raises(ValueError, match="no human-labelled turn was scored by every scorer"):
        paired_gold({"first": teacher[:1], "others": teacher[1:]})
    with pytest.raises(ValueError, match="twice holds dialogue d0 2 times"):
        paired_gold({"teacher": teacher, "twice": teacher + teacher[:1]})
    relabelled = [d.model_copy(deep=True) for d in teacher]
    relabelled[1].dialogue.turns[3].gold = Gold(label="faithful")
    with pytest.raises(ValueError, match="dialogue d1 turn 3 differs between teacher and relabelled \\(human label hallucinated against faithful"):
        paired_gold({"teacher": teacher, "relabelled": relabelled})
    reworded = [d.model_copy(deep=True) for d in teacher]
    reworded[2].dialogue.turns[1].text = "Something else."
    with pytest.raises(ValueError, match="dialogue d2 turn 1 differs between teacher and reworded \\(its text\\)"):
        paired_gold({"teacher": teacher, "reworded": reworded})
    unlabelled = [d.model_copy(deep=True) for d in teacher]
    for d in unlabelled:
        for turn in d.dialogue.turns:
            turn.gold = None
    with pytest.raises(ValueError, match="unlabelled scored no human-labelled turn"):
        paired_gold({"teacher": teacher, "unlabelled": unlabelled})
    stray = [d.model_copy(deep=True) for d in teacher]
    stray[0].turns[0].index = 99
    with pytest.raises(ValueError, match="dialogue d0: a result for turn 99, which its dialogue \\(7 turns\\) does not have"):
        paired_gold({"teacher": teacher, "stray": stray})


def test_eval_paired_reads_named_results_and_refuses_unclear_arguments(tmp_path):
    from typer.testing import CliRunner

    from fastvista.cli import app
    from fastvista.records_io import write_jsonl

    teacher = _human_labelled_scores()
    write_jsonl(tmp_path / "teacher.jsonl", teacher)
    write_jsonl(tmp_path / "flipped.jsonl", _flipped(teacher, keep=3))
    ran = CliRunner().invoke(app, ["eval", "paired", f"teacher={tmp_path / 'teacher.jsonl'}", f"flipped={tmp_path / 'flipped.jsonl'}",
                                   "-o", str(tmp_path / "paired.json")])
    assert ran.exit_code == 0, ran.output
    assert "| teacher - flipped | +0.333 [" in ran.output
    assert json.loads((tmp_path / "paired.json").read_text())["turns"]["compared"] == 9
    for args, message in (([f"a={tmp_path / 'teacher.jsonl'}", f"a={tmp_path / 'flipped.jsonl'}"], "a is given twice"),
                          ([f"a={tmp_path / 'teacher.jsonl'}", f"b={tmp_path / 'gone.jsonl'}"], "gone.jsonl"),
                          ([f"a={tmp_path / 'teacher.jsonl'}", "b="], "give NAME=RESULTS"),
                          ([f"a={tmp_path / 'teacher.jsonl'}", f"={tmp_path / 'flipped.jsonl'}"], "give NAME=RESULTS"),
                          ([f"a={tmp_path / 'teacher.jsonl'}", f"b={tmp_path / 'teacher.jsonl'}"], "is given as a and as b")):
        refused = CliRunner().invoke(app, ["eval", "paired", *args])
        assert refused.exit_code == 2 and message in refused.output, (args, refused.output)
