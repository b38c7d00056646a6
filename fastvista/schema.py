"""Pydantic records shared by every stage: dialogues in, scored dialogues out (docs/design.md)."""

from __future__ import annotations

from typing import Literal, Optional

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from fastvista.labels import Label


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


def encodable(text: str) -> str:
    """Text that can be written out again: JSON's \\ud800 escapes decode to lone surrogates,
    which no UTF-8 file can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"holds a lone surrogate ({text[e.start:e.end]!a} at character {e.start})") from None
    return text


Text = Annotated[str, AfterValidator(encodable)]


class GoldClaim(Record):
    text: str
    label: Label


class Gold(Record):
    """Human labels of a turn; `original` keeps the source's own label verbatim."""

    label: Optional[Literal["faithful", "hallucinated"]] = None
    original: Optional[str] = None
    claims: Optional[list[GoldClaim]] = None


class Turn(Record):
    role: Literal["user", "assistant"]
    text: Text
    reference: Optional[Text] = None
    score: Optional[bool] = None
    gold: Optional[Gold] = None
    # Source facts that are not part of the contract (e.g. Topical-Chat's knowledge_source).
    meta: Optional[dict] = None

    @property
    def scored(self) -> bool:
        """Only assistant turns whose `score` is not false are scored; the rest are context."""
        return self.role == "assistant" and self.score is not False


class Dialogue(Record):
    id: Text
    source: Text = "jsonl"
    system: Optional[Text] = None
    knowledge_init: list[Text] = Field(default_factory=list)
    turns: list[Turn]
    meta: Optional[dict] = None

    def scored_indices(self) -> list[int]:
        return [i for i, t in enumerate(self.turns) if t.scored]


class Claim(Record):
    text: str
    label: Label
    # Why the label could not be read from the model, when it could not (kept, never dropped).
    error: Optional[str] = None
    confidence: Optional[float] = None
    # The teacher's label distributions: P(VERIFIED) from verification and the class distribution
    # from classification, kept so decision thresholds can be fitted without relabelling.
    probabilities: Optional[dict[str, float]] = None
    about_speaker: Optional[bool] = None  # set by the teacher when the claim is about the speaker


class Usage(Record):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_calls: int = 0

    def add(self, other: "Usage") -> "Usage":
        return Usage(**{k: getattr(self, k) + getattr(other, k) for k in Usage.model_fields})


class TurnResult(Record):
    """A scored turn. A turn that could not be scored has no result: its dialogue is reported in
    failed.jsonl instead (fastvista.scheduler)."""

    index: int
    claims: list[Claim]
    score: float
    no_claims: bool
    hallucinated: bool
    # What the turn added to the knowledge store, and how many of its oldest entries that pushed
    # out (fastvista.memory): the store is replayed from these, never copied per turn.
    store_added: list[str] = Field(default_factory=list)
    store_evicted: int = 0
    usage: Usage = Field(default_factory=Usage)
    # Answers that were retried before one read, and other notes; never a failed call.
    errors: list[str] = Field(default_factory=list)
    # What a scorer without claims bases its score on (Q2's questions and answers, a judge's reason);
    # for the student, the repeated claims of its answer that were merged.
    details: Optional[dict] = None


class ScoredDialogue(Record):
    id: str
    source: str
    system: Optional[str] = None
    score: Optional[float] = None  # None: the dialogue has no scored turn, so nothing to score
    turns: list[TurnResult]
    usage: Usage = Field(default_factory=Usage)
    provenance: dict = Field(default_factory=dict)
    dialogue: Dialogue
