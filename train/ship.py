"""Ship a trained student in this repository: its adapter, its student format and a model card in
the Hugging Face style, in `students/NAME/`, to be pinned in `fastvista.models.STUDENTS`.

    fastvista models ship runs/learning_curve/turns_2400/student --name smollm2-135m-student \\
        --base smollm2-135m-instruct --agreement runs/learning_curve/turns_2400/agreement.json

The card holds the base model, the library, the training data's sha256, the training settings,
and the target table (agreement with the teacher on the corpus's test turns) with each target
marked met or not.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from fastvista.contract import BEFORE_OPTIONS
from fastvista.infer.student import StudentConfig
from fastvista.labels import Label
from fastvista.single_pass import ANSWER, spelled

# (label, agreement report path, target): the corpus issue's targets, student against teacher.
TARGETS = (
    ("hallucination-decision agreement", ("hallucinated_decision", "agreement"), 0.80),
    ("Cohen's kappa", ("hallucinated_decision", "kappa"), 0.55),
    ("turn-score Pearson", ("turn_score", "pearson"), 0.65),
    ("claim recall", ("claims", "recall"), 0.70),
    ("label accuracy on aligned claims", ("claims", "labels_on_aligned", "accuracy"), 0.70),
)
FILES = ("adapter_model.safetensors", "adapter_config.json", "format.json")


def report_value(report: dict, path: tuple):
    """The value at `path` of an agreement report (None where it is missing)."""
    for key in path:
        report = report.get(key) if isinstance(report, dict) else None
    return report


def target_table(agreement: dict) -> str:
    lines = ["| measure (test turns, student vs teacher) | value | target | met |", "|---|---|---|---|"]
    for label, path, target in TARGETS:
        value = report_value(agreement, path)
        if path == ("turn_score", "pearson"):
            ci = report_value(agreement, ("turn_score", "pearson_ci95"))
            shown = f"{value} [{ci[0]}, {ci[1]}]" if value is not None and ci else str(value)
        else:
            shown = str(value)
        met = "-" if value is None else ("yes" if value >= target else "no")
        lines.append(f"| {label} | {shown} | ≥ {target} | {met} |")
    return "\n".join(lines)


def rounded(value, digits: int):
    """A recorded figure as a reader wants it on a card; a missing one stays visible as None."""
    return None if value is None else (round(value) if digits == 0 else round(value, digits))


def differing(fmt: dict, student: StudentConfig) -> dict:
    """The settings of a recorded student format that differ from these student settings."""
    used = student.student_format().model_dump()
    trained = {**BEFORE_OPTIONS, **fmt}  # a record older than the layout and answer options: the format of its time
    return {k: v for k, v in trained.items() if k in used and k != "version" and v != used[k]}


def score_command(name: str, fmt: dict) -> str:
    """How `fastvista score` scores this student, whichever student is the default: the model and
    the answer style always, and every other format setting that differs from the library's."""
    answer = {**BEFORE_OPTIONS, **fmt}["answer"]
    rest = {k: v for k, v in differing(fmt, StudentConfig()).items() if k != "answer"}
    return f"fastvista score --set backend.model={name} --set student.answer={answer}" + "".join(
        f" --set student.{k}={v}" for k, v in rest.items())


def trained_in(precision: dict) -> dict | list[dict]:
    """The precision it trained in; one entry per chunk where a resume on another CPU changed it, so a
    card never names only the last chunk's precision for steps trained in another."""
    def kind(p: dict) -> dict:
        return {k: p.get(k) for k in ("mixed_precision", "dtype")}

    chunks = precision.get("chunks") or [precision]
    # a chunk killed before its first checkpoint left no steps: the next one resumed from where it had
    kept = [c for c, after in zip(chunks, [*chunks[1:], {}]) if not after.get("resumed_from") or after["resumed_from"] != c.get("resumed_from")]
    unrecorded = bool(kept[0].get("resumed_from"))  # resumed from a checkpoint carried without the run's precision.json
    if not unrecorded and all(kind(c) == kind(kept[0]) for c in kept):
        return kind(kept[0])
    rows = [{"chunk": i, "resumed_from": Path(c["resumed_from"]).name if c.get("resumed_from") else None, **kind(c)}
            for i, c in enumerate(kept, 1)]
    earlier = {"chunk": 0, "resumed_from": None, "mixed_precision": "not recorded", "dtype": "not recorded"}
    return [earlier, *rows] if unrecorded else rows


