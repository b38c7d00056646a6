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

from fastvista.evaluation.baselines.judge import JudgeConfig
from fastvista.evaluation.scorers import CLAIMLESS
from fastvista.schema import Dialogue, Gold, GoldClaim, ScoredDialogue, Turn, TurnResult

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
            "unqualified", "originally", "today", "currently", "later", "however", "there", "two", "both", "all", "any"}
# A fact must not lean on its context: no pronoun subject anywhere, no "The film ..." standing for a name.
_CONTEXTUAL = re.compile(r"\b(?:it|they|he|she|this|these|those|such)\b|^(?:The|This|These|Its|Their|His|Her) (?:film|company|"
                         r"game|series|band|show|album|song|book|team|league|franchise|network|station|tech giant|group|"
                         r"character|novel|organization|site|service|subsidiary|studio|award|ceremony|event|concept|term|"
                         r"genre|player|club|program|programme|channel|brand|product|device|singer|actor|artist)\b", re.I)
# Words after which a changed number or a negation may not contradict (bounds, scopes, quantities).
_UNSAFE = re.compile(r"\b(?:no|not|never|only|none|nor|some|many|several|most|few|various|often|sometimes|usually|"
                     r"more than|over|at least|nearly|almost|about|around|approximately|up to|under|less than|as of|by|between|and|from|to|"
                     r"since|until|before|after|circa|c\.)\s*\$?$", re.I)
_NEGATORS = re.compile(r"\b(?:no|not|never|only|none|nor|neither|without)\b|^(?:Some|Many|Several|Most|Few|Various)\b", re.I)
_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_NUMBER = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(?:s\b)?(?![\w]|[.,]\d)")  # "1930s" counts as 1930
_DAY = re.compile(rf"(?:\b(?:{_MONTHS})\s+\d{{1,2}}\b|\b\d{{1,2}}\s+(?:{_MONTHS})\b)")
_AUX = re.compile(r"\b(is|are|was|were|has been|have been|had been|can|will)\b(?! not\b)")
_RELATIVE = re.compile(r"\b(?:that|which|who|whom|whose|where|when|while|because|although|if)\b", re.I)
_ABBREVIATIONS = re.compile(r"\b(?:Mr|Mrs|Ms|Dr|St|No|Jr|Sr|Inc|Ltd|Co|vs|c|ca|approx|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|"
                            r"Oct|Nov|Dec|[A-Z])\.$")
_STOP = set("the a an and or but of to in on at for with by from as is are was were be been being it its this that these "
            "those he she they his her their which who also has have had".split())


def plain(text: str) -> str:
    """A reference without its title prefix and parentheses, spaces made single."""
    text = re.sub(r"\s*\([^()]*\)", "", re.sub(r"^[^:.]{1,80}:\s+", "", text.strip()))
    return " ".join(text.split())


def sentences(text: str) -> list[str]:
    """Split where a sentence mark is followed by a capital or a digit, not after an abbreviation
    or an initial ("U.S.", "Dr.", "B.")."""
    text = re.sub(r"(?<=[a-z0-9]{2}[.!?])(?=[A-Z])", " ", text.strip())  # "interest.In" lost its space
    parts, start = [], 0
    for m in re.finditer(r"(?<=[.!?])\s+(?=[A-Z0-9\"“])", text):
        if not _ABBREVIATIONS.search(text[start: m.start()]):
            parts.append(text[start: m.start()])
            start = m.end()
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP and (len(w) > 2 or w.isdigit())}


def repeats(sentence: str, fact: str) -> bool:
    """Whether a text repeats a fact: half the fact's content words, or one of its numbers."""
    fact_words, words = content_words(fact), content_words(sentence)
    numbers = set(_NUMBER.findall(fact))
    return bool(numbers & set(_NUMBER.findall(sentence))) or len(fact_words & words) >= 0.5 * len(fact_words)


