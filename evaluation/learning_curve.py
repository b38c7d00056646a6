"""The learning curve: the student's agreement with its teacher on the corpus's test turns against
the number of teacher-labelled turns it was trained on.

    fastvista eval learning-curve -c configs/eval/learning_curve_cpu.yaml -o runs/learning_curve

For each size the training set is the first whole dialogues of the corpus's train split, in
labelling order (a seeded shuffle, so every prefix is a fair sample), until that many turns: each
smaller set is part of each larger one, and a set stays the same as the corpus grows. Each point
trains with `accelerate launch train/sft.py`, scores the test dialogues with `fastvista score`
and compares with the teacher (`fastvista eval agreement`). A trained point is kept when what its
training depends on is the same (its training set, its validation set, the training configs:
its point.json); a point trained otherwise is refused, never mixed. Its scoring depends on the
test files and the scoring config only, and lives in a folder named by their digest: when the
corpus grows, the same students score the larger test split without training again, and the
earlier scores stay. The validation set is the first `eval_turns` turns of the validation
split (whole dialogues), so it too stays the same as the corpus grows. Writes
learning_curve.json, learning_curve.md and learning_curve.png.
"""

from __future__ import annotations

import hashlib
import json
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
    lines = ["| training turns | dialogues | test turns | " + " | ".join(METRICS.values()) + " | parsed |",
             "|---|---|---|" + "---|" * len(METRICS) + "---|"]
    for p in points:
        cells = [f"{v:.3f}" if isinstance(v, float) else "-" for v in (p["metrics"].get(c) for c in METRICS.values())]
        test = f"{p.get('test_turns', '-')}" + (f" ({p['test_turns_unscored']} unscored)" if p.get("test_turns_unscored") else "")
        lines.append(f"| {p['turns']} | {p['dialogues']} | {test} | " + " | ".join(cells) + f" | {p.get('parsed', '-')} |")
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
    """What a point's training depends on: its training and validation sets, the training configs."""
    return {"train_sha256": hashlib.sha256(train_text.encode()).hexdigest(), "eval_sha256": hashlib.sha256(eval_text.encode()).hexdigest(),
            "sft_config": _digest(cfg.sft_config), "sft_keys": cfg.sft_keys, "accelerate_config": _digest(cfg.accelerate_config)}


def scoring_folder(cfg: LearningCurveConfig, folder: Path) -> Path:
    """Where a point's scores on the current test files live: named by what they depend on."""
    depends = {"test_inputs": _digest(cfg.test_inputs), "test_teacher": _digest(cfg.test_teacher),
               "score_config": _digest(cfg.score_config), "score_overrides": cfg.score_overrides}
    return folder / f"scored_{hashlib.sha256(json.dumps(depends, sort_keys=True).encode()).hexdigest()[:12]}"


def point(cfg: LearningCurveConfig, examples: list[dict], size: int, out: Path, validation: list[dict] = ()) -> dict:
    """Train, score and compare one point, reusing a training only when what it depends on is the
    same (its manifest; a point trained otherwise is refused, never mixed) and scores only when
    made on the same test files and scoring config."""
    subset = first_turns(examples, size)
    folder = out / f"turns_{len(subset)}"
    folder.mkdir(parents=True, exist_ok=True)
    text, eval_text = _text(subset), _text(validation)
    wanted, recorded = manifest(cfg, text, eval_text), folder / "point.json"
    if recorded.exists() and json.loads(recorded.read_text()) != wanted:
        changed = [k for k, v in json.loads(recorded.read_text()).items() if wanted.get(k) != v]
        raise ValueError(f"{folder} was trained with another {', '.join(changed)} (a config changed?): use a new output folder")
    train_file, eval_file = folder / "train.jsonl", folder / "validation.jsonl"
    if not recorded.exists():
        for path, content in ((train_file, text), (eval_file, eval_text)):
            partial = path.with_suffix(".partial")
            partial.write_text(content)
            partial.replace(path)
        recorded.write_text(json.dumps(wanted, indent=2))
    student, scored = folder / "student", scoring_folder(cfg, folder)
    bin_dir = Path(sys.executable).parent
    if not (student / "training_record.json").exists():
        # resume: a killed point goes on from its last checkpoint
        keys = {**cfg.sft_keys, "train_file": str(train_file), "output_dir": str(student), "merge": True, "resume": True}
        if eval_text:
            keys["eval_file"] = str(eval_file)
        args = [a for k, v in keys.items() for a in (f"--{k}", json.dumps(v) if isinstance(v, (bool, list, dict)) or v is None else str(v))]
        _run([str(bin_dir / "accelerate"), "launch", "--config_file", cfg.accelerate_config, "train/sft.py",
              "--config", cfg.sft_config, *args], f"training on {len(subset)} turns")
    from fastvista.evaluation.compare import agreement
    from fastvista.records_io import read_scored
    from fastvista.scheduler import read_failed

    if not (scored / "summary.json").exists() or read_failed(scored):
        # resumes: kept dialogues stay, failed ones are tried again; exit 3 leaves those that fail
        # again (an answer that never parsed) in failed.jsonl, counted as unparsed below
        sets = [a for key in [*cfg.score_overrides, f"backend.model={student / 'merged'}"] for a in ("--set", key)]
        _run([str(bin_dir / "fastvista"), "score", "-c", cfg.score_config, *sets, "-i", cfg.test_inputs, "-o", str(scored)],
             f"scoring with the {len(subset)}-turn student", accept=(0, 3))
    report = agreement(read_scored(scored / "results.jsonl"), read_scored(Path(cfg.test_teacher)))
    (scored / "agreement.json").write_text(json.dumps(report, indent=2))
    record = json.loads((student / "training_record.json").read_text())
    return {"turns": len(subset), "dialogues": len({e["dialogue_id"] for e in subset}), "train_sha256": wanted["train_sha256"],
            "scores": str(scored),
            "test_turns": report["turns"]["usable"], "test_turns_unscored": report["turns"]["only_teacher"],
            "metrics": {column: metric(report, path) for path, column in METRICS.items()},
            "turn_score_pearson_ci95": metric(report, ("turn_score", "pearson_ci95")),
            "final_eval_loss": record.get("final_eval_loss"), "train_runtime_s": record.get("train_runtime_s"),
            "parsed": parsed_share(json.loads((scored / "summary.json").read_text()), read_failed(scored))}


def parsed_share(summary: dict, failed: list[dict]) -> float | None:
    """Scored turns over scored plus those of dialogues that failed (an answer that never read)."""
    unscored = sum(f.get("unscored_turns", 0) for f in failed)
    total = summary.get("scored_turns", 0) + unscored
    return round(summary.get("scored_turns", 0) / total, 4) if total else None


def main(cfg: LearningCurveConfig, out: Path) -> list[dict]:
    examples = read_examples(cfg.train_file)
    validation = first_turns(read_examples(cfg.eval_file), cfg.eval_turns) if cfg.eval_file else []
    sizes = sorted({len(first_turns(examples, n)) for n in cfg.sizes})
    points = []
    for size in sizes:
        points.append(point(cfg, examples, size, out, validation))
        (out / "learning_curve.json").write_text(json.dumps({"config": cfg.model_dump(), "points": points}, indent=2))
    (out / "learning_curve.md").write_text(table(points) + "\n")
    plot(points, out / "learning_curve.png")
    print(table(points))
    return points
