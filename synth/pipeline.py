"""The teacher's per-dialogue state machine, as a generator with no I/O.

`label_dialogue` yields the batch of requests its current step needs and receives their
completions; the scheduler drives many of these at once. Per scored assistant turn, in order:
1. decompose the whole turn into claims (history and few-shot examples in the prompt);
2. verify each claim against the knowledge store and the turn's reference;
3. classify each unverifiable claim (OUT_OF_SCOPE, CONTRADICTED, LACKING_EVIDENCE, ABSTENTION);
4. remember: append the turn's VERIFIED and OUT_OF_SCOPE claims to the store.
LLM calls per turn = 1 + claims + unverifiable claims (plus retries of unreadable answers).
"""

from __future__ import annotations

import re
from collections.abc import Generator

from pydantic import BaseModel, ConfigDict

from fastvista.labels import REMEMBERED_LABELS, UNVERIFIABLE_CLASSES, Label
from fastvista.llm import ChatRequest, Completion
from fastvista.schema import Claim, Dialogue, ScoredDialogue, TurnResult
from fastvista.scoring import is_hallucinated, scored_dialogue, turn_score
from fastvista.scheduler import ask, usage_of
from fastvista.single_pass import FormatError, normalise_claim, recent
from synth import prompts


class TeacherConfig(BaseModel):
    """The teacher's method settings; each is recorded in every output's provenance."""

    model_config = ConfigDict(extra="forbid")

    history: bool = True  # dialogue history in the decomposition prompt
    accumulate: bool = True  # grow the knowledge store with VERIFIED and OUT_OF_SCOPE claims
    few_shot: int = 6  # examples per prompt (0 = zero-shot)
    history_turns: int = 8  # most recent turns shown as history
    max_claims: int = 12  # a decomposition longer than this is cut (and reported)
    retries: int = 2  # extra attempts (sampled) for an answer that cannot be read
    retry_temperature: float = 0.7
    decompose_max_tokens: int = 320
    label_max_tokens: int = 8


class Unreadable(FormatError):
    """A teacher answer the parser cannot read."""


_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s*")


def parse_claims(text: str) -> list[str]:
    """Claims of a decomposition answer: one a line, bullets removed; NONE means no claim."""
    lines = [l.strip() for l in text.strip().split("\n") if l.strip()]
    if not lines:
        raise Unreadable("empty decomposition")
    if lines[0].strip(" .").upper() == "NONE":
        return []
    claims = []
    for line in lines:
        claim = normalise_claim(_BULLET.sub("", line))
        if not claim or claim.startswith("[") or claim.endswith(":") or claim.upper() == "NONE":
            continue
        if claim not in claims:
            claims.append(claim)
    if not claims:
        raise Unreadable(f"no claim in {text[:80]!r}")
    return claims


def _first_word_of(text: str, words: dict[str, object]):
    normalised = re.sub(r"[\s-]+", "_", text.upper())
    hits = [(normalised.find(w), value) for w, value in words.items() if w in normalised]
    if not hits:
        raise Unreadable(f"no label in {text[:80]!r}")
    return min(hits, key=lambda h: h[0])[1]


_VERIFY_WORDS = {"UNVERIFIABLE": False, "NOT_VERIFIED": False, "VERIFIED": True}
_CLASS_WORDS = {l.value: l for l in UNVERIFIABLE_CLASSES} | {"OUT_OF_SCOPE": Label.OUT_OF_SCOPE}


def parse_verdict(text: str) -> bool:
    """True for VERIFIED, False for UNVERIFIABLE (the earliest of the words wins)."""
    return _first_word_of(text, _VERIFY_WORDS)


def parse_class(text: str) -> Label:
    return _first_word_of(text, _CLASS_WORDS)


def label_turn(
    history: list[tuple[str, str]], text: str, reference: str | None, store: list[str], cfg: TeacherConfig
) -> Generator[list[ChatRequest], list[Completion], tuple[list[Claim], list[str], list[Completion]]]:
    """One turn through decompose -> verify -> classify; returns claims, errors, completions."""
    completions: list[Completion] = []
    errors: list[str] = []
    decompose = ChatRequest(
        messages=prompts.decompose_messages(history if cfg.history else [], text, cfg.few_shot),
        max_tokens=cfg.decompose_max_tokens,
    )
    [(claim_texts, error, _)] = yield from ask([decompose], parse_claims, cfg.retries, cfg.retry_temperature, completions)
    if error:
        errors.append(f"decompose: {error}")
        claim_texts = []
    if len(claim_texts) > cfg.max_claims:
        errors.append(f"decompose: {len(claim_texts)} claims, kept the first {cfg.max_claims}")
        claim_texts = claim_texts[: cfg.max_claims]

    verify = [
        ChatRequest(messages=prompts.verify_messages(store, reference, c, cfg.few_shot), max_tokens=cfg.label_max_tokens)
        for c in claim_texts
    ]
    verdicts = yield from ask(verify, parse_verdict, cfg.retries, cfg.retry_temperature, completions)
    labels: list[Label | None] = [Label.VERIFIED if ok else None for ok, _, _ in verdicts]
    claim_errors: list[str | None] = [f"verify: {e}" if e else None for _, e, _ in verdicts]

    unverifiable = [i for i, l in enumerate(labels) if l is None]
    classify = [
        ChatRequest(
            messages=prompts.classify_messages(store, reference, claim_texts[i], cfg.few_shot),
            max_tokens=cfg.label_max_tokens,
        )
        for i in unverifiable
    ]
    classes = yield from ask(classify, parse_class, cfg.retries, cfg.retry_temperature, completions)
    for i, (label, error, _) in zip(unverifiable, classes):
        # An unreadable class falls back to LACKING_EVIDENCE (unsafe, so never hides a problem).
        labels[i] = label or Label.LACKING_EVIDENCE
        if error:
            claim_errors[i] = "; ".join(filter(None, [claim_errors[i], f"classify: {error}"]))
    claims = [Claim(text=t, label=l, error=e) for t, l, e in zip(claim_texts, labels, claim_errors)]
    errors.extend(f"claim {k + 1}: {c.error}" for k, c in enumerate(claims) if c.error)
    return claims, errors, completions


def label_dialogue(dialogue: Dialogue, cfg: TeacherConfig) -> Generator[list[ChatRequest], list[Completion], ScoredDialogue]:
    """Label every scored turn of one dialogue, threading the knowledge store through them."""
    store = list(dialogue.knowledge_init)
    results: list[TurnResult] = []
    for index in dialogue.scored_indices():
        turn = dialogue.turns[index]
        history = recent([(t.role, t.text) for t in dialogue.turns[:index]], cfg.history_turns)
        claims, errors, completions = yield from label_turn(history, turn.text, turn.reference, store, cfg)
        if cfg.accumulate:
            store.extend(c.text for c in claims if c.label in REMEMBERED_LABELS and c.text not in store)
        labels = [c.label for c in claims]
        results.append(
            TurnResult(
                index=index,
                claims=claims,
                score=turn_score(labels),
                no_claims=not claims,
                hallucinated=is_hallucinated(labels),
                store_after=list(store),
                usage=usage_of(completions),
                errors=errors,
            )
        )
    return scored_dialogue(dialogue, results)
