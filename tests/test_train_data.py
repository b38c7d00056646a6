import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastvista.records_io import RecordError
from fastvista.train.data import enforce_max_length, oversample, read_examples, split_by_dialogue


def examples_of(turns_per_dialogue: list[int]) -> list[dict]:
    return [
        {"id": f"d{d}#{t}", "dialogue_id": f"d{d}", "prompt": [], "completion": []}
        for d, n in enumerate(turns_per_dialogue)
        for t in range(n)
    ]


@settings(max_examples=100)
@given(st.lists(st.integers(1, 6), min_size=2, max_size=40), st.floats(0.05, 0.5), st.integers(0, 5))
def test_split_holds_out_whole_dialogues(turns, fraction, seed):
    examples = examples_of(turns)
    train, held_out = split_by_dialogue(examples, fraction, seed)
    train_ids = {e["dialogue_id"] for e in train}
    eval_ids = {e["dialogue_id"] for e in held_out}
    assert not train_ids & eval_ids
    assert len(train) + len(held_out) == len(examples)
    assert 1 <= len(eval_ids) < len(turns)
    assert (train, held_out) == split_by_dialogue(examples, fraction, seed)  # reproducible


def test_long_examples_are_counted_then_dropped_or_refused():
    examples = examples_of([3])
    kept, report = enforce_max_length(examples, [10, 50, 20], max_length=30, policy="drop")
    assert [e["id"] for e in kept] == ["d0#0", "d0#2"]
    assert report["too_long"] == 1 and report["too_long_ids"] == ["d0#1"] and report["max_tokens_seen"] == 50
    with pytest.raises(ValueError, match="d0#1 \\(50 tokens\\)"):
        enforce_max_length(examples, [10, 50, 20], max_length=30, policy="fail")


def test_read_examples_names_the_line_and_field(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(examples_of([1])[0]) + "\n" + json.dumps({"prompt": [], "completion": []}) + "\n")
    with pytest.raises(RecordError) as err:
        read_examples(path)
    assert (err.value.line, err.value.field) == (2, "dialogue_id")


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parent.parent / "configs" / "sft").glob("*.yaml")))
def test_shipped_configs_parse_and_overrides_win(name):
    from fastvista.train.sft import check_choices, make_parser

    config = Path(__file__).parent.parent / "configs" / "sft" / name
    on_this_cpu = ["--bf16", "false", "--use_cpu", "true"]  # the 8B config is for GPUs; here only its parsing
    student, training, model = make_parser().parse_args_and_config(["--config", str(config), "--train_file", "x.jsonl", "--learning_rate", "0.123", *on_this_cpu])
    assert student.train_file == "x.jsonl" and training.learning_rate == 0.123
    assert model.use_peft and training.max_length >= 1024 and student.too_long == "drop"
    check_choices((student, training, model), str(config))


def test_a_config_value_outside_its_choices_is_refused_with_its_file_and_line(tmp_path):
    from fastvista.train.sft import check_choices, make_parser

    config = tmp_path / "student.yaml"
    config.write_text("model_name_or_path: m\nuse_cpu: true\ntrain_sampling_strategy: random\n'train_sampling_strategy' : by_length\n")
    parsed = make_parser().parse_args_and_config(["--config", str(config), "--train_file", "x.jsonl"])
    with pytest.raises(ValueError, match=rf"{config}, line 4: train_sampling_strategy: 'by_length' is not one of .*group_by_length"):
        check_choices(parsed, str(config))
    overridden = make_parser().parse_args_and_config(["--config", str(config), "--train_file", "x.jsonl",
                                                      "--train_sampling_strategy", "group_by_length"])
    check_choices(overridden, str(config))  # the command line's valid value wins over the file's


