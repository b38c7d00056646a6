"""A training checkpoint made from a finished run's adapter, so that a longer run over the same
examples in the same order goes on where that one ended instead of training its steps again (on a
2-core CPU, hours). A finished run keeps its adapter but not its optimizer state, so the Trainer
resumes with a fresh AdamW and a fresh scheduler, which warms up again: the caller records that.
The checkpoint sits at the last step the finished run completed on full batches; a partial last
batch is trained again in the longer run, so no example is skipped."""

from __future__ import annotations

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
