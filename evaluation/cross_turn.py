"""A cross-turn probe: does the scorer remember what the dialogue established?

Built from real dialogues with per-turn references (Topical-Chat's). In each base dialogue an
early assistant turn (the *fact turn*) states one self-contained sentence of its own reference. A
later assistant turn (the *probe turn*) is rewritten in four versions:

- ``contradict``: the fact again with its number changed (a year moved, a count multiplied) or, where
  it has no number, its verb negated (expected CONTRADICTED, hallucinated);
- ``abstain``: the speaker retracts it, unsure (expected ABSTENTION, not hallucinated);
- ``restate``: the fact again, unchanged (the control: expected VERIFIED, not hallucinated);
- ``unsupported``: another sentence of the dialogue's references that no turn said
  (expected LACKING_EVIDENCE, hallucinated).

Every reference sentence that repeats either fact is taken out of the probe turn's reference, so
only the dialogue's memory can verify, contradict or fail to support the probe turn. Only the fact
turn and the probe turn are scored; the turns between them stay as context. The probe turn holds
the expected decision and claim as gold, and its `meta` says how it was made.
"""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict

from fastvista.schema import Dialogue, Gold, GoldClaim, ScoredDialogue, Turn

TYPES = {  # type: (expected claim label, turn hallucinated)
    "contradict": ("CONTRADICTED", True),
    "abstain": ("ABSTENTION", False),
    "restate": ("VERIFIED", False),
    "unsupported": ("LACKING_EVIDENCE", True),
}
TEMPLATES = {
    "contradict": ("{fact}", "And {fact_lc}", "So, {fact_lc}"),
    "abstain": ("Actually, I'm not sure that {fact_lc_nodot} - I may have gotten that wrong.",
                "Hmm, I take that back: I don't really know whether {fact_lc_nodot}."),
    "restate": ("Like I said, {fact_lc}", "As I mentioned, {fact_lc}"),
    "unsupported": ("Also, {fact_lc}", "Oh, and {fact_lc}"),
}
MIN_WORDS, MAX_WORDS = 8, 30
_OPENERS = {"the", "a", "an", "in", "on", "at", "as", "by", "from", "for", "since", "after", "during", "with", "of", "to",
            "each", "every", "many", "most", "some", "one", "two", "three", "unlike", "like", "although", "while",
            "unqualified", "originally", "today", "currently", "later", "however"}
_PRONOUNS = {"it", "its", "he", "she", "they", "his", "her", "their", "this", "these", "those", "that", "there", "such"}
_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_NUMBER = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(?![\w]|[.,]\d)")
_DAY = re.compile(rf"(?:\b(?:{_MONTHS})\s+\d{{1,2}}\b|\b\d{{1,2}}\s+(?:{_MONTHS})\b)")
_AUX = re.compile(r"\b(is|are|was|were|has been|have been|had been|can|will)\b(?! not\b)")
_STOP = set("the a an and or but of to in on at for with by from as is are was were be been being it its this that these "
            "those he she they his her their which who also has have had".split())


def sentences(text: str) -> list[str]:
    """Split where a sentence mark is followed by a capital, not after initials ("U.S.", "B.")."""
    text = re.sub(r"(?<=[a-z0-9]{2}[.!?])(?=[A-Z])", " ", text.strip())  # "interest.In" lost its space
    return [s.strip() for s in re.split(r"(?<![.\s][A-Z]\.)(?<=[.!?])\s+(?=[A-Z0-9\"“])", text) if s.strip()]


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP and (len(w) > 2 or w.isdigit())}


def repeats(sentence: str, fact: str) -> bool:
    """Whether a text repeats a fact: half the fact's content words, or one of its numbers."""
    fact_words, words = content_words(fact), content_words(sentence)
    numbers = set(_NUMBER.findall(fact))
    return bool(numbers & set(_NUMBER.findall(sentence))) or len(fact_words & words) >= 0.5 * len(fact_words)


