"""The speed scaling curve: the student's speedup over the teacher and the plain teacher (the same
weights, the same engines) as knowledge grows and as dialogues grow, one `fastvista eval speed`
run per point, and where the ratio crosses VeriFastScore's 6.6x.

    fastvista data scaling-set data/corpus/inputs.jsonl.gz -o runs/scaling/inputs --limit 10
    fastvista data convert topical_chat $DATA/topical_chat/conversations/test_rare.json --option assistant=both \\
        --min-scored-turns 20 --max-scored-turns 20 --sample 6 -o runs/scaling/inputs/long_dialogues.jsonl
    fastvista eval scaling -c configs/eval/scaling_cpu.yaml -o runs/scaling --set speed.model=runs/student/NAME/merged

Knowledge: the same dialogues with references of each length (`references`). Dialogues: the
same long dialogues (each with at least the largest of `dialogue_turns` scored turns) cut after
their first N scored turns. Every point runs on the same engines, built once; each row starts
with an empty prefix cache. The speedup is over the fastest teacher row run (by default the
shipped teacher, the strongest in docs/speed.md) and over the teacher without prefix caching.
A point's run lives in a folder named by what it was measured on (settings, weights, inputs):
kept when the command runs again, its missing rows added, and never mixed with another. A point
whose row scored nothing (every dialogue failed closed) has no speed, and a point whose row failed
some dialogues has no comparable ratio (the failed ones cost time but add no turns): the table and
plot show both with what failed, the crossing leaves them out, the other points go on, the command
exits 3, and a rerun measures those rows again (their reasons: ROW.failed.jsonl in the point's folder).
Writes scaling.json, scaling.md and scaling.png.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fastvista.config import DataSelection
from fastvista.evaluation.speed import ROWS, NothingScored, SpeedConfig, run_settings

VERIFASTSCORE_SPEEDUP = 6.6  # VeriFastScore's reported speedup over its pipeline (arXiv 2505.16973)
PLAIN = "teacher, no prefix cache"


class ScalingConfig(BaseModel):
    """Settings of `fastvista eval scaling` (configs/eval/scaling_cpu.yaml)."""

    model_config = ConfigDict(extra="forbid")

    speed: dict  # the speed benchmark's settings for every point (configs/eval/speed_cpu.yaml's keys, without data)
    references: dict[int, str] = Field(default_factory=dict)  # reference tokens -> dialogues with references that long
    dialogues: Optional[str] = None  # long dialogues, cut after each of `dialogue_turns` scored turns
    dialogue_turns: list[int] = Field(default_factory=lambda: [5, 10, 15, 20])
    rows: list[str] = Field(default_factory=lambda: ["teacher", PLAIN, "student"])

    @model_validator(mode="after")
    def _checked_before_hours_of_work(self) -> "ScalingConfig":
        given = {"data", "only", "teacher_model"} & set(self.speed)
        if given:
            raise ValueError(f"speed.{sorted(given)[0]}: set by each point (data, only), or not for this curve (teacher_model: "
                             "the curve compares teacher and student on the same weights)")
        unknown = [r for r in self.rows if r not in ROWS]
        if unknown:
            raise ValueError(f"rows: no row named {unknown[0]!r}; the rows: {', '.join(ROWS)}")
        if "student" not in self.rows or not any(r.startswith("teacher") and r != PLAIN for r in self.rows):
            raise ValueError("rows: the curve needs the student row and a teacher row with prefix caching")
        if any(n < 1 for n in self.dialogue_turns):
            raise ValueError("dialogue_turns: each at least 1")
        SpeedConfig.model_validate({**self.speed, "data": {"input": "each point's"}})
        return self


def check_inputs(args: ScalingConfig) -> None:
    """Refuse a missing input file before any engine starts (the schema stays valid on a fresh clone)."""
    missing = [p for p in [*args.references.values(), *([args.dialogues] if args.dialogues else [])] if not Path(p).exists()]
    if missing:
        raise ValueError(f"{missing[0]}: no such file (build the inputs first: see `fastvista eval scaling --help`)")


def points(args: ScalingConfig) -> list[tuple[str, int, DataSelection]]:
    """(axis, x, dialogues) of every point of both curves."""
    found = [("reference tokens", n, DataSelection(input=path)) for n, path in sorted(args.references.items())]
    if args.dialogues:
        longest = max(args.dialogue_turns)
        found += [("scored turns", n, DataSelection(input=args.dialogues, min_scored_turns=longest, max_scored_turns=n))
                  for n in sorted(args.dialogue_turns)]
    if not found:
        raise ValueError("nothing to measure: give references (tokens -> file) and/or dialogues")
    return found


def summary(speed: dict) -> dict:
    """What the curve plots from one speed run."""
    rows = speed["configurations"]
    return {"speedup_over_teacher": speed["speedup"], "speedup_over_plain": speed.get("speedup_over_plain_teacher"),
            "teacher_row": speed["strongest_teacher_name"], "turns": rows["student"]["turns"],
            "failed_dialogues": {name: {"dialogues": r["failed_dialogues"], "turns_scored": r["turns"]}
                                 for name, r in rows.items() if r.get("failed_dialogues")},
            **{f"{name} turns/s": r["turns_per_second"] for name, r in rows.items()},
            **{f"{name} prompt tok/turn": r["prompt_tokens_per_turn"] for name, r in rows.items()}}


def comparable(point: dict) -> bool:
    """A ratio is comparable only when every row scored every dialogue: a row's failed dialogue
    costs time and calls but adds no turns, so its rate would be biased."""
    return "no_speed" not in point and not point.get("failed_dialogues")


def crossing(xs: list[float], ys: list[float | None], level: float = VERIFASTSCORE_SPEEDUP) -> dict:
    """Where the curve first crosses `level` (linear between points) and which way, or that it
    stays on one side over the whole range. A point with no comparable ratio (None) is a gap: a
    crossing across it is placed between its neighbours, not drawn through it."""
    pairs = [(x, y) for x, y in zip(xs, ys) if y is not None]
    if not pairs:
        return {"at": None, "note": "no comparable point"}
    for (x0, y0), (x1, y1) in zip(pairs, pairs[1:]):
        if (y0 < level) != (y1 < level):
            direction = "rises above" if y1 >= level else "falls below"
            if any(y is None for x, y in zip(xs, ys) if x0 < x < x1):
                return {"at": None, "direction": direction, "note": f"{direction} it between {x0} and {x1}, across a point with no comparable ratio"}
            return {"at": round(x0 + (level - y0) * (x1 - x0) / (y1 - y0), 1), "direction": direction}
    side = "above" if pairs[0][1] >= level else "below"
    return {"at": None, "note": f"{side} at every point" if len(pairs) == len(ys) else f"{side} at every comparable point"}


def point_folder(out: Path, axis: str, x: int, settings: dict) -> Path:
    """A point's run, in a folder named by everything it is measured on."""
    digest = hashlib.sha256(json.dumps(run_settings(SpeedConfig.model_validate(settings)), sort_keys=True).encode()).hexdigest()[:12]
    return out / ("reference" if axis == "reference tokens" else "turns") / f"{x}_{digest}"


