"""Score formulas of docs/design.md: pure functions over claim labels."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from fastvista.labels import Label
from fastvista.schema import Dialogue, ScoredDialogue, TurnResult, Usage


def turn_score(labels: Sequence[Label]) -> float:
    """Safe claims / claims; 1.0 for a turn without claims."""
    return sum(l.safe for l in labels) / len(labels) if labels else 1.0


def is_hallucinated(labels: Iterable[Label]) -> bool:
    """A turn is hallucinated iff one of its claims is CONTRADICTED or LACKING_EVIDENCE."""
    return any(not l.safe for l in labels)


def is_unattributed(labels: Sequence[Label]) -> bool:
    """The reading of attribution benchmarks (BEGIN, AIS): a turn is fully attributable only if it
    states something and every claim is VERIFIED. Opinions and experiences (OUT_OF_SCOPE), which
    VISTA counts safe, are not attributed to the knowledge; nor is a turn with nothing to check
    (BEGIN's annotators called 161 of its 167 responses that end in a question "Not fully attributable")."""
    return not labels or any(l is not Label.VERIFIED for l in labels)


def dialogue_score(turn_labels: Iterable[Sequence[Label]]) -> float | None:
    """The VISTA score: safe claims / claims over all scored turns (a micro-average); 1.0 if the
    turns make no claim, None if there is no scored turn (nothing was checked)."""
    turns = list(turn_labels)
    return turn_score([l for turn in turns for l in turn]) if turns else None


def system_scores(dialogues: Iterable[tuple[str | None, Iterable[Sequence[Label]]]]) -> dict:
    """Micro-averaged score per system over all its dialogues' claims."""
    by_system: dict = defaultdict(list)
    for system, turns in dialogues:
        by_system[system].extend(l for turn in turns for l in turn)
    return {system: turn_score(labels) for system, labels in by_system.items()}


def scored_dialogue(dialogue: Dialogue, results: list[TurnResult]) -> ScoredDialogue:
    """A dialogue's record of results: the VISTA score over its scored turns and the summed usage."""
    usage = Usage()
    for r in results:
        usage = usage.add(r.usage)
    labels = [[c.label for c in r.claims] for r in results]
    return ScoredDialogue(
        id=dialogue.id, source=dialogue.source, system=dialogue.system, score=dialogue_score(labels),
        turns=results, usage=usage, dialogue=dialogue,
    )
