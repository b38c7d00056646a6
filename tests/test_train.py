"""The student's training script on a tiny local model, through `accelerate launch` on CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastvista.records_io import write_jsonl
from fastvista.synth.pipeline import TeacherConfig
from fastvista.contract import StudentFormat
from fastvista.synth.training_set import training_examples
from tests.scripted import ScriptedBackend
from tests.test_pipeline import drive, museum_dialogue

FORMAT = StudentFormat(history_turns=8, max_store_claims=64)

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    examples = [e for i in range(8) for e in training_examples(drive(museum_dialogue(i), TeacherConfig(), ScriptedBackend()), FORMAT)]
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    write_jsonl(path, examples)
    return path


def write_config(path: Path, model: Path, train_file: Path, out: Path, **extra) -> Path:
    config = {
        "model_name_or_path": str(model), "dtype": "float32", "use_peft": True, "lora_r": 8, "lora_alpha": 16,
        "lora_target_modules": "all-linear", "train_file": str(train_file), "eval_fraction": 0.25,
        "max_length": 1200, "use_cpu": True, "bf16": False, "gradient_checkpointing": False,
        "per_device_train_batch_size": 4, "learning_rate": 0.01, "max_steps": 12, "logging_steps": 1,
        "eval_strategy": "steps", "eval_steps": 6, "save_strategy": "steps", "save_steps": 6, "report_to": "none",
        "output_dir": str(out), "seed": 0, **extra,
    }
    import yaml

    path.write_text(yaml.safe_dump(config))
    return path


def launch(config: Path, *args: str) -> subprocess.CompletedProcess:
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [str(accelerate), "launch", "--config_file", str(ROOT / "configs/accelerate/cpu.yaml"), str(ROOT / "train/sft.py"), "--config", str(config), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)


def test_accelerate_launch_trains_saves_and_resumes(tmp_path, tiny_model, train_file):
    from transformers import AutoTokenizer

    from fastvista.train.data import read_examples, token_length

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    lengths = sorted(token_length(e, tokenizer) for e in read_examples(train_file))
    max_length = lengths[len(lengths) * 2 // 3] - 1  # about a third of the examples are too long
    out = tmp_path / "adapter"
    config = write_config(tmp_path / "sft.yaml", tiny_model, train_file, out, max_length=max_length)
    done = launch(config, "--learning_rate", "0.02")
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "training_record.json").read_text())
    losses = [p["loss"] for p in record["loss"]]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3  # it learns
    assert record["config"]["training"]["learning_rate"] == 0.02  # the override won over the YAML
    assert record["examples"]["eval"] > 0 and record["final_eval_loss"] is not None
    too_long = record["length"]["train"]["too_long"] + record["length"]["eval"]["too_long"]
    assert too_long == sum(n > max_length for n in lengths) > 0
    assert record["examples"]["train"] + record["examples"]["eval"] == len(lengths) - too_long
    assert (out / "loss.png").stat().st_size > 0
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()

    # the adapter reloads with PEFT and generates
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), out)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        generated = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] > ids["input_ids"].shape[1]

    # --resume picks up the last checkpoint and trains to a later max_steps; --merge also saves
    # the base merged with the adapter, which generates what base + adapter generate
    again = launch(config, "--resume", "true", "--max_steps", "14", "--merge", "true")
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = json.loads((out / "training_record.json").read_text())
    assert resumed["resumed_from"].endswith("checkpoint-12")
    assert [p["step"] for p in resumed["loss"]][-2:] == [13, 14]
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), out)
    merged = AutoModelForCausalLM.from_pretrained(out / "merged")
    # so does a merge made after training (fastvista merge)
    from typer.testing import CliRunner

    from fastvista.cli import app

    assert CliRunner().invoke(app, ["merge", str(out), "--out", str(tmp_path / "merged-later")]).exit_code == 0
    later = AutoModelForCausalLM.from_pretrained(tmp_path / "merged-later")
    with torch.no_grad():
        expected = adapted.generate(**ids, max_new_tokens=8, do_sample=False)
        assert torch.equal(expected, merged.generate(**ids, max_new_tokens=8, do_sample=False))
        assert torch.equal(expected, later.generate(**ids, max_new_tokens=8, do_sample=False))


def test_only_completion_tokens_carry_loss(tiny_model, train_file):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from fastvista.train.data import read_examples

    [example] = read_examples(train_file)[:1]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    args = SFTConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, max_length=4096, report_to="none")
    trainer = SFTTrainer(model=str(tiny_model), args=args, train_dataset=Dataset.from_list([{"prompt": example["prompt"], "completion": example["completion"]}]), processing_class=tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[0]])
    labels = batch["labels"][0].tolist()
    prompt_len = len(tokenizer.apply_chat_template(example["prompt"], add_generation_prompt=True, tokenize=True)["input_ids"])
    assert all(l == -100 for l in labels[:prompt_len])
    completion = labels[prompt_len:]
    assert completion and all(l != -100 for l in completion)
    assert tokenizer.decode(completion).startswith(example["completion"][0]["content"])


def test_a_bf16_config_trains_in_what_this_cpu_computes_natively_and_records_it(tmp_path, tiny_model, train_file):
    from fastvista.precision import native_cpu_bf16

    out = tmp_path / "out"
    config = write_config(tmp_path / "sft.yaml", tiny_model, train_file, out, dtype="bfloat16", bf16=True, max_steps=2,
                          eval_strategy="no", save_strategy="no")
    done = launch(config)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "training_record.json").read_text())
    native = native_cpu_bf16()
    # what the Accelerator autocast to and what the weights were loaded in
    assert record["precision"]["mixed_precision"] == ("bf16" if native else "no") and record["config"]["training"]["bf16"] is native
    assert record["precision"]["dtype"] == ("bfloat16" if native else "float32")
    assert (record["precision"]["note"] is None) is native
    assert json.loads((out / "precision.json").read_text())[0]["mixed_precision"] == record["precision"]["mixed_precision"]
    refused = launch(config, "--bf16_fallback", "fail")
    assert (refused.returncode == 0) is native
    assert native or "--bf16 false --dtype float32" in refused.stderr


def test_on_a_cpu_the_lm_head_projects_the_answer_unless_told_otherwise_and_the_record_says_which(tmp_path, tiny_model, train_file):
    records = {}
    for positions in ("answer", "all"):
        out = tmp_path / positions
        config = write_config(tmp_path / f"{positions}.yaml", tiny_model, train_file, out, max_steps=2, eval_strategy="no",
                              save_strategy="no", lm_head_positions=positions)
        done = launch(config)
        assert done.returncode == 0, done.stderr[-3000:]
        records[positions] = json.loads((out / "training_record.json").read_text())
        assert records[positions]["precision"]["lm_head_positions"] == positions
        assert json.loads((out / "precision.json").read_text())[-1]["lm_head_positions"] == positions
    # the same examples, weights and seed: the same losses whichever positions the head projects
    assert [p["loss"] for p in records["answer"]["loss"]] == pytest.approx([p["loss"] for p in records["all"]["loss"]], rel=1e-4)
    # a YAML value is a default that argparse does not check against the choices: sft.py refuses it by file, line and name
    bad = write_config(tmp_path / "bad.yaml", tiny_model, train_file, tmp_path / "bad", lm_head_positions="Answer")
    refused = launch(bad)
    line = next(n for n, text in enumerate(bad.read_text().splitlines(), 1) if text.startswith("lm_head_positions:"))
    assert refused.returncode != 0 and f"{bad}, line {line}: lm_head_positions: 'Answer' is not one of answer, all" in refused.stderr


def test_too_long_examples_can_be_refused(tmp_path, tiny_model, train_file):
    config = write_config(tmp_path / "sft.yaml", tiny_model, train_file, tmp_path / "out", max_length=50, too_long="fail")
    done = launch(config)
    assert done.returncode != 0 and "exceed max_length=50" in done.stderr


def test_snapshots_are_saved_and_validated_once_the_first_n_examples_are_seen(tmp_path, tiny_model, train_file):
    from fastvista.train.data import read_examples

    rows = read_examples(train_file)
    held_out = {e["dialogue_id"] for e in rows[-6:]}
    train, evals = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    write_jsonl(train, [e for e in rows if e["dialogue_id"] not in held_out])
    write_jsonl(evals, [e for e in rows if e["dialogue_id"] in held_out])
    out = tmp_path / "run"
    config = write_config(tmp_path / "sft.yaml", tiny_model, train, out, eval_file=str(evals), max_steps=-1, num_train_epochs=1,
                          eval_steps=100, save_steps=100, train_sampling_strategy="sequential")
    from fastvista.evaluation.learning_curve import launch_args

    done = launch(config, *launch_args({"snapshot_examples": [6, 12]}))  # on the command line, as the learning curve passes it
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "training_record.json").read_text())
    assert record["snapshots"] == ["turns_12", "turns_6"]
    # batches of 4: the first 6 examples are all seen after step 2, the first 12 after step 3
    assert [json.loads((out / "snapshots" / n / "snapshot.json").read_text())["step"] for n in ("turns_6", "turns_12")] == [2, 3]
    assert {2, 3} <= {e["step"] for e in record["eval_loss"]}  # each snapshot was validated
    assert {"checkpoint-2", "checkpoint-3"} <= {p.name for p in out.glob("checkpoint-*")}  # and checkpointed (save_steps 100)
    assert (out / "snapshots" / "turns_6" / "format.json").exists()
    # a snapshot carries its own record (what `fastvista models ship` reads): its examples, step and validation loss
    early_record = json.loads((out / "snapshots" / "turns_6" / "training_record.json").read_text())
    assert early_record["examples"]["train"] == 8 and early_record["snapshot"] == {"first_examples": 6, "step": 2, "examples_through_step": 8}
    assert early_record["final_eval_loss"] == next(e["eval_loss"] for e in record["eval_loss"] if e["step"] == 2)
    assert early_record["data_sha256"] == record["data_sha256"] and early_record["config"] == record["config"]
    from safetensors.torch import load_file

    early, final = load_file(out / "snapshots" / "turns_6" / "adapter_model.safetensors"), load_file(out / "adapter_model.safetensors")
    assert early.keys() == final.keys() and any(not (early[k] == final[k]).all() for k in early)  # taken mid-run
    refused = launch(write_config(tmp_path / "bad.yaml", tiny_model, train, tmp_path / "bad", eval_file=str(evals), snapshot_examples=[6]))
    assert refused.returncode != 0 and "train_sampling_strategy: sequential" in refused.stderr


def test_a_run_goes_on_from_a_finished_adapter_and_refuses_one_of_another_shape(tmp_path, tiny_model, train_file):
    """init_adapter starts the LoRA weights from a finished run's: at learning rate 0 the new run's
    adapter is that run's, weight for weight; a fresh run's is not."""
    import torch
    from safetensors.torch import load_file

    first = tmp_path / "first"
    assert launch(write_config(tmp_path / "a.yaml", tiny_model, train_file, first, max_steps=3)).returncode == 0
    weights = lambda out: load_file(out / "adapter_model.safetensors")  # noqa: E731
    trained = weights(first)
    for name, init in (("went_on", str(first)), ("fresh", "")):
        out = tmp_path / name
        done = launch(write_config(tmp_path / f"{name}.yaml", tiny_model, train_file, out, max_steps=2, learning_rate=0.0,
                                   init_adapter=init, save_steps=1))
        assert done.returncode == 0, done.stderr[-3000:]
        same = all(torch.equal(trained[k], v) for k, v in weights(out).items())
        assert same == bool(init)
    record = json.loads((tmp_path / "went_on" / "training_record.json").read_text())
    assert record["init_adapter"]["path"] == str(first) and len(record["init_adapter"]["sha256"]) == 64
    assert "init_adapter" not in json.loads((tmp_path / "fresh" / "training_record.json").read_text())
    # a resume must start from what its first chunk started from
    swapped = launch(tmp_path / "fresh.yaml", "--resume", "true", "--max_steps", "3", "--init_adapter", str(first))
    assert swapped.returncode != 0 and "started from fresh weights, not from" in swapped.stderr
    # a refused fresh start into a finished run's folder keeps what that run started from
    marker = (tmp_path / "went_on" / "init_adapter.json").read_text()
    other = launch(write_config(tmp_path / "r4.yaml", tiny_model, train_file, tmp_path / "went_on", max_steps=1, lora_r=4,
                                init_adapter=str(first)))
    assert other.returncode != 0 and "another LoRA shape: r 8 (this run: 4)" in other.stderr
    assert (tmp_path / "went_on" / "init_adapter.json").read_text() == marker
    # a per-turn student may start a window student (more turns a call) or a compact-format one, but
    # not one that sees other history or another store
    from fastvista.contract import read_format
    from fastvista.train.data import read_examples

    rows = read_examples(train_file)
    fmt = rows[0]["format"]
    for name, change, refusal in (("window", {"turns_per_call": 2}, None),
                                  ("coded", {"layout": "reference-first", "answer": "coded"}, None),
                                  ("history", {"history_turns": fmt["history_turns"] + 1}, f"history_turns {fmt['history_turns']} (this run: "),
                                  ("store", {"max_store_claims": fmt["max_store_claims"] - 1}, "max_store_claims")):
        write_jsonl(tmp_path / f"{name}.jsonl", [{**e, "format": {**e["format"], **change}} for e in rows])
        done = launch(write_config(tmp_path / f"{name}.yaml", tiny_model, tmp_path / f"{name}.jsonl", tmp_path / name,
                                   max_steps=1, learning_rate=0.0, init_adapter=str(first), eval_strategy="no", save_strategy="no"))
        if refusal is None:
            assert done.returncode == 0, done.stderr[-3000:]
            assert all(torch.equal(trained[k], v) for k, v in weights(tmp_path / name).items())
            trained_as = read_format(tmp_path / name).model_dump()
            assert all(trained_as[k] == v for k, v in change.items())
            started = json.loads((tmp_path / name / "init_adapter.json").read_text())
            assert started["sha256"] == record["init_adapter"]["sha256"]
            assert {k: started[k] for k in change} == {k: fmt.get(k, "numbered" if k == "answer" else "store-first") for k in change}
        else:
            assert done.returncode != 0 and "trained on another student format: " + refusal in done.stderr