def curve(args: ScalingConfig, out: Path, measure: Callable[[dict, Path], dict]) -> dict:
    """Each point measured by `measure(speed settings, folder)`, only its rows not measured yet or
    with failed dialogues (tried again); the curves and their 6.6x crossings, written even when a
    point stops the run, so the summaries always show the points measured so far."""
    result: dict = {"model": args.speed.get("model"), "rows": args.rows, "points": {}, "crossings": {}}
    try:
        for axis, x, data in points(args):
            settings = {**args.speed, "data": data.model_dump(), "skip_plain": PLAIN not in args.rows}
            folder = point_folder(out, axis, x, settings)
            previous = folder / "speed.json"
            speed = json.loads(previous.read_text()) if previous.exists() else {"configurations": {}}
            again = [r for r in args.rows if r not in speed["configurations"] or speed["configurations"][r].get("failed_dialogues")]
            point = {"x": x, "run": str(folder)}
            try:
                if again:
                    speed = measure({**settings, "only": again}, folder)
                point.update(summary(speed))
            except NothingScored as e:  # reported with its reason, and tried again on the next run
                point["no_speed"] = str(e)
            result["points"].setdefault(axis, []).append(point)
    finally:
        for axis, rows in result["points"].items():
            xs = [r["x"] for r in rows]
            result["crossings"][axis] = {k: crossing(xs, [r[k] if comparable(r) else None for r in rows])
                                         for k in ("speedup_over_teacher", "speedup_over_plain")}
        (out / "scaling.json").write_text(json.dumps(result, indent=2))
        (out / "scaling.md").write_text(table(result))
        if result["points"]:
            plot(result, out / "scaling.png")
        else:  # no point measured: no plot of another run's points
            (out / "scaling.png").unlink(missing_ok=True)
    return result


