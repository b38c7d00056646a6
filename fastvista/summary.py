"""Statistics of a scoring run (teacher or student), computed from its scored dialogues (pure)."""

from __future__ import annotations

from collections import Counter

from fastvista.labels import Label
from fastvista.schema import ScoredDialogue
from fastvista.scoring import system_scores


def _mean(xs) -> float | None:
    xs = list(xs)
    return round(sum(xs) / len(xs), 4) if xs else None


def summarise(scored: list[ScoredDialogue]) -> dict:
    turns = [(d, r) for d in scored for r in d.turns]
    labels = Counter(c.label.value for _, r in turns for c in r.claims)
    n_claims = sum(labels.values())
    sources = {"scored": Counter(), "context": Counter()}
    for d in scored:
        for t in d.dialogue.turns:
            if t.role == "assistant" and t.meta and "knowledge_source" in t.meta:
                kinds = sorted({s.rstrip("0123456789") for s in t.meta["knowledge_source"]})
                sources["scored" if t.scored else "context"]["+".join(kinds) or "none"] += 1
    gold = [(r, d.dialogue.turns[r.index].gold) for d, r in turns]
    gold = [(r, g) for r, g in gold if g is not None and g.label is not None]
    summary = {
        "dialogues": len(scored),
        "scored_turns": len(turns),
        "turns_with_reference": sum(d.dialogue.turns[r.index].reference is not None for d, r in turns),
        "turns_with_errors": sum(bool(r.errors) for _, r in turns),
        "no_claim_turns": sum(r.no_claims for _, r in turns),
        "claims": n_claims,
        "claims_per_turn": _mean(len(r.claims) for _, r in turns),
        "label_distribution": {l.value: labels.get(l.value, 0) for l in Label},
        "label_share": {l.value: round(labels.get(l.value, 0) / n_claims, 4) if n_claims else 0.0 for l in Label},
        "hallucinated_turns": sum(r.hallucinated for _, r in turns),
        "mean_dialogue_score": _mean(d.score for d in scored if d.score is not None),
        "dialogues_without_scored_turns": sum(d.score is None for d in scored),
        "system_scores": system_scores((d.system, [[c.label for c in r.claims] for r in d.turns]) for d in scored if d.turns),
        "calls_per_turn": _mean(r.usage.calls for _, r in turns),
        "prompt_tokens_per_turn": _mean(r.usage.prompt_tokens for _, r in turns),
        "completion_tokens_per_turn": _mean(r.usage.completion_tokens for _, r in turns),
        # Topical-Chat: which knowledge each assistant turn cites, for scored and context turns.
        "assistant_turns_by_knowledge_source": {k: dict(v) for k, v in sources.items()} if any(sources.values()) else None,
    }
    if gold:
        summary["gold_turns"] = len(gold)
        summary["gold_turn_accuracy"] = _mean((g.label == "hallucinated") == r.hallucinated for r, g in gold)
        summary["gold_hallucinated_share"] = _mean(g.label == "hallucinated" for _, g in gold)
        gold_claims = [len(g.claims) for _, g in gold if g.claims is not None]
        if gold_claims:
            summary["gold_claims_per_turn"] = _mean(gold_claims)
    return summary
