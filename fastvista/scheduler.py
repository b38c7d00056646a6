"""Drives many dialogues' state machines (the teacher's or the student's) at once: each round,
the pending requests of every active dialogue go to the engine as one batch (or, on the
continuous schedule, each dialogue's calls go out on their own as soon as its last ones return),
so the engine stays full although each dialogue is sequential. Finished dialogues are appended
(and fsynced) to the output at once; a killed run resumes by skipping the dialogues already
written and answering the rest from the call cache.

Fail closed: a call the backend could not answer, or an answer that never reads, raises
`ScoringFailed` inside the dialogue's state machine; the dialogue is reported in failed.jsonl with
its reason, never written as a result, and tried again by the next run.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from pydantic import ValidationError
from tqdm import tqdm

from fastvista.llm import Backend, ChatRequest, Completion
from fastvista.records_io import RecordError, read_scored, to_json_line, write_jsonl
from fastvista.schema import Dialogue, ScoredDialogue, Usage
from fastvista.single_pass import FormatError

Answer = tuple[object, "str | None", Completion]  # parsed value (None if never), last error, completion


class ScoringFailed(RuntimeError):
    """A call that failed or an answer that never read: an error, never a score."""


def check_completion(c: Completion, request: ChatRequest) -> None:
    """A backend error fails the dialogue at once (the backend has done its retrying); an answer cut
    at `max_tokens` is a format error, never a shorter answer."""
    if c.error:
        raise ScoringFailed(f"backend: {c.error}")
    if c.finish_reason == "length":
        raise FormatError(f"answer cut at max_tokens={request.max_tokens}")


def ask(
    requests: list[ChatRequest],
    parse: Callable[[str], object] | list[Callable[[str], object]],
    retries: int,
    retry_temperature: float,
    completions: list[Completion],
) -> Generator[list[ChatRequest], list[Completion], list[Answer]]:
    """Send requests (from inside a state machine); retry answers that `parse` rejects with a
    FormatError, or that were cut at `max_tokens` (one parser for all, or one per request),
    sampling with a new seed each attempt. A backend error raises ScoringFailed (no retry here:
    the backend retried transport errors with the same settings). Every completion received is
    appended to `completions` (for the usage count); returns, per request, the parsed value or
    None, the last error, and the completion that parsed (or the last one)."""
    parsers = parse if isinstance(parse, list) else [parse] * len(requests)
    values: list = [None] * len(requests)
    errors: list[str | None] = [None] * len(requests)
    last: list = [None] * len(requests)
    pending = list(range(len(requests)))
    for attempt in range(retries + 1):
        if not pending:
            break
        batch = [
            requests[i] if attempt == 0 else requests[i].model_copy(update={"temperature": retry_temperature, "seed": attempt})
            for i in pending
        ]
        answers = yield batch
        completions.extend(answers)
        failed = []
        for i, r, c in zip(pending, batch, answers):
            last[i] = c
            try:
                check_completion(c, r)
                values[i], errors[i] = parsers[i](c.text), None
            except FormatError as e:
                errors[i] = f"{e} (attempt {attempt + 1})"
                failed.append(i)
        pending = failed
    return list(zip(values, errors, last))


def gather(machines: list[Generator]) -> Generator[list[ChatRequest], list[Completion], list]:
    """Advance several state machines as one: each round sends all their pending requests in one
    batch and hands each machine its answers; returns their values in order."""
    values: list = [None] * len(machines)
    pending: dict[int, list[ChatRequest]] = {}
    for i, m in enumerate(machines):
        try:
            pending[i] = next(m)
        except StopIteration as stop:
            values[i] = stop.value
    while pending:
        order = list(pending)
        answers = yield [r for i in order for r in pending[i]]
        offset = 0
        for i in order:
            n = len(pending[i])
            try:
                pending[i] = machines[i].send(answers[offset : offset + n])
            except StopIteration as stop:
                values[i] = stop.value
                del pending[i]
            offset += n
    return values


def drive(machine: Generator, backend: Backend):
    """Run one state machine to its end on `backend`, one batch at a time; returns its value."""
    try:
        requests = next(machine)
        while True:
            requests = machine.send(backend.generate(requests))
    except StopIteration as stop:
        return stop.value


def usage_of(completions: list[Completion]) -> Usage:
    return Usage(
        calls=len(completions),
        prompt_tokens=sum(c.prompt_tokens for c in completions),
        completion_tokens=sum(c.completion_tokens for c in completions),
        cached_calls=sum(c.cached for c in completions),
    )


@dataclass
class RunStats:
    labelled: int = 0
    resumed: int = 0
    rounds: int = 0
    calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_seconds: float = 0.0
    duplicates: list[str] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)  # {"id", "reason"} of dialogues not scored this run


class StaleResults(ValueError):
    """Results in the output folder that another input or other settings made."""


def method_of(provenance: dict) -> dict:
    """The part of a provenance that decides the labels. The data selection is left out: which
    dialogues a run takes may grow between runs, and what a selection does to one dialogue (a
    cut after N scored turns) is caught by comparing the stored dialogue with the input."""
    return {k: v for k, v in provenance.items() if k != "data"}


def finished(path: Path, provenance: dict | None = None) -> dict[str, Dialogue]:
    """The dialogues already scored in `path`, by id. Only an unterminated last line (a run killed
    mid-write) is cut off; any other line that does not read is an error naming file and line, so
    resuming never deletes a result. Results made with other settings (model and adapter content,
    prompts, method, data selection) are refused rather than mixed in."""
    if not path.exists():
        return {}
    done: dict[str, Dialogue] = {}
    good_bytes = 0
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.endswith(b"\n"):
                break  # torn last line
            try:
                record = ScoredDialogue.model_validate_json(raw)
            except ValidationError as e:
                raise RecordError(path, n, None, f"not a scored dialogue ({e.errors()[0]['msg']}); "
                                  "fix or remove this line, or write to another output folder") from None
            if provenance is not None and method_of(record.provenance) != method_of(provenance):
                old, new = method_of(record.provenance), method_of(provenance)
                changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                raise StaleResults(f"{path}:{n} was made with other settings (differing: {', '.join(changed)}); "
                                   "resume with the same settings, or write to another output folder")
            done[record.id] = record.dialogue
            good_bytes += len(raw)
    if good_bytes < path.stat().st_size:
        with open(path, "r+b") as f:
            f.truncate(good_bytes)
    return done


@contextmanager
def folder_lock(folder: Path):
    """One run at a time per output folder: a second one would append duplicates."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise RuntimeError(f"another run is writing to {folder} (pid {lock.read().strip() or '?'}); "
                               "wait for it, stop it, or write to another output folder") from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield


