"""Train the single-pass student: LoRA on a chat model with TRL's SFTTrainer.

    accelerate launch train/sft.py --config configs/sft/llama31_8b_lora.yaml [--any_key value]

Modelled on TRL's `trl/scripts/sft.py`: dataclass configs read by TrlParser (a YAML `--config`,
any key overridable on the command line) and a thin main. The data are the teacher's
`train.jsonl` (conversational prompt/completion, so the loss falls on the completion only), split
by dialogue; examples longer than `max_length` are counted and dropped or refused, never cut.
Writes the adapter and tokenizer (PEFT layout, loadable by `PeftModel.from_pretrained` and by
vLLM's `LoRARequest`), the student format the examples were rendered with (`format.json`, which
`fastvista score` checks), `training_record.json`, `loss.png`, and optionally a merged model.
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


@dataclass
class StudentArguments:
    train_file: str = field(metadata={"help": "The teacher's train.jsonl, or a datasets folder (save_to_disk)."})
    eval_file: str = field(default="", metadata={"help": "Validation examples (e.g. the corpus's validation.jsonl); without it, "
                                                         "eval_fraction of train_file's dialogues are held out."})
    eval_fraction: float = field(default=0.1, metadata={"help": "Share of dialogues held out for validation (without eval_file)."})
    split_seed: int = field(default=0, metadata={"help": "Seed of the split by dialogue."})
    too_long: str = field(default="drop", metadata={"help": "Examples over max_length: 'drop' (counted) or 'fail'."})
    merge: bool = field(default=False, metadata={"help": "Also save the base model merged with the adapter in OUTPUT/merged."})
    resume: bool = field(default=False, metadata={"help": "Resume from the last checkpoint in output_dir, if there is one."})
    parse_check: int = field(default=0, metadata={"help": "Greedy-decode this many validation prompts and report the share that parses."})
    label_weight: float = field(default=1.0, metadata={
        "help": "Loss weight of the one token that decides each claim's label (the first after ' | '), against 1 for every "
                "other answer token: the plain loss teaches claims long before labels (train/label_weight.py)."})
    bf16_fallback: str = field(default="float32", metadata={"choices": ["float32", "keep", "fail"],
        "help": "A CPU run that asks for bf16 on a CPU without native bf16 (avx512_bf16 or AMX), where bf16 trains ~11x slower: "
                "'float32' trains in float32 and records it, 'keep' trains in bf16 anyway, 'fail' refuses (train/precision.py)."})
    lm_head_positions: str = field(default="answer", metadata={"choices": ["answer", "all"],
        "help": "On a CPU, the positions TRL's fused LM head projects: 'answer' (those trained on: the same loss and gradients, "
                "1.37x the tokens/s for Qwen2.5-0.5B + LoRA) or 'all' (TRL's own CPU default); elsewhere TRL decides (train/lm_head.py)."})
    stop_after_minutes: float = field(default=0.0, metadata={
        "help": "End this chunk of a long run at the first optimizer step after this many minutes of training: a checkpoint "
                "is saved and the run exits 75 with no final adapter; run it again with --resume true to go on (0: no limit)."})
    init_adapter: str = field(default="", metadata={
        "help": "Start the LoRA weights from this finished adapter (a run's output folder) instead of fresh ones, to go on "
                "training it on new examples (a fresh optimizer, warmed up again). Its rank, alpha, target modules and "
                "student format must be this run's, except the turns a call (a per-turn student may start a window "
                "student); a resumed checkpoint already holds the weights."})
    oversample_label: str = field(default="", metadata={
        "help": "A claim label (VERIFIED, OUT_OF_SCOPE, LACKING_EVIDENCE, ABSTENTION, CONTRADICTED; not an answer style's "
                "word): repeat the train_file turns whose answer holds such a claim, after max_length's drops, until they make "
                "oversample_share of the rows trained from; never the validation turns. Needs train_sampling_strategy: "
                "random; refused with snapshot_examples; the record and the card say what was repeated (train/data.py)."})
    oversample_share: float = field(default=0.0, metadata={
        "help": "With oversample_label: the share of the rows (turns and their repeats, not claims) that hold the label, "
                "above its share before and at most 20 copies of a turn; whole copies, then a sample drawn with seed. "
                "Epochs count over the rows. 0: no oversampling."})
    snapshot_examples: list[int] = field(default_factory=list, metadata={
        "help": "Also save the adapter in OUTPUT/snapshots/turns_N, and validate, once training has seen the first N examples of "
                "train_file (in file order: needs train_sampling_strategy sequential and an eval_file): a learning curve from one run."})


def peak_memory_mb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prepare(student_args: StudentArguments, tokenizer, max_length: int, seed: int = 0):
    from fastvista.contract import format_of_examples
    from fastvista.train.data import enforce_max_length, read_examples, split_by_dialogue, token_length

    examples = read_examples(student_args.train_file)
    if student_args.eval_file:
        train, held_out = examples, read_examples(student_args.eval_file)
        shared = {e["dialogue_id"] for e in train} & {e["dialogue_id"] for e in held_out}
        if shared:
            raise ValueError(f"{len(shared)} dialogues are in both train_file and eval_file, e.g. {sorted(shared)[0]}")
    else:
        train, held_out = split_by_dialogue(examples, student_args.eval_fraction, student_args.split_seed)
    fmt = format_of_examples(train + held_out, student_args.train_file)
    reports = {}
    for name in ("train", "eval"):
        rows = train if name == "train" else held_out
        lengths = [token_length(e, tokenizer) for e in rows]
        kept, reports[name] = enforce_max_length(rows, lengths, max_length, student_args.too_long)
        if name == "train":
            train = kept
        else:
            held_out = kept
    if student_args.oversample_label:
        train, reports["oversample"] = oversample_label(train, student_args, fmt, seed)
    return train, held_out, reports, fmt


def check_oversample(student_args: StudentArguments, training_args) -> None:
    """oversample_label's settings, refused before any model or example is read."""
    from fastvista.labels import parse_label

    if not student_args.oversample_label:
        if student_args.oversample_share:
            raise ValueError(f"oversample_share {student_args.oversample_share} without oversample_label: name the label to oversample")
        return
    parse_label(student_args.oversample_label)  # ValueError names the labels
    if not 0 < student_args.oversample_share < 1:
        raise ValueError(f"oversample_label needs an oversample_share between 0 and 1, not {student_args.oversample_share}")
    if training_args.train_sampling_strategy != "random":
        raise ValueError(f"oversample_label needs train_sampling_strategy: random, not {training_args.train_sampling_strategy}: the "
                         "repeats follow the file, so a sequential run meets them last (or never) and a length-grouped one "
                         "puts copies of a turn in one batch")
    if student_args.snapshot_examples:
        raise ValueError("oversample_label repeats turns out of the file's order: snapshot_examples counts the first N of the file")


