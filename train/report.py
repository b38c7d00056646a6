"""What a training run reports beyond the loss: the loss plot, steady throughput and the parse rate."""

from __future__ import annotations

from pathlib import Path


def plot_losses(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if record["loss"]:
        ax.plot([p["step"] for p in record["loss"]], [p["loss"] for p in record["loss"]], label="train")
    if record["eval_loss"]:
        ax.plot([p["step"] for p in record["eval_loss"]], [p["eval_loss"] for p in record["eval_loss"]], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (completion tokens)")
    ax.set_title(f"student SFT: {Path(record['base_model']).name} on {record['train_file']}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def steady_tokens_per_s(step_seconds: dict[int, float], log_history: list[dict]) -> float | None:
    """Train tokens/s after the first logged step, counting only the steps' own time: start-up,
    warm-up, evaluations and checkpoints do not count.

    `step_seconds` maps each optimizer step to the seconds it took; the trainer logs the running
    count of trained (non-padding) tokens, `num_tokens`, at its logging steps.
    """
    tokens = {h["step"]: h["num_tokens"] for h in log_history if "num_tokens" in h and h.get("step") in step_seconds}
    steps = sorted(tokens)
    if len(steps) < 2:
        return None
    first, last = steps[0], steps[-1]
    seconds = sum(t for step, t in step_seconds.items() if first < step <= last)
    return (tokens[last] - tokens[first]) / seconds if seconds > 0 else None


def answer_reader(example: dict):
    """How a student's answer to a training example is read, and the tokens it may take: one
    block of claims per marked turn for a dialogue-level (window) example, one for a per-turn one."""
    from fastvista.contract import BEFORE_OPTIONS
    from fastvista.single_pass import parse_output
    from fastvista.window_pass import message_headers, parse_window_output

    if not example.get("format"):
        raise ValueError(f"example {example.get('id')!r} does not record its format: write the training set again")
    if example["format"].get("turns_per_call", 1) == 1:
        answer = {**BEFORE_OPTIONS, **example["format"]}["answer"]
        return (lambda text: parse_output(text, answer)), 256
    turns = sum(h.startswith("[TURN ") for h in message_headers(example["prompt"][-1]["content"]))
    if not turns:  # an empty answer would read as a whole window of nothing
        raise ValueError(f"example {example.get('id')!r} is a dialogue-level example with no marked turn in its prompt")
    return (lambda text: parse_window_output(text, turns)), 256 * turns


def parse_rate(base: str, adapter: str, examples: list[dict], dtype: str | None) -> dict:
    """Greedy answers of the trained student to validation prompts: the share that parses."""
    from fastvista.llm import BackendConfig, ChatRequest, make_backend
    from fastvista.text import FormatError

    backend = make_backend(BackendConfig(kind="hf", model=base, dtype=dtype or "auto", lora_adapters={"student": adapter}))
    readers = [answer_reader(e) for e in examples]
    requests = [ChatRequest(messages=e["prompt"], max_tokens=budget, lora="student") for e, (_, budget) in zip(examples, readers)]
    parsed = 0
    for completion, (read, _) in zip(backend.generate(requests), readers):
        try:
            read(completion.text)
            parsed += 1
        except FormatError:
            pass
    return {"examples": len(examples), "parsed": parsed, "share": parsed / len(examples)}
