"""The scaling curve: its inputs (references cut or grown to a target length from other passages) and the curve over speed runs."""

import json
from pathlib import Path

from fastvista.evaluation.scaling import long_reference, scaling_sets
from fastvista.schema import Dialogue, Turn


def words(text: str) -> int:
    return len(text.split())


def test_a_reference_is_cut_at_a_sentence_or_grown_with_other_passages_only():
    own = "One two three four. Five six seven eight. Nine ten eleven twelve."
    assert long_reference(own, [], 5, words) == "One two three four. Five six seven eight."  # whole sentences up to the target
    pool = ["A b c d e.", own, "F g h i j.", "A b c d e.", "K l m. N o p."]
    grown = long_reference(own, pool, 24, words)
    assert grown.split("\n") == [own, "A b c d e.", "F g h i j.", "K l m."]  # itself and repeats never; the last one cut
    assert words(long_reference(own, pool, 1000, words)) == words(own) + 16  # the pool runs out: all of it, once


def test_each_target_keeps_every_dialogue_and_only_scored_references_change():
    dialogues = [Dialogue(id=f"d{i}", turns=[Turn(role="user", text="hi"),
                                             Turn(role="assistant", text="x", reference=f"Passage {i} has five words."),
                                             Turn(role="assistant", text="y", reference=f"Context {i} stays.", score=False)])
                 for i in range(3)]
    sets = scaling_sets(dialogues, [2, 12], words)
    assert [d.id for d in sets[12]] == ["d0#ref12", "d1#ref12", "d2#ref12"]
    for d, original in zip(sets[12], dialogues):
        reference = d.turns[1].reference
        assert reference.startswith(original.turns[1].reference) and words(reference) >= 12  # its own passage first
        assert d.turns[1].meta["reference_tokens"] == words(reference)
        assert d.turns[2].reference == original.turns[2].reference  # a context turn is left alone
    assert sets[2][0].turns[1].reference == "Passage 0 has five words."  # below its own length: the first sentence


def test_distractors_can_come_from_more_dialogues_than_are_scored():
    passages = [Dialogue(id=f"p{i}", turns=[Turn(role="assistant", text="x", reference=f"Other passage number {i} here.")]) for i in range(5)]
    one = [Dialogue(id="d", turns=[Turn(role="assistant", text="x", reference="Own passage.")])]
    [grown] = scaling_sets(one, [10], words, passages=passages + one)[10]
    assert grown.turns[0].reference.startswith("Own passage.") and "Other passage number" in grown.turns[0].reference


def fake_speed(speedups: dict):
    """A stand-in for one `fastvista eval speed` run: the student's turns/s grows with the point."""
    calls = []

    def measure(settings: dict, folder):
        calls.append(settings)
        data = settings["data"]
        x = data["max_scored_turns"] or int(Path(data["input"]).stem.split("_")[-1])
        rows = {"teacher": 1.0, "teacher, no prefix cache": 0.5, "student": speedups[x]}
        speed = {"speedup": speedups[x], "speedup_over_plain_teacher": speedups[x] * 2, "strongest_teacher_name": "teacher",
                 "configurations": {k: {"turns_per_second": v, "turns": 10, "prompt_tokens_per_turn": 100.0} for k, v in rows.items()}}
        if x == 20:  # the teacher failed one dialogue closed: its rate counts the turns it scored
            speed["configurations"]["teacher"].update(turns=8, failed_dialogues=1)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "speed.json").write_text(json.dumps(speed))
        return speed

    return measure, calls