def oversample_label(train: list[dict], student_args: StudentArguments, fmt, seed: int) -> tuple[list[dict], dict]:
    """The training rows with oversample_label's turns repeated (train/data.py, oversample), and what was repeated."""
    from fastvista.labels import parse_label
    from fastvista.single_pass import parse_output
    from fastvista.text import FormatError
    from fastvista.train.data import oversample
    from fastvista.window_pass import parse_window_output

    label = parse_label(student_args.oversample_label)

    def labels_of(example: dict) -> list:
        answer = "\n".join(m["content"] for m in example["completion"] if m["role"] == "assistant")
        try:
            claims = ([c for turn in parse_window_output(answer, fmt.turns_per_call) for c in turn] if fmt.turns_per_call > 1
                      else parse_output(answer, fmt.answer))
        except FormatError as e:
            raise ValueError(f"{student_args.train_file}: example {example.get('id', example['dialogue_id'])}: its completion "
                             f"does not read as a {fmt.answer} answer ({e}): is it this format's training set?") from None
        return [c.label for c in claims]

    train, report = oversample(train, labels_of, label, student_args.oversample_share, seed)
    return train, {"label": label.value, "share": student_args.oversample_share, **report}


ROW_SETTINGS = ("seed", "data_seed", "per_device_train_batch_size", "gradient_accumulation_steps", "world_size", "train_sampling_strategy")


