"""The teacher's per-dialogue state machine, as a generator with no I/O.

`label_dialogue` yields the batch of requests its current step needs and receives their
completions; the scheduler drives many of these at once. Per scored assistant turn, in order:
1. decompose the whole turn into claims (history and few-shot examples in the prompt), or take
   the humans' claims (`gold_claims`, to score the labelling stage alone);
2. verify each claim against the knowledge store and the turn's reference, and
3. classify it (OUT_OF_SCOPE, CONTRADICTED, LACKING_EVIDENCE, ABSTENTION), both in one round; the
   class decides only where verification did not accept the claim;
4. remember: append the turn's VERIFIED and OUT_OF_SCOPE claims to the store (fastvista.memory).
LLM calls per turn = 1 + votes x (claims not about the speaker + claims), plus retries.
A failed call, a decomposition that never reads (or is cut at max_tokens), or a claim with no
readable label raises ScoringFailed: the dialogue is reported, never given a fallback score.
"""

from __future__ import annotations

import re

import numpy as np
from collections.abc import Generator

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fastvista.labels import UNVERIFIABLE_CLASSES, Label
from fastvista.llm import ChatRequest, Completion
from fastvista.memory import MAX_STORE_CLAIMS, initial_store, turn_result
from fastvista.schema import Claim, Dialogue, ScoredDialogue, TurnResult
from fastvista.scoring import scored_dialogue
from fastvista.protocol import ScoringFailed, ask, usage_of
from fastvista.text import FormatError, earliest, first_token_distribution, normalise_claim, recent
from fastvista.synth import prompts


class TeacherConfig(BaseModel):
    """The teacher's method settings; each is recorded in every output's provenance."""

    model_config = ConfigDict(extra="forbid")

    history: bool = True  # dialogue history in the decomposition prompt
    accumulate: bool = True  # grow the knowledge store with VERIFIED and OUT_OF_SCOPE claims
    few_shot: int = 6  # examples per prompt (0 = zero-shot)
    history_turns: int = 8  # most recent turns shown as history
    max_store_claims: int = MAX_STORE_CLAIMS  # the knowledge store's bound (oldest entries leave first)
    max_claims: int = 12  # a decomposition longer than this is cut (and reported)
    retries: int = 2  # extra attempts (sampled) for an answer that cannot be read
    retry_temperature: float = 0.7
    decompose_max_tokens: int = 320
    label_max_tokens: int = 8
    # Label the humans' claims (Gold.claims) instead of decomposing: scores the labelling stage alone.
    gold_claims: bool = False
    # Claims about the speaker itself (its opinions, experiences, not knowing) assert nothing about
    # the world: they skip verification and are told apart only as OUT_OF_SCOPE or ABSTENTION.
    speaker_claims: bool = True
    # Read each label from the log-probabilities of the answer's first token (a distribution over
    # the labels) instead of from its text; decided with the threshold and biases below.
    label_scores: bool = True
    verify_threshold: float = 0.5  # P(VERIFIED) from which a claim is VERIFIED
    class_bias: dict[Label, float] = Field(default_factory=dict)  # log-probability offsets per class
    # Self-consistency: each label question is asked with this many orders of the few-shot
    # examples and the answers' distributions averaged; the chosen label's share is its confidence.
    votes: int = 1

    @model_validator(mode="after")
    def _check(self) -> "TeacherConfig":
        if self.votes < 1:
            raise ValueError("votes must be at least 1")
        if any(label not in UNVERIFIABLE_CLASSES for label in self.class_bias):
            raise ValueError("class_bias takes only the four classes of unverifiable claims")
        return self


class Unreadable(FormatError):
    """A teacher answer the parser cannot read."""


_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s*")
_SPEAKER = re.compile(r"^\W*(?:(?:the\s+)?(?:assistant|wizard|speaker|agent|bot|chatbot)\b|(?:i|i'm|i've|my|me)\b)", re.I)


def about_speaker(claim: str) -> bool:
    """Whether a claim is about the speaker itself ("The assistant loves jazz.")."""
    return bool(_SPEAKER.match(claim))


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


_VERIFY_WORDS = {"UNVERIFIABLE": False, "UNVERIFIED": False, "NOT_VERIFIED": False, "VERIFIED": True}
_CLASS_WORDS = {l.value: l for l in UNVERIFIABLE_CLASSES} | {"OUT_OF_SCOPE": Label.OUT_OF_SCOPE}
# Every answer word starts with its own letter, so a first token tells them apart whatever the tokenizer.
_VERIFY_LETTERS = {"V": True, "U": False, "N": False}
_CLASS_LETTERS = {l.value[0]: l for l in UNVERIFIABLE_CLASSES}


