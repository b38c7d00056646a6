"""A rule-based stand-in for an LLM behind the Backend interface, so the teacher's control flow
can be checked exactly: it decomposes a turn into its sentences, verifies a claim if the
reference or the store contains it, and classifies by keywords. Unreadable on purpose when a
claim contains GARBLE."""

from __future__ import annotations

from fastvista.llm import ChatRequest, Completion
from fastvista.single_pass import split_sections
from synth import prompts


def _sections(message: str) -> dict[str, str]:
    return split_sections(message, prompts.SECTIONS)


def answer(request: ChatRequest) -> str:
    system = request.messages[0]["content"]
    user = _sections(request.messages[-1]["content"])
    if system == prompts.DECOMPOSE_SYSTEM:
        sentences = [s.strip() for s in user["[TURN]"].replace("?", "?.").split(".") if s.strip()]
        claims = [s + "." for s in sentences if not s.endswith("?")]
        return "\n".join(f"- {c}" for c in claims) if claims else "NONE"
    claim = user["[CLAIM]"].rstrip(".").lower()
    evidence = (user["[REFERENCE]"] + "\n" + user["[KNOWLEDGE STORE]"]).lower()
    if "garble" in claim:
        return "I cannot say."
    if system == prompts.VERIFY_SYSTEM:
        return "VERIFIED" if claim in evidence else "UNVERIFIABLE"
    if "not sure" in claim:
        return "ABSTENTION"
    if claim.startswith("i "):
        return "OUT_OF_SCOPE"
    if " not " in claim:
        return "CONTRADICTED"
    return "LACKING_EVIDENCE"


class ScriptedBackend:
    name = "scripted"
    supports_constraints = False

    def __init__(self):
        self.requests: list[ChatRequest] = []
        self.batches: list[int] = []

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        self.requests.extend(requests)
        self.batches.append(len(requests))
        return [
            Completion(text=answer(r), prompt_tokens=sum(len(m["content"].split()) for m in r.messages), completion_tokens=3)
            for r in requests
        ]
