"""The student's training data: read the teacher's set, split it by dialogue, account for length.

Pure functions but `read_examples`; the tokenizer is passed in.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from fastvista.records_io import RecordError, read_lines

REQUIRED = ("dialogue_id", "prompt", "completion")


def read_examples(path: str | Path) -> list[dict]:
    """Examples from the teacher's `train.jsonl`, or a `datasets` folder saved with save_to_disk."""
    path = Path(path)
    if path.is_dir():
        from datasets import DatasetDict, load_from_disk

        data = load_from_disk(str(path))
        rows = (data["train"] if isinstance(data, DatasetDict) else data).to_list()
        lines = [None] * len(rows)
    else:
        rows, lines = [], []
        for n, text in read_lines(path):
            if isinstance(text, RecordError):
                raise text
            try:
                rows.append(json.loads(text))
            except json.JSONDecodeError as e:
                raise RecordError(path, n, None, f"invalid JSON: {e.msg}") from None
            lines.append(n)
    for row, n in zip(rows, lines):
        for field in REQUIRED:
            if field not in row:
                raise RecordError(path, n, field, "missing (is this the teacher's train.jsonl?)")
    if not rows:
        raise RecordError(path, None, None, "holds no training examples")
    return rows


def file_hash(path: str | Path) -> str:
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def split_by_dialogue(examples: list[dict], eval_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Hold out whole dialogues, never single turns: turns of one dialogue share a store."""
    dialogues = sorted({e["dialogue_id"] for e in examples})
    random.Random(seed).shuffle(dialogues)
    n_eval = round(len(dialogues) * eval_fraction)
    if eval_fraction > 0 and len(dialogues) > 1:
        n_eval = min(max(n_eval, 1), len(dialogues) - 1)
    held_out = set(dialogues[:n_eval])
    return [e for e in examples if e["dialogue_id"] not in held_out], [e for e in examples if e["dialogue_id"] in held_out]


def token_length(example: dict, tokenizer) -> int:
    """Tokens of prompt plus completion as the chat template renders them for training."""
    encoded = tokenizer.apply_chat_template(example["prompt"] + example["completion"], tokenize=True, return_dict=True)
    return len(encoded["input_ids"])


def enforce_max_length(examples: list[dict], lengths: list[int], max_length: int, policy: str) -> tuple[list[dict], dict]:
    """Drop (or fail on) examples longer than `max_length`: a completion is never cut silently."""
    if policy not in ("drop", "fail"):
        raise ValueError(f"too_long must be 'drop' or 'fail', not {policy!r}")
    too_long = [(e["id"] if "id" in e else e["dialogue_id"], n) for e, n in zip(examples, lengths) if n > max_length]
    report = {
        "examples": len(examples),
        "too_long": len(too_long),
        "too_long_ids": [i for i, _ in too_long],
        "max_tokens_seen": max(lengths, default=0),
        "max_length": max_length,
        "policy": policy,
    }
    if too_long and policy == "fail":
        shown = ", ".join(f"{i} ({n} tokens)" for i, n in too_long[:5])
        raise ValueError(f"{len(too_long)} examples exceed max_length={max_length}: {shown}; raise max_length or set too_long=drop")
    kept = [e for e, n in zip(examples, lengths) if n <= max_length]
    return kept, report


MAX_COPIES = 20  # more copies of each rare turn would teach those turns by heart rather than their label


def oversample(examples: list[dict], labels_of, label, share: float, seed: int) -> tuple[list[dict], dict]:
    """Repeat the examples whose answer holds a claim of `label` until they are `share` of the
    training rows, every other example kept once, for a label the teacher rarely gives on its corpus
    (VERIFIED: 5% of its Topical-Chat claims, 27-32% of its claims on the human-labelled sets).
    Whole copies first, then a seeded sample of one more; `labels_of(example)` lists the labels of
    an example's claims."""
    if not 0 < share < 1:
        raise ValueError(f"oversample_share must lie between 0 and 1, not {share}")
    labels = [labels_of(e) for e in examples]
    rare = [i for i, claims in enumerate(labels) if label in claims]
    if not rare:
        raise ValueError(f"no training example holds a {label} claim to oversample")
    before = len(rare) / len(examples)
    if share <= before:
        raise ValueError(f"the training turns holding a {label} claim already make {before:.1%} of them: "
                         f"oversample_share {share} would repeat none")
    wanted = round(share * (len(examples) - len(rare)) / (1 - share))
    copies, rest = divmod(wanted, len(rare))
    if copies + (rest > 0) > MAX_COPIES:
        raise ValueError(f"oversample_share {share} would put each of the {len(rare)} turns holding a {label} claim in "
                         f"{wanted / len(rare):.1f} times (at most {MAX_COPIES}): ask for a smaller share")
    repeats = rare * (copies - 1) + random.Random(seed).sample(rare, rest)
    if not repeats:
        raise ValueError(f"oversample_share {share} is within a turn of the {before:.1%} the turns holding a {label} claim "
                         "already make: it would repeat none")
    rows = list(range(len(examples))) + repeats

    def claim_share(indices):
        claims = [c for i in indices for c in labels[i]]
        return round(sum(c == label for c in claims) / max(len(claims), 1), 4)

    report = {"examples_with_label": len(rare), "examples": len(examples), "repeats_added": len(repeats),
              "share_before": round(before, 4), "share_after": round((len(rare) + len(repeats)) / len(rows), 4),
              "claim_share_before": claim_share(range(len(examples))), "claim_share_after": claim_share(rows)}
    return [examples[i] for i in rows], report


def snapshot_steps(ids: list[str], dropped: set[str], counts: list[int], batch: int) -> dict[int, int]:
    """For each count n, the optimizer step after which sequential training (examples `ids` in
    file order, those in `dropped` left out as too long) has seen every kept one of the first n:
    {step: n}. A step that also holds the first examples after n is the first to see all n."""
    steps = {}
    for n in sorted(counts):
        seen = sum(i not in dropped for i in ids[:n])
        step = -(-seen // batch)
        if seen and step in steps:
            raise ValueError(f"snapshots after the first {steps[step]} and {n} examples fall in the same step {step}: leave more between them")
        if seen:
            steps[step] = n
    return steps
