"""The student's training set from teacher-labelled dialogues, in TRL's conversational
prompt/completion format, rendered with the one single-pass renderer."""

from __future__ import annotations

from fastvista.contract import StudentFormat
from fastvista.memory import stores_before
from fastvista.schema import ScoredDialogue
from fastvista.single_pass import render_target, student_messages
from fastvista.window_pass import render_window_target, window_messages, windows


def training_examples(scored: ScoredDialogue, fmt: StudentFormat) -> list[dict]:
    """One example per scored turn, rendered in `fmt` (recorded in each example); the store is
    the teacher's store before that turn.

    A turn whose labelling reported an error (an answer the teacher could not read) is left out:
    its label is a fallback, not the teacher's judgement. The store still advances past it.
    """
    examples = []
    for result, store in zip(scored.turns, stores_before(scored.dialogue.knowledge_init, scored.turns)):
        if result.errors:
            continue
        examples.append(
            {
                "id": f"{scored.id}#{result.index}",
                "dialogue_id": scored.id,
                "turn_index": result.index,
                "prompt": student_messages(scored.dialogue, result.index, store, fmt.history_turns, fmt.layout, fmt.answer),
                "completion": [{"role": "assistant", "content": render_target(result.claims, fmt.answer)}],
                "format": fmt.model_dump(),
            }
        )
    return examples


def window_examples(scored: ScoredDialogue, fmt: StudentFormat) -> list[dict]:
    """One example per window of `turns_per_call` scored turns (the dialogue-level pass); the
    store is the teacher's store before the window. A window with a turn the teacher could not
    label is left out whole."""
    examples = []
    results = {r.index: r for r in scored.turns}
    before = dict(zip(results, stores_before(scored.dialogue.knowledge_init, scored.turns)))
    for window in windows([r.index for r in scored.turns], fmt.turns_per_call):
        store = before[window[0]]
        if not any(results[i].errors for i in window):
            examples.append(
                {
                    "id": f"{scored.id}#{window[0]}-{window[-1]}",
                    "dialogue_id": scored.id,
                    "turn_index": window[0],
                    "prompt": window_messages(scored.dialogue, window, store, fmt.history_turns),
                    "completion": [{"role": "assistant", "content": render_window_target([results[i].claims for i in window])}],
                    "format": fmt.model_dump(),
                }
            )
    return examples