def parse_verification(text: str) -> bool:
    """True for VERIFIED, False for UNVERIFIABLE (the earliest of the words wins)."""
    return earliest(text, _VERIFY_WORDS, "label")


def parse_class(text: str) -> Label:
    return earliest(text, _CLASS_WORDS, "label")


DECISION_ORDER = (Label.VERIFIED, *UNVERIFIABLE_CLASSES)  # the label indices `decide_many` returns
_NOT_FOR_SPEAKERS = np.array([l not in (Label.OUT_OF_SCOPE, Label.ABSTENTION) for l in UNVERIFIABLE_CLASSES])


def decide_many(p_verified: np.ndarray, log_classes: np.ndarray, speaker: np.ndarray, threshold: float,
                bias: dict[Label, float]) -> np.ndarray:
    """VISTA's decision from the two questions' distributions, for many claims at once (indices
    into DECISION_ORDER): VERIFIED when P(VERIFIED) (NaN: not asked) reaches the threshold, else
    the most likely class after the bias (a speaker claim: OUT_OF_SCOPE or ABSTENTION only).
    Pure, so thresholds can be fitted on stored distributions (synth/calibrate.py)."""
    scores = log_classes + np.array([bias.get(l, 0.0) for l in UNVERIFIABLE_CLASSES])
    scores[np.ix_(speaker, _NOT_FOR_SPEAKERS)] = -np.inf
    verified = ~speaker & (np.nan_to_num(p_verified, nan=-1.0) >= threshold)
    return np.where(verified, 0, 1 + scores.argmax(axis=1))


def decide(p_verified: float | None, classes: dict[Label, float], speaker: bool, cfg: TeacherConfig) -> Label:
    """`decide_many` for one claim, its class distribution as a dict."""
    log_classes = np.log(np.array([[classes.get(l, 0.0) for l in UNVERIFIABLE_CLASSES]]) + 1e-9)
    p = np.array([np.nan if p_verified is None else p_verified])
    return DECISION_ORDER[int(decide_many(p, log_classes, np.array([speaker]), cfg.verify_threshold, cfg.class_bias)[0])]


def _mean(distributions: list[dict]) -> dict:
    keys = {k for d in distributions for k in d}
    return {k: sum(d.get(k, 0.0) for d in distributions) / len(distributions) for k in keys}


def _distribution(answer, letters: dict, cfg: TeacherConfig) -> dict | None:
    """The answer's distribution over the labels; None for an answer that never read (a stray
    letter in the top tokens of "Sorry, I cannot..." is no label)."""
    value, _, completion = answer
    if value is None:
        return None
    scores = first_token_distribution(completion, letters) if cfg.label_scores else None
    return scores if scores is not None else {value: 1.0}


def label_claims(
    claim_texts: list[str], reference: str | None, store: list[str], cfg: TeacherConfig, completions: list[Completion]
) -> Generator[list[ChatRequest], list[Completion], list[Claim]]:
    """Verify and classify every claim in one round (each question asked `votes` times with the
    few-shot examples in another order). The decision is VISTA's: a class only matters for a
    claim that verification did not accept; keeping every claim's class distribution lets the
    threshold and biases be fitted afterwards without relabelling."""
    speaker = [cfg.speaker_claims and about_speaker(c) for c in claim_texts]
    logprobs = 20 if cfg.label_scores else 0

    def request(messages) -> ChatRequest:
        return ChatRequest(messages=messages, max_tokens=cfg.label_max_tokens, logprobs=logprobs)

    to_verify = [i for i, s in enumerate(speaker) if not s]
    verify = [request(prompts.verify_messages(store, reference, claim_texts[i], cfg.few_shot, v)) for i in to_verify for v in range(cfg.votes)]
    classify = [request(prompts.classify_messages(store, reference, c, cfg.few_shot, v)) for c in claim_texts for v in range(cfg.votes)]
    # only the label word at the start is read: an answer that goes on past label_max_tokens is whole enough
    answers = yield from ask(verify + classify, [parse_verification] * len(verify) + [parse_class] * len(classify), cfg.retries,
                             cfg.retry_temperature, completions, cut_ok=True)
    verify_answers, class_answers = answers[: len(verify)], answers[len(verify) :]

    claims = []
    for k, text in enumerate(claim_texts):
        errors, p_verified = [], None
        if not speaker[k]:
            j = to_verify.index(k)
            votes = verify_answers[j * cfg.votes : (j + 1) * cfg.votes]
            found = [d for d in (_distribution(a, _VERIFY_LETTERS, cfg) for a in votes) if d is not None]
            errors += [f"verify: {a[1]}" for a in votes if a[1]]
            p_verified = _mean(found).get(True, 0.0) if found else None
        votes = class_answers[k * cfg.votes : (k + 1) * cfg.votes]
        found = [d for d in (_distribution(a, _CLASS_LETTERS, cfg) for a in votes) if d is not None]
        errors += [f"classify: {a[1]}" for a in votes if a[1]]
        classes = _mean(found) if found else {}
        if not classes and (p_verified is None or p_verified < cfg.verify_threshold):
            raise ScoringFailed(f"claim {text!r}: no readable label ({'; '.join(errors)})")
        label = decide(p_verified, classes, speaker[k], cfg)
        confidence = p_verified if label is Label.VERIFIED else classes.get(label)
        probabilities = {l.value: round(p, 4) for l, p in classes.items()}
        if p_verified is not None:
            probabilities["VERIFIED"] = round(p_verified, 4)
        claims.append(Claim(text=text, label=label, error="; ".join(errors) or None,
                            confidence=None if confidence is None else round(confidence, 4),
                            probabilities=probabilities or None, about_speaker=speaker[k] or None))
    return claims


