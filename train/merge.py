"""Merge a trained LoRA adapter into its base model and save the result (for engines where LoRA
is slow, e.g. vLLM on CPU, whose LoRA kernels are plain PyTorch).

    fastvista merge runs/student/smollm2_cpu --out runs/student/smollm2_cpu/merged
"""

from __future__ import annotations

import json
from pathlib import Path


def merge(adapter: Path, out: Path, dtype: str = "float32", base: str | None = None) -> Path:
    """The adapter merged into its base (`base`, or the one its adapter_config names), saved to
    `out` with the tokenizer and the student format.

    Merged in float32 by default: a LoRA delta added to bf16 weights is rounded to bf16's 8-bit
    mantissa, and a small delta mostly vanishes. (An engine that loads the merged model in bf16
    rounds it again; serving it in float32, or the adapter unmerged, keeps it.)"""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fastvista.contract import read_format, write_format
    from fastvista.models import resolve_model

    base = base or json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    model = AutoModelForCausalLM.from_pretrained(resolve_model(base), dtype="auto" if dtype == "auto" else getattr(torch, dtype))
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(str(out))
    # a shipped adapter leaves the tokenizer to its base
    tokenizer = adapter if (adapter / "tokenizer_config.json").exists() else resolve_model(base)
    AutoTokenizer.from_pretrained(str(tokenizer)).save_pretrained(str(out))
    fmt = read_format(adapter)
    if fmt is not None:  # the merged student keeps the format it was trained with
        write_format(out, fmt)
    return out
