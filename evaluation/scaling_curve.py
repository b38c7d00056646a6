"""The speed scaling curve: the student's speedup over the strongest and the plain teacher (same
weights, same engines) as knowledge grows and as dialogues grow, one `fastvista eval speed` run
per point, and where the ratio crosses VeriFastScore's 6.6x.

    fastvista data scaling-set data/corpus/inputs.jsonl.gz -o runs/scaling/inputs --limit 20
    fastvista data convert topical_chat $DATA/topical_chat/conversations/test_rare.json --option assistant=both \\
        --min-scored-turns 20 --max-scored-turns 20 --sample 20 -o runs/scaling/inputs/long_dialogues.jsonl
    fastvista eval scaling -c configs/eval/scaling_cpu.yaml -o runs/scaling --set speed.model=runs/student/NAME/merged

Knowledge: the same dialogues with references of each length (`references`). Dialogues: the
same long dialogues cut after their first N scored turns (`dialogue_turns`). Every point runs on
the same engines, built once. A point whose speed.json was measured on the same model and
dialogues is kept when the command runs again. Writes scaling.json, scaling.md and scaling.png.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fastvista.config import DataSelection
from fastvista.evaluation.speed import SpeedConfig, run_settings

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
    def _speed_settings_read(self) -> "ScalingConfig":
        SpeedConfig.model_validate({**self.speed, "data": {"input": "each point's"}, "only": self.rows})  # a typo fails here, not hours in
        return self


def points(args: ScalingConfig) -> list[tuple[str, int, DataSelection]]:
    """(axis, x, dialogues) of every point of both curves."""
    found = [("reference tokens", n, DataSelection(input=path)) for n, path in sorted(args.references.items())]
    if args.dialogues:
        found += [("scored turns", n, DataSelection(input=args.dialogues, min_scored_turns=n, max_scored_turns=n))
                  for n in sorted(args.dialogue_turns)]
    if not found:
        raise ValueError("nothing to measure: give references (tokens -> file) and/or dialogues")
    return found


def summary(speed: dict) -> dict:
    """What the curve plots from one speed run."""
    rows = speed["configurations"]
    return {"speedup_over_strongest": speed["speedup"], "speedup_over_plain": speed.get("speedup_over_plain_teacher"),
            "strongest_teacher": speed["strongest_teacher_name"], "turns": rows["student"]["turns"],
            **{f"{name} turns/s": r["turns_per_second"] for name, r in rows.items()},
            **{f"{name} prompt tok/turn": r["prompt_tokens_per_turn"] for name, r in rows.items()}}


def crossing(xs: list[float], ys: list[float | None], level: float = VERIFASTSCORE_SPEEDUP) -> float | None:
    """The first x at which the curve reaches `level` (linear between points), None if it never does."""
    pairs = [(x, y) for x, y in zip(xs, ys) if y is not None]
    for (x0, y0), (x1, y1) in zip([(None, None), *pairs], pairs):
        if y1 >= level:
            return x1 if x0 is None or y0 >= level else round(x0 + (level - y0) * (x1 - x0) / (y1 - y0), 1)
    return None


def curve(args: ScalingConfig, out: Path, measure: Callable[[dict, Path], dict]) -> dict:
    """Each point measured by `measure(speed settings, folder)` unless its folder already holds
    the same model's run on the same dialogues; the curves and their 6.6x crossings."""
    result: dict = {"model": args.speed.get("model"), "rows": args.rows, "points": {}, "crossings": {}}
    for axis, x, data in points(args):
        folder = out / ("reference" if axis == "reference tokens" else "turns") / str(x)
        settings = {**args.speed, "data": data.model_dump(), "only": args.rows, "skip_plain": PLAIN not in args.rows}
        previous = folder / "speed.json"
        speed = json.loads(previous.read_text()) if previous.exists() else None
        if not speed or speed.get("settings") != run_settings(SpeedConfig.model_validate(settings)) or not set(args.rows) <= set(speed["configurations"]):
            speed = measure(settings, folder)
        result["points"].setdefault(axis, []).append({"x": x, **summary(speed)})
        (out / "scaling.json").write_text(json.dumps(result, indent=2))
    for axis, rows in result["points"].items():
        xs = [r["x"] for r in rows]
        result["crossings"][axis] = {k: crossing(xs, [r[k] for r in rows]) for k in ("speedup_over_strongest", "speedup_over_plain")}
    (out / "scaling.json").write_text(json.dumps(result, indent=2))
    (out / "scaling.md").write_text(table(result))
    plot(result, out / "scaling.png")
    return result


def table(result: dict) -> str:
    lines = []
    for axis, rows in result["points"].items():
        lines += [f"\n### Speedup as {axis} grow ({result['model']})\n",
                  f"| {axis} | turns | student turns/s | teacher turns/s | plain teacher turns/s | vs strongest | vs plain |",
                  "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['x']} | {r['turns']} | {r.get('student turns/s')} | {r.get('teacher turns/s')} | {r.get(PLAIN + ' turns/s', '-')} | "
                         f"{r['speedup_over_strongest']}x | {r['speedup_over_plain'] or '-'}x |")
        cross = result["crossings"].get(axis, {})
        lines.append(f"\n{VERIFASTSCORE_SPEEDUP}x reached at {axis}: over the strongest teacher "
                     f"{cross.get('speedup_over_strongest') or 'not within the range'}, over the plain teacher "
                     f"{cross.get('speedup_over_plain') or 'not within the range'}.")
    return "\n".join(lines).strip() + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_data = list(result["points"].items())
    fig, axes = plt.subplots(1, len(axes_data), figsize=(5.5 * len(axes_data), 4), squeeze=False)
    for ax, (axis, rows) in zip(axes[0], axes_data):
        xs = [r["x"] for r in rows]
        ax.plot(xs, [r["speedup_over_strongest"] for r in rows], "o-", label="vs strongest teacher")
        if any(r["speedup_over_plain"] for r in rows):
            ax.plot(xs, [r["speedup_over_plain"] for r in rows], "s--", label="vs plain teacher (no prefix cache)")
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

    out.mkdir(parents=True, exist_ok=True)
    engines: dict = {}  # one set of engines for every point
    result = curve(args, out, lambda settings, folder: speed_main(SpeedConfig.model_validate(settings), folder, engines))
    print(table(result))
    return result
