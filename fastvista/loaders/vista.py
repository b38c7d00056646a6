"""VISTA's human re-annotation (JSON): conversations of {role, utterance, retrieved_document}.

Scored assistant turns carry `human_claims` ({claim_text, human_judgement}) and `gold_label`;
other assistant turns are context. `retrieved_document` "N/A" means no reference. Judgements map
verifiable -> VERIFIED, out of scope -> OUT_OF_SCOPE, lacking evidence -> LACKING_EVIDENCE,
abstention -> ABSTENTION, contradicted -> CONTRADICTED. The origin data set is the system.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from fastvista.labels import parse_label
from fastvista.records_io import RecordError, validation_error
from fastvista.schema import Dialogue, Gold, GoldClaim, Turn

from .common import expect, guarded


def load(path):
    try:
        conversations = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        yield RecordError(path, None, None, f"cannot read as JSON: {e}")
        return
    if not isinstance(conversations, list):
        yield RecordError(path, None, None, "expected a list of conversations")
        return
    for c, conversation in enumerate(conversations):
        yield from guarded(path, None, f"[{c}]", lambda: [_dialogue(path, c, conversation)])


def _turn(path, where: str, t) -> Turn:
    expect(path, None, where, t, dict, "a turn object")
    for field in ("role", "utterance"):
        if field not in t:
            raise RecordError(path, None, f"{where}.{field}", "missing")
    reference = t.get("retrieved_document")
    if reference in (None, "", "N/A"):
        reference = None
    gold = None
    if "human_claims" in t:
        claims = []
        for k, claim in enumerate(expect(path, None, f"{where}.human_claims", t["human_claims"], list, "a list of claims")):
            try:
                claims.append(GoldClaim(text=claim["claim_text"], label=parse_label(claim["human_judgement"])))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise RecordError(path, None, f"{where}.human_claims[{k}]", f"{type(e).__name__}: {e}") from None
        gold = Gold(label=t.get("gold_label"), original=t.get("original_dataset_label"), claims=claims)
    try:
        return Turn(
            role=t["role"],
            text=t["utterance"],
            reference=reference,
            score=None if gold else (False if t["role"] == "assistant" else None),
            gold=gold,
        )
    except ValidationError as e:
        raise validation_error(path, None, e, prefix=where) from None


def _dialogue(path, c: int, conversation) -> Dialogue:
    expect(path, None, f"[{c}]", conversation, list, "a list of turns")
    turns = [_turn(path, f"[{c}][{i}]", t) for i, t in enumerate(conversation)]
    scored = [t for t in conversation if "human_claims" in t]
    first = scored[0] if scored else {}
    return Dialogue(
        id=f"vista-{first.get('dataset', 'unknown')}-{first.get('conversation_id', c)}",
        source="vista/" + str(first.get("dataset", "unknown")).lower(),
        system=first.get("dataset"),
        turns=turns,
    )
