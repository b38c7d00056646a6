"""BEGIN (Dziri et al., 2022) dev TSVs: one response with its knowledge and previous message.

Fully attributable -> faithful; Not fully attributable -> hallucinated; Generic -> faithful
(a generic response states nothing to attribute). `model_name` is the system.
"""

from __future__ import annotations

from pathlib import Path

from fastvista.records_io import RecordError
from fastvista.schema import Dialogue, Turn

from .common import binary_gold, csv_records, require

GOLD = {"fully attributable": False, "not fully attributable": True, "generic": False}


def load(path):
    yield from csv_records(path, lambda line, row: [_record(path, line, row)], delimiter="\t")


def _record(path, line: int, row: dict) -> Dialogue:
    label = require(path, line, row, "begin_label")
    if label.lower() not in GOLD:
        raise RecordError(path, line, "begin_label", f"unknown label {label!r}")
    source = require(path, line, row, "data_source")
    return Dialogue(
        id=f"begin-{source}-{Path(path).stem}-{line:05d}",
        source=f"begin/{source}",
        system=require(path, line, row, "model_name"),
        turns=[
            Turn(role="user", text=row.get("message") or ""),
            Turn(
                role="assistant",
                text=require(path, line, row, "response"),
                reference=require(path, line, row, "knowledge"),
                gold=binary_gold(GOLD[label.lower()], label),
            ),
        ],
    )
