"""Loaders: each maps one benchmark's own files into dialogue records (docs/design.md).

A loader is a generator of `Dialogue | RecordError`; `load` raises the first error, or with a
`skipped` list collects every one with its reason and goes on, so no input is lost silently.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from fastvista.records_io import RecordError
from fastvista.schema import Dialogue

from . import ais, begin, dialfact, faithdial, jsonl, q2, topical_chat, vista

LOADERS: dict[str, Callable[..., Iterator[Dialogue | RecordError]]] = {
    "jsonl": jsonl.load,
    "begin": begin.load,
    "faithdial": faithdial.load,
    "q2": q2.load,
    "dialfact": dialfact.load,
    "ais": ais.load,
    "topical_chat": topical_chat.load,
    "vista": vista.load,
}


def load(
    source: str,
    path: str | os.PathLike,
    skipped: list[RecordError] | None = None,
    **options,
) -> Iterator[Dialogue]:
    """Dialogue records of `path` read by the loader named `source`."""
    if source not in LOADERS:
        raise ValueError(f"unknown source {source!r}; choose one of {sorted(LOADERS)}")
    if not os.path.exists(path):
        raise RecordError(path, None, None, "no such file or folder")
    count = 0
    for item in LOADERS[source](path, **options):
        if isinstance(item, RecordError):
            if skipped is None:
                raise item
            skipped.append(item)
            continue
        count += 1
        yield item
    if count == 0 and not skipped:
        raise RecordError(path, None, None, "holds no records")