def _number(fact: str) -> re.Match | None:
    """The number to change: a year first, never the day of a date."""
    days = [m.span() for m in _DAY.finditer(fact)]
    numbers = [m for m in _NUMBER.finditer(fact) if not any(a <= m.start() < b for a, b in days)]
    years = [m for m in numbers if "," not in m.group(1) and 1000 <= int(m.group(1)) <= 2099]
    return (years or numbers or [None])[0]


def fact_sentences(reference: str) -> list[str]:
    """Self-contained declarative reference sentences of 8-30 words that can be contradicted
    (a number to change or a verb to negate); the title prefix and parentheses are dropped."""
    text = re.sub(r"\s*\([^()]*\)", "", re.sub(r"^[^:.]{1,80}:\s+", "", reference.strip()))
    keep = []
    for s in sentences(text):
        words = s.split()
        if not (MIN_WORDS <= len(words) <= MAX_WORDS and s.endswith(".")) or words[0].lower() in _PRONOUNS:
            continue
        if re.search(r"[\[\]\"“”;:/]", s) or not (_number(s) or _AUX.search(s)):
            continue
        keep.append(s)
    return keep


def contradiction(fact: str, rng: random.Random) -> tuple[str, list[str]]:
    """The fact made false: its number changed (a year moved by 7-23, a count multiplied) or,
    without a number, its first verb negated. Returns the sentence and [old, new]."""
    match = _number(fact)
    if match is None:
        verb = _AUX.search(fact)
        negated = "cannot" if verb.group(1) == "can" else verb.group(1).replace(" been", "") + " not" + (" been" if "been" in verb.group(1) else "")
        return fact[: verb.start()] + negated + fact[verb.end():], [verb.group(1), negated]
    old = match.group(1)
    value = int(old.replace(",", ""))
    if 1000 <= value <= 2099 and "," not in old:  # a year
        new_value = value + rng.choice([-1, 1]) * rng.randint(7, 23)
    elif value < 10:
        new_value = value + rng.randint(2, 6)
    else:
        new_value = value * rng.choice([2, 3]) + rng.randint(1, 9) * 10 ** max(0, len(str(value)) - 2)
    new = f"{new_value:,}" if "," in old else str(new_value)
    return fact[: match.start(1)] + new + fact[match.end(1):], [old, new]


def lower_first(sentence: str, lowercase_words: set[str]) -> str:
    """Lower-case the opening word inside a template when it is a common word: one the dialogue's
    references also write in lower case ("Football" but not "Presley" or "NFL")."""
    first = sentence.split()[0].strip(",;:")
    common = first.lower() in _OPENERS or first.lower() in lowercase_words
    acronym = len(first) > 1 and first.isupper()
    return sentence[0].lower() + sentence[1:] if common and not acronym else sentence


def render(template: str, fact: str, lowercase_words: set[str]) -> str:
    lc = lower_first(fact, lowercase_words)
    return template.format(fact=fact, fact_lc=lc, fact_lc_nodot=lc.rstrip("."))


def _pick(dialogue: Dialogue, rng: random.Random, used: Counter):
    """(fact turn, probe turn, fact, other fact) or None when the dialogue cannot carry a probe.
    Facts used least so far come first, so that the many dialogues on one topic vary."""
    scored = [i for i in dialogue.scored_indices() if dialogue.turns[i].reference]
    if len(scored) < 2:
        return None
    probe = scored[-1]
    for fact_turn in scored[:-1]:
        facts = fact_sentences(dialogue.turns[fact_turn].reference)
        rng.shuffle(facts)
        facts.sort(key=lambda f: used[f])
        for fact in facts:
            pool = {s for i in scored for s in fact_sentences(dialogue.turns[i].reference)}
            others = sorted(s for s in pool if not repeats(s, fact) and not repeats(fact, s)
                            and not any(repeats(t.text, s) for t in dialogue.turns[: probe + 1]))
            if others:
                other = min(rng.sample(others, len(others)), key=lambda f: used[f])
                used.update([fact, other])
                return fact_turn, probe, fact, other
    return None


