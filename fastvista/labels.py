"""The five claim labels of VISTA and which of them are safe."""

from __future__ import annotations

from enum import Enum


class Label(str, Enum):
    VERIFIED = "VERIFIED"
    OUT_OF_SCOPE = "OUT_OF_SCOPE"
    ABSTENTION = "ABSTENTION"
    CONTRADICTED = "CONTRADICTED"
    LACKING_EVIDENCE = "LACKING_EVIDENCE"

    @property
    def safe(self) -> bool:
        return self in SAFE_LABELS


SAFE_LABELS = frozenset({Label.VERIFIED, Label.OUT_OF_SCOPE, Label.ABSTENTION})
# The labels of the teacher's classify step (claims that the verify step could not verify).
UNVERIFIABLE_CLASSES = (
    Label.OUT_OF_SCOPE,
    Label.CONTRADICTED,
    Label.LACKING_EVIDENCE,
    Label.ABSTENTION,
)
# Claims that enter the running knowledge store after their turn.
REMEMBERED_LABELS = frozenset({Label.VERIFIED, Label.OUT_OF_SCOPE})

# Spellings found in human annotations (VISTA's re-annotation uses lower-case words).
_ALIASES = {
    "verifiable": Label.VERIFIED,
    "verified": Label.VERIFIED,
    "supported": Label.VERIFIED,
    "out of scope": Label.OUT_OF_SCOPE,
    "out_of_scope": Label.OUT_OF_SCOPE,
    "abstention": Label.ABSTENTION,
    "contradicted": Label.CONTRADICTED,
    "contradiction": Label.CONTRADICTED,
    "lacking evidence": Label.LACKING_EVIDENCE,
    "lacking_evidence": Label.LACKING_EVIDENCE,
}


def parse_label(text: str) -> Label:
    """Map a label as written by a person or a source file to a Label; ValueError if unknown."""
    key = " ".join(text.strip().lower().replace("-", " ").split())
    if key in _ALIASES:
        return _ALIASES[key]
    if key.replace(" ", "_").upper() in Label.__members__:
        return Label[key.replace(" ", "_").upper()]
    raise ValueError(f"unknown claim label {text!r}; expected one of {[l.value for l in Label]}")
