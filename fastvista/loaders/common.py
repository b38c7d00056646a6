"""Helpers shared by the loaders: one rule for malformed records, CSV rows with line numbers,
required fields, binary gold.

Where a record is: a line number for line-based files (JSONL, CSV, TSV); for a JSON file that
holds one list or one object keyed by id, `line` is None and the field starts with the record's
place, `[i]` (the i-th item of the list) or the id (its key in the object).
"""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Callable, Iterable, Iterator

from pydantic import ValidationError

from fastvista.records_io import RecordError, validation_error
from fastvista.schema import Dialogue, Gold

csv.field_size_limit(sys.maxsize)


def guarded(
    path, line: int | None, where: str | None, records: Callable[[], Iterable[Dialogue]]
) -> Iterator[Dialogue | RecordError]:
    """The records made of one input record, or the RecordError that says where it is malformed.

    The one place where a wrong type or a missing key in untrusted input becomes an error that
    --skip-bad can skip, not a crash that stops the whole load.
    """
    try:
        yield from records()
    except RecordError as e:
        yield e
    except ValidationError as e:
        yield validation_error(path, line, e, prefix=where or "")
    except KeyError as e:
        yield RecordError(path, line, ".".join(p for p in (where, str(e.args[0])) if p), "missing")
    except (TypeError, ValueError, AttributeError, IndexError) as e:
        yield RecordError(path, line, where, f"malformed record ({type(e).__name__}: {e})")


def expect(path, line: int | None, field: str | None, value, kind: type, what: str):
    """`value` if it is a `kind`, else a RecordError naming `field`."""
    if not isinstance(value, kind):
        raise RecordError(path, line, field, f"expected {what}, got {type(value).__name__}")
    return value


def _decoded(lines: Iterable[bytes], bad: dict[int, str]) -> Iterator[str]:
    """Each line as text; a line that is not UTF-8 is decoded with U+FFFD and noted in `bad`."""
    for n, raw in enumerate(lines, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            bad[n] = f"not UTF-8 ({e.reason} at byte {e.start} of the line)"
            yield raw.decode("utf-8", errors="replace")


def _physical_lines(f) -> Iterator[bytes]:
    """Lines ended by \\n, \\r\\n or \\r, as the csv module reads them (open(newline=""))."""
    for chunk in f:
        yield from chunk.splitlines(keepends=True)


def csv_rows(path: str | os.PathLike, delimiter: str = ",") -> Iterator[tuple[int, dict] | RecordError]:
    """(line number, row) of a CSV/TSV file, the line where the row starts. Lines are decoded one
    by one, so a bad byte or a CSV error costs its row alone: a RecordError with its line."""
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    bad: dict[int, str] = {}
    with open(path, "rb") as f:
        reader = csv.DictReader(_decoded(_physical_lines(f), bad), delimiter=delimiter, quoting=quoting)
        start = 2
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:  # e.g. a NUL byte before Python 3.11
                yield RecordError(path, reader.line_num, None, f"not valid CSV: {e}")
                start = reader.line_num + 1
                continue
            if 1 in bad:
                yield RecordError(path, 1, None, f"header {bad[1]}")
                return
            yield _row(path, start, reader.line_num, row, bad)
            start = reader.line_num + 1


def _row(path, start: int, end: int, row: dict, bad: dict[int, str]) -> tuple[int, dict] | RecordError:
    """The row of lines start..end, or a RecordError at its first line that is not UTF-8, naming
    the first column that shows a replacement character."""
    row = {(k or "").strip(): v for k, v in row.items()}
    broken = next((n for n in range(start, end + 1) if n in bad), None)
    if broken is None:
        return start, row
    field = next((k for k, v in row.items() if isinstance(v, str) and "\ufffd" in v), None)
    return RecordError(path, broken, field, bad[broken])


def csv_records(
    path: str | os.PathLike, records: Callable[[int, dict], Iterable[Dialogue]], delimiter: str = ","
) -> Iterator[Dialogue | RecordError]:
    """The records `records(line, row)` makes of each row, or the RecordError of a bad row."""
    for item in csv_rows(path, delimiter):
        if isinstance(item, RecordError):
            yield item
        else:
            line, row = item
            yield from guarded(path, line, None, lambda: records(line, row))


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
