"""DialFact (Gupta et al., 2022) JSONL: a response with its full history and Wikipedia evidence.

SUPPORTS -> faithful; REFUTES and NOT ENOUGH INFO -> hallucinated (nothing given supports it).
The history alternates speakers and ends with the user's message before the response.
"""

from __future__ import annotations

import json

from fastvista.records_io import RecordError, read_lines
from fastvista.schema import Dialogue, Turn

from .common import binary_gold, expect, guarded

GOLD = {"SUPPORTS": False, "REFUTES": True, "NOT ENOUGH INFO": True}


def load(path):
    for n, text in read_lines(path):
        yield from guarded(path, n, None, lambda: [_record(path, n, text)])


def _record(path, n, text) -> Dialogue:
    if isinstance(text, RecordError):
        raise text
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError(path, n, None, f"invalid JSON: {e.msg}") from None
    expect(path, n, None, row, dict, "a JSON object")
    label = row["response_label"]
    if not isinstance(label, str) or label not in GOLD:
        raise RecordError(path, n, "response_label", f"unknown label {label!r}")
    context = row["context"]
    if not isinstance(context, list) or not all(isinstance(u, str) for u in context):
        raise RecordError(path, n, "context", "expected a list of utterances")
    roles = ["user" if (len(context) - i) % 2 else "assistant" for i in range(len(context))]
    evidence = row["evidence_list"]
    if not isinstance(evidence, list) or not all(isinstance(e, list) and len(e) > 2 and isinstance(e[2], str) for e in evidence):
        raise RecordError(path, n, "evidence_list", "expected [title, url, sentence, ...] items")
    return Dialogue(
        id=f"dialfact-{row['id']}",
        source="dialfact",
        meta={"type_label": row.get("type_label"), "data_type": row.get("data_type")},
        turns=[Turn(role=r, text=t, score=False if r == "assistant" else None) for r, t in zip(roles, context)]
        + [
            Turn(
                role="assistant",
                text=expect(path, n, "response", row["response"], str, "a string"),
                reference="\n".join(e[2] for e in evidence) or None,
                gold=binary_gold(GOLD[label], label),
            )
        ],
    )
