"""A checkpoint's label accuracy under teacher forcing: fed the teacher's answer, does the student
put the teacher's label first at each claim's decision token (train/label_weight.py)? One forward
pass per example, no generation: a minute on a CPU where scoring the test turns takes half an hour,
so a training recipe can be judged from its early checkpoints.

    fastvista eval label-accuracy runs/learning_curve/student/checkpoint-30 runs/corpus_split/validation.jsonl --turns 30
"""

from __future__ import annotations

from collections import Counter


def forced_label_accuracy(adapter: str, examples: list[dict], base: str | None = None) -> dict:
    """Share of the examples' claims whose label's first token the adapter ranks above the other
    labels' first tokens, given the prompt and the answer before it; and what it chose."""
    import json
    from pathlib import Path

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fastvista.contract import BEFORE_OPTIONS
    from fastvista.models import resolve_model
    from fastvista.train.label_weight import decision_positions, decision_tokens

    base = resolve_model(base or json.loads((Path(adapter) / "adapter_config.json").read_text())["base_model_name_or_path"])
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter).eval()
    answers = {{**BEFORE_OPTIONS, **(e.get("format") or {})}["answer"] for e in examples}
    if len(answers) > 1:
        raise ValueError(f"the examples mix answer styles ({sorted(answers)}): give one training set's examples")
    decisions = decision_tokens(tokenizer, answers.pop() if answers else "numbered")
    firsts = decisions.firsts
    order = sorted(firsts)
    right, chosen, truth = 0, Counter(), Counter()
    for e in examples:
        prompt = tokenizer.apply_chat_template(e["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        ids = tokenizer.apply_chat_template(e["prompt"] + e["completion"], tokenize=True, return_dict=True)["input_ids"]
        ids_t = torch.tensor([ids])
        trained = torch.tensor([[-100] * len(prompt) + ids[len(prompt):]])
        where = decision_positions(ids_t, trained, decisions)[0].nonzero().flatten()
        if not len(where):
            continue
        with torch.no_grad():
            logits = model(ids_t).logits[0, where][:, order]
        for guess, answer in zip(logits.argmax(-1).tolist(), where.tolist()):
            chosen[firsts[order[guess]]] += 1
            truth[firsts[ids[answer + 1]]] += 1
            right += order[guess] == ids[answer + 1]
    n = sum(truth.values())
    return {"adapter": adapter, "examples": len(examples), "claims": n, "accuracy": round(right / n, 4) if n else None,
            "teacher_labels": dict(truth), "chosen": dict(chosen)}
