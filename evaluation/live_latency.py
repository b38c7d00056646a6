"""Live latency: seconds to score one new assistant turn through the live API (infer/live.py)
on a served engine, for the student and the teacher, with 1 and 8 conversations at once.

    fastvista eval live-latency -c configs/eval/live_latency_cpu.yaml -o runs/live_latency \\
        --set student_model=runs/student/NAME/merged

Each scorer gets its own `vllm serve`, started here one at a time so it has the machine alone:
the student on its weights, the teacher on its own model with its shipped settings. A session
replays one dialogue as a guard sees it: user turns and unreferenced assistant turns join its
state, and each scored assistant turn is timed from the call to its result. With N sessions at
once, N threads share the server (which batches their calls) and every level scores the same
dialogues. One turn before the timing warms the server up, and each level starts with the
server's prefix cache emptied, so no level is served by what an earlier one cached. A call is
not retried: a failed turn ends its session, which is reported with its reason and none of its
turns is timed; the command then exits with an error, after writing what it measured.
Writes live_latency.json and live_latency.md.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fastvista.config import DataSelection, load_config, load_dialogues
from fastvista.llm import BackendConfig, make_backend
from fastvista.memory import initial_store
from fastvista.models import resolve_model
from fastvista.schema import Dialogue
from fastvista.infer.live import DialogueState, LiveScorer, LiveTeacher
from fastvista.infer.run import check_student_format, trained_rendering
from fastvista.infer.serve import reset_prefix_cache, running, serve_command, served_dtype
from fastvista.infer.student import StudentConfig
from fastvista.synth.pipeline import TeacherConfig

Scorer = Literal["student", "teacher"]


class LiveLatencyConfig(BaseModel):
    """Settings of `fastvista eval live-latency` (configs/eval/live_latency_cpu.yaml)."""

    model_config = ConfigDict(extra="forbid")

    student_model: str  # the per-turn student's merged weights (embedded name or folder)
    teacher_config: str = "configs/synth/teacher_vllm_cpu.yaml"  # the teacher's model and settings
    data: DataSelection
    sessions: list[int] = Field(default_factory=lambda: [1, 8])  # conversations scored at once
    scorers: list[Scorer] = Field(default_factory=lambda: ["student", "teacher"])
    max_model_len: int = 4096
    kv_cache_gb: float = 4.0
    dtype: str = "bfloat16"  # float32 on a CPU without native bf16 unless keep_bf16_on_cpu (fastvista/precision.py)
    keep_bf16_on_cpu: bool = False
    port: int = 8013
    timeout: float = 600  # seconds one call may take before it is an error (never retried)


def percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def fresh_state(scorer, dialogue: Dialogue) -> DialogueState:
    return DialogueState(store=initial_store(dialogue.knowledge_init, scorer.config.max_store_claims))


def warm_up(scorer, dialogue: Dialogue) -> None:
    """Score the first scored turn once, untimed: a fresh server's first calls pay its warm-up."""
    state = fresh_state(scorer, dialogue)
    index = dialogue.scored_indices()[0]
    for turn in dialogue.turns[:index]:
        state = state.with_turn(turn.role, turn.text)
    scorer.score(state, dialogue.turns[index].text, dialogue.turns[index].reference)


def replay(scorer, dialogue: Dialogue, stop: threading.Event | None = None) -> dict:
    """One guarded conversation: seconds per scored turn, or the failure that ended it (then no
    turn of it is timed: the turns before a failure are the short-history, fast ones)."""
    seconds, calls = [], 0
    try:
        state = fresh_state(scorer, dialogue)
        for index, turn in enumerate(dialogue.turns):
            if stop is not None and stop.is_set():
                return {"dialogue": dialogue.id, "seconds": [], "calls": 0, "failed": "stopped"}
            if not turn.scored:
                state = state.with_turn(turn.role, turn.text)
                continue
            start = time.perf_counter()
            result, state = scorer.score(state, turn.text, turn.reference)
            seconds.append(time.perf_counter() - start)
            calls += result.usage.calls
    except Exception as e:  # noqa: BLE001 - a guard's failure is a result here: reported with its reason
        where = f"turn {index}: " if "index" in locals() else ""
        return {"dialogue": dialogue.id, "seconds": [], "calls": 0, "failed": f"{where}{type(e).__name__}: {e}"}
    return {"dialogue": dialogue.id, "seconds": seconds, "calls": calls, "failed": None}


