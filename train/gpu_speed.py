"""The real-scale training path on one GPU, timed: `accelerate launch train/sft.py` with
`configs/sft/llama31_8b_lora.yaml` on random weights of the Llama-3.1-8B shape, beside a raw
PEFT training loop at sequence 4,096 (the reference the project measures itself against).

    python train/gpu_speed.py --tokenizer DIR --train-file train.jsonl[.gz] --out DIR

No weights can travel to a lent accelerator, and speed does not depend on weight values, so the
model is initialised at random in bf16 and saved where sft.py loads it like any local model. The
tokenizer (any chat tokenizer whose ids fit the 128,256-row embedding) only turns the corpus's
examples into tokens. Writes gpu_speed.json: the raw loop's tokens/s and peak memory, and for
each sft.py variant its steady tokens/s (after the first step), peak memory and the ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

LLAMA31_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=128256, max_position_embeddings=8192)  # a dry run of this script on a CPU

# sft.py keys over the shipped config (which groups examples by length, batch 16 x 2). "wrapped" packing cuts
# the token stream into rows of max_length, the raw loop's layout; "bfd" packs whole examples padding-free, which
# without a varlen attention kernel (flash-attn is not installed there) attends over the whole flattened batch.
RANDOM = {"train_sampling_strategy": "random"}
VARIANTS = {
    "packed, wrapped rows of 4,096 (batch 4 x 1)": {"max_steps": 8, "packing": True, "packing_strategy": "wrapped",
                                                    "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, **RANDOM},
    "padded, random order (batch 4 x 8)": {"max_steps": 4, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 8,
                                           **RANDOM},
    "packed bfd, padding-free (batch 4 x 1)": {"max_steps": 5, "packing": True, "per_device_train_batch_size": 4,
                                               "gradient_accumulation_steps": 1, **RANDOM},
    "packed bfd, flex attention (batch 4 x 1)": {"max_steps": 6, "packing": True, "per_device_train_batch_size": 4,
                                                 "gradient_accumulation_steps": 1, "attn_implementation": "flex_attention", **RANDOM},
    "padded rows, batch 16 x 2": {"max_steps": 4, "per_device_train_batch_size": 16, "gradient_accumulation_steps": 2, **RANDOM},
    # Rows of like length (transformers' LengthGroupedSampler over each step's 32 examples): whole examples,
    # no varlen kernel needed, little padding left.
    "grouped by length (batch 4 x 8)": {"max_steps": 5, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 8},
    "grouped by length, batch 8 x 4": {"max_steps": 5, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 4},
    "grouped by length, batch 16 x 2 (the shipped config)": {"max_steps": 5},
}
TINY_KEYS = {"use_cpu": True, "bf16": False, "max_steps": 2, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1,
             "max_length": 512}


def random_model(folder: Path, shape: dict, tokenizer: Path, device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**shape, dtype="bfloat16"))
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(folder)
    for f in tokenizer.iterdir():
        shutil.copy(f, folder / f.name)
    return model


def raw_lora_loop(model, seq: int, micro_batch: int, device: str, steps: int = 4) -> dict:
    """LoRA r16 on all linear layers, gradient checkpointing, AdamW: the reference loop."""
    import torch
    from peft import LoraConfig, get_peft_model

    model.train()
    model.gradient_checkpointing_enable()
    model.enable_input_require_grads()
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    peft_model = get_peft_model(model, lora)
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(100, 120000, (micro_batch, seq), device=device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        peft_model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    step = sorted(times[1:])[len(times[1:]) // 2]
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return {"seq": seq, "micro_batch": micro_batch, "step_s": round(step, 3), "tokens_per_s": round(micro_batch * seq / step),
            "peak_gib": round(peak, 1) if peak else None}


def sft_variant(name: str, keys: dict, model: Path, train_file: str, out: Path, accelerate_config: str) -> dict:
    folder = out / "".join(c if c.isalnum() else "_" for c in name)[:40]
    keys = {"model_name_or_path": str(model), "train_file": train_file, "eval_fraction": 0, "eval_strategy": "no",
            "save_strategy": "no", "logging_steps": 1, "output_dir": str(folder), **keys}
    args = [a for k, v in keys.items() for a in (f"--{k}", json.dumps(v) if isinstance(v, bool) else str(v))]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", accelerate_config, "train/sft.py",
           "--config", "configs/sft/llama31_8b_lora.yaml", *args]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}", "stderr": done.stderr[-3000:]}
    record = json.loads((folder / "training_record.json").read_text())
    return {"steady_tokens_per_s": record.get("steady_tokens_per_s"), "tokens_per_s": record.get("tokens_per_s"),
            "peak_gib": round(record["peak_memory_mb"] / 1024, 1), "tokens": record.get("tokens"),
            "steps": keys["max_steps"], "examples": record["examples"], "length": {k: v for k, v in record["length"]["train"].items() if k != "too_long_ids"},
            "wall_s": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="folder with a chat tokenizer (tokenizer.json, template)")
    parser.add_argument("--train-file", required=True, help="the student's training examples (train.jsonl[.gz])")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/llama31_8b_random"))
    parser.add_argument("--only", nargs="*", help="run only the variants whose names contain one of these")
    parser.add_argument("--no-raw-loop", action="store_true", help="skip the raw loop (measured in an earlier call, whose "
                        "gpu_speed.json in --out is kept) and reuse the saved random model if there is one")
    parser.add_argument("--tiny", action="store_true", help="a tiny model on the CPU: checks the script, measures nothing")
    opts = parser.parse_args()

    import torch

    from fastvista.train.data import file_hash

    device = "cpu" if opts.tiny else "cuda"
    opts.out.mkdir(parents=True, exist_ok=True)
    previous = opts.out / "gpu_speed.json"  # an earlier call's figures are kept and added to, never lost
    result = json.loads(previous.read_text()) if previous.exists() else {}
    result.update({"versions": {m: __import__(m).__version__ for m in ("torch", "transformers", "peft", "accelerate", "trl", "datasets")},
                   "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "shape": "tiny" if opts.tiny else "Llama-3.1-8B",
                   "train_file": {"name": Path(opts.train_file).name, "sha256": file_hash(opts.train_file)}})
    print(result, flush=True)

    def save():
        (opts.out / "gpu_speed.json").write_text(json.dumps(result, indent=2))

    if not (opts.no_raw_loop and (opts.model_dir / "config.json").exists()):
        t = time.perf_counter()
        model = random_model(opts.model_dir, TINY if opts.tiny else LLAMA31_8B, opts.tokenizer, device)
        result["random_model_s"] = round(time.perf_counter() - t, 1)
        if not opts.no_raw_loop:
            result["raw_loop"] = raw_lora_loop(model, 256 if opts.tiny else 4096, 4, device)
            print(result["raw_loop"], flush=True)
        save()
        del model
        if device == "cuda":
            torch.cuda.empty_cache()

    accelerate_config = "configs/accelerate/cpu.yaml" if opts.tiny else "configs/accelerate/single_gpu.yaml"
    result.setdefault("sft", {})
    for name, keys in VARIANTS.items():
        if opts.only and not any(part in name for part in opts.only):
            continue
        keys = {**keys, **(TINY_KEYS if opts.tiny else {})}
        row = sft_variant(name, keys, opts.model_dir, opts.train_file, opts.out, accelerate_config)
        if row.get("steady_tokens_per_s") and "raw_loop" in result:
            row["vs_raw_loop"] = round(row["steady_tokens_per_s"] / result["raw_loop"]["tokens_per_s"], 3)
        result["sft"][name] = row
        print(name, row, flush=True)
        save()


if __name__ == "__main__":
    main()
