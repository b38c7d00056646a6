"""Helpers shared by the loaders: CSV rows with line numbers, required fields, binary gold."""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Iterator

from fastvista.records_io import RecordError
from fastvista.schema import Gold

csv.field_size_limit(sys.maxsize)


def csv_rows(path: str | os.PathLike, delimiter: str = ",") -> Iterator[tuple[int, dict]]:
    """(line number, row) of a CSV/TSV file; the line is where the row starts."""
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter=delimiter, quoting=quoting)
            start = 2
            for row in reader:
                yield start, {(k or "").strip(): v for k, v in row.items()}
                start = reader.line_num + 1
    except UnicodeDecodeError as e:
        raise RecordError(path, None, None, f"not UTF-8 ({e.reason} at byte {e.start})") from None


def require(path, line, row: dict, field: str) -> str:
    """The non-empty value of `field`, or a RecordError naming it."""
    value = row.get(field)
    if value is None:
        raise RecordError(path, line, field, f"missing column (have {sorted(row)})")
    if not value.strip():
        raise RecordError(path, line, field, "empty")
    return value.strip()


def binary_gold(hallucinated: bool | None, original: str) -> Gold:
    label = None if hallucinated is None else ("hallucinated" if hallucinated else "faithful")
    return Gold(label=label, original=original)
