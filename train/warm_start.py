"""Going on from a finished run's adapter. Either a training checkpoint made from it, so that a longer run over the same
examples in the same order goes on where that one ended instead of training its steps again (on a
2-core CPU, hours). A finished run keeps its adapter but not its optimizer state, so the Trainer
resumes with a fresh AdamW and a fresh scheduler, which warms up again: the caller records that.
The checkpoint sits at the last step the finished run completed on full batches; a partial last
batch is trained again in the longer run, so no example is skipped."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def finished_steps(record: dict, where: Path) -> int:
    """The optimizer steps of a finished run (its training_record.json at `where`), refused unless
    it was one pass on one process with whole-number step settings: the Trainer skips
    step x batch examples on resume, which is right only then. Its closing validation logs its
    last step, which must agree."""
    training = record.get("config", {}).get("training", {})
    keys = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_train_epochs", "max_steps", "logging_steps",
            "eval_steps", "save_steps")
    missing = [k for k in keys if k not in training] + ([] if isinstance(record.get("examples", {}).get("train"), int) else ["examples.train"])
    if missing:
        raise ValueError(f"{where}: no {', '.join(missing)}: not a finished training run's record")
    if record.get("oversample"):
        raise ValueError(f"{where}: its run repeated the turns holding a {record['oversample']['label']} claim: its steps do "
                         "not follow the file's order, so no run can go on from them")
    if training["num_train_epochs"] != 1 or training["max_steps"] > 0:
        raise ValueError(f"{where}: its run was not one pass over its examples (num_train_epochs {training['num_train_epochs']}, "
                         f"max_steps {training['max_steps']}): a longer run cannot go on from it")
    fractional = [k for k in ("logging_steps", "eval_steps", "save_steps") if training[k] is not None and training[k] != int(training[k])]
    if fractional:
        raise ValueError(f"{where}: {', '.join(fractional)} given as a share of the steps: give them as steps to go on from it")
    batch = training["per_device_train_batch_size"] * training["gradient_accumulation_steps"]
    steps = -(-record["examples"]["train"] // batch)
    # its closing validation logs the last step; without one, the last logged loss falls in its last logging interval
    logged = [e["step"] for e in record.get("eval_loss", [])] or [e["step"] for e in record.get("loss", [])]
    last = max(logged, default=None)
    if last is None or last > steps or last <= steps - (training["logging_steps"] if not record.get("eval_loss") else 1):
        raise ValueError(f"{where}: its record's last logged step is {last}, not that of one process over its examples ({steps})")
    return steps


def full_steps(record: dict) -> int:
    """The steps of a finished run (checked by finished_steps) that saw full batches."""
    training = record["config"]["training"]
    return record["examples"]["train"] // (training["per_device_train_batch_size"] * training["gradient_accumulation_steps"])


def checkpoint_from_adapter(adapter: Path, folder: Path, record: dict, where: Path) -> int:
    """Write `folder` (a Trainer checkpoint-N) from a finished run's adapter and record (read from
    `where`): its weights and a trainer state at N, with the run's logged losses up to N. Returns N."""
    from transformers import TrainerControl, TrainerState

    missing = [name for name in ADAPTER_FILES if not (adapter / name).exists()]
    if missing:
        raise ValueError(f"{adapter}: no {', '.join(missing)}: not a finished run's adapter")
    finished_steps(record, where)
    step = full_steps(record)
    if step < 1:
        raise ValueError(f"{adapter}: its run finished no full batch, nothing to go on from")
    training = record["config"]["training"]
    history = [{"step": e["step"], "loss": e["loss"]} for e in record.get("loss", []) if e["step"] <= step]
    history += [{"step": e["step"], "eval_loss": e["eval_loss"]} for e in record.get("eval_loss", []) if e["step"] <= step]
    folder.mkdir(parents=True)
    for name in ADAPTER_FILES:
        shutil.copyfile(adapter / name, folder / name)
    state = TrainerState(global_step=step, log_history=sorted(history, key=lambda h: h["step"]),
                         logging_steps=training["logging_steps"], eval_steps=training["eval_steps"], save_steps=training["save_steps"],
                         train_batch_size=training["per_device_train_batch_size"],
                         stateful_callbacks=[TrainerControl()])  # the Trainer's next checkpoint writes its state again
    state.save_to_json(str(folder / "trainer_state.json"))
    return step


RENDERING = ("turns_per_call", "layout", "answer")  # format fields a warm start may change
INIT_MARKER = "init_adapter.json"  # in a run's output folder: the adapter its weights started from


