"""Live use: score one new assistant turn of a running conversation.

The dialogue state (the student's knowledge store and the history) is a small JSON-serialisable
record, so a guard can keep it anywhere (a session store, a cookie, a database row) between turns:

    scorer = LiveScorer(make_backend(BackendConfig(kind="openai", base_url=..., model="student")))
    # scores in the format the served student was trained in, read from the folder a server on
    # this machine names; a server elsewhere needs its settings: LiveScorer(backend, StudentConfig(answer=...))
    state = DialogueState()
    state = state.with_user("Who painted the Mona Lisa?")
    result, state = scorer.score(state, "Leonardo da Vinci painted it in 1503.", reference=passage)
    if result.hallucinated: ...

`LiveTeacher` scores on the same state with the multi-call teacher (VISTA's pipeline), for a
guard that pays its calls for its accuracy and to time the two side by side
(`fastvista eval live-latency`).

Both fail closed: a backend that is down, a key it refuses, a prompt too long or an answer that
never reads raises ScoringFailed (or ConfigError), never returns "not hallucinated".
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from fastvista.llm import Backend, BackendConfig
from fastvista.protocol import drive
from fastvista.schema import TurnResult
from fastvista.single_pass import LAYOUTS, render_messages, render_user_message
from fastvista.text import recent
from fastvista.infer.run import as_trained, check_student_format
from fastvista.infer.student import StudentConfig, score_turn
from fastvista.synth.pipeline import TeacherConfig, teacher_turn


class DialogueState(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    store: list[str] = Field(default_factory=list)
    history: list[tuple[Literal["user", "assistant"], str]] = Field(default_factory=list)

    def with_user(self, text: str) -> "DialogueState":
        return self.with_turn("user", text)

    def with_turn(self, role: Literal["user", "assistant"], text: str) -> "DialogueState":
        """The state after a turn that is not scored (a user turn, an assistant turn without a reference)."""
        return self.model_copy(update={"history": [*self.history, (role, text)]})


class LiveScorer:
    def __init__(self, backend: Backend, config: Optional[StudentConfig] = None):
        self.backend = backend
        known = isinstance(getattr(backend, "config", None), BackendConfig)
        # given no settings: those the student was trained with, where its format.json can be read
        self.config = config or (as_trained(backend.config, StudentConfig()) if known else StudentConfig())
        if self.config.turns_per_call != 1:
            raise ValueError("live scoring scores one turn a call: use a per-turn student (turns_per_call: 1)")
        if known:  # a student in another format is refused, as by `fastvista score`
            check_student_format(backend.config, self.config)

    def score(self, state: DialogueState, text: str, reference: str | None = None) -> tuple[TurnResult, DialogueState]:
        """Score `text` as the next assistant turn; returns its result and the state after it."""
        cfg = self.config
        message = render_user_message(state.store, reference, recent(state.history, cfg.history_turns), text, LAYOUTS[cfg.layout])
        constrained = self.backend.supports_constraints and cfg.constrain
        result, store = drive(score_turn(render_messages(message, cfg.answer), len(state.history), state.store, cfg, constrained), self.backend)
        return result, DialogueState(store=store, history=[*state.history, ("assistant", text)])


class LiveTeacher:
    def __init__(self, backend: Backend, config: Optional[TeacherConfig] = None):
        self.backend = backend
        self.config = config or TeacherConfig()
        if self.config.gold_claims:
            raise ValueError("live scoring decomposes each turn itself: gold_claims is for human-labelled benchmarks")

    def score(self, state: DialogueState, text: str, reference: str | None = None) -> tuple[TurnResult, DialogueState]:
        """Score `text` as the next assistant turn, as `fastvista synth` scores a dialogue's turn."""
        result, store = drive(teacher_turn(len(state.history), list(state.history), text, reference, state.store, self.config), self.backend)
        return result, DialogueState(store=store, history=[*state.history, ("assistant", text)])
