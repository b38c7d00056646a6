"""Project only the answer's positions through the LM head when training on a CPU.

TRL 1.16 trains through a fused LM head (`trl.trainer.utils.add_fused_lm_head`) that never builds
the full logits. Where Triton runs (CUDA, XPU) it projects only the positions whose next token is
trained on; elsewhere it projects every position, so that compiling devices see one tile shape.
A CPU compiles nothing, and the student's loss falls on its answer only (about 90 of 700
tokens), so on a CPU the head projected the whole prompt through Qwen2.5's 151,936-word
vocabulary, a dozen elementwise passes a tile, for positions whose loss is zero. The answer's
positions alone give the same loss and gradients at 1.37x the train tokens/s of Qwen2.5-0.5B +
LoRA on a 2-core AVX2 CPU (docs/training-speed.md).
"""

from __future__ import annotations

POSITIONS = ("answer", "all")
CHECKED_TRL = "1.16."  # the TRL whose fused LM head this was read against: its only use of the rule is `compact`


def lm_head_positions(wanted: str) -> str:
    """Set, for this process, what TRL's fused LM head projects on a CPU: 'answer' (the positions
    trained on) or 'all' (TRL's own rule). Returns what is in force: 'all' where this TRL is not
    the one read."""
    import trl
    import trl.trainer.utils as trl_utils

    if wanted not in POSITIONS:
        raise ValueError(f"lm_head_positions must be one of {', '.join(POSITIONS)}, not {wanted!r}")
    rule = getattr(trl_utils, "_use_triton", None)
    trl_rule = getattr(rule, "trl_rule", rule)
    if trl_rule is None:
        return "all"
    if wanted == "all" or not trl.__version__.startswith(CHECKED_TRL):
        trl_utils._use_triton = trl_rule
        return "all"

    def answer_on_cpu(device) -> bool:
        return device.type == "cpu" or trl_rule(device)

    answer_on_cpu.trl_rule = trl_rule
    trl_utils._use_triton = answer_on_cpu
    return "answer"
