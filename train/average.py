"""Average several LoRA checkpoints of one run into one adapter (tail weight averaging).

At a constant learning rate each checkpoint is one noisy draw from the end of the trajectory (the
0.5B curve's validation loss moved 0.240 -> 0.253 in six steps); the mean of the last few is close
to what a decaying rate would have reached, without training again. The mean of K LoRA deltas
s * B_k A_k is itself a LoRA, exactly, of rank K*r: the A matrices stacked, the B matrices side by
side, and the 1/K folded into the scale s (not into B, where bf16 would round it). It merges and is
scored like any other adapter; served unmerged, its rank K*r must fit the engine's max_lora_rank.
Shipped, K times the adapter's size is a cost: `rank` factors each module's mean delta to its best
rank-N approximation (truncated SVD) and records the share of each delta kept.

    fastvista average runs/x/checkpoint-120 runs/x/checkpoint-130 runs/x/student -o runs/x/tail_mean [--rank 16]
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
# what a checkpoint carries besides its weights that an adapter needs (or a merge reads)
CARRIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
STACKED = ("lora_A.weight", "lora_embedding_A")  # rank along dim 0
SIDE_BY_SIDE = ("lora_B.weight", "lora_embedding_B")  # rank along dim 1
# what a delta adds unscaled, averaged as it is: trained tokens
AVERAGED = ("trainable_tokens_delta",)
# config keys that may differ between checkpoints of one run without changing what a delta means
FREE_KEYS = {"inference_mode", "revision"}
UNORDERED_KEYS = {"target_modules"}  # PEFT writes a set, in the process's hash order
# settings under which a mean of deltas is not a plain LoRA of the stacked matrices (lora_bias: PEFT
# scales the bias with B A, so a mean of biases under the mean's own scale is not the mean)
VARIANTS = ("lora_bias", "use_dora", "use_qalora", "use_bdlora", "kasa_config", "monteclora_config", "arrow_config",
            "target_parameters", "alora_invocation_tokens", "layer_replication", "rank_pattern", "alpha_pattern")
PLAIN_INIT = (True, False, "gaussian")  # other initialisations (PiSSA, OLoRA, LoftQ...) change the base weights


def kind(key: str) -> str:
    """How a tensor of the adapter averages: stacked, side by side, averaged, or refused."""
    if key.endswith(STACKED):
        return "stacked"
    if key.endswith(SIDE_BY_SIDE):
        return "side by side"
    if key.endswith(AVERAGED):
        return "averaged"
    raise ValueError(f"{key}: a tensor of a LoRA variant, or a whole module PEFT saved beside the adapter (modules_to_save, "
                     "embedding layers), whose mean is not known to be a LoRA")


def averaged_weights(states: list[dict], names: list[str]) -> dict:
    """The adapters' tensors joined so that, with the scale of `averaged_config`, the delta is
    the exact mean of theirs: A (r x in) stacked to K*r rows, B (out x r) side by side, anything
    a delta adds linearly averaged as it is."""
    import torch

    keys, dtypes = set(states[0]), {t.dtype for t in states[0].values()}
    for state, name in zip(states[1:], names[1:]):
        if set(state) != keys:
            raise ValueError(f"{name}/{WEIGHTS}: trains other modules than {names[0]}'s: {sorted(keys ^ set(state))[:3]}")
        if {t.dtype for t in state.values()} != dtypes:
            raise ValueError(f"{name}/{WEIGHTS}: saved as {sorted(map(str, {t.dtype for t in state.values()}))}, "
                             f"{names[0]}'s as {sorted(map(str, dtypes))}: not checkpoints of one run")
    out = {}
    for key in sorted(keys):
        tensors = [s[key] for s in states]
        how = kind(key)
        if how == "stacked":
            out[key] = torch.cat(tensors, dim=0)
        elif how == "side by side":
            out[key] = torch.cat(tensors, dim=1)
        else:
            out[key] = torch.stack([t.float() for t in tensors]).mean(dim=0).to(tensors[0].dtype)
        out[key] = out[key].contiguous()
    return out


def comparable(config: dict) -> dict:
    return {k: sorted(v) if k in UNORDERED_KEYS and isinstance(v, list) else v for k, v in config.items() if k not in FREE_KEYS}


def averaged_config(configs: list[dict], names: list[str]) -> dict:
    """The config of the rank-K*r adapter: the sources' own, with r times K and alpha set so that
    each delta's scale is 1/K of theirs (alpha / r, or alpha / sqrt(r) with rsLoRA); refused where
    a mean of deltas is not such a LoRA."""
    first = comparable(configs[0])
    for config, name in zip(configs[1:], names[1:]):
        other = comparable(config)
        differs = sorted(k for k in set(first) | set(other) if other.get(k) != first.get(k))
        if differs:
            raise ValueError(f"{name}/{CONFIG}: {', '.join(differs)} differ from {names[0]}'s: not checkpoints of one run")
    where = f"{names[0]}/{CONFIG}"
    if first.get("peft_type") != "LORA":
        raise ValueError(f"{where}: peft_type {first.get('peft_type')!r}: only LoRA adapters average into one")
    variants = [key for key in VARIANTS if first.get(key)]
    if variants:
        raise ValueError(f"{where}: {', '.join(variants)}: a LoRA variant whose mean is not a plain LoRA")
    if first.get("init_lora_weights", True) not in PLAIN_INIT:
        raise ValueError(f"{where}: init_lora_weights {first['init_lora_weights']!r} changes the base weights")
    for key in ("r", "lora_alpha"):
        if not isinstance(first.get(key), (int, float)):
            raise ValueError(f"{where}: no {key}")
    k = len(configs)
    # plain: alpha / (K r) = (alpha / r) / K; rsLoRA: alpha' / sqrt(K r) = (alpha / sqrt(r)) / K
    alpha = first["lora_alpha"] / (k ** 0.5 if first.get("use_rslora") else 1)
    return {**configs[-1], "r": first["r"] * k, "lora_alpha": alpha}


def lora_scale(config: dict) -> float:
    """What PEFT multiplies B A by: alpha / r, or alpha / sqrt(r) with rsLoRA."""
    return config["lora_alpha"] / (config["r"] ** 0.5 if config.get("use_rslora") else config["r"])


def truncated(weights: dict, config: dict, rank: int) -> tuple[dict, dict, dict]:
    """Each module's delta s * B A refactored to its best rank-`rank` approximation (Eckart-Young):
    QR of B and of A^T leave a small K*r square whose SVD gives the delta's singular values; the
    kept ones are split evenly between the new B and A (scale 1, the config's alpha set to match).
    Returns the weights, their config and, for each module whose delta is not zero, the share of its
    squared Frobenius norm kept."""
    import torch

    if not 1 <= rank <= config["r"]:
        raise ValueError(f"rank {rank}: must be between 1 and the mean's own rank {config['r']} (K checkpoints x their rank)")
    scale, out, kept = lora_scale(config), dict(weights), {}
    for a_key in sorted(k for k in weights if k.endswith(STACKED)):
        b_key = a_key.replace("lora_A.weight", "lora_B.weight").replace("lora_embedding_A", "lora_embedding_B")
        a, b = weights[a_key], weights[b_key]
        q_b, r_b = torch.linalg.qr(b.double())
        q_a, r_a = torch.linalg.qr(a.double().T)
        u, values, vh = torch.linalg.svd(scale * r_b @ r_a.T)
        module = a_key.rsplit(".lora_", 1)[0]
        if rank > len(values):
            raise ValueError(f"rank {rank}: above what {module}'s delta ({b.shape[0]} x {a.shape[1]}) can have ({len(values)})")
        root = values[:rank].sqrt()
        out[b_key] = ((q_b @ u[:, :rank]) * root).to(b.dtype).contiguous()
        out[a_key] = (root[:, None] * (vh[:rank] @ q_a.T)).to(a.dtype).contiguous()
        total = float((values ** 2).sum())
        if total:  # a module that never moved has nothing to keep
            kept[module] = float((values[:rank] ** 2).sum()) / total
    return out, {**config, "r": rank, "lora_alpha": rank ** 0.5 if config.get("use_rslora") else rank}, kept


def refused_output(out: Path, adapters: list[Path]) -> str | None:
    """Why `out` may not be written: an existing folder is never replaced, and neither an input
    nor a folder holding one is ever touched (nor by the `.partial` folder it is built in)."""
    target = out.resolve()
    if out.name in ("", ".", "..") or target == target.parent:
        return f"{out}: name a new folder for the averaged adapter"
    for adapter in adapters:
        source = adapter.resolve()
        for written in (target, target.with_name(target.name + ".partial")):
            if written == source or written in source.parents or source in written.parents:
                return f"{out}: overlaps the input {adapter}" + (f" (built in {written.name})" if written != target else "")
    if target.exists():
        return f"{out}: exists; the averaged adapter goes to a new folder (remove it first to write it again)"
    return None


def _read(adapter: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    for name in (WEIGHTS, CONFIG):
        if not (adapter / name).exists():
            raise ValueError(f"{adapter}: no {name} (a PEFT adapter folder or a training checkpoint)")
    try:
        config = json.loads((adapter / CONFIG).read_text())
    except ValueError as e:
        raise ValueError(f"{adapter / CONFIG}: not JSON ({e})") from None
    try:
        return load_file(str(adapter / WEIGHTS)), config
    except Exception as e:  # safetensors raises its own error type for a truncated or foreign file
        raise ValueError(f"{adapter / WEIGHTS}: unreadable ({e})") from None


def average(adapters: list[Path], out: Path, rank: int | None = None) -> dict:
    """The adapters' mean written to `out` (a new folder; built aside, renamed in), with the
    student format they share, the last one's tokenizer files, and `averaged.json` naming the
    sources by their content sha256. With `rank`, the mean truncated to that rank (`truncated`).
    Returns that record (with the rank)."""
    from safetensors.torch import save_file

    from fastvista.contract import read_format, write_format
    from fastvista.fingerprint import content_sha256

    if len(adapters) < 2:
        raise ValueError("average needs at least two adapters")
    if (why := refused_output(out, adapters)) is not None:
        raise ValueError(why)
    names = [str(a) for a in adapters]
    read = [_read(a) for a in adapters]
    digests = [content_sha256(a / WEIGHTS) for a in adapters]
    for i, digest in enumerate(digests):
        if digest in digests[:i]:
            raise ValueError(f"{adapters[i]}: the same weights as {adapters[digests.index(digest)]}: each checkpoint counts once")
    formats = {}
    for adapter in adapters:
        try:
            fmt = read_format(adapter)
        except ValueError as e:
            raise ValueError(f"{adapter}/format.json: {e}") from None
        if fmt is not None:
            formats[str(adapter)] = fmt
    if not formats:
        raise ValueError("none of the adapters records its student format (format.json): include the run's "
                         "final adapter or one of its snapshots")
    if len(set(formats.values())) > 1:
        raise ValueError(f"the adapters were trained with different student formats: {formats}")
    config = averaged_config([c for _, c in read], names)
    weights = averaged_weights([w for w, _ in read], names)

    record = {"rule": "mean of the LoRA deltas", "rank": config["r"],
              "sources": [{"adapter": n, "content_sha256": d} for n, d in zip(names, digests)]}
    if rank is not None and rank != config["r"]:
        weights, config, kept = truncated(weights, config, rank)
        worst = min(kept, key=kept.get) if kept else None
        record.update(rule=f"mean of the LoRA deltas, truncated to rank {rank} by SVD", rank=rank, exact_rank=record["rank"],
                      norm_kept={"of": "each LoRA module's mean delta, its squared Frobenius norm (modules whose delta is zero left out)",
                                 "least": kept.get(worst), "least_module": worst,
                                 "mean_over_modules": sum(kept.values()) / len(kept) if kept else None, "modules": kept})
    partial = out.resolve().with_name(out.resolve().name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # refused_output keeps inputs out of it
    partial.mkdir(parents=True)
    try:
        save_file(weights, str(partial / WEIGHTS), metadata={"format": "pt"})
        (partial / CONFIG).write_text(json.dumps(config, indent=2))
        write_format(partial, next(iter(formats.values())))
        for name in CARRIED:
            source = next((a / name for a in reversed(adapters) if (a / name).exists()), None)
            if source is not None:
                shutil.copy2(source, partial / name)
        (partial / "averaged.json").write_text(json.dumps(record, indent=2))
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    partial.rename(out)
    return record
