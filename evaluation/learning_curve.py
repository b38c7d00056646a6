"""The learning curve: the student's agreement with its teacher on the corpus's test turns against
the number of teacher-labelled turns it was trained on, from one training run.

    fastvista eval learning-curve -c configs/eval/learning_curve_cpu.yaml -o runs/learning_curve

The training set of a point is the first whole dialogues of the corpus's train split, in labelling
order (a seeded shuffle, so every prefix is a fair sample), until that many turns: each smaller set
is part of each larger one. One run trains on the largest, in order (`train_sampling_strategy:
sequential`), each point's examples shuffled among those it adds to the previous one; the adapter
is saved, and validated, as soon as the run has seen a point's examples (`snapshot_examples` of
train/sft.py). So a point's student is what a run on its examples alone would be after one
pass (but for their order), at the same learning rate (the curve's config keeps it constant
after a fixed number of warm-up steps), and the
whole curve costs one training on the largest set: on a CPU, where training is the long pole.
Each point's student is merged (float32), scores the test dialogues with `fastvista score` and is
compared with the teacher (`fastvista eval agreement`).

A run keeps the training and validation sets it started with (copies in the output folder, their
digests and the training configs in run.json): a killed run resumes on them even after the corpus
grew (with a note: a curve of the grown corpus is a new output folder), and one whose training
configs changed is refused, never mixed. Checkpoints are saved at every snapshot. A point's scores
depend on the test files and the scoring config only and live in a folder named by their digest;
the test files are copied once per command, so every point of a command is scored on the same
test split, and a grown split is scored again by the same students without training. The
largest trained point is scored first, so a command stopped while earlier points are scored again
(after the test files or the scoring config changed) already has it in learning_curve.json, which
lists the points still to score (`not_scored_yet`; curves with such points are not compared). The
validation set is the first `eval_turns` turns of the validation split (whole dialogues).
Everything is checked before training; the training and scoring logs are kept beside their
outputs. Writes learning_curve.json, learning_curve.md and learning_curve.png. Between the chunks
of a long run, `--set train=false` scores the points trained so far and names those still to come.

A curve grows past a finished run with `extends: THAT_RUN` in a new output folder: the same
training configs, the finished run's training examples the first of this one's (larger sizes on
the same corpus split). Its points become this run's first ones, scores kept, and training goes on
from its adapter after the examples it saw; a finished run keeps no optimizer state, so AdamW
starts afresh and warms up again (run.json records it). Hours of CPU training are not repeated.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from fastvista.train.data import file_hash, read_examples
from fastvista.train.ship import TARGETS, report_value

METRICS = {  # agreement report key path -> column
    ("hallucinated_decision", "agreement"): "decision agreement",
    ("hallucinated_decision", "kappa"): "kappa",
    ("turn_score", "pearson"): "turn-score Pearson",
    ("claims", "recall"): "claim recall",
    ("claims", "labels_on_aligned", "accuracy"): "label accuracy (aligned)",
}


class LearningCurveConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sft_config: str  # configs/sft/*.yaml: the student's training settings
    accelerate_config: str = "configs/accelerate/cpu.yaml"
    score_config: str  # configs/score/*.yaml: how the merged student scores
    train_file: str  # the corpus's train.jsonl (fastvista data corpus-split)
    eval_file: str = ""  # its validation.jsonl
    eval_turns: int = 0  # validate on its first turns (whole dialogues); 0: all of it
    test_inputs: str  # the test dialogues to score
    test_teacher: str  # the teacher's labels of those dialogues
    sizes: list[int] = Field(min_length=1)  # training turns per point; 0 stands for all of them
    sft_keys: dict = {}  # sft.py keys over sft_config for every point (e.g. num_train_epochs)
    score_overrides: list[str] = []  # `fastvista score --set` keys over score_config (e.g. backend.dtype=float32)
    train: bool = True  # false: no training, score the points trained so far (between the chunks of a long run)
    # a finished curve's output folder that this (new) run goes on from: same training configs, its
    # training set the first part of this one's; its points become this run's first, scores kept
    extends: str = ""
    # end each training chunk at the first step after this many minutes, with a checkpoint (0: train to the end);
    # the points trained so far are scored and the same command goes on (not part of the run's identity)
    chunk_minutes: float = 0


NOTE = ("Each point is one pass over its first N training turns at a constant learning rate: snapshots of one run, "
        "so a point is what a run on its turns alone would be. A point ships like a finished run (`fastvista models ship SNAPSHOT`).")


def first_turns(examples: list[dict], n: int) -> list[dict]:
    """Whole dialogues in file order until at least n examples (all when n is 0 or too large)."""
    if n <= 0 or n >= len(examples):
        return list(examples)
    taken, dialogues = [], set()
    for e in examples:
        if e["dialogue_id"] not in dialogues:
            if len(taken) >= n:
                break
            dialogues.add(e["dialogue_id"])
        taken.append(e)
    return taken


def table(points: list[dict]) -> str:
    lines = ["| training turns | dialogues | validation loss | test turns | " + " | ".join(METRICS.values()) + " | parsed |",
             "|---|---|---|---|" + "---|" * len(METRICS) + "---|"]
    for p in points:
        cells = [f"{v:.3f}" if isinstance(v, float) else "-" for v in (p["metrics"].get(c) for c in METRICS.values())]
        test = f"{p.get('test_turns', '-')}" + (f" ({p['test_turns_unscored']} unscored)" if p.get("test_turns_unscored") else "")
        loss = f"{p['eval_loss']:.4f}" if p.get("eval_loss") is not None else "-"
        lines.append(f"| {p['turns']} | {p['dialogues']} | {loss} | {test} | " + " | ".join(cells) + f" | {p.get('parsed', '-')} |")
    return "\n".join(lines)


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    targets = {path: target for _, path, target in TARGETS}
    for key, column in METRICS.items():
        xs = [p["turns"] for p in points if p["metrics"].get(column) is not None]
        [line] = ax.plot(xs, [p["metrics"][column] for p in points if p["metrics"].get(column) is not None], "o-", label=column)
        if key in targets:  # the target, dashed in the metric's colour
            ax.axhline(targets[key], color=line.get_color(), linestyle="--", linewidth=0.8, alpha=0.7)
    ax.set_xscale("log")
    ax.set_title("dashed: the targets", fontsize=8)
    ax.set_xlabel("teacher-labelled training turns")
    ax.set_ylabel("agreement with the teacher (test turns)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bases_table(curves: dict[str, dict]) -> str:
    """Several curves (learning_curve.json, one per base) in one table, by training turns; refused
    unless every curve was scored on the same test files (the digest in their frozen copies' folder)."""
    tests = {name: Path(curve["config"]["test_teacher"]).parent.name for name, curve in curves.items()}
    if len(set(tests.values())) > 1:
        raise ValueError(f"the curves were scored on different test files, so their points do not compare: {tests}")
    unscored = {name: curve["not_scored_yet"] for name, curve in curves.items() if curve.get("not_scored_yet")}
    if unscored:
        raise ValueError(f"points still to score (their command stopped midway; run it again): {unscored}")
    lines = ["| base | training turns | validation loss | " + " | ".join(METRICS.values()) + " | parsed |",
             "|---|---|---|" + "---|" * len(METRICS) + "---|"]
    for name, curve in curves.items():
        for p in sorted(curve["points"], key=lambda p: p["turns"]):
            cells = [f"{v:.3f}" if isinstance(v, float) else "-" for v in (p["metrics"].get(c) for c in METRICS.values())]
            loss = f"{p['eval_loss']:.3f}" if p.get("eval_loss") is not None else "-"
            lines.append(f"| {name} | {p['turns']} | {loss} | " + " | ".join(cells) + f" | {p.get('parsed', '-')} |")
    return "\n".join(lines)


def plot_bases(curves: dict[str, dict], path: Path) -> None:
    """One panel per measure, one line per base, the target dashed: which base learns faster."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = {key: target for _, key, target in TARGETS}
    fig, axes = plt.subplots(1, len(METRICS), figsize=(2.8 * len(METRICS), 3.4))
    lines, turns = {}, sorted({p["turns"] for curve in curves.values() for p in curve["points"]})
    for ax, (key, column) in zip(axes, METRICS.items()):
        for name, curve in curves.items():
            shown = sorted((p["turns"], p["metrics"][column]) for p in curve["points"] if p["metrics"].get(column) is not None)
            if shown:
                [lines[name]] = ax.plot(*zip(*shown), "o-", color=f"C{list(curves).index(name)}")
        if key in targets:
            ax.axhline(targets[key], color="gray", linestyle="--", linewidth=0.8)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(turns, [str(t) for t in turns], rotation=45)
        ax.set_title(column, fontsize=9)
        ax.set_xlabel("training turns", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle("agreement with the teacher on the same test turns (dashed: the target)", fontsize=9)
    fig.legend(list(lines.values()), list(lines), fontsize=7, loc="lower center", ncol=len(lines))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _run(cmd: list[str], what: str, log: Path, accept: tuple[int, ...] = (0,)) -> None:
    """Run a stage with its output in `log` (appended: a resumed stage keeps its earlier log), on
    every core (a test's OMP_NUM_THREADS=1 would otherwise train on one)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": str(os.cpu_count() or 1)})
    if done.returncode not in accept:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {' '.join(cmd)}\n(log: {log})\n{tail}")


def launch_args(keys: dict) -> list[str]:
    """sft.py's command-line keys: a list as its items (argparse reads `--key 1 2`), an empty list
    left out, other values as JSON or text."""
    args: list[str] = []
    for k, v in keys.items():
        if isinstance(v, list):
            args += [f"--{k}", *map(str, v)] if v else []
        else:
            args += [f"--{k}", json.dumps(v) if isinstance(v, (bool, dict)) or v is None else str(v)]
    return args


def _digest(path: str) -> str | None:
    return file_hash(path) if path and Path(path).exists() else None


def _text(rows: list[dict]) -> str:
    return "".join(json.dumps(e) + "\n" for e in rows)


def manifest(cfg: LearningCurveConfig, train_text: str, eval_text: str) -> dict:
    """What the run's training depends on: its training and validation sets, the training configs."""
    return {"train_sha256": hashlib.sha256(train_text.encode()).hexdigest(), "eval_sha256": hashlib.sha256(eval_text.encode()).hexdigest(),
            "sft_config": _digest(cfg.sft_config), "sft_keys": cfg.sft_keys, "accelerate_config": _digest(cfg.accelerate_config)}


def scoring_folder(cfg: LearningCurveConfig, folder: Path) -> Path:
    """Where a point's scores on the current test files live: named by what they depend on."""
    depends = {"test_inputs": _digest(cfg.test_inputs), "test_teacher": _digest(cfg.test_teacher),
               "score_config": _digest(cfg.score_config), "score_overrides": cfg.score_overrides}
    return folder / f"scored_{hashlib.sha256(json.dumps(depends, sort_keys=True).encode()).hexdigest()[:12]}"


def ordered(examples: list[dict], sizes: list[int], seed: int = 0) -> list[dict]:
    """The run's training file: the first `sizes[0]` examples shuffled among themselves, then the
    next ones up to `sizes[1]`, and so on: read in order, the first n examples are each point's."""
    rng, rows, start = random.Random(seed), [], 0
    for end in sorted(sizes):
        block = examples[start:end]
        rng.shuffle(block)
        rows += block
        start = end
    return rows


TRAINING_CONFIGS = ("sft_config", "sft_keys", "accelerate_config")


def extend(earlier: Path, student: Path, wanted: dict, text: str, eval_text: str) -> tuple[Path, dict]:
    """Seed a folder beside `student` from the finished run of `earlier`, whose training set is the
    first part of this one's, on the same configs: its snapshots and its last point (as a snapshot,
    with their scores) and a checkpoint from its adapter (train/warm_start.py), so training goes on
    after the examples it saw. Its optimizer state was not kept: the optimizer starts afresh and
    warms up again. Returns the seeded folder (the caller records it in run.json, then renames it
    in) and what run.json records of it."""
    from fastvista.train.warm_start import checkpoint_from_adapter, finished_steps

    was_path, done = earlier / "run.json", earlier / "student" / "training_record.json"
    if not was_path.exists() or not done.exists():
        raise ValueError(f"extends: {earlier} holds no finished learning-curve run (run.json, student/training_record.json)")
    was, record = json.loads(was_path.read_text()), json.loads(done.read_text())
    if not isinstance(was.get("sizes"), list) or not was["sizes"] or "train_sha256" not in was:
        raise ValueError(f"extends: {was_path}: no sizes or train_sha256: not a learning-curve run's record")
    changed = [k for k in TRAINING_CONFIGS if was.get(k) != wanted[k]]
    if changed:
        raise ValueError(f"extends: {earlier} was trained with another {', '.join(changed)}: its steps are not this run's")
    earlier_text = (earlier / "train.jsonl").read_text() if (earlier / "train.jsonl").exists() else None
    if earlier_text is None or hashlib.sha256(earlier_text.encode()).hexdigest() != was["train_sha256"]:
        raise ValueError(f"extends: {earlier}/train.jsonl is missing or not the file its run.json records")
    held_out = earlier / "validation.jsonl"
    if not text.startswith(earlier_text) or (held_out.read_text() if held_out.exists() else "") != eval_text:
        raise ValueError(f"extends: {earlier}'s training examples are not the first of this run's, in its order, on the same "
                         "validation set (the same corpus split, and its sizes among this config's)")
    if not set(was["sizes"]) <= set(wanted["sizes"]) or wanted["sizes"][-1] <= was["sizes"][-1]:
        raise ValueError(f"extends: {earlier}'s points {was['sizes']} must all be among this run's {wanted['sizes']}, "
                         "and this run must go past its last")
    steps = finished_steps(record, done)
    partial = student.with_name(student.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    skip = shutil.ignore_patterns("merged", "merged.partial", "checkpoint-*", "snapshots")
    for snapshot in sorted((earlier / "student" / "snapshots").glob("turns_*")):
        if not snapshot.name.endswith(".partial"):
            shutil.copytree(snapshot, partial / "snapshots" / snapshot.name, ignore=skip)
    last = partial / "snapshots" / f"turns_{was['sizes'][-1]}"
    shutil.copytree(earlier / "student", last, ignore=skip)
    snapshot = {"first_examples": was["sizes"][-1], "step": steps, "examples_through_step": record["examples"]["train"]}
    (last / "snapshot.json").write_text(json.dumps(snapshot))
    (last / "training_record.json").write_text(json.dumps({**record, "snapshot": snapshot}, indent=2))
    step = checkpoint_from_adapter(earlier / "student", partial / "checkpoint-0", record, done)
    (partial / "checkpoint-0").rename(partial / f"checkpoint-{step}")
    if (earlier / "student" / "precision.json").exists():  # the chunks of training go on from the earlier run's
        shutil.copyfile(earlier / "student" / "precision.json", partial / "precision.json")
    return partial, {"run": str(earlier.resolve()), "train_sha256": was["train_sha256"], "sizes": was["sizes"], "resumes_at_step": step,
                     "optimizer": "started afresh with its warm-up (a finished run keeps no optimizer state)"}


def _write(path: Path, content: str) -> None:
    """Written aside and renamed in: a kill leaves the old file or the new one, never half of one."""
    partial = path.with_suffix(".partial")
    partial.write_text(content)
    partial.replace(path)


def train(cfg: LearningCurveConfig, examples: list[dict], sizes: list[int], validation: list[dict], out: Path) -> tuple[Path, list[dict], list[int], bool]:
    """One training run over the largest point's examples, snapshots at the others. A run that
    has trained goes on with the sets it started with (a note says when the corpus changed since)
    and is refused when a training config changed. Returns the student folder, the run's
    training examples in the order it reads them, its sizes, and whether a chunk ended before the
    training did (`chunk_minutes`)."""
    from fastvista.train.sft import CHUNK_MARKER

    text, eval_text = _text(ordered(examples[: sizes[-1]], sizes)), _text(validation)
    wanted, recorded = {**manifest(cfg, text, eval_text), "sizes": sizes}, out / "run.json"
    train_file, eval_file, student = out / "train.jsonl", out / "validation.jsonl", out / "student"
    trained = any(student.glob("checkpoint-*")) or any(student.glob("snapshots/turns_*")) or (student / "training_record.json").exists()
    if recorded.exists() and trained:
        was = json.loads(recorded.read_text())
        changed = [k for k in TRAINING_CONFIGS if was.get(k) != wanted[k]]
        if changed:
            raise ValueError(f"{out} was trained with another {', '.join(changed)}: use a new output folder")
        went_on_from = was.get("extends", {}).get("run")
        if went_on_from and Path(went_on_from).resolve() != (Path(cfg.extends).resolve() if cfg.extends else None):
            raise ValueError(f"{out} went on from {went_on_from}, not {cfg.extends or 'no earlier run'}: use a new output folder")
        if {k: v for k, v in was.items() if k != "extends"} != wanted:
            print(f"note: {out} goes on with the training and validation sets it started with ({was['sizes'][-1]} training turns); "
                  "the corpus changed since: a curve of the current corpus needs a new output folder", file=sys.stderr)
        sizes, eval_text = was["sizes"], eval_file.read_text() if eval_file.exists() else ""
    else:  # a run that never trained a step may start again with other inputs
        out.mkdir(parents=True, exist_ok=True)
        for path, content in ((train_file, text), (eval_file, eval_text), (recorded, json.dumps(wanted, indent=2))):
            _write(path, content)
        if cfg.extends:  # recorded before the seed is renamed in: a run killed while seeding is seeded again
            seeded, origin = extend(Path(cfg.extends), student, wanted, text, eval_text)
            _write(recorded, json.dumps({**wanted, "extends": origin}, indent=2))
            seeded.rename(student)
    chunk_ended = False
    if not (student / "training_record.json").exists():
        # resume: a killed run goes on from its last checkpoint; snapshots already saved stay
        keys = {**cfg.sft_keys, "train_file": str(train_file), "output_dir": str(student), "merge": True, "resume": True,
                "stop_after_minutes": cfg.chunk_minutes, "train_sampling_strategy": "sequential", "snapshot_examples": sizes[:-1]}
        if eval_text:
            keys["eval_file"] = str(eval_file)
        marker = student / CHUNK_MARKER
        marker.unlink(missing_ok=True)  # only this launch's
        try:
            _run([str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", cfg.accelerate_config, "train/sft.py",
                  "--config", cfg.sft_config, *launch_args(keys)], f"training on {sizes[-1]} turns", out / "train.log")
        except RuntimeError:
            if not marker.exists():
                raise
            chunk_ended = True
            print(f"note: this training chunk ended after {cfg.chunk_minutes:g} minutes at {json.loads(marker.read_text())['checkpoint']}; "
                  "the same command goes on from it", file=sys.stderr)
    return student, read_examples(str(train_file)), sizes, chunk_ended


def trained_so_far(cfg: LearningCurveConfig, out: Path) -> tuple[Path, list[dict], list[int]]:
    """The run of `out` as it stands, for scoring without training: its student folder, training
    examples in order and sizes; refused when this config would have trained another run."""
    recorded = out / "run.json"
    if not recorded.exists():
        raise ValueError(f"{out} holds no learning-curve run (run.json): train first (train: true)")
    was, wanted = json.loads(recorded.read_text()), manifest(cfg, "", "")
    changed = [k for k in TRAINING_CONFIGS if was.get(k) != wanted[k]]
    if changed:
        raise ValueError(f"{out} was trained with another {', '.join(changed)}: score it with the config it was trained with")
    return out / "student", read_examples(str(out / "train.jsonl")), was["sizes"]


def merged(adapter: Path) -> Path:
    """An adapter (a snapshot's or the finished run's) merged into its base (float32), built aside and
    renamed in: kept runs need not keep their merged models."""
    done = adapter / "merged"
    if not done.exists():
        from fastvista.train.merge import merge

        partial = adapter / "merged.partial"
        shutil.rmtree(partial, ignore_errors=True)
        merge(adapter, partial)
        partial.rename(done)
    return done


def score_point(cfg: LearningCurveConfig, size: int, subset: list[dict], adapter: Path, record: dict) -> dict:
    """One point's student scores the test dialogues and is compared with the teacher; its adapter
    is merged only when there is scoring to do (a kept run's scores are read without 2 GB merges)."""
    from fastvista.evaluation.compare import agreement
    from fastvista.records_io import read_scored
    from fastvista.scheduler import read_failed

    scored = scoring_folder(cfg, adapter)
    if not (scored / "summary.json").exists() or read_failed(scored):
        model = merged(adapter)
        # resumes: kept dialogues stay, failed ones are tried again; exit 3 leaves those that fail
        # again (an answer that never parsed) in failed.jsonl, counted as unparsed below
        sets = [a for key in [*cfg.score_overrides, f"backend.model={model}"] for a in ("--set", key)]
        _run([str(Path(sys.executable).parent / "fastvista"), "score", "-c", cfg.score_config, *sets, "-i", cfg.test_inputs,
              "-o", str(scored)], f"scoring with the {size}-turn student", scored.with_name(scored.name + ".log"), accept=(0, 3))
    report = agreement(read_scored(scored / "results.jsonl"), read_scored(Path(cfg.test_teacher)))
    (scored / "agreement.json").write_text(json.dumps(report, indent=2))
    return {"turns": size, "dialogues": len({e["dialogue_id"] for e in subset}), "scores": str(scored),
            "test_turns": report["turns"]["usable"], "test_turns_unscored": report["turns"]["only_teacher"],
            "metrics": {column: report_value(report, path) for path, column in METRICS.items()},
            "turn_score_pearson_ci95": report_value(report, ("turn_score", "pearson_ci95")), **record,
            "parsed": parsed_share(json.loads((scored / "summary.json").read_text()), read_failed(scored))}


def parsed_share(summary: dict, failed: list[dict]) -> float | None:
    """Scored turns over scored plus those of dialogues that failed (an answer that never read)."""
    unscored = sum(f.get("unscored_turns", 0) for f in failed)
    total = summary.get("scored_turns", 0) + unscored
    return round(summary.get("scored_turns", 0) / total, 4) if total else None


def checked(cfg: LearningCurveConfig, out: Path | None = None) -> None:
    """Everything the hours of training lead to, checked before they start: the files, the
    scoring config with its overrides, and no test dialogue among the training ones."""
    from fastvista.config import load_config
    from fastvista.infer.run import ScoreConfig

    seeded = out is not None and (out / "student").exists()  # then the earlier run is no longer read
    if cfg.extends and not seeded and not (Path(cfg.extends) / "run.json").exists():
        raise ValueError(f"extends: {cfg.extends}: no learning-curve run there (run.json)")
    if len(cfg.sizes) > 1 and not cfg.eval_file:
        raise ValueError("eval_file: the snapshots of one run are validated on it (and it keeps the training file in order)")
    for key in ("sft_config", "accelerate_config", "score_config", "train_file", "eval_file", "test_inputs", "test_teacher"):
        path = getattr(cfg, key)
        if path and not Path(path).exists():
            raise ValueError(f"{key}: {path}: no such file (the corpus files come from `fastvista data corpus-split`)")
    tree = load_config(cfg.score_config, [*cfg.score_overrides, "backend.model=each point's student"])
    tree.pop("data", None)
    ScoreConfig.model_validate(tree)
    with open(cfg.test_inputs) as f:
        tested = {json.loads(line)["id"] for line in f if line.strip()}
    trained = {e["dialogue_id"] for e in read_examples(cfg.train_file)}
    if tested & trained:
        raise ValueError(f"{cfg.test_inputs}: {len(tested & trained)} test dialogues are in {cfg.train_file}, e.g. {sorted(tested & trained)[0]}")


def frozen_tests(cfg: LearningCurveConfig, out: Path) -> LearningCurveConfig:
    """The test files copied once (folder named by their digest): every point of this command is
    scored on the same split even if the corpus is split again meanwhile."""
    digest = hashlib.sha256(f"{file_hash(cfg.test_inputs)} {file_hash(cfg.test_teacher)}".encode()).hexdigest()[:12]
    folder = out / "tests" / digest
    if not folder.exists():
        partial = folder.with_name(digest + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        shutil.copyfile(cfg.test_inputs, partial / "test_inputs.jsonl")
        shutil.copyfile(cfg.test_teacher, partial / "test_labelled.jsonl")
        partial.rename(folder)
    return cfg.model_copy(update={"test_inputs": str(folder / "test_inputs.jsonl"), "test_teacher": str(folder / "test_labelled.jsonl")})


def main(cfg: LearningCurveConfig, out: Path) -> list[dict]:
    from fastvista.reaper import watch_children
    from fastvista.scheduler import folder_lock

    checked(cfg, out)
    with folder_lock(out):
        watch_children()  # a killed command takes its training and scoring with it
        return curve(cfg, out)


def curve(cfg: LearningCurveConfig, out: Path) -> list[dict]:
    if cfg.train:
        examples = read_examples(cfg.train_file)
        validation = first_turns(read_examples(cfg.eval_file), cfg.eval_turns) if cfg.eval_file else []
        sizes = sorted({len(first_turns(examples, n)) for n in cfg.sizes})
        student, rows, sizes, chunk_ended = train(cfg, examples, sizes, validation, out)
    else:
        (student, rows, sizes), chunk_ended = trained_so_far(cfg, out), False
    cfg = frozen_tests(cfg, out)
    finished = (student / "training_record.json").exists()
    run = json.loads((student / "training_record.json").read_text()) if finished else {}
    eval_loss = {e["step"]: e["eval_loss"] for e in run.get("eval_loss", [])}
    points, pending, trained = [], [], []

    def save() -> None:
        unscored = [size for size, _, _ in trained if size not in {p["turns"] for p in points}]
        _write(out / "learning_curve.json", json.dumps({"config": cfg.model_dump(), "training": str(student), "points": points,
                                                        "not_trained_yet": pending, "not_scored_yet": unscored}, indent=2))

    for size in sizes:
        if size == sizes[-1]:
            if not finished:
                pending.append(size)
                continue
            adapter, record = student, {"step": None, "eval_loss": run.get("final_eval_loss")}
        else:
            snapshot = student / "snapshots" / f"turns_{size}"
            if not snapshot.exists():
                if cfg.train and not chunk_ended:
                    raise RuntimeError(f"the run left no snapshot after {size} turns ({snapshot}): see {student}")
                pending.append(size)
                continue
            step = json.loads((snapshot / "snapshot.json").read_text())["step"]
            saved = json.loads((snapshot / "training_record.json").read_text()) if (snapshot / "training_record.json").exists() else {}
            # the snapshot's own validation, else the run's at its step (a snapshot of an earlier run, extended, was
            # validated there; the run that goes on validates that step again on more examples)
            own = saved.get("final_eval_loss")
            adapter, record = snapshot, {"step": step, "eval_loss": own if own is not None else eval_loss.get(step)}
        trained.append((size, adapter, record))
    if trained:
        save()
    for size, adapter, record in reversed(trained):  # the newest point first: the one a run waits for
        points.append(score_point(cfg, size, rows[:size], adapter, record))
        points.sort(key=lambda p: p["turns"])
        save()
    if not points:
        raise ValueError(f"no point of {out} is trained yet (sizes {sizes}): nothing to score")
    save()
    waiting = f"\n\nNot trained yet: {', '.join(map(str, pending))} turns (the run goes on with `train: true`)." if pending else ""
    (out / "learning_curve.md").write_text(f"{NOTE}{waiting}\n\n{table(points)}\n")
    plot(points, out / "learning_curve.png")
    print(table(points) + waiting)
    return points
