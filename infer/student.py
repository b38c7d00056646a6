"""The student's per-dialogue state machine: one model call per scored turn, or per window of
scored turns (`turns_per_call`, the dialogue-level pass of `fastvista.window_pass`).

Turn k's knowledge store is built from the student's own VERIFIED and OUT_OF_SCOPE claims of the
turns before it, so calls of one dialogue are sequential; the scheduler batches the next call of
every open dialogue into one engine call (a wave). A window carries its store in its own answer,
so a dialogue of N scored turns needs N / turns_per_call waves instead of N. The answer is forced into the single-pass
format where the engine can (a regex), retried with sampling where it cannot, and a turn whose
answer never parses is reported with `parse_error`, never dropped.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Optional

from pydantic import BaseModel, ConfigDict

from fastvista.labels import REMEMBERED_LABELS
from fastvista.llm import ChatRequest, Completion, TokenLogprob
from fastvista.scheduler import ask, usage_of
from fastvista.schema import Claim, Dialogue, ScoredDialogue, TurnResult
from fastvista.scoring import is_hallucinated, scored_dialogue, turn_score
from fastvista.single_pass import HISTORY_TURNS, MAX_CLAIM_CHARS, MAX_CLAIMS, output_regex, parse_output, student_messages
from fastvista.window_pass import parse_window_output, window_messages, window_regex, windows


class StudentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    adapter: Optional[str] = "student"  # the LoRA adapter's name in the backend; None: the base model
    history_turns: int = HISTORY_TURNS
    max_tokens: int = 512
    temperature: float = 0.0  # greedy by default; with a seed, sampling is reproducible
    seed: Optional[int] = None
    constrain: bool = True  # force the format with a regex where the engine supports it
    max_claims: int = MAX_CLAIMS  # bounds of the forced format (max_tokens must cover them)
    max_claim_chars: int = MAX_CLAIM_CHARS
    retries: int = 2  # further attempts (sampled) when an answer does not parse
    retry_temperature: float = 0.7
    logprobs: int = 1  # > 0: a confidence per claim from its label tokens' log-probabilities
    # 1: the per-turn single pass (DESIGN.md); N > 1: one call scores up to N scored turns (the
    # model must have been trained on that format: the teacher's train_window.jsonl)
    turns_per_call: int = 1


def label_confidences(logprobs: list[TokenLogprob] | None, claims: list[Claim]) -> list[float | None]:
    """Probability the model gave each claim's label: exp of the summed log-probabilities of the
    tokens that spell it (after the claim's ` | `). Located in the tokens' own text, which matches
    the answer's wherever the format is (ASCII separators and labels)."""
    if not logprobs:
        return [None] * len(claims)
    spans, offset = [], 0
    for token in logprobs:
        spans.append((offset, offset + len(token.token), token.logprob))
        offset += len(token.token)
    joined = "".join(t.token for t in logprobs)
    confidences, cursor = [], 0
    for claim in claims:
        start = joined.find(" | " + claim.label.value, cursor)
        if start < 0:
            return [None] * len(claims)
        start += 3
        cursor = end = start + len(claim.label.value)
        confidences.append(math.exp(sum(lp for s, e, lp in spans if s < end and e > start)))
    return confidences


def student_request(messages: list[dict], cfg: StudentConfig, constrained: bool) -> ChatRequest:
    return ChatRequest(
        messages=messages,
        max_tokens=cfg.max_tokens,
        temperature=cfg.temperature,
        seed=cfg.seed,
        regex=output_regex(cfg.max_claims, cfg.max_claim_chars) if constrained and cfg.constrain else None,
        lora=cfg.adapter,
        logprobs=cfg.logprobs,
    )


def score_turn(
    messages: list[dict], index: int, store: list[str], cfg: StudentConfig, constrained: bool
) -> Generator[list[ChatRequest], list[Completion], TurnResult]:
    """Score one turn given its rendered messages; returns its result with the store after it."""
    completions: list[Completion] = []
    [(claims, error, completion)] = yield from ask(
        [student_request(messages, cfg, constrained)], parse_output, cfg.retries, cfg.retry_temperature, completions
    )
    if claims is None:
        return TurnResult(
            index=index, claims=[], score=None, no_claims=False, hallucinated=False, store_after=list(store),
            usage=usage_of(completions), errors=[f"student: {error}"], parse_error=error, raw_output=completion.text,
        )
    for claim, confidence in zip(claims, label_confidences(completion.logprobs, claims)):
        claim.confidence = confidence
    labels = [c.label for c in claims]
    new_store = list(store) + [c.text for c in claims if c.label in REMEMBERED_LABELS and c.text not in store]
    return TurnResult(
        index=index, claims=claims, score=turn_score(labels), no_claims=not claims,
        hallucinated=is_hallucinated(labels), store_after=new_store, usage=usage_of(completions),
        errors=[f"student: {len(completions) - 1} unparseable answer(s) before one parsed"] if len(completions) > 1 else [],
    )


def score_window(
    dialogue: Dialogue, window: list[int], store: list[str], cfg: StudentConfig, constrained: bool
) -> Generator[list[ChatRequest], list[Completion], list[TurnResult]]:
    """Score a window of scored turns in one call. The call's usage is booked on the window's
    first turn, so per-turn sums stay the run's totals."""
    completions: list[Completion] = []
    request = student_request(window_messages(dialogue, window, store, cfg.history_turns), cfg, False).model_copy(update={
        "max_tokens": cfg.max_tokens * len(window),
        "regex": window_regex(len(window), cfg.max_claims, cfg.max_claim_chars) if constrained and cfg.constrain else None,
    })
    [(per_turn, error, completion)] = yield from ask(
        [request], lambda text: parse_window_output(text, len(window)), cfg.retries, cfg.retry_temperature, completions
    )
    usage = [usage_of(completions)] + [usage_of([])] * (len(window) - 1)
    if per_turn is None:
        return [TurnResult(index=i, claims=[], score=None, no_claims=False, hallucinated=False, store_after=list(store), usage=u,
                           errors=[f"student: {error}"], parse_error=error, raw_output=completion.text) for i, u in zip(window, usage)]
    every = [c for claims in per_turn for c in claims]
    for claim, confidence in zip(every, label_confidences(completion.logprobs, every)):
        claim.confidence = confidence
    results = []
    for index, claims, u in zip(window, per_turn, usage):
        labels = [c.label for c in claims]
        store = list(store) + [c.text for c in claims if c.label in REMEMBERED_LABELS and c.text not in store]
        results.append(TurnResult(index=index, claims=claims, score=turn_score(labels), no_claims=not claims,
                                  hallucinated=is_hallucinated(labels), store_after=store, usage=u))
    return results


def score_dialogue(dialogue: Dialogue, cfg: StudentConfig, constrained: bool) -> Generator[list[ChatRequest], list[Completion], ScoredDialogue]:
    store = list(dialogue.knowledge_init)
    results: list[TurnResult] = []
    if cfg.turns_per_call > 1:
        for window in windows(dialogue.scored_indices(), cfg.turns_per_call):
            window_results = yield from score_window(dialogue, window, store, cfg, constrained)
            store = window_results[-1].store_after
            results.extend(window_results)
        return scored_dialogue(dialogue, results)
    for index in dialogue.scored_indices():
        messages = student_messages(dialogue, index, store, cfg.history_turns)
        result = yield from score_turn(messages, index, store, cfg, constrained)
        store = result.store_after
        results.append(result)
    return scored_dialogue(dialogue, results)
