"""A rule-based stand-in for an LLM behind the Backend interface, so the teacher's control flow
can be checked exactly: it decomposes a turn into its sentences, verifies a claim if the
reference or the store contains it, and classifies by keywords. Unreadable on purpose when a
claim contains GARBLE."""

from __future__ import annotations

from fastvista.llm import ChatRequest, Completion
from fastvista.single_pass import split_sections
from fastvista.synth import prompts


def _sections(message: str) -> dict[str, str]:
    return split_sections(message, prompts.SECTIONS)


def baseline_answer(system: str, message: str) -> str | None:
    """The baselines' steps by rule (None: not a baseline prompt)."""
    from fastvista.evaluation.baselines import factscore, judge, steps

    if system not in (steps.QG_SYSTEM, steps.QA_SYSTEM, steps.NLI_SYSTEM, factscore.FACTS_SYSTEM, factscore.SUPPORT_SYSTEM, judge.JUDGE_SYSTEM):
        return None
    sections = split_sections(message, ("[TEXT]", "[ANSWER]", "[QUESTION]", "[PREMISE]", "[HYPOTHESIS]", "[SENTENCE]",
                                        "[REFERENCE]", "[FACT]", "[HISTORY]", "[TURN]"))
    if system == steps.QG_SYSTEM:
        return "no question here" if "GARBLE" in sections["[ANSWER]"] else f"Which words are {sections['[ANSWER]']}?"
    if system == steps.QA_SYSTEM:
        wanted, text = sections["[QUESTION]"].removeprefix("Which words are ").rstrip("?"), sections["[TEXT]"]
        if wanted.lower() in text.lower():
            start = text.lower().index(wanted.lower())
            return text[start : start + len(wanted)]
        first = wanted.split()[-1]
        return first if first.lower() in text.lower().split() else "NO ANSWER"
    if system == steps.NLI_SYSTEM:
        premise, hypothesis = sections["[PREMISE]"].lower(), sections["[HYPOTHESIS]"].lower()
        return "CONTRADICTION" if " not " in premise else ("ENTAILMENT" if hypothesis in premise else "NEUTRAL")
    if system == factscore.FACTS_SYSTEM:
        facts = [f.strip(" .") for f in sections["[SENTENCE]"].split(" and ") if f.strip(" .")]
        return "\n".join(f"- {f[0].upper() + f[1:]}." for f in facts) if "?" not in sections["[SENTENCE]"] else "NONE"
    if system == factscore.SUPPORT_SYSTEM:
        return "True" if sections["[FACT]"].rstrip(".").lower() in sections["[REFERENCE]"].lower() else "False"
    if system == judge.JUDGE_SYSTEM:
        if "GARBLE" in sections["[TURN]"]:
            return "I cannot judge this."
        unsupported = [s for s in sections["[TURN]"].split(".") if s.strip() and s.strip().lower() not in sections["[REFERENCE]"].lower()]
        return f"HALLUCINATED\nReason: {unsupported[0].strip()} is not in the reference." if unsupported else "FAITHFUL\nAll supported."


def answer(request: ChatRequest) -> str:
    system = request.messages[0]["content"]
    baseline = baseline_answer(system, request.messages[-1]["content"])
    if baseline is not None:
        return baseline
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
    concurrent = False

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


def student_answer(request: ChatRequest) -> str:
    """The single-pass answer by the same rules: one claim per sentence of [TURN]."""
    from fastvista.window_pass import WINDOW_SYSTEM_PROMPT

    if request.messages[0]["content"] == WINDOW_SYSTEM_PROMPT:
        return window_answer(request.messages[-1]["content"], request.temperature)
    from fastvista.single_pass import SYSTEM_PROMPTS, parse_output, render_target

    sections = split_sections(request.messages[-1]["content"])
    answer = turn_answer(sections["[TURN]"], sections["[REFERENCE]"] + "\n" + sections["[KNOWLEDGE STORE]"], request.temperature)
    style = next((name for name, prompt in SYSTEM_PROMPTS.items() if prompt == request.messages[0]["content"]), "numbered")
    if style != "numbered" and "MAYBE" not in answer:  # the same claims, in the asked style
        return render_target(parse_output(answer), style)
    return answer


def window_answer(message: str, temperature: float) -> str:
    """The dialogue-level answer: each marked turn by the per-turn rules, the claims it already
    remembered in this answer counting as evidence for the later turns."""
    from fastvista.window_pass import message_headers

    headers = message_headers(message)
    blocks, current = {}, None
    for line in message.split("\n"):
        if line in headers:
            current = line
            blocks[current] = []
        else:
            blocks[current].append(line)
    remembered, out = "\n".join(blocks["[KNOWLEDGE STORE]"]), []
    for k in range(1, sum(h.startswith("[TURN") for h in headers) + 1):
        answer = turn_answer("\n".join(blocks[f"[TURN {k}]"]), "\n".join(blocks[f"[REFERENCE {k}]"]) + "\n" + remembered, temperature)
        remembered += "\n" + "\n".join(l.split(". ", 1)[1].split(" | ")[0] for l in answer.split("\n") if l.endswith(("VERIFIED", "OUT_OF_SCOPE")))
        out.append(f"[TURN {k}]\n{answer}")
    return "\n".join(out)


def turn_answer(turn: str, evidence: str, temperature: float) -> str:
    if "BROKEN" in turn or ("FLAKY" in turn and temperature == 0):
        return "Sorry, here are the claims: Paris | MAYBE"
    evidence = evidence.lower()
    lines = []
    for sentence in [s.strip() for s in turn.split(".") if s.strip() and not s.strip().endswith("?")]:
        claim = sentence.replace("FLAKY", "").strip()
        if claim.lower() in evidence:
            label = "VERIFIED"
        elif claim.startswith("I "):
            label = "OUT_OF_SCOPE"
        else:
            label = "LACKING_EVIDENCE"
        lines.append(f"{len(lines) + 1}. {claim}. | {label}")
    return "\n".join(lines) or "NONE"


class ScriptedStudent(ScriptedBackend):
    """The student's stand-in: logprobs spell the answer one character at a time (-0.1 each)."""

    supports_constraints = True

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        from fastvista.llm import TokenLogprob

        self.requests.extend(requests)
        self.batches.append(len(requests))
        answers = [student_answer(r) for r in requests]
        return [
            Completion(text=a, prompt_tokens=len(r.messages[-1]["content"].split()), completion_tokens=len(a),
                       logprobs=[TokenLogprob(token=ch, logprob=-0.1) for ch in a] if r.logprobs else None)
            for r, a in zip(requests, answers)
        ]