def test_train_speed_runs_each_variant_as_the_training_script_with_its_keys(tmp_path):
    from fastvista.train.throughput import TrainSpeedConfig, row, table, variant_command

    cfg = TrainSpeedConfig(sft_config="configs/sft/smollm2_corpus_cpu.yaml", max_steps=3,
                           variants={"bf16": {"dtype": "bfloat16", "bf16": True}})
    cmd = variant_command(cfg, cfg.variants["bf16"], tmp_path / "bf16")
    assert cmd[1:5] == ["launch", "--config_file", "configs/accelerate/cpu.yaml", "train/sft.py"]
    args = dict(zip(cmd[7::2], cmd[8::2]))
    assert args["--max_steps"] == "3" and args["--bf16"] == "true" and args["--save_strategy"] == "no"
    assert args["--output_dir"] == str(tmp_path / "bf16") and args["--merge"] == "false"
    assert args["--logging_steps"] == "1"  # the steady throughput needs the token count at every step
    assert args["--eval_file"] == "" and args["--eval_fraction"] == "0"  # a speed run spends nothing on validation
    fast = row({"tokens_per_s": 300.0, "steady_tokens_per_s": 320.0, "peak_memory_mb": 900, "loss": [{"step": 3, "loss": 1.5}],
                "examples": {"train": 40}, "precision": {"mixed_precision": "no", "dtype": "float32", "note": "trained in float32",
                                                         "lm_head_positions": "answer"}})
    slow = row({"tokens_per_s": 150.0, "peak_memory_mb": 1200, "loss": [{"step": 3, "loss": 1.6}], "examples": {"train": 40}})
    text = table({"fast": fast, "slow": slow})
    # one measure for all rows; each row says what it trained in (a bf16 variant can fall back to float32) and which
    # positions its LM head projected (a record from before the setting has none)
    assert "| fast | no mixed, float32 weights | answer | 300.0 | 320.0 | 1.00 | 900 | 1.5 | 40 |" in text
    assert "| slow | - | - | 150.0 | - | 0.50 |" in text


def test_steady_throughput_leaves_out_the_first_step_and_what_falls_between_steps():
    from fastvista.train.report import steady_tokens_per_s

    seconds = {1: 9.0, 2: 1.0, 3: 1.0, 4: 2.0}  # an evaluation after step 3 would not be in any step's time
    history = [{"step": 1, "num_tokens": 1000, "loss": 2.0}, {"step": 2, "num_tokens": 1500}, {"step": 3, "num_tokens": 2100},
               {"step": 3, "eval_loss": 1.9}, {"step": 4, "num_tokens": 2500}]
    assert steady_tokens_per_s(seconds, history) == (2500 - 1000) / (1.0 + 1.0 + 2.0)
    assert steady_tokens_per_s(seconds, history[:1]) is None  # one logged step: nothing after the first
    resumed = {3: 1.0, 4: 2.0}  # a resumed run times (and counts tokens) from its restart only
    assert steady_tokens_per_s(resumed, [{"step": 3, "num_tokens": 400}, {"step": 4, "num_tokens": 800}]) == 400 / 2.0


def test_snapshot_steps_fall_where_sequential_training_has_seen_the_first_n_kept_examples():
    from fastvista.train.data import snapshot_steps

    ids = [f"e{i}" for i in range(10)]
    assert snapshot_steps(ids, set(), [4, 5, 10], batch=4) == {1: 4, 2: 5, 3: 10}
    # e1 and e2 were too long: the first 5 examples are 3 kept ones, all in the first batch
    assert snapshot_steps(ids, {"e1", "e2"}, [5, 8], batch=4) == {1: 5, 2: 8}
    assert snapshot_steps(ids, {"e0"}, [1], batch=4) == {}  # nothing of the first one is trained on
    with pytest.raises(ValueError, match="same step 2"):
        snapshot_steps(ids, set(), [5, 6], batch=4)


@settings(max_examples=100)
@given(st.integers(1, 30), st.integers(1, 200), st.floats(0.05, 0.95), st.integers(0, 5))
def test_oversampling_raises_the_labelled_share_and_keeps_every_other_turn_once(rare, common, share, seed):
    examples = [{"id": f"r{i}", "labels": ["V", "L"]} for i in range(rare)] + [{"id": f"c{i}", "labels": ["L"]} for i in range(common)]
    try:
        out, report = oversample(examples, lambda e: e["labels"], "V", share, seed)
    except ValueError as e:  # asked for no more than the turns already make (to a turn), or for more copies than allowed
        assert ("repeat none" in str(e) and share < (rare + 1) / (rare + common + 1)) or "at most" in str(e)
        return
    ids = [e["id"] for e in out]
    assert ids[:len(examples)] == [e["id"] for e in examples]  # the originals first, in order
    assert all(ids.count(f"c{i}") == 1 for i in range(common))
    counts = [ids.count(f"r{i}") for i in range(rare)]
    assert max(counts) - min(counts) <= 1 and max(counts) <= 20  # whole copies, then one more of a sample: no turn favoured
    assert sum(counts) / len(out) == pytest.approx(share, abs=1 / len(out))
    assert sum(counts) / len(out) == pytest.approx(report["share_after"], abs=1e-4)
    assert report["claim_share_after"] == pytest.approx(sum(counts) / (2 * sum(counts) + common), abs=1e-4)
    assert report["repeats_added"] == len(out) - len(examples) and report["examples_with_label"] == rare
    assert out == oversample(examples, lambda e: e["labels"], "V", share, seed)[0]  # reproducible


