"""bf16 training on a CPU only where the CPU computes bf16 itself.

With avx512_bf16 or AMX, bf16 trains the CPU student 1.68x faster than float32. Without them (an
AVX2-only CPU), torch emulates bf16 matrix products and the same training ran 11x slower than
float32 (docs/training-speed.md). So a CPU run that asks for bf16 (mixed precision or bf16 weights)
gets float32 on a CPU without native bf16, unless it says otherwise (`bf16_fallback`), and the
training record says so. The CPU test is fastvista/precision.py's, shared with inference.
"""

from __future__ import annotations

FALLBACKS = ("float32", "keep", "fail")


def cpu_precision(mixed: str, dtype: str, on_cpu: bool, native: bool, fallback: str) -> tuple[str, str, str | None]:
    """The (mixed precision, weights dtype) a run trains with, and a note when they differ from what
    it asked for.

    `mixed` is the Accelerator's mode ('no', 'bf16', 'fp16'), `dtype` the weights' dtype with 'auto'
    already resolved to the checkpoint's. Only a CPU run that asks for bf16 on a CPU without native
    bf16 is affected: 'float32' trains in float32, 'keep' in bf16 anyway, 'fail' refuses."""
    if fallback not in FALLBACKS:
        raise ValueError(f"bf16_fallback must be one of {', '.join(FALLBACKS)}, not {fallback!r}")
    if not on_cpu or native or "bf16" not in (mixed, "bf16" if dtype == "bfloat16" else None):
        return mixed, dtype, None
    if fallback == "fail":
        raise ValueError("this CPU has no native bf16 (avx512_bf16 or AMX): bf16 training runs ~11x slower than float32 "
                         "here (docs/training-speed.md); pass --bf16 false --dtype float32, or --bf16_fallback float32 (or keep)")
    if fallback == "keep":
        return mixed, dtype, "bf16 kept on a CPU without native bf16 (bf16_fallback: keep): expect ~11x slower than float32"
    return ("no" if mixed == "bf16" else mixed), "float32", \
        "trained in float32: this CPU has no native bf16 (avx512_bf16 or AMX), where bf16 runs ~11x slower"


def resumed_precision(previous: list[dict], current: dict) -> str | None:
    """A note when a resumed run trains in another precision than the chunks before it (a run
    started on a CPU with native bf16 and resumed on one without, or the reverse)."""
    keys = ("mixed_precision", "dtype")
    before = {tuple(p.get(k) for k in keys) for p in previous}
    now = tuple(current.get(k) for k in keys)
    if before and before != {now}:
        return f"resumed in {dict(zip(keys, now))} after chunks trained in {[dict(zip(keys, b)) for b in sorted(before, key=str)]}"
    return None
