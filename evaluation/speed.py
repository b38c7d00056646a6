"""Speed benchmark: the multi-call teacher against the single-pass student on the same engine,
the same base model, the same hardware and the same dialogues.

    python -m evaluation.speed --model smollm2-135m-instruct --adapter runs/student/smollm2_cpu \\
        --source vista --input ../shared/data/vista_human_dev.json --out runs/speed

One vLLM engine serves both (prefix caching on, no completion cache): the teacher batched across
dialogues in waves (its strongest fair setting), the student with its LoRA adapter. Prints a
markdown table and writes speed.json and speed.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from fastvista.config import DataSelection, load_dialogues
from fastvista.llm import BackendConfig, make_backend
from fastvista.scheduler import run
from fastvista.records_io import read_scored
from infer.student import StudentConfig, score_dialogue
from synth.pipeline import TeacherConfig, label_dialogue


def measure(name: str, dialogues, machine, backend, out: Path) -> dict:
    path = out / f"{name}.jsonl"
    path.unlink(missing_ok=True)
    start = time.perf_counter()
    stats = run(dialogues, machine, lambda: backend, path, progress=True, desc=name)
    wall = time.perf_counter() - start
    turns = [t for d in read_scored(path) for t in d.turns]
    return {
        "turns": len(turns),
        "wall_seconds": round(wall, 2),
        "turns_per_second": round(len(turns) / wall, 3),
        "seconds_per_turn": round(wall / len(turns), 3),
        "rounds": stats.rounds,
        "calls_per_turn": round(statistics.mean(t.usage.calls for t in turns), 2),
        "prompt_tokens_per_turn": round(statistics.mean(t.usage.prompt_tokens for t in turns), 1),
        "completion_tokens_per_turn": round(statistics.mean(t.usage.completion_tokens for t in turns), 1),
    }


def table(result: dict) -> str:
    rows = ["| scorer | turns | calls/turn | prompt tok/turn | completion tok/turn | rounds | wall s | turns/s |",
            "|---|---|---|---|---|---|---|---|"]
    for name in ("teacher", "student"):
        r = result[name]
        rows.append(f"| {name} | {r['turns']} | {r['calls_per_turn']} | {r['prompt_tokens_per_turn']} | "
                    f"{r['completion_tokens_per_turn']} | {r['rounds']} | {r['wall_seconds']} | {r['turns_per_second']} |")
    rows.append(f"\nspeedup (turns/s, student over teacher): **{result['speedup']}x** on {result['engine']}")
    return "\n".join(rows)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Base model of both (embedded name, folder or hub id).")
    parser.add_argument("--adapter", help="The student's LoRA adapter folder (without one, the single pass runs on the base model: the same shape of work).")
    parser.add_argument("--input", required=True)
    parser.add_argument("--source", default="jsonl")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--out", type=Path, default=Path("runs/speed"))
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--kv-cache-gb", type=float, default=2.0)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dialogues = load_dialogues(DataSelection(input=args.input, source=args.source, limit=args.limit), None)
    config = BackendConfig(kind="vllm", model=args.model, dtype=args.dtype, max_model_len=args.max_model_len,
                           kv_cache_memory_bytes=int(args.kv_cache_gb * 2**30),
                           lora_adapters={"student": args.adapter} if args.adapter else {}, max_lora_rank=64)
    backend = make_backend(config)
    student = StudentConfig(adapter="student" if args.adapter else None)
    result = {
        "engine": f"vllm ({args.dtype}, prefix caching) on {args.model}" + (" + LoRA adapter" if args.adapter else ""),
        "dialogues": len(dialogues),
        "teacher": measure("teacher", dialogues, lambda d: label_dialogue(d, TeacherConfig()), backend, args.out),
        "student": measure("student", dialogues, lambda d: score_dialogue(d, student, True), backend, args.out),
    }
    result["speedup"] = round(result["student"]["turns_per_second"] / result["teacher"]["turns_per_second"], 2)
    (args.out / "speed.json").write_text(json.dumps(result, indent=2))
    (args.out / "speed.md").write_text(table(result) + "\n")
    print(table(result))
    return result


if __name__ == "__main__":
    main()