def model_card(name: str, base: str, record: dict, agreement: dict) -> str:
    """The README.md of a shipped student: front matter, what it is, its data, its settings, its figures."""
    front = {"base_model": base, "library_name": "peft", "license": "apache-2.0", "pipeline_tag": "text-generation",
             "tags": ["fastvista", "factuality", "dialogue", "lora", "trl"]}
    training = record.get("config", {}).get("training", {})
    steps = training.get("max_steps") or -1  # a positive max_steps, not the epochs, ends a run
    settings = {k: training.get(k) for k in ("max_steps" if steps > 0 else "num_train_epochs", "learning_rate", "lr_scheduler_type",
                                             "warmup_steps", "train_sampling_strategy", "per_device_train_batch_size",
                                             "gradient_accumulation_steps", "max_length", "bf16") if k in training}
    model = record.get("config", {}).get("model", {})
    settings.update({k: model.get(k) for k in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules") if k in model})
    if record.get("precision"):  # what it trained in, which can differ from the config's bf16 on a CPU (train/precision.py)
        settings["trained_in"] = trained_in(record["precision"])
    fmt = record.get("format", {})
    answer = fmt.get("answer", ANSWER)
    labels = ", ".join(label.value if spelled(label, answer) == label.value else f"`{spelled(label, answer)}` for {label.value}"
                       for label in Label)
    use = score_command(name, fmt)
    split = "fastvista data corpus-split" + "".join(f" --{k.replace('_', '-')} {v}" for k, v in differing(fmt, StudentConfig()).items()
                                                   if k in ("history_turns", "layout", "answer"))
    turns = agreement.get("turns", {}).get("usable")
    snapshot = record.get("snapshot")
    over = record.get("oversample")
    examples = record.get("examples", {}).get("train")  # the rows drawn from: the turns, and repeats where a run oversampled
    rows = (f"rows ({over['examples']} teacher-labelled turns and {over['repeats_added']} repeats)" if over
            else "teacher-labelled turns")
    batch = training.get("per_device_train_batch_size", 1) * training.get("gradient_accumulation_steps", 1) * record.get("world_size", 1)
    if snapshot:
        trained_on = (f"The first {snapshot['examples_through_step']} (one pass in file order: the snapshot at step {snapshot['step']} "
                      f"of a learning-curve run, its {snapshot['first_examples']}-turn point; the settings below are that run's)")
    elif steps > 0 and isinstance(examples, int) and steps * batch < examples:
        trained_on = f"{steps * batch} ({steps} steps of {batch}, in {training.get('train_sampling_strategy', 'random')} order) of the {examples}"
    elif steps > 0 and isinstance(examples, int):
        trained_on = f"{steps * batch / examples:.2f} passes ({steps} steps of {batch}) over the {examples}"
    else:
        trained_on = str(examples)
    started = record.get("init_adapter")
    started_line = (f"\nIts LoRA weights started from the finished adapter `{started['path']}` (sha256 `{started['sha256']}`), not from\n"
                    "fresh ones, so what it learned there counts too: that adapter's own record says from what.\n" if started else "")
    claims = (f"; {over['label']} claims went from {over['claim_share_before']:.1%} to {over['claim_share_after']:.1%} of the claims"
              if over and "claim_share_after" in over else "")  # records written before claim shares were kept lack them
    over_line = (f"\nThe {over['examples_with_label']} turns holding a {over['label']} claim were repeated until they made "
                 f"{over['share_after']:.1%} of the rows\n({over['share_before']:.1%} of the turns){claims}.\n" if over else "")
    resumed = record.get("resumed_from")
    cost = ("A snapshot: the run's time and memory are in its own record." if snapshot else
            f"Trained in {rounded(record.get('train_runtime_s'), 0)} s at {rounded(record.get('tokens_per_s'), 1)} tokens/s (peak\n"
            f"memory {record.get('peak_memory_mb')} MB)"
            + (f", timing only its last chunk: it resumed from {Path(resumed).name}." if resumed else "."))
    return f"""---
{yaml.safe_dump(front, sort_keys=False).strip()}
---

# {name}

The single-pass student of fastvista: given a dialogue turn, its history, its reference and the
knowledge store, one call writes every claim of the turn with its label ({labels}), in the
format `fastvista score` forces and reads. It learned to agree with fastvista's teacher: the VISTA pipeline whose model,
settings and prompts version `data/corpus/CORPUS.md` records.

- **Base model:** {base}; a LoRA adapter, trained with TRL's SFTTrainer and PEFT.
- **Use:** `fastvista models fetch {name}` (merges the adapter into the base), then `{use}`.
- **Student format** (recorded in format.json; `fastvista score` refuses other settings):
  {json.dumps(fmt)}

## Training data

{trained_on} {rows} of `{record.get('train_file')}`
(sha256 `{record.get('data_sha256')}`), built from the corpus of `data/corpus/` with
`{split}`. Validation: {record.get('examples', {}).get('eval')} turns of
dialogues never trained on; final validation loss {rounded(record.get('final_eval_loss'), 4)}.
{started_line}{over_line}
## Training settings

```yaml
{yaml.safe_dump(settings, sort_keys=False).strip()}
```

{cost}

## Agreement with the teacher ({turns} test turns of the corpus, never trained on)

{target_table(agreement)}
"""


def ship(adapter: Path, name: str, base: str, agreement: dict, students: Path) -> tuple[Path, str]:
    """Copy the adapter's files and write its card into `students/NAME`; returns the folder and
    the digest of its files (to pin in fastvista.models.STUDENTS)."""
    import re

    from fastvista.models import resolve_model, shipped_digest

    if not re.fullmatch(r"[\w][\w.-]*", name):
        raise ValueError(f"name {name!r}: letters, digits, . - _ only (it names a folder)")
    missing = [f for f in FILES + ("training_record.json",) if not (adapter / f).exists()]
    if missing:
        raise ValueError(f"{adapter} lacks {', '.join(missing)}: is it a student trained by train/sft.py?")
    trained = json.loads((adapter / "training_record.json").read_text())
    if trained.get("final_eval_loss") is None:
        raise ValueError(f"{adapter}: its training record holds no validation loss (a run killed before validating it: "
                         "resume it, or train with an eval_file)")
    if not trained.get("format"):
        raise ValueError(f"{adapter}: its training record holds no student format: train it again with train/sft.py")
    trained_on = trained.get("base_model")
    if trained_on and resolve_model(trained_on) != resolve_model(base):
        raise ValueError(f"{adapter} was trained on {trained_on}, not on {base}")
    if not (report_value(agreement, ("turns", "usable")) or 0) > 0:
        raise ValueError("the agreement report compares no turn: give the `fastvista eval agreement` report of this student "
                         "on the corpus's test turns")
    folder = students / name
    folder.mkdir(parents=True, exist_ok=True)
    for f in FILES:
        shutil.copy(adapter / f, folder / f)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = base  # the embedded name, not the trainer's local path
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    record = json.loads((adapter / "training_record.json").read_text())
    (folder / "README.md").write_text(model_card(name, base, record, agreement))
    return folder, shipped_digest(folder)