def _number(fact: str) -> re.Match | None:
    """The number to change: a year first; never the day of a date, a decade, or a number after a
    bound or a scope ("over 5 billion", "as of 2010"), whose change may still hold."""
    days = [m.span() for m in _DAY.finditer(fact)]
    numbers = [m for m in _NUMBER.finditer(fact) if not any(a <= m.start() < b for a, b in days)
               and not m.group(0).endswith("s") and not _UNSAFE.search(fact[: m.start()])]
    years = [m for m in numbers if "," not in m.group(1) and 1000 <= int(m.group(1)) <= 2099]
    return (years or numbers or [None])[0]


def _verb(fact: str) -> re.Match | None:
    """The main verb to negate: an auxiliary before any relative clause."""
    clause = _RELATIVE.search(fact)
    verb = _AUX.search(fact[: clause.start()] if clause else fact)
    return verb


def fact_sentences(reference: str) -> list[str]:
    """Self-contained declarative reference sentences of 8-30 words that can be contradicted (a
    number to change, or a main verb to negate in a sentence with no negation or quantifier)."""
    keep = []
    for s in sentences(plain(reference)):
        if not (MIN_WORDS <= len(s.split()) <= MAX_WORDS and s.endswith(".")) or _CONTEXTUAL.search(s):
            continue
        if re.search(r"[\[\]\"“”;:/]", s) or _NEGATORS.search(s) or not (_number(s) or _verb(s)):
            continue
        keep.append(s)
    return keep


def contradiction(fact: str, rng: random.Random) -> tuple[str, list[str]]:
    """The fact made false: its number changed (a year moved by 7-23, a count multiplied) or,
    without one, its main verb negated. Returns the sentence and [old, new]."""
    match = _number(fact)
    if match is None:
        verb = _verb(fact)
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
    words = sentence.split()
    first = words[0].strip(",;:")
    if first.lower() in _OPENERS:
        return sentence[0].lower() + sentence[1:]
    named = len(first) > 1 and first.isupper() or len(words) > 1 and words[1][:1].isupper()  # "NFL", "Black Panther"
    return sentence[0].lower() + sentence[1:] if first.lower() in lowercase_words and not named else sentence


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
            if repeats(dialogue.turns[fact_turn].text, fact):
                continue  # the turn said it already: appending it would say it twice
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
        kept = [s for s in sentences(plain(probe_turn.reference)) if not repeats(s, fact) and not repeats(s, other)]
        removed = len(sentences(plain(probe_turn.reference))) - len(kept)
        title = (re.match(r"^[^:.]{1,80}:\s+", probe_turn.reference.strip()) or [""])[0]  # "Black Panther (film): "
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
            turns_k[probe] = Turn(role="assistant", text=text, reference=title + " ".join(kept),
                                  gold=Gold(label="hallucinated" if hallucinated else "faithful", original=kind,
                                            claims=[GoldClaim(text=claim, label=label)]),
                                  meta={**(probe_turn.meta or {}), **meta, "original_text": probe_turn.text})
            probes.append(Dialogue(id=f"{d.id}#{kind}", source=f"cross_turn/{d.source}", system=d.system,
                                   knowledge_init=d.knowledge_init, turns=turns_k, meta=d.meta))
    return probes, skipped


def probe_turn(dialogue: Dialogue) -> tuple[int, str] | None:
    """The probe turn's index and version, read from its meta (not from its position: a scorer
    may have cut the dialogue)."""
    return next(((i, t.meta["probe"]) for i, t in enumerate(dialogue.turns) if t.meta and t.meta.get("probe") in TYPES), None)


def shares(turns: list[TurnResult], kind: str, claimless: bool) -> dict:
    """Probe turns of one version: how many, the share flagged hallucinated (detection for
    contradict/unsupported, false alarms for restate/abstain), of correct decisions, and of turns
    with a claim of the expected label (None for a scorer that gives no claims at all, as the judge
    and Q2, which decide turns only)."""
    label, hallucinated = TYPES[kind]
    n = len(turns)
    if not n:
        return {"n": 0, "flagged_share": None, "correct_decision_share": None, "expected_label_share": None}
    share = round(sum(bool(t.hallucinated) for t in turns) / n, 4)
    expected = None if claimless else round(sum(any(c.label.value == label for c in t.claims) for t in turns) / n, 4)
    return {"n": n, "flagged_share": share, "correct_decision_share": share if hallucinated else round(1 - share, 4),
            "expected_label_share": expected}


