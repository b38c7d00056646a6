"""Q2's annotated Wizard-of-Wikipedia responses (Honovich et al., 2021).

`{dodeca,memnet}_{consistent,inconsistent}.csv`: the file name gives system and label
(consistent -> faithful, inconsistent -> hallucinated). `cross_annotation.csv` holds both systems'
responses per row (label 1 = inconsistent) and yields two records a row. A folder loads the four
single-system files.
"""

from __future__ import annotations

from pathlib import Path

from fastvista.records_io import RecordError
from fastvista.schema import Dialogue, Turn

from .common import binary_gold, csv_records, require

SYSTEMS = ("dodeca", "memnet")
FILES = [f"{s}_{c}.csv" for s in SYSTEMS for c in ("consistent", "inconsistent")]


def load(path):
    path = Path(path)
    if path.is_dir():
        for name in FILES:
            yield from _load_file(path / name)
    else:
        yield from _load_file(path)


def _record(path, line, row, system, response_field, hallucinated, original) -> Dialogue:
    index = row.get("") or str(line)
    return Dialogue(
        id=f"q2-{path.stem}-{system}-{index}",
        source="q2/wow",
        system=system,
        meta={"topic": row.get("topic"), "episode_idx": row.get("episode_idx")},
        turns=[
            Turn(role="user", text=row.get("message") or ""),
            Turn(
                role="assistant",
                text=require(path, line, row, response_field),
                reference=require(path, line, row, "knowledge"),
                gold=binary_gold(hallucinated, original),
            ),
        ],
    )


def _cross_records(path: Path, line: int, row: dict):
    """Both systems' records of a cross_annotation row."""
    for system in SYSTEMS:
        value = require(path, line, row, f"{system}_label")
        if value not in ("0", "1"):
            raise RecordError(path, line, f"{system}_label", f"expected 0 or 1, got {value!r}")
        yield _record(path, line, row, system, f"{system}_response", value == "1", value)


def _load_file(path: Path):
    if not path.exists():
        yield RecordError(path, None, None, "no such file")
        return
    if path.stem == "cross_annotation":
        yield from csv_records(path, lambda line, row: _cross_records(path, line, row))
        return
    system, _, consistency = path.stem.partition("_")
    if system not in SYSTEMS or consistency not in ("consistent", "inconsistent"):
        yield RecordError(path, None, None, f"file name must be one of {FILES} or cross_annotation.csv")
        return
    hallucinated = consistency == "inconsistent"
    yield from csv_records(path, lambda line, row: [_record(path, line, row, system, "response", hallucinated, consistency)])
