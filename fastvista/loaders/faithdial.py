"""FaithDial's audit CSVs (Dziri et al., 2022): gold/ responses and CTRL, DoHA, GPT2 outputs.

Labels contain a hallucination -> hallucinated; Entailment, Generic, Uncooperative -> faithful.
Rows without a label (most of gold/topical.csv) keep `gold.label` null. The folder is the system.
"""

from __future__ import annotations

from pathlib import Path

from fastvista.records_io import RecordError
from fastvista.schema import Dialogue, Turn

from .common import binary_gold, csv_records, require

FAITHFUL_WORDS = {"entailment", "entailmentt", "generic", "uncooperative"}


def gold_of(label: str) -> bool | None:
    """True if hallucinated, None if unlabelled; ValueError on a word never seen in the audit."""
    words = {w.strip() for w in label.lower().replace(".", ",").split(",") if w.strip()}
    if not words:
        return None
    if any(w.startswith("hallucinat") or w == "partial hallucination" for w in words):
        return True
    if words <= FAITHFUL_WORDS:
        return False
    raise ValueError(f"unknown label {label!r}")


def load(path):
    path = Path(path)
    yield from csv_records(path, lambda line, row: [_record(path, line, row)])


def _record(path: Path, line: int, row: dict) -> Dialogue:
    system = path.parent.name.lower()
    domain = path.stem.split("_")[-1].replace("topicalchat", "topical")
    knowledge_field = "evidence" if "evidence" in row else "knowledge"
    response_field = "response" if "response" in row else system
    label_field = "BEGIN" if "BEGIN" in row else "begin_label"
    label = row.get(label_field)
    if label is None:
        raise RecordError(path, line, label_field, "missing column")
    try:
        hallucinated = gold_of(label)
    except ValueError as e:
        raise RecordError(path, line, label_field, str(e)) from None
    return Dialogue(
        id=f"faithdial-{system}-{domain}-{line:05d}",
        source=f"faithdial/{domain}",
        system=system,
        turns=[
            Turn(role="user", text=row.get("history") or ""),
            Turn(
                role="assistant",
                text=require(path, line, row, response_field),
                reference=require(path, line, row, knowledge_field),
                gold=binary_gold(hallucinated, label),
            ),
        ],
    )
