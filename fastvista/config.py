"""Run configuration shared by the stages: which data a run reads, and YAML with overrides."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field

from fastvista.loaders import load
from fastvista.records_io import RecordError
from fastvista.schema import Dialogue
from fastvista.selection import sample, select


class DataSelection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: str
    source: str = "jsonl"
    options: dict = Field(default_factory=dict)  # loader options, e.g. wow_file for AIS
    limit: Optional[int] = Field(None, ge=1)
    min_scored_turns: int = 0
    max_scored_turns: Optional[int] = None
    sample: Optional[int] = Field(None, ge=1)  # a seeded random sample of this many of the selected dialogues
    seed: int = 0


def set_key(tree: dict, dotted: str, value) -> None:
    """Apply one `a.b.c=value` override to a nested dict."""
    *parents, leaf = dotted.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
    tree[leaf] = value


def selected(data: DataSelection, skip_bad: bool) -> tuple[list[Dialogue], list[dict]]:
    """What a run reads: the selected dialogues, and a report (file, line, reason; or id and
    reason) for each input it will not score, so every input is accounted for."""
    skipped: list[RecordError] = []
    dropped: list[dict] = []
    dialogues = load_dialogues(data, skipped if skip_bad else None, dropped)
    return dialogues, [e.as_dict() for e in skipped] + dropped


def load_config(path: str | None, overrides: list[str]) -> dict:
    tree = yaml.safe_load(Path(path).read_text()) if path else {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} is not KEY=VALUE")
        set_key(tree, key.strip(), yaml.safe_load(value))
    return tree


def load_dialogues(data: DataSelection, skipped: list[RecordError] | None, dropped: list[dict] | None = None) -> list[Dialogue]:
    """The selected dialogues; bad records raise, or are collected in `skipped` when given;
    dialogues the selection leaves out for too few scored turns are reported in `dropped`."""
    chosen = list(select(load(data.source, data.input, skipped, **data.options), data.limit, data.min_scored_turns,
                         data.max_scored_turns, dropped))
    return sample(chosen, data.sample, data.seed) if data.sample is not None else chosen


TABLE_NAME = re.compile(r"\w[\w ,+-]*")  # a table's variant and data-set names: each names a folder beside its files


def check_name(name: str, what: str) -> None:
    if not isinstance(name, str) or not TABLE_NAME.fullmatch(name):
        raise ValueError(f"{what} name {name!r}: letters, digits, spaces and , + - only (it names a folder)")


def table_data(data: DataSelection, name: str, skip_bad: bool = False) -> tuple[list[Dialogue], list[dict]]:
    """A data set of a table (ablation, teacher quality, benchmark) and the report of what it
    leaves out (`selected`). Refused at once, naming the set: no dialogue to score (the table
    would crash hours later) and an id given twice (one would be scored, counted once, silently)."""
    dialogues, report = selected(data, skip_bad)
    if not any(d.scored_indices() for d in dialogues):
        raise ValueError(f"data set {name!r} ({data.input}): no dialogue with a turn to score "
                         f"({len(dialogues)} dialogues selected, {len(report)} left out)")
    seen: set[str] = set()
    for d in dialogues:
        if d.id in seen:
            raise ValueError(f"data set {name!r} ({data.input}): dialogue id {d.id!r} is given twice; "
                             "give each dialogue its own id")
        seen.add(d.id)
    return dialogues, report
