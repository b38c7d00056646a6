"""Choosing which dialogues (and how many of their turns) a run scores."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

from fastvista.schema import Dialogue


def truncate_scored(dialogue: Dialogue, max_scored_turns: int) -> Dialogue:
    """Cut a dialogue just after its `max_scored_turns`-th scored turn."""
    scored = dialogue.scored_indices()
    if len(scored) <= max_scored_turns:
        return dialogue
    return dialogue.model_copy(update={"turns": dialogue.turns[: scored[max_scored_turns - 1] + 1]})


def select(
    dialogues: Iterable[Dialogue],
    limit: int | None = None,
    min_scored_turns: int = 0,
    max_scored_turns: int | None = None,
    dropped: list[dict] | None = None,
) -> Iterator[Dialogue]:
    """The first `limit` dialogues with at least `min_scored_turns` scored turns, each cut
    after `max_scored_turns` scored turns; each dialogue left out for too few scored turns is
    reported in `dropped` with its reason."""
    n = 0
    for d in dialogues:
        if limit is not None and n >= limit:
            return
        if len(d.scored_indices()) < min_scored_turns:
            if dropped is not None:
                dropped.append({"id": d.id, "reason": f"{len(d.scored_indices())} scored turns, fewer than min_scored_turns={min_scored_turns}"})
            continue
        yield truncate_scored(d, max_scored_turns) if max_scored_turns else d
        n += 1


def sample(dialogues: list[Dialogue], n: int, seed: int = 0) -> list[Dialogue]:
    """A seeded random sample of `n` dialogues (all, if there are fewer), in their input order."""
    if n >= len(dialogues):
        return dialogues
    keep = sorted(random.Random(seed).sample(range(len(dialogues)), n))
    return [dialogues[i] for i in keep]
