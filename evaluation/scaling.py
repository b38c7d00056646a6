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
from collections.abc import Callable, Sequence

from fastvista.evaluation.cross_turn import sentences
from fastvista.schema import Dialogue


def long_reference(own: str, pool: Sequence[str], target: int, count: Callable[[str], int]) -> str:
    """`own` cut to its first sentences, or extended with passages of `pool` (in order, none that
    `own` already holds, none twice; the last one cut at a sentence), to about `target` tokens."""
    if count(own) >= target:
        return _first_sentences(own, target, count)
    parts, size = [own], count(own)
    for passage in dict.fromkeys(pool):
        if size >= target:
            break
        if passage in own:
            continue
        if size + count(passage) > target:
            passage = _first_sentences(passage, target - size, count)
        parts.append(passage)
        size += count(passage)
    return "\n".join(parts)


def _first_sentences(text: str, target: int, count: Callable[[str], int]) -> str:
    kept: list[str] = []
    for sentence in sentences(text):
        kept.append(sentence)
        if count(" ".join(kept)) >= target:
            break
    return " ".join(kept)


def passages_of(dialogues: Sequence[Dialogue]) -> list[str]:
    """The reading-set passages behind the dialogues' references (one per entity line)."""
    return sorted({line.strip() for d in dialogues for t in d.turns if t.reference for line in t.reference.split("\n") if line.strip()})


def scaling_sets(dialogues: list[Dialogue], targets: Sequence[int], count: Callable[[str], int], seed: int = 0,
                 passages: Sequence[Dialogue] = ()) -> dict[int, list[Dialogue]]:
    """For each target, every dialogue with each scored turn's reference at that length (its
    token count in the turn's meta); the distractors come from the passages of `passages`
    (default: the dialogues themselves)."""
    pool = passages_of(passages or dialogues)
    random.Random(seed).shuffle(pool)
    sets = {}
    for target in targets:
        out = []
        for n, d in enumerate(dialogues):
            rotated = pool[n % len(pool):] + pool[: n % len(pool)]  # each dialogue draws other distractors
            turns = []
            for t in d.turns:
                if t.scored and t.reference:
                    reference = long_reference(t.reference, rotated, target, count)
                    t = t.model_copy(update={"reference": reference, "meta": {**(t.meta or {}), "reference_tokens": count(reference)}})
                turns.append(t)
            out.append(d.model_copy(update={"id": f"{d.id}#ref{target}", "turns": turns}))
        sets[target] = out
    return sets