def label_turn(
    history: list[tuple[str, str]], text: str, reference: str | None, store: list[str], cfg: TeacherConfig,
    gold_claims: list[str] | None = None,
) -> Generator[list[ChatRequest], list[Completion], tuple[list[Claim], list[str], list[Completion]]]:
    """One turn through decompose -> verify and classify; returns claims, errors, completions."""
    completions: list[Completion] = []
    errors: list[str] = []
    if gold_claims is not None:
        claim_texts = gold_claims
    else:
        decompose = ChatRequest(
            messages=prompts.decompose_messages(history if cfg.history else [], text, cfg.few_shot),
            max_tokens=cfg.decompose_max_tokens,
        )
        [(claim_texts, error, last)] = yield from ask([decompose], parse_claims, cfg.retries, cfg.retry_temperature, completions)
        if claim_texts is None:
            raise ScoringFailed(f"decompose: {error}; last answer {last.text[-200:]!r}")
        if len(claim_texts) > cfg.max_claims:
            errors.append(f"decompose: {len(claim_texts)} claims, kept the first {cfg.max_claims}")
            claim_texts = claim_texts[: cfg.max_claims]
    claims = (yield from label_claims(claim_texts, reference, store, cfg, completions)) if claim_texts else []
    errors.extend(f"claim {k + 1}: {c.error}" for k, c in enumerate(claims) if c.error)
    return claims, errors, completions


def teacher_turn(
    index: int, history: list[tuple[str, str]], text: str, reference: str | None, store: list[str], cfg: TeacherConfig,
    gold_claims: list[str] | None = None,
) -> Generator[list[ChatRequest], list[Completion], tuple[TurnResult, list[str]]]:
    """Turn `index` labelled and remembered as the teacher does in a dialogue (batch or live):
    its result and the store after it (unchanged without accumulation)."""
    claims, errors, completions = yield from label_turn(recent(history, cfg.history_turns), text, reference, store, cfg, gold_claims)
    result, after = turn_result(index, claims, store, cfg.max_store_claims, usage_of(completions), errors)
    if not cfg.accumulate:
        return result.model_copy(update={"store_added": [], "store_evicted": 0}), list(store)
    return result, after


def label_dialogue(dialogue: Dialogue, cfg: TeacherConfig) -> Generator[list[ChatRequest], list[Completion], ScoredDialogue]:
    """Label every scored turn of one dialogue, threading the knowledge store through them."""
    store = initial_store(dialogue.knowledge_init, cfg.max_store_claims)
    results: list[TurnResult] = []
    for index in dialogue.scored_indices():
        turn = dialogue.turns[index]
        gold = [c.text for c in turn.gold.claims] if cfg.gold_claims and turn.gold and turn.gold.claims is not None else None
        if cfg.gold_claims and gold is None:
            raise ValueError(f"{dialogue.id} turn {index}: gold_claims is set but the turn has no human claims")
        try:
            result, store = yield from teacher_turn(index, [(t.role, t.text) for t in dialogue.turns[:index]], turn.text,
                                                    turn.reference, store, cfg, gold)
        except ScoringFailed as e:
            raise ScoringFailed(f"turn {index}: {e}") from e
        results.append(result)
    return scored_dialogue(dialogue, results)
