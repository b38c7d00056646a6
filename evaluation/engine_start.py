"""Engine start against throughput, per vLLM engine mode: how long a command waits before its
first answer, and how fast it answers after that.

    fastvista eval engine-start --model smollm2-135m-instruct -i data/demo/topical_chat_demo.jsonl -o runs/engine_start

Each (mode, repeat) runs in a fresh process, so each start is what a new command pays. Each mode
has its own, at first empty, vLLM cache folder (OUT/cache/MODE): its first start is cold, and
its second finds the compile cache the first one left. The workload is the
student's prompts for every scored turn of the input (empty stores), answered greedily up to
`max_tokens`, in one batch. Writes engine_start.json and engine_start.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

MODES = ("compiled", "compiled_no_aot", "eager")


def workload(path: str) -> list:
    from fastvista.config import DataSelection, load_dialogues
    from fastvista.llm import ChatRequest
    from fastvista.single_pass import student_messages

    dialogues = load_dialogues(DataSelection(input=path), None)
    return [ChatRequest(messages=student_messages(d, i, []), max_tokens=64) for d in dialogues for i in d.scored_indices()]


def child(mode: str, model: str, path: str, kv_bytes: int) -> dict:
    """One fresh engine: seconds to build it, then to answer the workload, and the dtype it computed
    in (bf16 asked; float32 on a CPU without native bf16, fastvista/precision.py)."""
    from fastvista.llm import BackendConfig, compute_dtype, make_backend

    requests = workload(path)
    config = BackendConfig(kind="vllm", model=model, dtype="bfloat16", engine_mode=mode, kv_cache_memory_bytes=kv_bytes)
    started = time.perf_counter()
    backend = make_backend(config)
    built = time.perf_counter()
    completions = backend.generate(requests)
    done = time.perf_counter()
    tokens = sum(c.completion_tokens for c in completions)
    return {"mode": mode, "dtype": compute_dtype(config), "start_s": round(built - started, 1), "answer_s": round(done - built, 1), "requests": len(completions),
            "completion_tokens": tokens, "tokens_per_s": round(tokens / (done - built), 1)}


def table(rows: list[dict]) -> str:
    lines = ["| mode | run | computed in | engine start (s) | workload (s) | completion tokens/s | requests |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['repeat']} | {r['dtype']} | {r['start_s']} | {r['answer_s']} | {r['tokens_per_s']} | {r['requests']} |")
    return "\n".join(lines)


def main(model: str, path: str, modes: list[str], repeats: int, out: Path, kv_bytes: int) -> list[dict]:
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown engine mode(s) {', '.join(sorted(unknown))}: choose from {', '.join(MODES)}")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in modes:
        cache = out / "cache" / mode
        shutil.rmtree(cache, ignore_errors=True)
        for repeat in range(1, repeats + 1):
            result = out / f"{mode}_{repeat}.json"
            result.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "fastvista.evaluation.engine_start", mode, model, path, str(kv_bytes), str(result)]
            env = {**os.environ, "VLLM_CACHE_ROOT": str(cache.resolve())}
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
            if done.returncode != 0 or not result.exists():
                raise RuntimeError(f"engine mode {mode} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
            rows.append({**json.loads(result.read_text()), "repeat": repeat})
            (out / "engine_start.json").write_text(json.dumps({"model": model, "input": path, "rows": rows}, indent=2))
    (out / "engine_start.md").write_text(table(rows) + "\n")
    print(table(rows))
    return rows


if __name__ == "__main__":  # one fresh engine; its figures go to a file (vLLM logs to stdout)
    mode, model, path, kv, result = sys.argv[1:6]
    Path(result).write_text(json.dumps(child(mode, model, path, int(kv))))