def probe_dialogues(dialogues: list[Dialogue], seed: int = 0) -> tuple[list[Dialogue], Counter]:
    """The four versions of each dialogue that can carry a probe, and why the others cannot."""
    rng = random.Random(seed)
    probes, skipped, used = [], Counter(), Counter()
    for d in dialogues:
        picked = _pick(d, rng, used)
        if picked is None:
            skipped["fewer than two scored turns, or no reference sentence that can be stated and contradicted"] += 1
            continue
        fact_turn, probe, fact, other = picked
        probe_turn = d.turns[probe]
        kept = [s for s in sentences(probe_turn.reference) if not repeats(s, fact) and not repeats(s, other)]
        removed = len(sentences(probe_turn.reference)) - len(kept)
        if not kept:
            skipped["the probe turn's reference is only the facts"] += 1
            continue
        turns = [t.model_copy(update={"score": False}) if t.role == "assistant" and i not in (fact_turn, probe) else t
                 for i, t in enumerate(d.turns[: probe + 1])]
        stated = d.turns[fact_turn]
        said = stated.text.rstrip()
        said += "" if not said or said[-1] in ".!?" else "."
        turns[fact_turn] = stated.model_copy(update={"text": f"{said} {fact}".strip(), "gold": None})
        lowercase_words = {w for t in d.turns if t.reference for w in re.findall(r"\b[a-z]+\b", t.reference)}
        for kind, (label, hallucinated) in TYPES.items():
            meta = {"probe": kind, "fact_turn": fact_turn, "fact": fact, "reference_sentences_removed": removed}
            if kind == "contradict":
                claim, meta["changed"] = contradiction(fact, rng)
            elif kind == "unsupported":
                claim = meta["unsupported_fact"] = other
            else:
                claim = fact
            meta["template"] = template = rng.choice(TEMPLATES[kind])
            text = render(template, claim, lowercase_words)
            turns_k = list(turns)
            turns_k[probe] = Turn(role="assistant", text=text, reference=" ".join(kept),
                                  gold=Gold(label="hallucinated" if hallucinated else "faithful", original=kind,
                                            claims=[GoldClaim(text=claim, label=label)]),
                                  meta={**(probe_turn.meta or {}), **meta, "original_text": probe_turn.text})
            probes.append(Dialogue(id=f"{d.id}#{kind}", source=f"cross_turn/{d.source}", system=d.system,
                                   knowledge_init=d.knowledge_init, turns=turns_k, meta=d.meta))
    return probes, skipped


def cross_turn_report(scored: list[ScoredDialogue]) -> dict:
    """Per probe type: probe turns scored, the share flagged hallucinated (detection for
    contradict/unsupported, false alarms for restate/abstain), and the labels the scorer gave."""
    rows: dict[str, dict] = defaultdict(lambda: {"n": 0, "flagged": 0, "labels": Counter(), "no_claim": 0})
    for s in scored:
        kind = s.id.rpartition("#")[2]
        probe = len(s.dialogue.turns) - 1  # the probe turn ends its dialogue
        turn = next((t for t in s.turns if t.index == probe), None)
        if kind not in TYPES or turn is None:
            continue
        row = rows[kind]
        row["n"] += 1
        row["flagged"] += bool(turn.hallucinated)
        row["labels"].update(c.label.value for c in turn.claims)
        row["no_claim"] += not turn.claims
    report = {}
    for kind, (label, hallucinated) in TYPES.items():
        if kind not in rows:
            continue
        r = rows[kind]
        share = round(r["flagged"] / r["n"], 4)
        report[kind] = {"n": r["n"], "expected": label, "flagged_share": share,
                        "correct_decision_share": share if hallucinated else round(1 - share, 4),
                        "claim_labels": dict(r["labels"]), "no_claim_turns": r["no_claim"]}
    return report
