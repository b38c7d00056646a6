"""DialFact (Gupta et al., 2022) JSONL: a response with its full history and Wikipedia evidence.

SUPPORTS -> faithful; REFUTES and NOT ENOUGH INFO -> hallucinated (nothing given supports it).
The history alternates speakers and ends with the user's message before the response.
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from fastvista.records_io import RecordError, read_lines, validation_error
from fastvista.schema import Dialogue, Turn

from .common import binary_gold

GOLD = {"SUPPORTS": False, "REFUTES": True, "NOT ENOUGH INFO": True}


def load(path):
    for n, text in read_lines(path):
        try:
            yield _record(path, n, text)
        except RecordError as e:
            yield e


def _record(path, n, text) -> Dialogue:
    if isinstance(text, RecordError):
        raise text
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError(path, n, None, f"invalid JSON: {e.msg}") from None
    for field in ("id", "context", "response", "response_label", "evidence_list"):
        if field not in row:
            raise RecordError(path, n, field, "missing")
    label = row["response_label"]
    if label not in GOLD:
        raise RecordError(path, n, "response_label", f"unknown label {label!r}")
    context = row["context"]
    if not isinstance(context, list):
        raise RecordError(path, n, "context", "expected a list of utterances")
    roles = ["user" if (len(context) - i) % 2 else "assistant" for i in range(len(context))]
    try:
        evidence = "\n".join(e[2] for e in row["evidence_list"])
    except (TypeError, IndexError):
        raise RecordError(path, n, "evidence_list", "expected [title, url, sentence, ...] items") from None
    try:
        return Dialogue(
            id=f"dialfact-{row['id']}",
            source="dialfact",
            meta={"type_label": row.get("type_label"), "data_type": row.get("data_type")},
            turns=[Turn(role=r, text=t, score=False if r == "assistant" else None) for r, t in zip(roles, context)]
            + [
                Turn(
                    role="assistant",
                    text=row["response"],
                    reference=evidence or None,
                    gold=binary_gold(GOLD[label], label),
                )
            ],
        )
    except ValidationError as e:
        raise validation_error(path, n, e) from None
