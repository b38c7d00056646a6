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

A trained run is kept when what it depends on is the same (its training and validation sets, the
training configs: run.json); a run trained otherwise is refused, never mixed. (A corpus that grew
has a larger train split: with `0`, "all of it", among the sizes, that is another run.) A point's
scores depend on the test files and the scoring config only and live in a folder named by their
digest: with fixed sizes the same students score a grown test split again without training, and
the earlier scores stay. The validation set is the first `eval_turns` turns of the validation split
(whole dialogues). Writes learning_curve.json, learning_curve.md and learning_curve.png.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from fastvista.train.data import file_hash, read_examples

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
    sizes: list[int]  # training turns per point; 0 stands for all of them
    sft_keys: dict = {}  # sft.py keys over sft_config for every point (e.g. num_train_epochs)
    score_overrides: list[str] = []  # `fastvista score --set` keys over score_config (e.g. backend.dtype=float32)


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


def metric(report: dict, path: tuple) -> float | None:
    for key in path:
        report = report.get(key) if isinstance(report, dict) else None
    return report


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

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for column in ("decision agreement", "kappa", "turn-score Pearson", "label accuracy (aligned)"):
        xs = [p["turns"] for p in points if p["metrics"].get(column) is not None]
        ax.plot(xs, [p["metrics"][column] for p in points if p["metrics"].get(column) is not None], "o-", label=column)
    ax.set_xscale("log")
    ax.set_xlabel("teacher-labelled training turns")
    ax.set_ylabel("agreement with the teacher (test turns)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _run(cmd: list[str], what: str, accept: tuple[int, ...] = (0,)) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode not in accept:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")


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


def train(cfg: LearningCurveConfig, examples: list[dict], sizes: list[int], validation: list[dict], out: Path) -> Path:
    """One training run over the largest point's examples, snapshots at the others; kept when
    what it depends on is unchanged, refused when it changed."""
    text, eval_text = _text(ordered(examples[: sizes[-1]], sizes)), _text(validation)
    wanted, recorded = {**manifest(cfg, text, eval_text), "sizes": sizes}, out / "run.json"
    train_file, eval_file, student = out / "train.jsonl", out / "validation.jsonl", out / "student"
    trained = any(student.glob("checkpoint-*")) or any(student.glob("snapshots/turns_*")) or (student / "training_record.json").exists()
    if recorded.exists() and json.loads(recorded.read_text()) != wanted and trained:
        changed = [k for k, v in json.loads(recorded.read_text()).items() if wanted.get(k) != v]
        raise ValueError(f"{out} was trained with another {', '.join(changed)} (the corpus grew or a config changed?): "
                         "use a new output folder")
    if not recorded.exists() or not trained:  # a run that never trained a step may start again with other inputs
        out.mkdir(parents=True, exist_ok=True)
        for path, content in ((train_file, text), (eval_file, eval_text)):
            partial = path.with_suffix(".partial")
            partial.write_text(content)
            partial.replace(path)
        recorded.write_text(json.dumps(wanted, indent=2))
    if not (student / "training_record.json").exists():
        # resume: a killed run goes on from its last checkpoint; snapshots already saved stay
        keys = {**cfg.sft_keys, "train_file": str(train_file), "output_dir": str(student), "merge": True, "resume": True,
                "train_sampling_strategy": "sequential", "snapshot_examples": sizes[:-1]}
        if eval_text:
            keys["eval_file"] = str(eval_file)
        args = [a for k, v in keys.items() for a in (f"--{k}", json.dumps(v) if isinstance(v, (bool, list, dict)) or v is None else str(v))]
        _run([str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", cfg.accelerate_config, "train/sft.py",
              "--config", cfg.sft_config, *args], f"training on {sizes[-1]} turns")
    return student


def merged(adapter: Path) -> Path:
    """A snapshot's adapter merged into its base (float32), built aside and renamed in."""
    done = adapter / "merged"
    if not done.exists():
        from fastvista.train.merge import merge

        partial = adapter / "merged.partial"
        shutil.rmtree(partial, ignore_errors=True)
        merge(adapter, partial)
        partial.rename(done)
    return done


def score_point(cfg: LearningCurveConfig, size: int, subset: list[dict], model: Path, record: dict) -> dict:
    """One point's student scores the test dialogues and is compared with the teacher."""
    from fastvista.evaluation.compare import agreement
    from fastvista.records_io import read_scored
    from fastvista.scheduler import read_failed

    scored = scoring_folder(cfg, model.parent)
    if not (scored / "summary.json").exists() or read_failed(scored):
        # resumes: kept dialogues stay, failed ones are tried again; exit 3 leaves those that fail
        # again (an answer that never parsed) in failed.jsonl, counted as unparsed below
        sets = [a for key in [*cfg.score_overrides, f"backend.model={model}"] for a in ("--set", key)]
        _run([str(Path(sys.executable).parent / "fastvista"), "score", "-c", cfg.score_config, *sets, "-i", cfg.test_inputs,
              "-o", str(scored)], f"scoring with the {size}-turn student", accept=(0, 3))
    report = agreement(read_scored(scored / "results.jsonl"), read_scored(Path(cfg.test_teacher)))
    (scored / "agreement.json").write_text(json.dumps(report, indent=2))
    return {"turns": size, "dialogues": len({e["dialogue_id"] for e in subset}), "scores": str(scored),
            "test_turns": report["turns"]["usable"], "test_turns_unscored": report["turns"]["only_teacher"],
            "metrics": {column: metric(report, path) for path, column in METRICS.items()},
            "turn_score_pearson_ci95": metric(report, ("turn_score", "pearson_ci95")), **record,
            "parsed": parsed_share(json.loads((scored / "summary.json").read_text()), read_failed(scored))}


def parsed_share(summary: dict, failed: list[dict]) -> float | None:
    """Scored turns over scored plus those of dialogues that failed (an answer that never read)."""
    unscored = sum(f.get("unscored_turns", 0) for f in failed)
    total = summary.get("scored_turns", 0) + unscored
    return round(summary.get("scored_turns", 0) / total, 4) if total else None


def main(cfg: LearningCurveConfig, out: Path) -> list[dict]:
    if len(cfg.sizes) > 1 and not cfg.eval_file:
        raise ValueError("eval_file: the snapshots of one run are validated on it (and it keeps the training file in order)")
    examples = read_examples(cfg.train_file)
    validation = first_turns(read_examples(cfg.eval_file), cfg.eval_turns) if cfg.eval_file else []
    sizes = sorted({len(first_turns(examples, n)) for n in cfg.sizes})
    student = train(cfg, examples, sizes, validation, out)
    run = json.loads((student / "training_record.json").read_text())
    eval_loss = {e["step"]: e["eval_loss"] for e in run.get("eval_loss", [])}
    points = []
    for size in sizes:
        if size == sizes[-1]:
            model, record = student / "merged", {"step": None, "eval_loss": run.get("final_eval_loss")}
        else:
            snapshot = student / "snapshots" / f"turns_{size}"
            if not snapshot.exists():
                raise RuntimeError(f"the run left no snapshot after {size} turns ({snapshot}): see {student}")
            step = json.loads((snapshot / "snapshot.json").read_text())["step"]
            model, record = merged(snapshot), {"step": step, "eval_loss": eval_loss.get(step)}
        points.append(score_point(cfg, size, first_turns(examples, size), model, record))
        (out / "learning_curve.json").write_text(json.dumps({"config": cfg.model_dump(), "training": str(student), "points": points}, indent=2))
    (out / "learning_curve.md").write_text(table(points) + "\n")
    plot(points, out / "learning_curve.png")
    print(table(points))
    return points