def test_scaling_curve_finds_where_the_speedup_crosses_6_6x_and_keeps_finished_points(tmp_path):
    from fastvista.evaluation.scaling_curve import ScalingConfig, curve

    files = {n: tmp_path / f"ref_{n}.jsonl" for n in (100, 1000, 4000)}
    for f in [*files.values(), tmp_path / "long.jsonl"]:
        f.write_text("")
    cfg = ScalingConfig(speed={"model": "student"}, references={n: str(f) for n, f in files.items()},
                        dialogues=str(tmp_path / "long.jsonl"), dialogue_turns=[5, 20])
    speedups = {100: 1.5, 1000: 4.0, 4000: 9.2, 5: 1.4, 20: 2.0}
    measure, calls = fake_speed(speedups)
    result = curve(cfg, tmp_path / "out", measure)
    assert len(calls) == 5 and calls[0]["only"] == ["teacher", "teacher, no prefix cache", "student"]
    # every dialogue-length point cuts the same dialogues: those with at least 20 scored turns
    assert [(c["data"]["min_scored_turns"], c["data"]["max_scored_turns"]) for c in calls[3:]] == [(20, 5), (20, 20)]
    # 6.6x between 1,000 tokens (4.0x) and 4,000 (9.2x): 1000 + (6.6 - 4.0) / (9.2 - 4.0) * 3000
    assert result["crossings"]["reference tokens"]["speedup_over_teacher"] == {"at": 2500.0, "direction": "rises above"}
    assert result["crossings"]["reference tokens"]["speedup_over_plain"]["at"] == round(100 + (6.6 - 3.0) / (8.0 - 3.0) * 900, 1)
    # the 20-turn point's teacher failed a dialogue: its ratio is not compared
    assert result["crossings"]["scored turns"]["speedup_over_teacher"] == {"at": None, "note": "below at every comparable point"}
    text = (tmp_path / "out" / "scaling.md").read_text()
    assert "over the teacher, below at every comparable point" in text and (tmp_path / "out" / "scaling.png").stat().st_size > 0
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert rows["| 20"].endswith("| teacher: 1 dialogue failed (8 turns scored) |") and rows["| 5"].endswith("| none |")
    # run again: every point is kept but the teacher row that failed a dialogue, measured again;
    # another model is measured apart, the first run's folders stay
    measure2, calls2 = fake_speed(speedups)
    curve(cfg, tmp_path / "out", measure2)
    assert [(c["data"]["max_scored_turns"], c["only"]) for c in calls2] == [(20, ["teacher"])]
    del calls2[:]
    curve(cfg.model_copy(update={"speed": {"model": "other"}}), tmp_path / "out", measure2)
    assert len(calls2) == 5 and len(list((tmp_path / "out" / "reference").iterdir())) == 6


def test_a_crossing_is_found_either_way_and_a_curve_above_everywhere_says_so():
    from fastvista.evaluation.scaling_curve import crossing

    assert crossing([1, 2, 3], [8, 7, 5]) == {"at": 2.2, "direction": "falls below"}
    assert crossing([1, 2], [7, 9]) == {"at": None, "note": "above at every point"}
    assert crossing([1, 2], [None, None]) == {"at": None, "note": "no comparable point"}
    # never drawn across a point with no comparable ratio: placed between its neighbours
    assert crossing([1000, 2000, 4000], [4.0, None, 9.2]) == {
        "at": None, "direction": "rises above", "note": "rises above it between 1000 and 4000, across a point with no comparable ratio"}


