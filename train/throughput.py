"""Training throughput on this machine: the same student training run in several settings,
a few steps each, side by side (tokens/s, peak memory, the loss reached).

    fastvista eval train-speed -c configs/eval/train_speed_cpu.yaml -o runs/train_speed

Each variant is `accelerate launch train/sft.py` with the base config and the variant's keys
(e.g. `bf16: true`, `padding_free: true`, another `train_file` rendered with a shorter history)
for `max_steps` steps, without evaluation or checkpoints; its training_record.json gives the
figures. Run it with nothing else on the machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class TrainSpeedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sft_config: str  # the base TRL config (configs/sft/*.yaml)
    accelerate_config: str = "configs/accelerate/cpu.yaml"
    max_steps: int = 8
    variants: dict[str, dict] = Field(default_factory=dict)  # name -> sft.py keys over the base config


def variant_command(cfg: TrainSpeedConfig, overrides: dict, out: Path) -> list[str]:
    """The `accelerate launch` command of one variant (its keys as command-line overrides)."""
    accelerate = Path(sys.executable).parent / "accelerate"
    keys = {"max_steps": cfg.max_steps, "logging_steps": 1, "eval_strategy": "no", "save_strategy": "no", "parse_check": 0, "merge": False,
            **overrides, "output_dir": str(out), "eval_file": "", "eval_fraction": 0}  # no validation pass: speed only
    args = [a for k, v in keys.items() for a in (f"--{k}", json.dumps(v) if isinstance(v, bool) else str(v))]
    return [str(accelerate), "launch", "--config_file", cfg.accelerate_config, "train/sft.py", "--config", cfg.sft_config, *args]


def row(record: dict) -> dict:
    losses = [p["loss"] for p in record.get("loss", [])]
    steady = record.get("steady_tokens_per_s")
    return {"tokens_per_s": round(record["tokens_per_s"], 1) if record.get("tokens_per_s") else None,
            "steady_tokens_per_s": round(steady, 1) if steady else None,
            "peak_memory_mb": record.get("peak_memory_mb"), "train_runtime_s": record.get("train_runtime_s"),
            "last_loss": losses[-1] if losses else None, "examples": record.get("examples", {}).get("train"),
            # what the run trained in: a bf16 variant trains in float32 on a CPU without native bf16 unless it keeps bf16
            "precision": {k: record["precision"].get(k) for k in ("mixed_precision", "dtype")} if record.get("precision") else None,
            "lm_head_positions": (record.get("precision") or {}).get("lm_head_positions")}


def table(rows: dict[str, dict]) -> str:
    """Variants side by side, compared on tokens/s after the first step when every row has it
    (else on the overall tokens/s: one measure for all rows)."""
    steady = all(r.get("steady_tokens_per_s") for r in rows.values())

    def rate(r):
        return (r["steady_tokens_per_s"] if steady else r["tokens_per_s"]) or 0

    fastest = max(rate(r) for r in rows.values()) or None
    lines = ["| variant | trained in | LM head projects | train tokens/s | after the first step | vs fastest | peak MB | loss at the last step "
             "| examples |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        ratio = f"{rate(r) / fastest:.2f}" if fastest and rate(r) else "-"
        trained_in = "{mixed_precision} mixed, {dtype} weights".format(**r["precision"]) if r.get("precision") else "-"
        lines.append(f"| {name} | {trained_in} | {r.get('lm_head_positions') or '-'} | {r['tokens_per_s']} | {r.get('steady_tokens_per_s') or '-'} | {ratio} | {r['peak_memory_mb']} "
                     f"| {r['last_loss']} | {r['examples']} |")
    return "\n".join(lines)


def main(cfg: TrainSpeedConfig, out: Path) -> dict:
    rows = {}
    for name, overrides in cfg.variants.items():
        folder = out / name
        done = subprocess.run(variant_command(cfg, overrides, folder), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"variant {name!r} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        rows[name] = row(json.loads((folder / "training_record.json").read_text()))
        (out / "train_speed.json").write_text(json.dumps({"config": cfg.model_dump(), "variants": rows}, indent=2))
    (out / "train_speed.md").write_text(table(rows) + "\n")
    print(table(rows))
    return rows