def seen_history(scored: list[ScoredDialogue]) -> tuple[int, bool]:
    """The history turns the scorer saw (its settings in the results' provenance; the judge's
    default where none is recorded) and whether it decides turns without claims (Q2, the judge):
    a fact turn further back than the window is out of the scorer's sight, so the report splits
    each version by that gap."""
    provenance = next((s.provenance for s in scored if s.provenance), {}) or {}
    settings = provenance.get("settings") or provenance.get("teacher") or {}
    return settings.get("history_turns", JudgeConfig().history_turns), provenance.get("scorer") in CLAIMLESS


def cross_turn_report(scored: list[ScoredDialogue], failed: list[dict] | None = None) -> dict:
    """Per probe version: the figures of `shares`, also by the gap between fact turn and probe
    turn (within the judge's history window or beyond it), the labels the scorer gave, and the probe
    dialogues left without a probe-turn result (not scored, or failed: `failed.jsonl`)."""
    turns: dict[str, list[tuple[int, TurnResult]]] = defaultdict(list)  # version: (gap, probe turn result)
    unscored: Counter = Counter()
    for s in scored:
        found = probe_turn(s.dialogue)
        if found is None:
            continue
        index, kind = found
        turn = next((t for t in s.turns if t.index == index), None)
        if turn is None:
            unscored[kind] += 1
        else:
            turns[kind].append((index - s.dialogue.turns[index].meta["fact_turn"], turn))
    for f in failed or []:
        kind = str(f.get("id", "")).rpartition("#")[2]
        if kind in TYPES:
            unscored[kind] += 1
    window, claimless = seen_history(scored)
    gaps = (f"gap <= {window}", f"gap > {window}")
    report = {}
    for kind, (label, _) in TYPES.items():
        if kind not in turns and kind not in unscored:
            continue
        rows = turns[kind]
        report[kind] = {**shares([t for _, t in rows], kind, claimless), "expected": label,
                        "by_gap": {gaps[0]: shares([t for g, t in rows if g <= window], kind, claimless),
                                   gaps[1]: shares([t for g, t in rows if g > window], kind, claimless)},
                        "claim_labels": dict(Counter(c.label.value for _, t in rows for c in t.claims)),
                        "no_claim_turns": sum(not t.claims for _, t in rows), "without_result": unscored[kind]}
    return report


def cross_turn_table(reports: dict[str, dict]) -> str:
    """Scorers side by side: per probe version, the share of correct turn decisions (detections
    for contradict and unsupported, no false alarm for restate and abstain) and of probe turns
    with a claim of the expected label ("-": the scorer gives no claims); under each scorer, the
    same by the gap between fact turn and probe turn."""
    header = "| scorer | " + " | ".join(f"{k}: correct decision / expected label" for k in TYPES) + " | without result |"
    lines = [header, "|---|" + "---|" * len(TYPES) + "---|"]

    def cell(row: dict | None) -> str:
        if not row or row["n"] == 0:
            return "-"
        expected = "-" if row["expected_label_share"] is None else f"{row['expected_label_share']:.2f}"
        return f"{row['correct_decision_share']:.2f} / {expected} (n={row['n']})"

    for name, report in reports.items():
        missing = sum(r["without_result"] for r in report.values())
        lines.append(f"| {name} | " + " | ".join(cell(report.get(k)) for k in TYPES) + f" | {missing} |")
        for gap in next(iter(report.values()))["by_gap"] if report else ():
            cells = (cell(report[k]["by_gap"][gap] if k in report else None) for k in TYPES)
            lines.append(f"| {name}, {gap} | " + " | ".join(cells) + " | - |")
    return "\n".join(lines)
