"""The student format as a recorded contract between the training set, the trained student and
the scorer: a student trained with one history window, window size or store bound and scored
with another reads prompts it never saw, and nothing in its answers would say so.

The teacher writes the format into every training example (`format`); `train/sft.py` checks
that the examples agree and writes it beside the adapter (and the merged model) as
`format.json`; `fastvista score`, `fastvista eval run --scorer student` and the speed benchmark
refuse a student whose recorded format differs from their settings (or an adapter with none),
and `fastvista serve` refuses an adapter with none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

FORMAT_VERSION = 1  # the renderer's sections and the target's lines (their options are the fields below)
FILE = "format.json"
# The order of the prompt's sections: store first (the first students), or reference first, which a
# prefix cache reuses more of from one turn to the next (docs/speed.md, "Prefix reuse").
Layout = Literal["store-first", "reference-first"]
# How the answer writes a claim: "1. claim | LABEL"; "claim | L" with a one-letter label, which
# decodes a third fewer tokens (docs/student.md, "The speedup a user gets"); or "1. claim | word"
# with a short label word (docs/student.md, "Short label words"). fastvista/single_pass.py spells them.
Answer = Literal["numbered", "coded", "worded"]
# The library's layout and answer style: every student format, setting and command defaults to them
# (the default shipped student's answer is `worded`: configs/score/shipped_student_cpu.yaml sets it).
LAYOUT: Layout = "store-first"
ANSWER: Answer = "numbered"
# What a format recorded before these fields existed was: read into every record that lacks them.
BEFORE_OPTIONS = {"layout": "store-first", "answer": "numbered"}


class StudentFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = FORMAT_VERSION
    layout: Layout = LAYOUT
    answer: Answer = ANSWER
    history_turns: int
    turns_per_call: int = Field(1, ge=1)
    max_store_claims: int

    @model_validator(mode="after")
    def _one_window_format(self) -> "StudentFormat":
        if self.turns_per_call > 1 and (self.layout, self.answer) != ("store-first", "numbered"):
            raise ValueError("a dialogue-level student (turns_per_call > 1) has one format: layout store-first, answer numbered")
        return self


class FormatMismatch(ValueError):
    """A student scored with another format than the one it was trained on."""


def write_format(folder: str | Path, fmt: StudentFormat) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / FILE).write_text(json.dumps(fmt.model_dump(), indent=2) + "\n")


def read_format(folder: str | Path) -> StudentFormat | None:
    path = Path(folder) / FILE
    return recorded(json.loads(path.read_text())) if path.exists() else None


def recorded(data: dict) -> StudentFormat:
    """A format as a file or an example records it (one recorded before the layout and answer
    options existed has the format of that time)."""
    return StudentFormat.model_validate({**BEFORE_OPTIONS, **data} if isinstance(data, dict) else data)


def format_of_examples(examples: list[dict], where: str) -> StudentFormat:
    """The one format every training example was rendered with."""
    found = {json.dumps(recorded(e["format"]).model_dump() if e.get("format") else None, sort_keys=True) for e in examples}
    if found == {"null"}:
        raise FormatMismatch(f"{where}: the examples do not record their format (field 'format'); "
                             "write the training set again with `fastvista synth`")
    if len(found) > 1:
        raise FormatMismatch(f"{where}: the examples were rendered with {len(found)} different formats: {sorted(found)}")
    return recorded(json.loads(found.pop()))


def check_format(trained: StudentFormat, used: StudentFormat, where: str) -> None:
    if trained != used:
        a, b = trained.model_dump(), used.model_dump()
        differing = ", ".join(f"{k}: trained {a[k]!r}, scoring {b[k]!r}" for k in a if a[k] != b[k])
        settings = " ".join(f"student.{k}={a[k]}" for k in a if a[k] != b[k] and k != "version")
        raise FormatMismatch(f"the student in {where} was trained with another format ({differing}); "
                             f"score with the settings it was trained with ({settings}; --set on the command line), or train it again")
