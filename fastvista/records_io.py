"""Reading and writing dialogue records as JSONL, with errors that name file, line and field."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import BaseModel, ValidationError

from fastvista.schema import Dialogue, ScoredDialogue


class RecordError(ValueError):
    """A malformed input record; says where it is and what is wrong."""

    def __init__(self, path: str | os.PathLike, line: int | None, field: str | None, reason: str):
        self.path, self.line, self.field, self.reason = str(path), line, field, reason
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: field {field!r}: {reason}" if field else f"{where}: {reason}")

    def as_dict(self) -> dict:
        return {"file": self.path, "line": self.line, "field": self.field, "reason": self.reason}


def validation_error(path, line: int | None, exc: ValidationError, prefix: str = "") -> RecordError:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in (prefix, *first["loc"]) if p != "")
    return RecordError(path, line, field or None, first["msg"])


def open_binary(path: str | os.PathLike):
    """A file's bytes, gunzipped when its name ends in .gz (the shipped corpus is compressed)."""
    return gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")


def read_lines(path: str | os.PathLike) -> Iterator[tuple[int, str | RecordError]]:
    """Yield (line number, text) for non-blank lines, or a RecordError for a non-UTF-8 line."""
    with open_binary(path) as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield n, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield n, RecordError(path, n, None, f"not UTF-8 ({e.reason} at byte {e.start})")


def iter_dialogues(path: str | os.PathLike) -> Iterator[tuple[int, Dialogue | RecordError]]:
    """(line number, record or the RecordError that says why the line is not one)."""
    for n, item in read_lines(path):
        try:
            yield n, _parse_line(path, n, item)
        except RecordError as err:
            yield n, err


def read_dialogues(
    path: str | os.PathLike, skipped: list[RecordError] | None = None
) -> Iterator[tuple[int, Dialogue]]:
    """Dialogue records of a JSONL file with their line numbers.

    Raises RecordError on the first bad record; with a `skipped` list, collects it there and
    goes on. An empty file is an error: a run over nothing is almost always a mistake.
    """
    count = 0
    for n, item in iter_dialogues(path):
        if isinstance(item, RecordError):
            if skipped is None:
                raise item
            skipped.append(item)
            continue
        count += 1
        yield n, item
    if count == 0 and not skipped:
        raise RecordError(path, None, None, "file holds no records")


def _parse_line(path, n: int, item: str | RecordError) -> Dialogue:
    if isinstance(item, RecordError):
        raise item
    try:
        obj = json.loads(item)
    except json.JSONDecodeError as e:
        raise RecordError(path, n, None, f"invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(obj, dict):
        raise RecordError(path, n, None, f"expected a JSON object, got {type(obj).__name__}")
    try:
        return Dialogue.model_validate(obj)
    except ValidationError as e:
        raise validation_error(path, n, e) from None


def read_scored(path: str | os.PathLike, ids: set[str] | None = None) -> list[ScoredDialogue]:
    """Scored dialogues of a results file (teacher or student), optionally only those in `ids`."""
    scored = []
    with open_binary(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                scored.append(ScoredDialogue.model_validate_json(line))
            except ValidationError as e:
                raise validation_error(path, n, e) from None
    return scored if ids is None else [s for s in scored if s.id in ids]


def write_jsonl(path: str | os.PathLike, records: Iterable[BaseModel | dict]) -> int:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(to_json_line(r))
            n += 1
    return n


def to_json_line(record: BaseModel | dict) -> str:
    if isinstance(record, BaseModel):
        return record.model_dump_json(exclude_none=True) + "\n"
    return json.dumps(record, ensure_ascii=False) + "\n"


def write_json(path: str | os.PathLike, value: dict) -> None:
    """Replaced whole, never half-written: a later run reads it."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value, indent=2))
    partial.replace(path)
