import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastvista.records_io import RecordError
from fastvista.train.data import enforce_max_length, read_examples, split_by_dialogue


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