def test_oversampling_refuses_what_would_repeat_none_or_too_much():
    examples = [{"labels": ["V"]}, {"labels": ["L"]}, {"labels": []}]
    with pytest.raises(ValueError, match="between 0 and 1"):
        oversample(examples, lambda e: e["labels"], "V", 1.0, 0)
    with pytest.raises(ValueError, match="no training example holds a X claim"):
        oversample(examples, lambda e: e["labels"], "X", 0.3, 0)
    with pytest.raises(ValueError, match="already make 33.3% of them: oversample_share 0.3 would repeat none"):
        oversample(examples, lambda e: e["labels"], "V", 0.3, 0)
    with pytest.raises(ValueError, match="within a turn of the 33.3%"):
        oversample(examples, lambda e: e["labels"], "V", 0.34, 0)  # above the share before, but not by a whole repeat
    with pytest.raises(ValueError, match="at most 20"):
        oversample(examples + [{"labels": []}] * 40, lambda e: e["labels"], "V", 0.5, 0)  # 1 turn in 43: 42 copies
    assert len(oversample(examples + [{"labels": []}] * 17, lambda e: e["labels"], "V", 0.5, 0)[0]) == 38  # 19 copies: allowed


def student_example(i, labels, answer="worded", window=False):
    from fastvista.schema import Claim
    from fastvista.single_pass import render_target

    text = render_target([Claim(text=f"Claim {i}.{n}.", label=label) for n, label in enumerate(labels)], answer)
    text = f"[TURN 1]\n{text}\n[TURN 2]\nNONE" if window else text
    return {"id": f"t{i}", "dialogue_id": f"d{i}", "prompt": [], "completion": [{"role": "assistant", "content": text}]}


@pytest.mark.parametrize("answer,window", [("numbered", False), ("coded", False), ("worded", False), ("numbered", True)])
def test_the_turns_oversampled_are_those_whose_answer_labels_a_claim_so_in_each_answer_style(answer, window):
    from fastvista.contract import StudentFormat
    from fastvista.labels import Label
    from fastvista.train.sft import StudentArguments, oversample_label

    fmt = StudentFormat(answer=answer, history_turns=8, max_store_claims=64, turns_per_call=2 if window else 1)
    labels = [[Label.LACKING_EVIDENCE, Label.VERIFIED], [Label.OUT_OF_SCOPE], [], [Label.LACKING_EVIDENCE], [Label.OUT_OF_SCOPE]]
    train = [student_example(i, ls, answer, window) for i, ls in enumerate(labels)]
    args = StudentArguments(train_file="train.jsonl", oversample_label="verified", oversample_share=0.5)
    out, report = oversample_label(train, args, fmt, seed=0)
    assert [e["id"] for e in out] == ["t0", "t1", "t2", "t3", "t4", "t0", "t0", "t0"]  # 4 of 8 rows hold a VERIFIED claim
    assert (report["label"], report["examples_with_label"], report["share_after"]) == ("VERIFIED", 1, 0.5)
    assert (report["claim_share_before"], report["claim_share_after"]) == (0.2, 0.3636)  # 1 of 5 claims, then 4 of 11


