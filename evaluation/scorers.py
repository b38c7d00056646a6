"""Every scorer by name, behind one interface: `machine(dialogue)` is a generator that yields
batches of chat requests and returns a ScoredDialogue, so the scheduler batches, caches and
resumes all of them alike.

    teacher    the VISTA pipeline (synth)           student    the single pass (infer)
    q2         question generation + QA + NLI       factscore  sentences -> atomic facts -> support
    judge      one holistic LLM call per turn

Q2, FActScore and the judge score each turn on its own (no knowledge store), so all turns of a
dialogue go to the engine together.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from fastvista.llm import Backend, BackendConfig
from fastvista.protocol import gather, usage_of
from fastvista.scheduler import Schedule
from fastvista.schema import Dialogue
from fastvista.scoring import scored_dialogue
from fastvista.text import recent
from fastvista.evaluation.baselines.factscore import FactScoreConfig, factscore_turn
from fastvista.evaluation.baselines.judge import JudgeConfig, judge_turn
from fastvista.evaluation.baselines.q2 import Q2Config, q2_turn
from fastvista.evaluation.baselines.steps import HFSteps, LLMSteps, Spacy
from fastvista.infer.student import StudentConfig, score_dialogue
from fastvista.synth.pipeline import TeacherConfig, label_dialogue

SCORERS = ("teacher", "student", "q2", "factscore", "judge")
Scorer = Literal["teacher", "student", "q2", "factscore", "judge"]


class EvalConfig(BaseModel):
    """A scorer and its settings; `backend` is the LLM it prompts (optional only for a Q2 whose
    three steps all name Hugging Face models)."""

    model_config = ConfigDict(extra="forbid")

    scorer: Scorer
    backend: Optional[BackendConfig] = None
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    student: StudentConfig = Field(default_factory=StudentConfig)
    q2: Q2Config = Field(default_factory=Q2Config)
    factscore: FactScoreConfig = Field(default_factory=FactScoreConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    max_active: int = 64
    schedule: Schedule = "waves"

    def settings(self) -> dict:
        return getattr(self, self.scorer).model_dump(mode="json")


def per_turn(dialogue: Dialogue, turn_machine: Callable, claimless: bool):
    """Run `turn_machine(index, completions)` for every scored turn at once; a claimless scorer's
    dialogue score is the mean of its turn scores."""
    indices = dialogue.scored_indices()
    tracks = [[] for _ in indices]
    results = yield from gather([turn_machine(i, c) for i, c in zip(indices, tracks)])
    for index, result, completions in zip(indices, results, tracks):
        result.index, result.usage = index, usage_of(completions)
    scored = scored_dialogue(dialogue, results)
    if claimless:
        scores = [r.score for r in results if r.score is not None]
        scored.score = round(sum(scores) / len(scores), 4) if scores else None
    return scored


def machine_for(config: EvalConfig) -> Callable[[Dialogue], object]:
    """The chosen scorer's dialogue machine."""
    if config.scorer == "teacher":
        return lambda d: label_dialogue(d, config.teacher)
    if config.scorer == "student":
        # vllm and OpenAI-compatible servers force the format; transformers' generate cannot.
        constrained = config.backend is not None and config.backend.kind != "hf" and config.student.constrain
        return lambda d: score_dialogue(d, config.student, constrained)
    if config.scorer == "q2":
        cfg = config.q2
        nlp = Spacy(cfg.spacy_model)
        hf = HFSteps(cfg.qg_model, cfg.qa_model, cfg.nli_model)

        def q2(d: Dialogue):
            def turn(i, completions):
                llm = LLMSteps()
                llm.completions = completions
                steps = SimpleNamespace(questions=hf.questions if cfg.qg_model else llm.questions,
                                        answers=hf.answers if cfg.qa_model else llm.answers,
                                        nli=hf.nli if cfg.nli_model else llm.nli)
                return q2_turn(d.turns[i].text, d.turns[i].reference or "", cfg, steps, nlp)

            return per_turn(d, turn, claimless=True)

        return q2
    if config.scorer == "factscore":
        nlp = Spacy(config.factscore.spacy_model)
        return lambda d: per_turn(d, lambda i, c: factscore_turn(d.turns[i].text, d.turns[i].reference, config.factscore, nlp, c), claimless=False)
    cfg = config.judge

    def judge(d: Dialogue):
        def turn(i, completions):
            history = recent([(t.role, t.text) for t in d.turns[:i]], cfg.history_turns)
            return judge_turn(history, d.turns[i].text, d.turns[i].reference, cfg, completions)

        return per_turn(d, turn, claimless=True)

    return judge


def backend_factory(config: EvalConfig) -> Callable[[], Backend]:
    def build() -> Backend:
        if config.backend is None:
            raise ValueError(f"scorer {config.scorer!r} prompts an LLM: give a backend section in the config")
        from fastvista.llm import make_checked_backend

        return make_checked_backend(config.backend, [config.student.adapter if config.scorer == "student" else None])

    return build
