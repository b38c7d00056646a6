"""Plain JSONL in the dialogue record format of docs/design.md."""

from __future__ import annotations

from fastvista.records_io import iter_dialogues


def load(path):
    for _, item in iter_dialogues(path):
        yield item