def same_training_rows(output_dir: Path, train: list[dict], training_args, resuming: bool) -> None:
    """A resumed run skips the batches its checkpoint trained, which is right only when it draws from
    the same rows, in the same order, with the same seed and batches as its first chunk
    (OUTPUT/training_rows.json): another file, max_length or oversampling, or another seed or batch,
    would quietly skip rows it never trained and train again rows it had."""
    import hashlib

    marker = output_dir / "training_rows.json"
    now = {"sha256": hashlib.sha256(json.dumps([[e["prompt"], e["completion"]] for e in train]).encode()).hexdigest(),
           "rows": len(train), **{k: getattr(training_args, k, None) for k in ROW_SETTINGS}}
    if resuming:
        if not marker.exists():
            print(f"--resume: no {marker} (a run begun before it was kept, or going on from a finished run's steps): "
                  "its training rows cannot be checked", file=sys.stderr)
            return
        before = json.loads(marker.read_text())
        differ = [f"{k}: {before.get(k)} then, {v} now" for k, v in now.items() if k != "sha256" and before.get(k) != v]
        if before.get("sha256") != now["sha256"] and not differ:
            differ = [f"the same {len(train)} rows in number, other rows or another order"]
        if differ:
            raise ValueError(f"--resume: {output_dir} was trained on other rows than these ({'; '.join(differ)}): resume with the "
                             "same train_file, max_length, oversampling, seed and batch settings, or train into another output_dir")
    elif training_args.process_index == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        partial = marker.with_suffix(".partial")
        partial.write_text(json.dumps(now))
        partial.replace(marker)