Schedule = Literal["waves", "continuous"]
SCHEDULES = get_args(Schedule)


def run(
    dialogues: Iterable[Dialogue],
    machine: Callable[[Dialogue], object],
    backend_factory: Callable[[], Backend],
    out_path: Path,
    max_active: int = 256,
    total: int | None = None,
    provenance: dict | None = None,
    progress: bool = True,
    desc: str = "dialogues",
    schedule: Schedule = "waves",
) -> RunStats:
    """Run `machine(dialogue)` generators to completion, appending results to `out_path`.

    `waves`: each round sends every open dialogue's pending requests as one batch and waits for
    all of them. `continuous`: each dialogue's requests go to the backend on their own, and its
    next requests leave as soon as its answers return, so a long answer holds up no other dialogue
    (the engine behind, `vllm serve`, batches whatever is in flight); needs a backend that takes
    calls from several threads (`openai`). The backend is built on the first batch, so a finished
    run re-run starts no engine.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: one of {', '.join(SCHEDULES)}")
    stats = RunStats()
    start = time.perf_counter()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = finished(out_path, provenance)
    seen: set[str] = set()
    source = iter(dialogues)
    active: dict[str, tuple[object, list]] = {}
    steps: dict[str, int] = {}  # sequential calls each open dialogue has waited for (continuous)
    bar = tqdm(total=total, unit="dlg", desc=desc, disable=not progress, dynamic_ncols=True)

    with open(out_path, "a", encoding="utf-8") as out:

        def finish(result: ScoredDialogue) -> None:
            result.provenance = provenance or {}
            out.write(to_json_line(result))
            out.flush()
            os.fsync(out.fileno())
            stats.labelled += 1
            bar.update(1)

        def fail(i: str, error: ScoringFailed) -> None:
            stats.failed.append({"id": i, "reason": str(error)})
            bar.update(1)

        def start_one(d: Dialogue) -> None:
            gen = machine(d)
            try:
                active[d.id] = (gen, next(gen))
                steps[d.id] = 0
            except StopIteration as stop:
                finish(stop.value)
            except ScoringFailed as e:
                fail(d.id, e)

        def refill() -> None:
            while len(active) < max_active:
                d = next(source, None)
                if d is None:
                    return
                if d.id in seen or d.id in active:
                    stats.duplicates.append(d.id)
                    continue
                seen.add(d.id)
                if d.id in done:
                    if done[d.id] != d:
                        raise StaleResults(f"{out_path}: dialogue {d.id!r} was scored from another version of it (the input or the "
                                           "data selection changed); write to another output folder")
                    stats.resumed += 1
                    bar.update(1)
                    continue
                start_one(d)

        def count(completions: list[Completion]) -> None:
            stats.calls += len(completions)
            stats.cached_calls += sum(c.cached for c in completions)
            stats.prompt_tokens += sum(c.prompt_tokens for c in completions)
            stats.completion_tokens += sum(c.completion_tokens for c in completions)
            bar.set_postfix(calls=stats.calls, cached=stats.cached_calls, tokens=stats.prompt_tokens + stats.completion_tokens, active=len(active))

        def advance(i: str, answers: list[Completion]) -> None:
            """Hand a dialogue its answers: it asks again, or it is finished and written."""
            gen, _ = active[i]
            steps[i] += 1
            try:
                active[i] = (gen, gen.send(answers))
                return
            except StopIteration as stop:
                finish(stop.value)
            except ScoringFailed as e:
                fail(i, e)
            del active[i]
            if schedule == "continuous":  # rounds: the longest chain of calls any dialogue waited for
                stats.rounds = max(stats.rounds, steps[i])
            del steps[i]

        refill()
        if active:
            backend = backend_factory()
            if schedule == "continuous":
                _continuous(backend, active, advance, count, refill, max_active)
            else:
                while active:
                    ids = list(active)
                    completions = backend.generate([r for i in ids for r in active[i][1]])
                    stats.rounds += 1
                    count(completions)
                    offset = 0
                    for i in ids:
                        n = len(active[i][1])
                        advance(i, completions[offset : offset + n])
                        offset += n
                    refill()
    bar.close()
    stats.wall_seconds = round(time.perf_counter() - start, 2)
    return stats


def _continuous(backend: Backend, active: dict, advance: Callable, count: Callable, refill: Callable, max_active: int) -> None:
    """Keep one call per open dialogue in flight; advance each dialogue the moment its call returns.
    The state machines, the output and the counts stay on this thread; only `generate` runs on others."""
    if not getattr(backend, "concurrent", False):
        raise ValueError(f"the continuous schedule needs a backend that takes concurrent calls (openai, e.g. vllm serve); "
                         f"{backend.name} does not: use the waves schedule")
    flying: dict[Future, str] = {}
    with ThreadPoolExecutor(max_workers=max_active) as pool:

        def send_waiting() -> None:
            busy = set(flying.values())
            for i, (_, requests) in list(active.items()):
                if i not in busy:
                    flying[pool.submit(backend.generate, requests)] = i

        send_waiting()
        while flying:
            finished, _ = wait(flying, return_when=FIRST_COMPLETED)
            for future in finished:
                i = flying.pop(future)
                completions = future.result()
                count(completions)
                advance(i, completions)
            refill()
            send_waiting()


def read_failed(folder: Path) -> list[dict]:
    """The dialogues a run in `folder` could not score, each with its reason (failed.jsonl)."""
    path = Path(folder) / "failed.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] if path.exists() else []


def run_to_folder(
    dialogues: list[Dialogue],
    machine: Callable[[Dialogue], object],
    backend_factory: Callable[[], Backend],
    results: Path,
    skipped: list[dict],
    provenance: dict,
    max_active: int,
    progress: bool,
    desc: str,
    schedule: Schedule = "waves",
) -> tuple[list[ScoredDialogue], dict]:
    """`run` under the folder's lock, then what every stage writes beside its results, so every
    input is accounted for: `skipped.jsonl` (bad inputs, dialogues the selection dropped and
    duplicate ids, each with its reason) and `failed.jsonl` (dialogues whose calls or answers
    failed this run; the next run tries them again). Returns the selected dialogues' results
    (resumed ones included) and the run's part of the summary."""
    with folder_lock(results.parent):
        stats = run(dialogues, machine, backend_factory, results, max_active=max_active, total=len(dialogues),
                    provenance=provenance, progress=progress, desc=desc, schedule=schedule)
        reports = list(skipped) + [{"id": i, "reason": "duplicate id: done once"} for i in stats.duplicates]
        write_jsonl(results.parent / "skipped.jsonl", reports)
        write_jsonl(results.parent / "failed.jsonl", stats.failed)
        scored = read_scored(results, {d.id for d in dialogues}) if results.exists() else []
    run_report = {"inputs_skipped": len(reports), "failed_dialogues": len(stats.failed),
                  "this_run": {**stats.__dict__, "duplicates": len(stats.duplicates), "failed": len(stats.failed)},
                  "provenance": provenance}
    return scored, run_report