def not_comparable(result: dict) -> list[str]:
    """The points with no speed or with failed dialogues, each with what failed."""
    found = []
    for axis, rows in result["points"].items():
        found += [f"{axis} {r['x']}: {_failed(r)}" for r in rows if not comparable(r)]
    return found


def _failed(point: dict) -> str:
    if "no_speed" in point:
        return "no speed: " + " ".join(point["no_speed"].split())
    return "; ".join(f"{name}: {f['dialogues']} dialogue{'s' * (f['dialogues'] > 1)} failed ({f['turns_scored']} turns scored)"
                     for name, f in point["failed_dialogues"].items())


def _said(c: dict) -> str:
    return f"{c['direction']} it at {c['at']}" if c.get("at") is not None else c["note"]


def table(result: dict) -> str:
    lines = []
    for axis, rows in result["points"].items():
        lines += [f"\n### Speedup as {axis} grow ({result['model']})\n",
                  f"| {axis} | turns | student turns/s | teacher turns/s | plain teacher turns/s | vs teacher | vs plain teacher | failed closed |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            failed = "none" if comparable(r) else _failed(r).replace("|", "\\|")
            if "no_speed" in r:
                lines.append(f"| {r['x']} | - | - | - | - | - | - | {failed} |")
                continue
            plain = f"{r['speedup_over_plain']}x" if r["speedup_over_plain"] is not None else "-"
            lines.append(f"| {r['x']} | {r['turns']} | {r.get('student turns/s')} | {r.get(r['teacher_row'] + ' turns/s')} | "
                         f"{r.get(PLAIN + ' turns/s', '-')} | {r['speedup_over_teacher']}x | {plain} | {failed} |")
        cross = result["crossings"].get(axis, {})
        lines.append(f"\n{VERIFASTSCORE_SPEEDUP}x, as {axis} grow: over the teacher, {_said(cross['speedup_over_teacher'])}; "
                     f"over the plain teacher, {_said(cross['speedup_over_plain'])}.")
    return "\n".join(lines).strip() + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_data = list(result["points"].items())
    fig, axes = plt.subplots(1, len(axes_data), figsize=(5.5 * len(axes_data), 4), squeeze=False)
    for ax, (axis, rows) in zip(axes[0], axes_data):
        kept = [r for r in rows if comparable(r)]
        xs = [r["x"] for r in kept]
        ax.plot(xs, [r["speedup_over_teacher"] for r in kept], "o-", label="vs teacher (prefix cache)")
        if any(r["speedup_over_plain"] for r in kept):
            ax.plot(xs, [r["speedup_over_plain"] for r in kept], "s--", label="vs plain teacher (no prefix cache)")
        partial = [r for r in rows if "no_speed" not in r and not comparable(r)]
        if partial:
            ax.plot([r["x"] for r in partial], [r["speedup_over_teacher"] for r in partial], "o", markerfacecolor="none",
                    color="grey", label="vs teacher, a row failed dialogues (not comparable)")
        for i, r in enumerate(r for r in rows if "no_speed" in r):
            ax.axvline(r["x"], color="red", linestyle=":", label="no speed: every dialogue failed closed" if i == 0 else None)
        ax.axhline(VERIFASTSCORE_SPEEDUP, color="grey", linestyle=":", label=f"VeriFastScore {VERIFASTSCORE_SPEEDUP}x")
        ax.axhline(1, color="black", linewidth=0.5)
        ax.set_xlabel(axis)
        ax.set_ylabel("student speedup (turns/s ratio)")
        ax.legend(fontsize=8)
    fig.suptitle(f"Single pass vs teacher, same weights and engine: {result['model']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args: ScalingConfig, out: Path) -> dict:
    from fastvista.evaluation.speed import main as speed_main

    check_inputs(args)
    out.mkdir(parents=True, exist_ok=True)
    engines: dict = {}  # one set of engines for every point
    result = curve(args, out, lambda settings, folder: speed_main(SpeedConfig.model_validate(settings), folder, engines))
    print(table(result))
    return result