def test_scaling_settings_are_checked_before_any_point_runs(tmp_path):
    import pytest

    from fastvista.evaluation.scaling_curve import ScalingConfig, main

    (tmp_path / "ref.jsonl").write_text("")
    good = {"speed": {"model": "student"}, "references": {100: str(tmp_path / "ref.jsonl")}}
    with pytest.raises(ValueError, match="none.jsonl: no such file"):
        main(ScalingConfig(**{**good, "references": {100: str(tmp_path / "none.jsonl")}}), tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before any folder or engine
    for bad, message in (({"rows": ["teacher", "studnet"]}, "no row named 'studnet'"),
                         ({"rows": ["teacher, no prefix cache", "student"]}, "teacher row"),
                         ({"speed": {"model": "s", "teacher_model": "t"}}, "same weights"),
                         ({"speed": {"model": "s", "max_model_lenn": 1}}, "max_model_lenn"),
                         ({"dialogue_turns": [0, 5]}, "at least 1")):
        with pytest.raises(ValueError, match=message):
            ScalingConfig(**{**good, **bad})


def test_points_without_a_comparable_ratio_are_reported_left_out_of_the_crossing_and_measured_again(tmp_path, monkeypatch):
    """A row that scored nothing has no speed; a row that failed some dialogues has a biased rate.
    Both points are shown with what failed, left out of the crossing, and the CLI exits 3; a rerun
    measures only those rows. Another error stops the run with the summaries of what it measured."""
    from typer.testing import CliRunner

    from fastvista.cli import app
    from fastvista.evaluation.speed import NothingScored

    files = {n: tmp_path / f"ref_{n}.jsonl" for n in (100, 1000, 2000, 4000)}
    for f in files.values():
        f.write_text("")
    cfg = tmp_path / "scaling.yaml"
    cfg.write_text(json.dumps({"speed": {"model": "student"}, "references": {str(n): str(f) for n, f in files.items()}}))
    measure, calls = fake_speed({100: 1.5, 1000: 4.0, 2000: 5.0, 4000: 9.0})
    partial = {"1000": 1}

    def flaky(settings, folder):
        x = settings["data"]["input"].split("_")[-1].split(".")[0]
        if x == "2000":
            calls.append(settings)
            raise NothingScored("teacher", "teacher: no dialogue was scored (3 failed, e.g. [{'reason': 'no label | twice'}])")
        speed = measure(settings, folder)
        if partial.pop(x, None):  # the teacher failed one dialogue closed on the first run only
            speed["configurations"]["teacher"].update(turns=8, failed_dialogues=1)
            (folder / "speed.json").write_text(json.dumps(speed))
        return speed

    monkeypatch.setattr("fastvista.evaluation.speed.main", lambda settings, folder, engines: flaky(settings.model_dump(), folder))
    run = CliRunner().invoke(app, ["eval", "scaling", "-c", str(cfg), "-o", str(tmp_path / "out")])
    assert run.exit_code == 3 and "reference tokens 1000: teacher: 1 dialogue failed (8 turns scored)" in run.output
    assert "reference tokens 2000: no speed: teacher: no dialogue was scored" in run.output
    result = json.loads((tmp_path / "out" / "scaling.json").read_text())
    # 6.6x over the teacher lies between 100 (1.5x) and 4,000 (9.0x), across points with no comparable ratio;
    # over the plain teacher the 1,000 point compares (its plain teacher and student scored all): 3.0x -> 8.0x
    assert result["crossings"]["reference tokens"]["speedup_over_teacher"]["note"].startswith("rises above it between 100 and 4000")
    assert result["crossings"]["reference tokens"]["speedup_over_plain"]["at"] == round(100 + (6.6 - 3.0) / (8.0 - 3.0) * 900, 1)
    rows = {line.split(" | ")[0]: line for line in (tmp_path / "out" / "scaling.md").read_text().splitlines() if line.startswith("| ")}
    assert "| (4.0x, not comparable) | 8.0x |" in rows["| 1000"]
    assert rows["| 2000"].count(" | ") == 7 and "no label \\| twice" in rows["| 2000"] and rows["| 4000"].endswith("| none |")
    # a rerun measures the failed rows only: the teacher at 1,000 (it now scores all) and the point at 2,000
    del calls[:]
    run = CliRunner().invoke(app, ["eval", "scaling", "-c", str(cfg), "-o", str(tmp_path / "out")])
    assert [(c["data"]["input"], c["only"]) for c in calls] == [(str(files[1000]), ["teacher"]), (str(files[2000]), ["teacher", "teacher, no prefix cache", "student"])]
    assert run.exit_code == 3 and "reference tokens 1000:" not in run.output and "reference tokens 2000: no speed: teacher" in run.output
    # any other error stops the run, and the summaries show the points measured before it
    monkeypatch.setattr("fastvista.evaluation.speed.main", lambda settings, folder, engines: (_ for _ in ()).throw(OSError("disk full")))
    run = CliRunner().invoke(app, ["eval", "scaling", "-c", str(cfg), "-o", str(tmp_path / "other"), "--set", "speed.model=other"])
    assert run.exit_code == 2 and "disk full" in run.output
    stopped = json.loads((tmp_path / "other" / "scaling.json").read_text())
    assert stopped["points"] == {} and stopped["stopped"] == "OSError: disk full"
    assert (tmp_path / "other" / "scaling.md").read_text().startswith("**Stopped before the end (OSError: disk full)")


def test_a_row_that_replays_a_row_measured_again_is_measured_again_too(tmp_path):
    """Measuring the student row again drops the rows that replay its answers (speed.py): the
    curve measures them in the same run, so no configured row goes missing unnoticed."""
    from fastvista.evaluation.scaling_curve import ScalingConfig, curve
    from fastvista.evaluation.speed import PREFILL

    (tmp_path / "ref_100.jsonl").write_text("")
    cfg = ScalingConfig(speed={"model": "student"}, references={100: str(tmp_path / "ref_100.jsonl")}, rows=["teacher", "student", PREFILL])
    measure, calls = fake_speed({100: 2.0})
    curve(cfg, tmp_path / "out", measure)
    [folder] = (tmp_path / "out" / "reference").iterdir()
    speed = json.loads((folder / "speed.json").read_text())
    speed["configurations"]["student"]["failed_dialogues"] = 1
    (folder / "speed.json").write_text(json.dumps(speed))
    del calls[:]
    curve(cfg, tmp_path / "out", measure)
    assert [c["only"] for c in calls] == [["student", PREFILL]]