def adapter_sha256(adapter: Path) -> str:
    """The content of an adapter's weights and config, not of what else its folder holds."""
    digest = hashlib.sha256()
    for name in ADAPTER_FILES:
        digest.update((adapter / name).read_bytes())
    return digest.hexdigest()


def started_from(adapter: str, output_dir: Path, resuming: bool) -> dict | None:
    """What a run's weights started from (OUTPUT/init_adapter.json): a resumed run must name the
    adapter its first chunk started from, unchanged, or none if it started fresh."""
    marker = output_dir / INIT_MARKER
    if not resuming:  # a fresh start: an earlier run's marker goes once this run's start is checked
        if not adapter:
            marker.unlink(missing_ok=True)
        return None  # load_adapter_weights writes the marker once the adapter passes
    before = json.loads(marker.read_text()) if marker.exists() else None
    now = adapter_sha256(Path(adapter)) if adapter and Path(adapter).is_dir() else None
    if (before or {}).get("sha256") != now or (adapter and now is None):
        was = f"{before['path']} (sha256 {before['sha256'][:12]})" if before else "fresh weights"
        asked = f"{adapter} as it is now" if adapter else "fresh weights"
        raise ValueError(f"--resume: {output_dir} started from {was}, not from {asked}: resume with the init_adapter it started from")
    return before


def load_adapter_weights(model, adapter: Path, fmt, model_args, output_dir: Path) -> dict:
    """Put a finished run's LoRA weights into `model` (a fresh PEFT model of the same shape), for a
    run that trains it further on new examples, and record it in OUTPUT/init_adapter.json.
    Refused unless its LoRA settings, base and student format are this run's, and every weight
    finds its place. Only how a prompt and an answer are laid out may differ (turns per call,
    section order, answer style): a student learns the same task in another rendering, so a
    per-turn student can start a window student or a student of a more compact format."""
    from peft import load_peft_weights, set_peft_model_state_dict

    from fastvista.contract import read_format

    if not adapter.is_dir():
        raise ValueError(f"init_adapter {adapter}: no such folder")
    if adapter.resolve() == output_dir.resolve():
        raise ValueError(f"init_adapter {adapter} is this run's output_dir: train into another folder")
    missing = [name for name in ADAPTER_FILES if not (adapter / name).exists()]
    if missing:
        raise ValueError(f"init_adapter {adapter}: no {', '.join(missing)}: not a finished run's adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    asked = model.peft_config["default"]
    mine = {"r": asked.r, "lora_alpha": asked.lora_alpha, "use_rslora": asked.use_rslora,
            "target_modules": sorted(asked.target_modules), "modules_to_save": sorted(asked.modules_to_save or [])}
    theirs_lora = {k: sorted(config.get(k) or []) if k in ("target_modules", "modules_to_save") else config.get(k, False if k == "use_rslora" else None)
                   for k in mine}
    differ = [f"{k} {theirs_lora[k]!r} (this run: {v!r})" for k, v in mine.items() if theirs_lora[k] != v]
    if differ:
        raise ValueError(f"init_adapter {adapter}: another LoRA shape: {'; '.join(differ)}")
    if Path(config.get("base_model_name_or_path", "")).name != Path(str(model_args.model_name_or_path)).name:
        raise ValueError(f"init_adapter {adapter}: trained on {config.get('base_model_name_or_path')!r}, "
                         f"not this run's {model_args.model_name_or_path!r}")
    try:
        theirs = read_format(adapter)
    except ValueError as e:  # unreadable JSON or a field out of the format
        raise ValueError(f"init_adapter {adapter}/format.json: {e}") from e
    if theirs is None:
        raise ValueError(f"init_adapter {adapter}: records no student format (format.json): give a finished run's folder")
    a, b = theirs.model_dump(), fmt.model_dump()
    differ = [f"{k} {a[k]!r} (this run: {b[k]!r})" for k in a if k not in RENDERING and a[k] != b[k]]
    if differ:
        raise ValueError(f"init_adapter {adapter}: trained on another student format: {'; '.join(differ)}")
    started = {"path": str(adapter), "sha256": adapter_sha256(adapter), **{k: a[k] for k in RENDERING}}
    result = set_peft_model_state_dict(model, load_peft_weights(str(adapter), device="cpu"))
    unplaced = list(result.unexpected_keys)
    unset = [k for k in result.missing_keys if "lora_" in k]
    if unplaced or unset:
        example = (unplaced or unset)[0]
        raise ValueError(f"init_adapter {adapter}: {len(unplaced)} weights fit no place in this model and {len(unset)} of its "
                         f"LoRA weights were not given, e.g. {example}")
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / INIT_MARKER).write_text(json.dumps(started))
    return started
