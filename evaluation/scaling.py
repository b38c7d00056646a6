"""Inputs for the speed scaling curve: the same dialogues with references of growing length.

    fastvista data scaling-set data/corpus/inputs.jsonl.gz -o runs/scaling --reference-tokens 100 500 1000 2000 4000

Where a single pass should win big is long knowledge (the teacher re-reads the reference for
every claim). Each scored turn's reference becomes its own passage followed by real passages
of other Topical-Chat reading sets (seeded order) until it holds the target number of tokens;
a target below the turn's own passage keeps its first sentences up to the target. The turn
still cites its own passage first, so what it says keeps its support; the rest is the distractor
knowledge a retriever would bring along. One file per target, ids suffixed `#refN`. Targets
above ~3,000 tokens need `backend.max_model_len: 8192` in the speed config.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

from fastvista.schema import Dialogue


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def long_reference(own: str, pool: Sequence[str], target: int, count: Callable[[str], int]) -> str:
    """`own` cut or extended with passages of `pool` (in order, never itself) to about `target` tokens."""
    if count(own) >= target:
        kept: list[str] = []
        for sentence in _sentences(own):
            kept.append(sentence)
            if count(" ".join(kept)) >= target:
                break
        return " ".join(kept)
    parts, size = [own], count(own)
    for passage in pool:
        if size >= target:
            break
        if passage != own:
            parts.append(passage)
            size += count(passage)
    return "\n".join(parts)


def scaling_sets(dialogues: list[Dialogue], targets: Sequence[int], count: Callable[[str], int], seed: int = 0,
                 passages: Sequence[Dialogue] = ()) -> dict[int, list[Dialogue]]:
    """For each target, every dialogue with each scored turn's reference at that length; the
    distractors come from the references of `passages` (default: the dialogues themselves)."""
    pool = sorted({t.reference for d in (passages or dialogues) for t in d.turns if t.reference})
    random.Random(seed).shuffle(pool)
    sets = {}
    for target in targets:
        out = []
        for n, d in enumerate(dialogues):
            rotated = pool[n % len(pool):] + pool[: n % len(pool)]  # each dialogue draws other distractors
            turns = [t.model_copy(update={"reference": long_reference(t.reference, rotated, target, count)}) if t.scored and t.reference
                     else t for t in d.turns]
            out.append(d.model_copy(update={"id": f"{d.id}#ref{target}", "turns": turns}))
        sets[target] = out
    return sets
