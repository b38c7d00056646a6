"""Weight the loss of the tokens that decide each claim's label.

In the student's answer ("1. A claim. | LACKING_EVIDENCE", "A claim. | L" coded, "1. A claim. |
unsupported" worded) one token
decides a claim's label: the first after the bar (the labels' first tokens differ). The claim's own words are most of the
loss, so the plain loss teaches the student to write claims long before it teaches their labels:
after 254 corpus turns SmolLM2-135M wrote OUT_OF_SCOPE for every claim (docs/student.md).

Scaling by w the gradient that reaches the final hidden state at the position predicting a
decision token is the same as weighting that token's loss by w (its loss depends on the weights
only through that hidden state). TRL's loss is left as it is, so the logged losses stay
comparable with an unweighted run.
"""

from __future__ import annotations

from typing import NamedTuple

from fastvista.contract import Answer
from fastvista.labels import Label
from fastvista.schema import Claim
from fastvista.single_pass import render_target


class Decisions(NamedTuple):
    """Where a tokenizer decides labels: tokens holding the bar, blank tokens that may stand between
    the bar and the label (a tokenizer may write the space before a one-letter label as a token of
    its own), and each label's first token -> the label."""

    bars: frozenset[int]
    spaces: frozenset[int]
    firsts: dict[int, str]


def decision_tokens(tokenizer, answer: Answer = "numbered") -> Decisions:
    """The decision tokens of this tokenizer and answer style; refuses one whose labels share a
    first token (one token would then not decide the label)."""
    text = {i: tokenizer.convert_tokens_to_string([token]) for token, i in tokenizer.get_vocab().items()}
    special = set(getattr(tokenizer, "all_special_ids", []))  # "<|im_end|>" holds a bar but ends a message
    bars = frozenset(i for i, t in text.items() if "|" in t and i not in special)
    spaces, firsts = set(), {}
    for label in Label:
        ids = tokenizer(render_target([Claim(text="A claim.", label=label)], answer), add_special_tokens=False)["input_ids"]
        k = max(k for k, t in enumerate(ids) if t in bars) + 1
        if not text[ids[k]].strip():
            spaces.add(ids[k])
            k += 1
        firsts[ids[k]] = label.value
    if len(firsts) != len(Label):
        raise ValueError("this tokenizer gives two labels the same first token: label_weight needs one token to decide a label")
    return Decisions(bars, frozenset(spaces), firsts)


def decision_positions(input_ids, labels, decisions: Decisions):
    """[batch, length] booleans: the positions whose next token, trained on, decides a label: a bar,
    or a space right after one."""
    import torch

    def holds(ids, tokens):
        return torch.isin(ids, torch.tensor(sorted(tokens) or [-1], device=ids.device))

    ends_bar = holds(input_ids, decisions.bars)
    ends_bar[:, 1:] |= holds(input_ids[:, 1:], decisions.spaces) & ends_bar[:, :-1].clone()
    decides = holds(input_ids[:, 1:], decisions.firsts) & (labels[:, 1:] != -100)
    positions = torch.zeros_like(input_ids, dtype=torch.bool)
    positions[:, :-1] = ends_bar[:, :-1] & decides
    return positions


def weigh_decisions(model, weight: float, decisions: Decisions):
    """Make `model`'s backward pass weigh decision tokens by `weight`. Returns `set_batch(input_ids,
    labels)`, to call before each forward. The hook sits on the decoder's final norm, whose output
    is the hidden state the LM head reads (also under TRL's fused LM head)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    norm = getattr(decoder, "norm", None)
    if norm is None:
        raise ValueError(f"label_weight: {type(model).__name__} has no decoder.norm to hook (a Llama-style model is expected)")
    batch = {}

    def set_batch(input_ids, labels):
        batch["scale"] = 1 + (weight - 1) * decision_positions(input_ids, labels, decisions).unsqueeze(-1).float()

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        scale = batch.get("scale")
        if hidden.requires_grad and scale is not None and scale.shape[:2] == hidden.shape[:2]:
            hidden.register_hook(lambda grad: grad * scale.to(grad.dtype))

    norm.register_forward_hook(hook)
    return set_batch


def decision_weighted(trainer_class, weight: float, tokenizer, answer: Answer = "numbered"):
    """`trainer_class` (TRL's SFTTrainer) whose training weighs decision tokens by `weight`."""

    class DecisionWeightedTrainer(trainer_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._set_batch = weigh_decisions(self.model, weight, decision_tokens(tokenizer, answer))

        def compute_loss(self, model, inputs, *args, **kwargs):
            self._set_batch(inputs["input_ids"], inputs["labels"])
            return super().compute_loss(model, inputs, *args, **kwargs)

    return DecisionWeightedTrainer
