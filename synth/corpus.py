"""The student's corpus inputs: Topical-Chat dialogues that no evaluation set uses, split by
dialogue into train / validation / test.

Evaluation sets reuse Topical-Chat conversations (BEGIN's and FaithDial's Topical-Chat parts
continue them), so a dialogue is left out when any of its turns appears, whitespace and case
aside, in any turn of an evaluation set, or when it is one of the demo's dialogues. The split is
a hash of the dialogue id, so it never changes when dialogues are added; the labelling order is
a seeded shuffle, so any prefix of the file is a fair sample to label first.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from fastvista.loaders import load
from fastvista.records_io import RecordError
from fastvista.schema import Dialogue, ScoredDialogue
from fastvista.selection import truncate_scored

SPLITS = ("train", "validation", "test")
MIN_TEXT = 25  # shorter turns ("lol", "Yes, I agree.") recur across unrelated dialogues


def split_of(dialogue_id: str, test_share: float = 0.12, validation_share: float = 0.08) -> str:
    x = int(hashlib.sha256(dialogue_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if x < test_share else "validation" if x < test_share + validation_share else "train"


def _key(text: str) -> str | None:
    key = " ".join(text.lower().split())
    return key if len(key) >= MIN_TEXT else None


def turn_keys(dialogues: Iterable[Dialogue]) -> set[str]:
    return {k for d in dialogues for t in d.turns if (k := _key(t.text))}


def build(
    topical_chat_files: list[Path], evaluation_sets: list[tuple[str, Path]], exclude_ids: set[str],
    max_scored_turns: int, seed: int = 0,
) -> tuple[list[Dialogue], dict]:
    """The corpus dialogues (shuffled, each with `meta.split`) and a report of what was left out."""
    skipped: list[RecordError] = []
    evaluation = set()
    for source, path in evaluation_sets:
        evaluation |= turn_keys(load(source, path, skipped))
    kept, dropped = [], Counter()
    for path in topical_chat_files:
        for d in load("topical_chat", path, skipped):
            if d.id in exclude_ids:
                dropped["demo dialogue"] += 1
            elif any(k in evaluation for t in d.turns if (k := _key(t.text))):
                dropped["shares a turn with an evaluation set"] += 1
            elif not d.scored_indices():
                dropped["no turn with a resolvable reference"] += 1
            else:
                d = truncate_scored(d, max_scored_turns)
                kept.append(d.model_copy(update={"meta": {**(d.meta or {}), "split": split_of(d.id)}}))
    random.Random(seed).shuffle(kept)
    report = {
        "dialogues": len(kept),
        "dropped": dict(dropped),
        "unreadable_records": len(skipped),
        "by_split": {s: {"dialogues": sum(d.meta["split"] == s for d in kept),
                         "scored_turns": sum(len(d.scored_indices()) for d in kept if d.meta["split"] == s)} for s in SPLITS},
        "evaluation_turn_texts": len(evaluation),
        "max_scored_turns": max_scored_turns,
        "seed": seed,
    }
    return kept, report


_ENDS_A_SENTENCE = re.compile(r"[.!?)\"'\u201d]$")


def corpus_report(scored: list[ScoredDialogue]) -> dict:
    """What the labelled corpus holds, per split, and the checks it must pass before training:
    turns the teacher could not label cleanly (errors: retried or cut decompositions) are left
    out of training and counted; a claim that does not end like a sentence is listed (a cut
    answer would end mid-sentence; none should, since cut answers are errors)."""
    by_split: dict[str, dict] = {}
    unfinished = []
    for s in scored:
        split = (s.dialogue.meta or {}).get("split", "unsplit")
        row = by_split.setdefault(split, {"dialogues": 0, "scored_turns": 0, "turns_with_errors": 0, "claims": 0,
                                          "labels": Counter(), "hallucinated_turns": 0, "no_claim_turns": 0})
        row["dialogues"] += 1
        for t in s.turns:
            row["scored_turns"] += 1
            row["turns_with_errors"] += bool(t.errors)
            row["claims"] += len(t.claims)
            row["labels"].update(c.label.value for c in t.claims)
            row["hallucinated_turns"] += t.hallucinated
            row["no_claim_turns"] += t.no_claims
            unfinished += [f"{s.id}#{t.index}: {c.text}" for c in t.claims if not _ENDS_A_SENTENCE.search(c.text.strip())]
    for row in by_split.values():
        row["labels"] = dict(row["labels"])
        row["claims_per_turn"] = round(row["claims"] / row["scored_turns"], 3) if row["scored_turns"] else None
        row["usable_turns"] = row["scored_turns"] - row["turns_with_errors"]
    return {"by_split": by_split, "claims_not_ending_a_sentence": len(unfinished), "examples_not_ending_a_sentence": unfinished[:20]}
