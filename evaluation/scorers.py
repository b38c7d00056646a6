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

import hashlib
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fastvista.llm import Backend, BackendConfig
from fastvista.protocol import gather, usage_of
from fastvista.scheduler import Schedule
from fastvista.schema import Dialogue
from fastvista.scoring import scored_dialogue
from fastvista.text import recent
from fastvista.contract import FORMAT_VERSION
from fastvista.evaluation.baselines import factscore, judge, steps
from fastvista.evaluation.baselines.factscore import FactScoreConfig, factscore_turn
from fastvista.evaluation.baselines.judge import JudgeConfig, judge_turn
from fastvista.evaluation.baselines.q2 import Q2Config, q2_turn
from fastvista.evaluation.baselines.steps import HFSteps, LLMSteps, Spacy
from fastvista.infer.student import StudentConfig, check_answer_budget, score_dialogue
from fastvista.synth.pipeline import TeacherConfig, label_dialogue
from fastvista.synth.prompts import PROMPTS_VERSION

SCORERS = ("teacher", "student", "q2", "factscore", "judge")
CLAIMLESS = ("q2", "judge")  # scorers that decide turns without claims
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

    @model_validator(mode="after")
    def _answer_budget_fits(self) -> "EvalConfig":
        if self.scorer == "student" and self.backend and self.backend.kind != "openai":
            check_answer_budget(self.student, self.backend.max_model_len)
        return self

    def settings(self) -> dict:
        return getattr(self, self.scorer).model_dump(mode="json")

    def provenance(self) -> dict:
        """What decides this scorer's results (model, weights, prompts, settings): results made
        otherwise are refused on resume rather than mixed in."""
        from fastvista.llm import fingerprint

        return {"scorer": self.scorer, "model": self.backend.model if self.backend else None,
                "weights": fingerprint(self.backend) if self.backend else None,
                "prompts_version": PROMPTS_VERSIONS[self.scorer], "settings": self.settings()}


def _digest(*prompts) -> str:
    return hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:12]


# The prompts each scorer's answers depend on: the teacher's and the student's carry versions, the
# baselines' are told apart by their text, so an edited prompt never resumes old results.
PROMPTS_VERSIONS = {
    "teacher": PROMPTS_VERSION,
    "student": f"student-format-v{FORMAT_VERSION}",
    "q2": _digest(steps.QG_SYSTEM, steps.QA_SYSTEM, steps.NLI_SYSTEM),
    "factscore": _digest(factscore.FACTS_SYSTEM, factscore.FACTS_EXAMPLES, factscore.SUPPORT_SYSTEM),
    "judge": _digest(judge.JUDGE_SYSTEM),
}


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

            return per_turn(d, turn, claimless="q2" in CLAIMLESS)

        return q2
    if config.scorer == "factscore":
        nlp = Spacy(config.factscore.spacy_model)
        return lambda d: per_turn(d, lambda i, c: factscore_turn(d.turns[i].text, d.turns[i].reference, config.factscore, nlp, c), claimless="factscore" in CLAIMLESS)
    cfg = config.judge

    def judge(d: Dialogue):
        def turn(i, completions):
            history = recent([(t.role, t.text) for t in d.turns[:i]], cfg.history_turns)
            return judge_turn(history, d.turns[i].text, d.turns[i].reference, cfg, completions)

        return per_turn(d, turn, claimless="judge" in CLAIMLESS)

    return judge


def adapter_of(config: EvalConfig) -> Optional[str]:
    """The LoRA adapter the scorer prompts (None: the backend's base model)."""
    return config.student.adapter if config.scorer == "student" else None


def backend_factory(config: EvalConfig, adapters: Optional[list[Optional[str]]] = None) -> Callable[[], Backend]:
    """The backend, checked when it starts for `adapters` (default: the scorer's own), so an
    engine several scorers share refuses an adapter one of them lacks before any of them runs."""
    def build() -> Backend:
        if config.backend is None:
            raise ValueError(f"scorer {config.scorer!r} prompts an LLM: give a backend section in the config")
        from fastvista.llm import make_checked_backend

        return make_checked_backend(config.backend, adapters or [adapter_of(config)])

    return build
