"""The student's corpus inputs: Topical-Chat dialogues that no evaluation set uses, split by
dialogue into train / validation / test.

Evaluation sets reuse Topical-Chat conversations (BEGIN's and FaithDial's Topical-Chat parts
continue them), so a dialogue is left out when any of its turns appears, whitespace and case
aside, in any turn of an evaluation set, or when it is one of the demo's dialogues. The split is
a hash of the dialogue id, so it never changes when dialogues are added; the labelling order is
a seeded shuffle, so any prefix of the file is a fair sample to label first.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from fastvista.loaders import load
from fastvista.records_io import RecordError
from fastvista.schema import Dialogue
from fastvista.selection import truncate_scored

SPLITS = ("train", "validation", "test")
MIN_TEXT = 25  # shorter turns ("lol", "Yes, I agree.") recur across unrelated dialogues


def split_of(dialogue_id: str, test_share: float = 0.12, validation_share: float = 0.08) -> str:
    x = int(hashlib.sha256(dialogue_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if x < test_share else "validation" if x < test_share + validation_share else "train"


def _key(text: str) -> str | None:
    key = " ".join(text.lower().split())
    return key if len(key) >= MIN_TEXT else None


def turn_keys(dialogues: Iterable[Dialogue]) -> set[str]:
    return {k for d in dialogues for t in d.turns if (k := _key(t.text))}


def build(
    topical_chat_files: list[Path], evaluation_sets: list[tuple[str, Path]], exclude_ids: set[str],
    max_scored_turns: int, seed: int = 0,
) -> tuple[list[Dialogue], dict]:
    """The corpus dialogues (shuffled, each with `meta.split`) and a report of what was left out."""
    skipped: list[RecordError] = []
    evaluation = set()
    for source, path in evaluation_sets:
        evaluation |= turn_keys(load(source, path, skipped))
    kept, dropped = [], Counter()
    for path in topical_chat_files:
        for d in load("topical_chat", path, skipped):
            if d.id in exclude_ids:
                dropped["demo dialogue"] += 1
            elif any(k in evaluation for t in d.turns if (k := _key(t.text))):
                dropped["shares a turn with an evaluation set"] += 1
            elif not d.scored_indices():
                dropped["no turn with a resolvable reference"] += 1
            else:
                d = truncate_scored(d, max_scored_turns)
                kept.append(d.model_copy(update={"meta": {**(d.meta or {}), "split": split_of(d.id)}}))
    random.Random(seed).shuffle(kept)
    report = {
        "dialogues": len(kept),
        "dropped": dict(dropped),
        "unreadable_records": len(skipped),
        "by_split": {s: {"dialogues": sum(d.meta["split"] == s for d in kept),
                         "scored_turns": sum(len(d.scored_indices()) for d in kept if d.meta["split"] == s)} for s in SPLITS},
        "evaluation_turn_texts": len(evaluation),
        "max_scored_turns": max_scored_turns,
        "seed": seed,
    }
    return kept, report
