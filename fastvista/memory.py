"""VISTA's memory rule, in one place for the teacher, the student and every scorer: after a turn
its VERIFIED and OUT_OF_SCOPE claims enter the knowledge store, once each.

The store is bounded (`max_claims`, 64 by default): when a turn would grow it past the bound, the
oldest entries leave first, so a 1,000-turn dialogue keeps a prompt of bounded length. Each turn's
result records what it added and how many old entries it pushed out, not a copy of the store;
`stores_before` replays them. A `knowledge_init` longer than the bound is an error, never cut.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastvista.labels import REMEMBERED_LABELS
from fastvista.protocol import ScoringFailed
from fastvista.schema import Claim, TurnResult, Usage
from fastvista.scoring import is_hallucinated, turn_score

MAX_STORE_CLAIMS = 64


def initial_store(knowledge_init: Sequence[str], max_claims: int = MAX_STORE_CLAIMS) -> list[str]:
    if len(knowledge_init) > max_claims:
        raise ScoringFailed(f"knowledge_init holds {len(knowledge_init)} entries, more than the store's bound "
                            f"of {max_claims} (max_store_claims)")
    return list(knowledge_init)


def remember(store: Sequence[str], claims: Sequence[Claim], max_claims: int = MAX_STORE_CLAIMS) -> tuple[list[str], list[str], int]:
    """The store after a turn: (new store, claims added, old entries pushed out)."""
    added: list[str] = []
    for c in claims:
        if c.label in REMEMBERED_LABELS and c.text not in store and c.text not in added:
            added.append(c.text)
    grown = [*store, *added]
    evicted = max(0, len(grown) - max_claims)
    return grown[evicted:], added, evicted


def turn_result(
    index: int, claims: list[Claim], store: Sequence[str], max_claims: int, usage: Usage | None = None,
    errors: list[str] | None = None, details: dict | None = None,
) -> tuple[TurnResult, list[str]]:
    """A scored turn's result (score, decision, what it remembered) and the store after it."""
    new_store, added, evicted = remember(store, claims, max_claims)
    labels = [c.label for c in claims]
    result = TurnResult(index=index, claims=claims, score=turn_score(labels), no_claims=not claims,
                        hallucinated=is_hallucinated(labels), store_added=added, store_evicted=evicted,
                        usage=usage or Usage(), errors=errors or [], details=details)
    return result, new_store


def stores_before(knowledge_init: Sequence[str], results: Sequence[TurnResult]) -> list[list[str]]:
    """The store each turn was scored with, replayed from the results."""
    store, before = list(knowledge_init), []
    for r in results:
        before.append(store)
        grown = [*store, *r.store_added]
        store = grown[r.store_evicted:]
    return before