def level(scorer, dialogues: list[Dialogue], sessions: int) -> dict:
    """Every dialogue replayed, `sessions` of them at a time; an interrupt stops every session."""
    stop = threading.Event()
    start = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=sessions)
    try:
        runs = list(pool.map(lambda d: replay(scorer, d, stop), dialogues))
    except BaseException:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    wall = time.perf_counter() - start
    seconds = [s for r in runs for s in r["seconds"]]
    return {
        "sessions": sessions,
        "timed_turns": len(seconds),
        "p50_s": percentile(seconds, 50),
        "p95_s": percentile(seconds, 95),
        "mean_s": round(float(np.mean(seconds)), 3) if seconds else None,
        "max_s": round(max(seconds), 3) if seconds else None,
        "turns_per_s": round(len(seconds) / wall, 3),
        "calls_per_turn": round(sum(r["calls"] for r in runs) / len(seconds), 2) if seconds else None,
        "failed_sessions": [{"dialogue": r["dialogue"], "reason": r["failed"]} for r in runs if r["failed"]],
    }


def scorer_setup(name: Scorer, args: LiveLatencyConfig) -> tuple[str, object]:
    """The model a scorer is served on, and a factory of its live scorer over a backend."""
    if name == "student":
        student = StudentConfig(adapter=None, **trained_rendering(args.student_model))
        check_student_format(BackendConfig(kind="vllm", model=args.student_model), student)
        return resolve_model(args.student_model), lambda backend: LiveScorer(backend, student)
    tree = load_config(args.teacher_config, [])
    model = (tree.get("backend") or {}).get("model")
    if not model:
        raise ValueError(f"{args.teacher_config}: backend.model is missing (the teacher's model)")
    teacher = TeacherConfig.model_validate(tree.get("teacher", {}))
    LiveTeacher(None, teacher)  # refuses settings live scoring cannot use, before any server starts
    return resolve_model(model), lambda backend: LiveTeacher(backend, teacher)


def table(result: dict) -> str:
    rows = ["| scorer | model | sessions | timed turns | p50 s | p95 s | mean s | turns/s | calls/turn | failed sessions |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in result["scorers"].items():
        for lv in r["levels"]:
            rows.append(f"| {name} | {r['model']} | {lv['sessions']} | {lv['timed_turns']} | {lv['p50_s']} | {lv['p95_s']} | "
                        f"{lv['mean_s']} | {lv['turns_per_s']} | {lv['calls_per_turn']} | {len(lv['failed_sessions'])} |")
    return "\n".join(rows) + f"\n\nEngine: {result['engine']}; {result['dialogues']} dialogues, {result['scored_turns']} scored turns.\n"


def main(args: LiveLatencyConfig, out: Path) -> dict:
    if not args.sessions or min(args.sessions) < 1:
        raise ValueError("sessions: give one or more counts of at least 1")
    selected = load_dialogues(args.data, None)
    dialogues = [d for d in selected if d.scored_indices()]
    if not dialogues:
        raise ValueError(f"{args.data.input}: no dialogue with a scored turn")
    if max(args.sessions) > len(dialogues):
        raise ValueError(f"sessions: {max(args.sessions)} at once need as many dialogues; {args.data.input} selects {len(dialogues)}")
    setups = {name: scorer_setup(name, args) for name in args.scorers}  # every setting checked before any server starts
    out.mkdir(parents=True, exist_ok=True)
    dtypes = {name: served_dtype(model, args.dtype, args.keep_bf16_on_cpu) for name, (model, _) in setups.items()}
    result = {"engine": f"vllm serve ({', '.join(sorted(set(dtypes.values())))}, {args.kv_cache_gb} GiB KV cache)", "dialogues": len(dialogues),
              "dialogues_without_scored_turn": len(selected) - len(dialogues),
              "scored_turns": sum(len(d.scored_indices()) for d in dialogues), "settings": args.model_dump(), "scorers": {}}
    url = f"http://127.0.0.1:{args.port}/v1"
    for name, (model, make_scorer) in setups.items():
        cmd = serve_command(model, {}, port=args.port, max_model_len=args.max_model_len, dtype=dtypes[name],
                            kv_cache_memory_bytes=int(args.kv_cache_gb * 2**30))
        with running(cmd, url, out / f"server_{name}.log", benchmark=True):
            backend = make_backend(BackendConfig(kind="openai", model=model, base_url=url, concurrency=256, timeout=args.timeout,
                                                 max_retries=0))
            scorer = make_scorer(backend)
            try:
                warm_up(scorer, dialogues[0])
            except Exception as e:
                raise RuntimeError(f"{name}: the warm-up turn failed ({type(e).__name__}: {e}); see {out / f'server_{name}.log'}") from e
            levels = []
            for n in args.sessions:
                reset_prefix_cache(url)
                levels.append(level(scorer, dialogues, n))
        result["scorers"][name] = {"model": model, "levels": levels}
        (out / "live_latency.json").write_text(json.dumps(result, indent=2))
    (out / "live_latency.md").write_text(table(result))
    print(table(result))
    failed = sum(len(lv["failed_sessions"]) for r in result["scorers"].values() for lv in r["levels"])
    if failed:
        raise RuntimeError(f"{failed} sessions failed (each with its reason in {out / 'live_latency.json'}); their turns are not timed")
    return result