def test_an_answer_that_does_not_read_names_the_file_and_the_example():
    from fastvista.contract import StudentFormat
    from fastvista.labels import Label
    from fastvista.train.sft import StudentArguments, oversample_label

    train = [student_example(0, [Label.VERIFIED], "numbered"), student_example(1, [Label.OUT_OF_SCOPE], "numbered")]
    args = StudentArguments(train_file="runs/x/train.jsonl", oversample_label="VERIFIED", oversample_share=0.6)
    with pytest.raises(ValueError, match=r"runs/x/train.jsonl: example t0: its completion does not read as a worded answer"):
        oversample_label(train, args, StudentFormat(answer="worded", history_turns=8, max_store_claims=64), seed=0)


@pytest.mark.parametrize("settings,message", [
    ({"oversample_share": 0.3}, "without oversample_label"),
    ({"oversample_label": "VERIFIED"}, "needs an oversample_share between 0 and 1, not 0.0"),
    ({"oversample_label": "SUPPORTED!", "oversample_share": 0.3}, "unknown claim label"),
    ({"oversample_label": "VERIFIED", "oversample_share": 0.3, "strategy": "sequential"}, "needs train_sampling_strategy: random, not sequential"),
    ({"oversample_label": "VERIFIED", "oversample_share": 0.3, "strategy": "group_by_length"}, "copies of a turn in one batch"),
    ({"oversample_label": "VERIFIED", "oversample_share": 0.3, "snapshot_examples": [100]}, "snapshot_examples counts the first N"),
])
def test_oversampling_settings_are_refused_before_anything_is_read(settings, message):
    from types import SimpleNamespace

    from fastvista.train.sft import StudentArguments, check_oversample

    training = SimpleNamespace(train_sampling_strategy=settings.pop("strategy", "random"))
    with pytest.raises(ValueError, match=message):
        check_oversample(StudentArguments(train_file="t.jsonl", **settings), training)
    check_oversample(StudentArguments(train_file="t.jsonl"), training)  # no oversampling: nothing to check
    check_oversample(StudentArguments(train_file="t.jsonl", oversample_label="VERIFIED", oversample_share=0.3),
                     SimpleNamespace(train_sampling_strategy="random"))


def test_a_resumed_run_refuses_rows_other_than_its_first_chunk_trained_on(tmp_path, capsys):
    from types import SimpleNamespace

    from fastvista.labels import Label
    from fastvista.train.sft import same_training_rows

    args = SimpleNamespace(seed=0, data_seed=None, per_device_train_batch_size=2, gradient_accumulation_steps=8, world_size=1,
                           train_sampling_strategy="random", process_index=0)
    rows, run = [student_example(i, [Label.VERIFIED]) for i in range(3)], tmp_path / "run"
    same_training_rows(run, rows, args, resuming=True)  # a run begun before the marker was kept: said, not refused
    assert "cannot be checked" in capsys.readouterr().err and not (run / "training_rows.json").exists()
    same_training_rows(run, rows, args, resuming=False)
    same_training_rows(run, rows, args, resuming=True)  # the same rows and settings: goes on
    with pytest.raises(ValueError, match="rows: 3 then, 4 now"):
        same_training_rows(run, rows + rows[:1], args, resuming=True)  # a repeat more
    with pytest.raises(ValueError, match="other rows or another order"):
        same_training_rows(run, rows[::-1], args, resuming=True)
    with pytest.raises(ValueError, match="seed: 0 then, 1 now"):
        same_training_rows(run, rows, SimpleNamespace(**{**vars(args), "seed": 1}), resuming=True)
    same_training_rows(run, rows[:2], SimpleNamespace(**{**vars(args), "process_index": 1}), resuming=False)  # not the main process
    same_training_rows(run, rows, args, resuming=True)  # so the marker is the first chunk's still
    same_training_rows(run, rows[:2], args, resuming=False)  # a fresh start writes its own rows
    with pytest.raises(ValueError, match="rows: 2 then, 3 now"):
        same_training_rows(run, rows, args, resuming=True)


def test_no_run_goes_on_from_an_oversampled_one(tmp_path):
    from fastvista.train.warm_start import finished_steps

    training = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8, "num_train_epochs": 1, "max_steps": -1,
                "logging_steps": 4, "eval_steps": 20, "save_steps": 10}
    record = {"config": {"training": training}, "examples": {"train": 5276}, "oversample": {"label": "VERIFIED"}}
    with pytest.raises(ValueError, match="repeated the turns holding a VERIFIED claim"):
        finished_steps(record, tmp_path)