def step_timer():
    """A callback that records when each optimizer step ended (for the steady throughput)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.began, self.seconds = 0.0, {}

        def on_step_begin(self, args, state, control, **kwargs):
            self.began = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # before any evaluation or save of the step
            self.seconds[state.global_step] = time.perf_counter() - self.began

    return StepTimer()


CHUNK_ENDED = 75  # the exit status of a run stopped by stop_after_minutes (EX_TEMPFAIL: run it again to go on)
CHUNK_MARKER = "chunk_ended.json"  # written in output_dir beside it: launchers (accelerate) report any failure as 1


def chunk_limit(minutes: float):
    """A callback that ends the run at the first step after `minutes` of training, with a
    checkpoint of that step, unless it was the last: a chunk of a long run on a machine that
    does not outlive a session loses no step it trained."""
    from transformers import TrainerCallback

    class ChunkLimit(TrainerCallback):
        def __init__(self):
            self.began, self.stopped_at = time.perf_counter(), None

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step < state.max_steps and time.perf_counter() - self.began >= minutes * 60:
                control.should_save = control.should_training_stop = True
                self.stopped_at = state.global_step

    return ChunkLimit()


def snapshot_saver(trainer, steps: dict[int, int], out: Path, fmt, tokenizer, record: dict):
    """A callback that saves the adapter (with tokenizer, format and its training record) at the
    given steps, each built aside and renamed in, and has the trainer validate and checkpoint at
    those steps (a killed run resumes from its last snapshot, with that snapshot's validation loss
    logged). A snapshot's record is the run's, for its first N examples: `fastvista models ship`
    takes a snapshot like a finished run."""
    import shutil

    from transformers import TrainerCallback

    from fastvista.contract import write_format

    def write_record(folder: Path, update: dict) -> None:
        path = folder / "training_record.json"
        current = json.loads(path.read_text()) if path.exists() else {}
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps({**current, **update}, indent=2, default=str))
        partial.rename(path)

    class SnapshotSaver(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            n = steps.get(state.global_step)
            if n is None:
                return
            folder = out / "snapshots" / f"turns_{n}"
            saved = folder / "training_record.json"
            if saved.exists() and json.loads(saved.read_text()).get("final_eval_loss") is not None:
                return  # saved and validated before (by an earlier run this one goes on from): not again
            control.should_evaluate = True  # logged at this step in the record's eval_loss
            control.should_save = True
            if folder.exists() or not trainer.accelerator.is_main_process:
                return
            partial = folder.with_name(folder.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            trainer.save_model(str(partial))
            tokenizer.save_pretrained(str(partial))
            write_format(partial, fmt)
            seen = state.global_step * args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
            snapshot = {"first_examples": n, "step": state.global_step, "examples_through_step": seen}
            (partial / "snapshot.json").write_text(json.dumps(snapshot))
            # whole batches: the adapter has seen the first `seen` kept examples, N of the curve's point and a few more
            examples = {**record["examples"], "train": min(seen, record["examples"]["train"])}
            write_record(partial, {**record, "examples": examples, "snapshot": snapshot, "final_eval_loss": None,
                                   "loss": [{"step": h["step"], "loss": h["loss"]} for h in state.log_history if "loss" in h]})
            partial.rename(folder)

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            n = steps.get(state.global_step)
            path = out / "snapshots" / f"turns_{n}" / "training_record.json"
            if n is None or not metrics or not path.exists() or not trainer.accelerator.is_main_process:
                return
            saved = json.loads(path.read_text())
            # only this run's snapshot of this step: never an older run's folder left in output_dir
            if saved.get("snapshot", {}).get("step") == state.global_step and saved.get("data_sha256") == record["data_sha256"]:
                write_record(path.parent, {"final_eval_loss": metrics.get("eval_loss")})

    return SnapshotSaver()


def run_record(student_args: StudentArguments, training_args, model_args, fmt, train: list, held_out: list, length_reports: dict,
               precision: dict, started_with: dict | None = None) -> dict:
    """What a trained adapter was trained on and how: the part of its record a snapshot shares."""
    from fastvista.train.data import file_hash

    return {
        "base_model": model_args.model_name_or_path,
        "format": fmt.model_dump(),
        "train_file": student_args.train_file,
        "data_sha256": file_hash(student_args.train_file),
        "examples": {"train": len(train), "eval": len(held_out), "dialogues_eval": len({e["dialogue_id"] for e in held_out})},
        "length": {name: r for name, r in length_reports.items() if name != "oversample"},
        **({"oversample": length_reports["oversample"]} if "oversample" in length_reports else {}),
        "config": {"student": asdict(student_args), "model": asdict(model_args), "training": training_args.to_dict()},
        "world_size": training_args.world_size,  # processes: a step's examples are batch x accumulation x this
        "precision": precision,
        **({"init_adapter": started_with} if started_with else {}),
    }


def trains_on_cpu(training_args) -> bool:
    return training_args.use_cpu or training_args.device.type == "cpu"


def choose_precision(student_args: StudentArguments, training_args, model_args, base: str) -> str | None:
    """Set the run's mixed precision and weights dtype for this machine (train/precision.py) before
    anything is built; the note says what changed."""
    from transformers import AutoConfig

    from fastvista.precision import native_cpu_bf16
    from fastvista.train.precision import cpu_precision

    asked = model_args.dtype
    if asked in (None, "auto"):  # the checkpoint's own dtype, as from_pretrained would load it
        asked = str(AutoConfig.from_pretrained(base).dtype or "float32").removeprefix("torch.")
    mixed, dtype, note = cpu_precision(training_args.mixed_precision, asked, trains_on_cpu(training_args), native_cpu_bf16(),
                                       student_args.bf16_fallback)
    if note and (mixed, dtype) != (training_args.mixed_precision, asked):
        training_args.mixed_precision, training_args.bf16, model_args.dtype = mixed, mixed == "bf16", dtype  # the Accelerator reads mixed_precision
    if note:
        print(note, file=sys.stderr, flush=True)
    return note


def precision_chunks(out: Path, checkpoint: str | None, current: dict, write: bool) -> tuple[list[dict], str | None]:
    """The precision of each chunk of this run (OUTPUT/precision.json): a resumed run appends to its
    chunks, a fresh one starts them again; the note says when a resume changed precision."""
    from fastvista.train.precision import resumed_precision

    path = out / "precision.json"
    previous = json.loads(path.read_text()) if checkpoint and path.exists() else []
    chunks = [*previous, {**current, "resumed_from": checkpoint}]
    if write:  # the main process only
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(chunks, indent=2))
    note = resumed_precision(previous, current)
    if note:
        print(note, file=sys.stderr, flush=True)
    return chunks, note


def main(student_args: StudentArguments, training_args, model_args) -> dict:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_utils import get_last_checkpoint
    from trl import SFTTrainer, get_peft_config

    from fastvista.contract import write_format
    from fastvista.models import resolve_model
    from fastvista.precision import native_cpu_bf16
    from fastvista.train.lm_head import lm_head_positions
    from fastvista.train.report import parse_rate, plot_losses, steady_tokens_per_s
    from fastvista.train.warm_start import load_adapter_weights, started_from

    check_oversample(student_args, training_args)
    started = time.perf_counter()
    base = resolve_model(model_args.model_name_or_path)
    precision_note = choose_precision(student_args, training_args, model_args, base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    if training_args.max_length is None:
        raise ValueError("set max_length: examples longer than it are counted and dropped, never truncated")
    train, held_out, length_reports, fmt = prepare(student_args, tokenizer, training_args.max_length, training_args.seed)
    checkpoint = get_last_checkpoint(training_args.output_dir) if student_args.resume and os.path.isdir(training_args.output_dir) else None
    same_training_rows(Path(training_args.output_dir), train, training_args, resuming=checkpoint is not None)
    columns = ("prompt", "completion")
    train_ds = Dataset.from_list([{k: e[k] for k in columns} for e in train])
    eval_ds = Dataset.from_list([{k: e[k] for k in columns} for e in held_out]) if held_out else None
    if eval_ds is None:
        training_args.eval_strategy = "no"
    init = {"dtype": model_args.dtype, "attn_implementation": model_args.attn_implementation}
    training_args.model_init_kwargs = {**(training_args.model_init_kwargs or {}), **{k: v for k, v in init.items() if v}}
    if student_args.label_weight <= 0:
        raise ValueError(f"label_weight must be positive, not {student_args.label_weight}")
    # what the fused LM head projects on a CPU (train/lm_head.py); elsewhere TRL decides
    positions = lm_head_positions(student_args.lm_head_positions)  # refuses a value other than answer or all
    positions = positions if trains_on_cpu(training_args) else "trl"
    trainer_class = SFTTrainer
    if student_args.label_weight != 1:
        from fastvista.train.label_weight import decision_weighted

        trainer_class = decision_weighted(SFTTrainer, student_args.label_weight, tokenizer, fmt.answer)
    if training_args.train_sampling_strategy == "group_by_length":  # an order a resumed run repeats (train/length_order.py)
        from fastvista.train.length_order import length_ordered

        trainer_class = length_ordered(trainer_class)
    trainer = trainer_class(
        model=base,
        args=training_args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    timer = step_timer()
    trainer.add_callback(timer)
    if student_args.resume and checkpoint is None:
        trainer.accelerator.print(f"--resume: no checkpoint in {training_args.output_dir}, starting fresh")
    started_with = started_from(student_args.init_adapter, Path(training_args.output_dir), resuming=checkpoint is not None)
    if student_args.init_adapter and checkpoint is None:
        started_with = load_adapter_weights(trainer.model, Path(student_args.init_adapter), fmt, model_args, Path(training_args.output_dir))
    # what the Accelerator and the loaded weights actually use, not only what was asked
    current = {"mixed_precision": trainer.accelerator.mixed_precision, "dtype": str(next(trainer.model.parameters()).dtype).removeprefix("torch."),
               "native_cpu_bf16": native_cpu_bf16(), "note": precision_note, "lm_head_positions": positions}
    chunks, resume_note = precision_chunks(Path(training_args.output_dir), checkpoint, current, trainer.accelerator.is_main_process)
    precision = {**current, "resume_note": resume_note, "chunks": chunks}
    if student_args.snapshot_examples:
        if training_args.train_sampling_strategy != "sequential" or not student_args.eval_file:
            raise ValueError("snapshot_examples needs train_sampling_strategy: sequential (the first N examples are those seen "
                             "first) and an eval_file (train_file's order is kept only then)")
        from fastvista.train.data import read_examples, snapshot_steps

        batch = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps * training_args.world_size
        steps = snapshot_steps([e["id"] for e in read_examples(student_args.train_file)], set(length_reports["train"]["too_long_ids"]),
                               student_args.snapshot_examples, batch)
        trainer.add_callback(snapshot_saver(trainer, steps, Path(training_args.output_dir), fmt, tokenizer,
                                            run_record(student_args, training_args, model_args, fmt, train, held_out, length_reports, precision, started_with)))
    chunk = chunk_limit(student_args.stop_after_minutes) if student_args.stop_after_minutes > 0 else None
    if chunk:
        trainer.add_callback(chunk)
    result = trainer.train(resume_from_checkpoint=checkpoint)
    if chunk and chunk.stopped_at is not None:
        if trainer.accelerator.is_main_process:
            marker = {"step": chunk.stopped_at, "checkpoint": f"checkpoint-{chunk.stopped_at}", "minutes": student_args.stop_after_minutes}
            (Path(training_args.output_dir) / CHUNK_MARKER).write_text(json.dumps(marker))
        trainer.accelerator.print(f"this chunk ended after {student_args.stop_after_minutes:g} minutes at step {chunk.stopped_at}: "
                                  f"checkpoint-{chunk.stopped_at} saved in {training_args.output_dir}; run again with --resume true to go on")
        sys.exit(CHUNK_ENDED)
    eval_metrics = trainer.evaluate() if eval_ds is not None else {}
    out = Path(training_args.output_dir)
    trainer.save_model(str(out))
    record = {}
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(str(out))
        write_format(out, fmt)
        history = trainer.state.log_history
        # the last count, not the largest: a resumed run counts again from 0 (and times only itself)
        tokens = next((h["num_tokens"] for h in reversed(history) if "num_tokens" in h), 0)
        record = {
            **run_record(student_args, training_args, model_args, fmt, train, held_out, length_reports, precision, started_with),
            "loss": [{"step": h["step"], "loss": h["loss"]} for h in history if "loss" in h],
            # by step: the last evaluation and the closing one can fall on the same step
            "eval_loss": [{"step": k, "eval_loss": v} for k, v in {h["step"]: h["eval_loss"] for h in history if "eval_loss" in h}.items()],
            "final_eval_loss": eval_metrics.get("eval_loss"),
            "train_runtime_s": result.metrics.get("train_runtime"),
            "tokens": tokens,
            "tokens_per_s": tokens / result.metrics["train_runtime"] if result.metrics.get("train_runtime") else None,
            "steady_tokens_per_s": steady_tokens_per_s(timer.seconds, history),
            "peak_memory_mb": round(peak_memory_mb(), 1),
            "resumed_from": checkpoint,
            "snapshots": sorted(p.name for p in (out / "snapshots").glob("turns_*") if not p.name.endswith(".partial")),
        }
        plot_losses(record, out / "loss.png")
        if student_args.merge:  # from the saved adapter, in float32 (merging into bf16 weights rounds the delta away)
            from fastvista.train.merge import merge

            merge(out, out / "merged", base=base)
        if student_args.parse_check and held_out:
            record["parse_check"] = parse_rate(base, str(out), held_out[: student_args.parse_check], model_args.dtype)
        record["wall_time_s"] = round(time.perf_counter() - started, 1)
        (out / "training_record.json").write_text(json.dumps(record, indent=2, default=str))
        trainer.accelerator.print(f"adapter, training_record.json and loss.png in {out}")
    return record


def make_parser():
    from trl import ModelConfig, SFTConfig, TrlParser

    return TrlParser((StudentArguments, SFTConfig, ModelConfig))


def check_choices(configs, config_file: str | None) -> None:
    """Refuse a value outside its key's choices. argparse checks them on the command line only: a YAML value is
    taken as given, and a misspelt one (`train_sampling_strategy: by_length`) would quietly train another way."""
    lines = Path(config_file).read_text().splitlines() if config_file else []
    for config in configs:
        for f in fields(config):
            choices, value = f.metadata.get("choices"), getattr(config, f.name)
            if choices and value is not None and value not in choices:
                key = re.compile(rf"""^["']?{re.escape(f.name)}["']?\s*:""")  # a top-level key, quoted or not
                line = max((n for n, text in enumerate(lines, 1) if key.match(text)), default=None)  # YAML keeps the last
                where = f"{config_file}, line {line}: " if line else ""
                raise ValueError(f"{where}{f.name}: {value!r} is not one of {', '.join(map(str, choices))}")


if __name__ == "__main__":
    configs = make_parser().parse_args_and_config()
    check_choices(configs, sys.argv[sys.argv.index("--config") + 1] if "--config" in sys.argv else None)
    main(*configs)
