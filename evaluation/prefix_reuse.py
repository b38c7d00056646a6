"""How much of each student prompt a prefix cache could reuse from the dialogue's previous turn,
for several orders of the prompt's sections: the offline half of the prefix-reuse question.

    fastvista eval prefix-reuse runs/corpus_split/test_labelled.jsonl --tokenizer smollm2-135m-instruct

Each dialogue's turns are rendered as the per-turn student sees them (the stores replayed from
the teacher's labels), tokenized with the chat template, and compared with the previous scored
turn's prompt (a dialogue's first turn with the previous dialogue's last: they share the system
prompt): the common prefix, cut to whole KV blocks, is what an engine with prefix caching need
not prefill again. Decoding is not counted: it is the same in every layout.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from fastvista.memory import stores_before
from fastvista.schema import ScoredDialogue
from fastvista.single_pass import HISTORY, HISTORY_TURNS, REFERENCE, STORE, TURN, render_messages, render_user_message
from fastvista.text import recent

# name -> (section order, history window: None for the whole history)
LAYOUTS = {
    "store, reference, history (8), turn (today)": ((STORE, REFERENCE, HISTORY, TURN), HISTORY_TURNS),
    "history (8), store, reference, turn": ((HISTORY, STORE, REFERENCE, TURN), HISTORY_TURNS),
    "history (all), store, reference, turn": ((HISTORY, STORE, REFERENCE, TURN), None),
    "reference, store, history (8), turn": ((REFERENCE, STORE, HISTORY, TURN), HISTORY_TURNS),
}


def user_message(order: Sequence[str], window: int | None, store, reference, history, turn) -> str:
    """The student's user message in another section order and history window."""
    return render_user_message(store, reference, history if window is None else recent(history, window), turn, order)


def common_prefix(a: Sequence[int], b: Sequence[int], block: int) -> int:
    """Tokens of the longest common prefix, down to whole blocks of the KV cache."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n // block * block


def prompts(dialogue: ScoredDialogue, order, window) -> list[list[dict]]:
    d = dialogue.dialogue
    stores = stores_before(d.knowledge_init, dialogue.turns)
    out = []
    for result, store in zip(dialogue.turns, stores):
        turn = d.turns[result.index]
        history = [(t.role, t.text) for t in d.turns[: result.index]]
        out.append(render_messages(user_message(order, window, store, turn.reference, history, turn.text)))
    return out


def reuse(scored: list[ScoredDialogue], tokenizer, block: int = 16) -> dict:
    """Per layout: prompt tokens per turn, tokens to prefill per turn with a prefix cache, and
    the share of prompt tokens reused."""
    report = {}
    for name, (order, window) in LAYOUTS.items():
        total, prefilled = [], []
        previous: list[int] = []
        for s in scored:
            for messages in prompts(s, order, window):
                ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
                total.append(len(ids))
                prefilled.append(len(ids) - common_prefix(previous, ids, block))
                previous = ids
        report[name] = {"turns": len(total), "prompt_tokens_per_turn": round(statistics.mean(total), 1),
                        "prefilled_tokens_per_turn": round(statistics.mean(prefilled), 1),
                        "reused_share": round(1 - sum(prefilled) / sum(total), 4)}
    return report


def table(report: dict) -> str:
    lines = ["| layout | prompt tokens / turn | prefilled with a prefix cache | reused |", "|---|---|---|---|"]
    for name, r in report.items():
        lines.append(f"| {name} | {r['prompt_tokens_per_turn']} | {r['prefilled_tokens_per_turn']} | {r['reused_share']:.1%} |")
    return "\n".join(lines)
