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
kept when the command runs again, its missing rows added, and never mixed with another. A ratio
made from a row that failed dialogues (they cost time but add no turns) or scored nothing at all
is not comparable: the table and plot show it with what failed, the crossing leaves it out, the
other points go on, the command exits 3, and a rerun measures those rows again, with the rows that
replay them (the reasons: ROW.failed.jsonl in the point's folder).
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
from fastvista.evaluation.speed import DEPENDS, ROWS, NothingScored, SpeedConfig, failed_rows, run_settings

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


def summary(speed: dict, rows: list[str]) -> dict:
    """What the curve plots from one speed run's rows (those the curve asks for): each row's rate
    and prompt tokens, the rows that failed dialogues, and the ratios of the fastest student row
    over the fastest teacher row with prefix caching and over the plain teacher."""
    configs = {name: r for name, r in speed["configurations"].items() if name in rows}
    point: dict = {"failed_dialogues": {name: {"dialogues": n, "turns_scored": configs[name]["turns"]} for name, n in failed_rows(configs).items()},
                   **{f"{name} turns/s": r["turns_per_second"] for name, r in configs.items()},
                   **{f"{name} prompt tok/turn": r["prompt_tokens_per_turn"] for name, r in configs.items()}}
    students = [n for n in configs if n.startswith("student")]
    teachers = [n for n in configs if n.startswith("teacher") and n != PLAIN]
    if students:
        best = max(students, key=lambda n: configs[n]["turns_per_second"])
        point["turns"] = configs[best]["turns"]
        if teachers:
            point["teacher_row"] = max(teachers, key=lambda n: configs[n]["turns_per_second"])
            point["speedup_over_teacher"] = round(configs[best]["turns_per_second"] / configs[point["teacher_row"]]["turns_per_second"], 2)
        if PLAIN in configs:
            point["speedup_over_plain"] = round(configs[best]["turns_per_second"] / configs[PLAIN]["turns_per_second"], 2)
    return point


RATIOS = ("speedup_over_teacher", "speedup_over_plain")


def ratio_rows(key: str, rows: list[str]) -> list[str]:
    """The rows a ratio is made of: every student row, and the teacher rows it divides by."""
    divisors = [r for r in rows if r == PLAIN] if key == "speedup_over_plain" else [r for r in rows if r.startswith("teacher") and r != PLAIN]
    return [r for r in rows if r.startswith("student")] + divisors


def comparable(point: dict, key: str, rows: list[str]) -> float | None:
    """The point's ratio when every row it is made of scored every dialogue, else None: a failed
    dialogue costs time and calls but adds no turns, so the rate would be biased."""
    broken = set(point.get("failed_dialogues", {})) | set(point.get("no_speed", {}))
    return None if broken & set(ratio_rows(key, rows)) else point.get(key)


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
    """Each point measured by `measure(speed settings, folder)`: only its rows not measured yet or
    with failed dialogues, and the rows that replay those. The summaries are written even when a
    point stops the run, saying so, so they never pass for a whole curve."""
    result: dict = {"model": args.speed.get("model"), "rows": args.rows, "points": {}, "crossings": {}}
    try:
        for axis, x, data in points(args):
            settings = {**args.speed, "data": data.model_dump(), "skip_plain": PLAIN not in args.rows}
            folder = point_folder(out, axis, x, settings)
            previous = folder / "speed.json"
            kept = json.loads(previous.read_text())["configurations"] if previous.exists() else {}
            again = [r for r in args.rows if r not in kept or kept[r].get("failed_dialogues")]
            again += [r for r in args.rows if DEPENDS.get(r) in again and r not in again]
            point = {"x": x, "run": str(folder)}
            try:
                speed = measure({**settings, "only": again}, folder) if again else {"configurations": kept}
            except NothingScored as e:  # the rows measured before it stay; it is tried again on the next run
                speed = json.loads(previous.read_text()) if previous.exists() else {"configurations": {}}
                point["no_speed"] = {e.row: str(e)}
            point.update(summary(speed, args.rows))
            result["points"].setdefault(axis, []).append(point)
    except BaseException as e:
        result["stopped"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        try:
            write_summaries(result, out)
        except Exception as e:  # never hides the error that stopped the run
            if "stopped" not in result:
                raise
            print(f"the summaries could not be written: {e}")
    return result


def write_summaries(result: dict, out: Path) -> None:
    for axis, rows in result["points"].items():
        xs = [r["x"] for r in rows]
        result["crossings"][axis] = {k: crossing(xs, [comparable(r, k, result["rows"]) for r in rows]) for k in RATIOS}
    (out / "scaling.json").write_text(json.dumps(result, indent=2))
    (out / "scaling.md").write_text(table(result))
    if result["points"]:
        plot(result, out / "scaling.png")
    else:  # no point measured: no plot of another run's points
        (out / "scaling.png").unlink(missing_ok=True)


def not_comparable(result: dict) -> list[str]:
    """The points with a ratio that is not comparable, each with what failed."""
    wanted = [k for k in RATIOS if k == "speedup_over_teacher" or PLAIN in result["rows"]]
    return [f"{axis} {r['x']}: {_failed(r)}" for axis, rows in result["points"].items() for r in rows
            if any(comparable(r, k, result["rows"]) is None for k in wanted)]


def _failed(point: dict) -> str:
    said = ["no speed: " + " ".join(reason.split()) for reason in point.get("no_speed", {}).values()]  # each names its row
    said += [f"{name}: {f['dialogues']} dialogue{'s' * (f['dialogues'] > 1)} failed ({f['turns_scored']} turns scored)"
             for name, f in point.get("failed_dialogues", {}).items()]
    return "; ".join(said) or "none"


def _said(c: dict) -> str:
    return f"{c['direction']} it at {c['at']}" if c.get("at") is not None else c["note"]


def table(result: dict) -> str:
    lines = [f"**Stopped before the end ({result['stopped']}): only the points below were measured.**"] if "stopped" in result else []
    for axis, rows in result["points"].items():
        lines += [f"\n### Speedup as {axis} grow ({result['model']})\n",
                  f"| {axis} | turns | student turns/s | teacher turns/s | plain teacher turns/s | vs teacher | vs plain teacher | failed closed |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            ratios = [_ratio(r, k, result["rows"]) for k in RATIOS]
            lines.append(f"| {r['x']} | {r.get('turns', '-')} | {r.get('student turns/s', '-')} | {r.get(r.get('teacher_row', '') + ' turns/s', '-')} | "
                         f"{r.get(PLAIN + ' turns/s', '-')} | {ratios[0]} | {ratios[1]} | {_failed(r).replace('|', chr(92) + '|')} |")
        cross = result["crossings"].get(axis, {})
        lines.append(f"\n{VERIFASTSCORE_SPEEDUP}x, as {axis} grow: over the teacher, {_said(cross['speedup_over_teacher'])}; "
                     f"over the plain teacher, {_said(cross['speedup_over_plain'])}.")
    return "\n".join(lines).strip() + "\n"


def _ratio(point: dict, key: str, rows: list[str]) -> str:
    if point.get(key) is None:
        return "-"
    return f"{point[key]}x" if comparable(point, key, rows) is not None else f"({point[key]}x, not comparable)"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_data = list(result["points"].items())
    fig, axes = plt.subplots(1, len(axes_data), figsize=(5.5 * len(axes_data), 4), squeeze=False)
    for ax, (axis, rows) in zip(axes[0], axes_data):
        for key, style, label in (("speedup_over_teacher", "o-", "vs teacher (prefix cache)"),
                                  ("speedup_over_plain", "s--", "vs plain teacher (no prefix cache)")):
            kept = [(r["x"], comparable(r, key, result["rows"])) for r in rows]
            kept = [(x, y) for x, y in kept if y is not None]
            if kept:
                ax.plot(*zip(*kept), style, label=label)
        partial = [r for r in rows if r.get("speedup_over_teacher") is not None and comparable(r, "speedup_over_teacher", result["rows"]) is None]
        if partial:
            ax.plot([r["x"] for r in partial], [r["speedup_over_teacher"] for r in partial], "o", markerfacecolor="none",
                    color="grey", label="vs teacher, a row failed dialogues (not comparable)")
        for i, r in enumerate(r for r in rows if "no_speed" in r):
            ax.axvline(r["x"], color="red", linestyle=":", label="a row with no speed: every dialogue failed closed" if i == 0 else None)
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
