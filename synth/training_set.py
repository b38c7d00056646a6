"""The student's training set from teacher-labelled dialogues, in TRL's conversational
prompt/completion format, rendered with the one single-pass renderer."""

from __future__ import annotations

from fastvista.schema import ScoredDialogue
from fastvista.single_pass import HISTORY_TURNS, render_target, student_messages


def training_examples(scored: ScoredDialogue, history_turns: int = HISTORY_TURNS) -> list[dict]:
    """One example per scored turn; the store is the teacher's store before that turn.

    A turn whose labelling reported an error (an answer the teacher could not read) is left out:
    its label is a fallback, not the teacher's judgement. The store still advances past it.
    """
    examples = []
    store = list(scored.dialogue.knowledge_init)
    for result in scored.turns:
        if result.errors:
            store = result.store_after
            continue
        examples.append(
            {
                "id": f"{scored.id}#{result.index}",
                "dialogue_id": scored.id,
                "turn_index": result.index,
                "prompt": student_messages(scored.dialogue, result.index, store, history_turns),
                "completion": [{"role": "assistant", "content": render_target(result.claims)}],
            }
        )
        store = result.store_after
    return examples
