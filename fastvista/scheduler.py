"""The run loop: drives many dialogues' state machines (fastvista.protocol) to completion on one
backend and writes each result the moment its dialogue finishes.

- **Waves** (`waves`): each round, the pending requests of every open dialogue go to the engine
  as one batch, so the engine stays full although each dialogue is sequential.
- **Continuous** (`continuous`): each dialogue's calls go out on their own, its next ones as soon
  as its last return: no wave waits for its longest answer. In-process vLLM is stepped on this
  thread and takes each call into its running batch; servers and hosted APIs get each call on a
  thread and batch whatever is in flight.
- **Resume**: finished dialogues are appended and fsynced at once; a killed run resumes by
  skipping the dialogues already written (if their input and settings are unchanged) and
  answering the rest from the call cache.
- **Fail closed**: a dialogue whose machine raises `ScoringFailed` is reported in failed.jsonl
  with its reason, never written as a result, and tried again by the next run.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from pydantic import ValidationError
from tqdm import tqdm

from fastvista.llm import Backend, ChatRequest, Completion
from fastvista.protocol import Machine, ScoringFailed
from fastvista.records_io import RecordError, read_scored, to_json_line, write_jsonl
from fastvista.schema import Dialogue, ScoredDialogue


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
    engine_start_seconds: float = 0.0  # building the backend (an engine start), inside wall_seconds
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
            try:
                record = ScoredDialogue.model_validate_json(raw)
            except ValidationError as e:
                if not raw.endswith(b"\n"):
                    break  # torn last line: a run killed mid-write
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
    elif good_bytes and not raw.endswith(b"\n"):
        with open(path, "ab") as f:  # a whole last record whose newline was lost: keep it, end its line
            f.write(b"\n")
    return done


def changed_input(path: Path, dialogue_id: str) -> StaleResults:
    return StaleResults(f"{path}: dialogue {dialogue_id!r} was scored from another version of it (the input "
                        "or the data selection changed); write to another output folder")


def check_resume(path: Path, provenance: dict, dialogues: list[Dialogue]) -> None:
    """What `run` would refuse on reaching it, refused before any engine starts: results in `path`
    made with other settings, or from another version of a dialogue of `dialogues`."""
    done = finished(path, provenance)
    changed = next((d.id for d in dialogues if d.id in done and done[d.id] != d), None)
    if changed is not None:
        raise changed_input(path, changed)


HELD_LOCKS = "FASTVISTA_HELD_LOCKS"  # folders locked by this process or the commands that started it


def _lock_holder(folder: Path) -> str | None:
    """The pid written in `folder`'s lock while another run holds it; None when it is free."""
    with open(folder / ".lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            return lock.read().strip() or "?"
        fcntl.flock(lock, fcntl.LOCK_UN)
    return None


@contextmanager
def folder_lock(folder: Path):
    """One run at a time per output folder, and none inside another run's folder, nor around one
    (a run writes its sub-folders): a second one would append duplicates. A command's own
    sub-commands (a learning curve's scoring) inherit its locks through HELD_LOCKS."""
    folder.mkdir(parents=True, exist_ok=True)
    here, held = folder.resolve(), set(filter(None, os.environ.get(HELD_LOCKS, "").split(os.pathsep)))
    around = [p for p in here.parents if str(p) not in held and (p / ".lock").is_file()]
    inside = [Path(root) for root, _, files in os.walk(here) if ".lock" in files and Path(root) != here and root not in held]
    for other in around + inside:
        pid = _lock_holder(other)
        if pid is not None:
            raise RuntimeError(f"another run (pid {pid}) is writing to {other}, {'which holds' if other in around else 'inside'} "
                               f"{folder}; wait for it, stop it, or write to another output folder")
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
        before = os.environ.get(HELD_LOCKS)
        os.environ[HELD_LOCKS] = os.pathsep.join(sorted(held | {str(here)}))
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(HELD_LOCKS, None)
            else:
                os.environ[HELD_LOCKS] = before


def locked_folder(main: Callable) -> Callable:
    """A stage's `main(tree, out_dir, ...)` run whole under the output folder's lock, so a second
    run on the folder is refused before it writes anything there."""

    @functools.wraps(main)
    def locked(tree: dict, out_dir: Path, *args, **kwargs):
        with folder_lock(out_dir):
            return main(tree, out_dir, *args, **kwargs)

    return locked


Schedule = Literal["waves", "continuous"]
SCHEDULES = get_args(Schedule)


class _Run:
    """One run's state: the open dialogues (each with its machine and pending requests), the
    input still to start, the output file and the counts."""

    def __init__(self, dialogues: Iterable[Dialogue], machine: Callable[[Dialogue], Machine[ScoredDialogue]], out, failed_out,
                 done: dict[str, Dialogue], out_path: Path, max_active: int, provenance: dict, bar: tqdm, continuous: bool):
        self.source: Iterator[Dialogue] = iter(dialogues)
        self.machine, self.out, self.failed_out, self.done, self.out_path = machine, out, failed_out, done, out_path
        self.max_active, self.provenance, self.bar, self.continuous = max_active, provenance, bar, continuous
        self.active: dict[str, tuple[Machine, list[ChatRequest]]] = {}
        self.steps: dict[str, int] = {}  # sequential calls each open dialogue has waited for (continuous)
        self.scored_turns: dict[str, int] = {}  # of each open dialogue, to count what a failure leaves unscored
        self.seen: set[str] = set()
        self.stats = RunStats()

    def refill(self) -> None:
        """Open dialogues from the input until `max_active` are open; skip duplicates and the
        dialogues already written (refusing one whose input changed since)."""
        while len(self.active) < self.max_active:
            d = next(self.source, None)
            if d is None:
                return
            if d.id in self.seen or d.id in self.active:
                self.stats.duplicates.append(d.id)
                continue
            self.seen.add(d.id)
            if d.id in self.done:
                if self.done[d.id] != d:
                    raise changed_input(self.out_path, d.id)
                self.stats.resumed += 1
                self.bar.update(1)
                continue
            self.start(d)

    def start(self, d: Dialogue) -> None:
        gen = self.machine(d)
        self.steps[d.id] = 0
        self.scored_turns[d.id] = len(d.scored_indices())
        try:
            self.active[d.id] = (gen, next(gen))
        except StopIteration as stop:
            self.close(d.id, result=stop.value)
        except ScoringFailed as e:
            self.close(d.id, failure=e)

    def advance(self, i: str, answers: list[Completion]) -> None:
        """Hand a dialogue its answers: it asks again, or it is finished (written) or failed."""
        gen, _ = self.active[i]
        self.steps[i] += 1
        try:
            self.active[i] = (gen, gen.send(answers))
        except StopIteration as stop:
            self.close(i, result=stop.value)
        except ScoringFailed as e:
            self.close(i, failure=e)

    def close(self, i: str, result: ScoredDialogue | None = None, failure: ScoringFailed | None = None) -> None:
        self.active.pop(i, None)
        if self.continuous:  # rounds: the longest chain of calls any dialogue waited for
            self.stats.rounds = max(self.stats.rounds, self.steps[i])
        del self.steps[i]
        turns = self.scored_turns.pop(i)
        if failure is not None:
            report = {"id": i, "reason": str(failure), "unscored_turns": turns}
            self.stats.failed.append(report)
            if self.failed_out is not None:
                self.failed_out.write(to_json_line(report))
                self.failed_out.flush()
        else:
            self.write(result)
        self.bar.update(1)

    def write(self, result: ScoredDialogue) -> None:
        result.provenance = self.provenance
        self.out.write(to_json_line(result))
        self.out.flush()
        os.fsync(self.out.fileno())
        self.stats.labelled += 1

    def count(self, completions: list[Completion]) -> None:
        s = self.stats
        s.calls += len(completions)
        s.cached_calls += sum(c.cached for c in completions)
        s.prompt_tokens += sum(c.prompt_tokens for c in completions)
        s.completion_tokens += sum(c.completion_tokens for c in completions)
        self.bar.set_postfix(calls=s.calls, cached=s.cached_calls, tokens=s.prompt_tokens + s.completion_tokens,
                             failed=len(s.failed), active=len(self.active))

    def waves(self, backend: Backend) -> None:
        """Each round: every open dialogue's pending requests as one batch."""
        while self.active:
            ids = list(self.active)
            completions = backend.generate([r for i in ids for r in self.active[i][1]])
            self.stats.rounds += 1
            self.count(completions)
            offset = 0
            for i in ids:
                n = len(self.active[i][1])
                self.advance(i, completions[offset : offset + n])
                offset += n
            self.refill()

    def continuously(self, backend: Backend) -> None:
        """One call per open dialogue in flight; each dialogue advances the moment its call returns.
        An engine this thread steps (in-process vLLM) is stepped here; a backend that takes
        concurrent calls (openai) gets each call on a thread of its own. The machines, the output
        and the counts stay on this thread."""
        if getattr(backend, "stepping", False):
            self.keep_in_flight(backend)
        elif getattr(backend, "concurrent", False):
            with ThreadPoolExecutor(max_workers=self.max_active) as pool:
                self.keep_in_flight(_InThreads(backend, pool))
        else:
            raise ValueError(f"the continuous schedule needs a backend that takes calls as they come (vllm in process, or openai, "
                             f"e.g. vllm serve); {backend.name} does not: use the waves schedule")

    def keep_in_flight(self, calls) -> None:
        """Each open dialogue's pending calls submitted at once; its answers handed back as the
        backend returns them, and its next calls submitted then. A run that stops midway abandons
        what is still in flight, so none of it answers a later call."""
        flying: dict = {}  # ticket -> dialogue

        def send_waiting() -> None:
            busy = set(flying.values())
            for i, (_, requests) in list(self.active.items()):
                if i not in busy:
                    flying[calls.submit(requests)] = i

        try:
            send_waiting()
            while flying:
                for ticket, completions in calls.step():
                    i = flying.pop(ticket)
                    self.count(completions)
                    self.advance(i, completions)
                self.refill()
                send_waiting()
        except BaseException:
            calls.abandon()
            raise


class _InThreads:
    """`submit` / `step` / `abandon` over a backend whose blocking `generate` takes concurrent
    calls: each call on a thread of the pool."""

    def __init__(self, backend: Backend, pool: ThreadPoolExecutor):
        self.backend, self.pool, self.flying = backend, pool, set()

    def submit(self, requests: list[ChatRequest]) -> Future:
        future = self.pool.submit(self.backend.generate, requests)
        self.flying.add(future)
        return future

    def step(self) -> list[tuple[Future, list[Completion]]]:
        done, self.flying = wait(self.flying, return_when=FIRST_COMPLETED)
        return [(future, future.result()) for future in done]

    def abandon(self) -> None:
        for future in self.flying:
            future.cancel()


def run(
    dialogues: Iterable[Dialogue],
    machine: Callable[[Dialogue], Machine[ScoredDialogue]],
    backend_factory: Callable[[], Backend],
    out_path: Path,
    max_active: int = 256,
    total: int | None = None,
    provenance: dict | None = None,
    progress: bool = True,
    desc: str = "dialogues",
    schedule: Schedule = "waves",
    failed_out=None,
) -> RunStats:
    """Run `machine(dialogue)` to completion for every dialogue, appending results to `out_path`
    (and failures, as they happen, to the open file `failed_out`). The backend is built when the
    first dialogue needs a call, so a finished run re-run starts no engine."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: one of {', '.join(SCHEDULES)}")
    start = time.perf_counter()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = finished(out_path, provenance)
    bar = tqdm(total=total, unit="dlg", desc=desc, disable=not progress, dynamic_ncols=True)
    with open(out_path, "a", encoding="utf-8") as out:
        state = _Run(dialogues, machine, out, failed_out, done, out_path, max_active, provenance or {}, bar, schedule == "continuous")
        state.refill()
        if state.active:
            started = time.perf_counter()
            backend = backend_factory()
            state.stats.engine_start_seconds = round(time.perf_counter() - started, 2)
            state.continuously(backend) if schedule == "continuous" else state.waves(backend)
    bar.close()
    state.stats.wall_seconds = round(time.perf_counter() - start, 2)
    return state.stats


def run_reporting_failures(dialogues, machine, backend_factory, results: Path, failed: Path | None = None, **options) -> RunStats:
    """`run`, its failures written as they happen to `failed` (by default failed.jsonl beside
    `results`: the dialogues this run could not score, with reasons; the next run tries them
    again). The file is replaced only when the run ends, so a crash or a refusal keeps the last
    run's reasons."""
    failed = failed or results.parent / "failed.jsonl"
    results.parent.mkdir(parents=True, exist_ok=True)
    partial = failed.with_name(failed.name + ".partial")
    with open(partial, "w", encoding="utf-8") as failed_out:
        stats = run(dialogues, machine, backend_factory, results, failed_out=failed_out, **options)
    partial.replace(failed)
    return stats


def read_failed(folder: Path) -> list[dict]:
    """The dialogues a run in `folder` could not score, each with its reason (failed.jsonl)."""
    path = Path(folder) / "failed.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] if path.exists() else []


def run_to_folder(
    dialogues: list[Dialogue],
    machine: Callable[[Dialogue], Machine[ScoredDialogue]],
    backend_factory: Callable[[], Backend],
    results: Path,
    skipped: list[dict],
    provenance: dict,
    max_active: int,
    progress: bool,
    desc: str,
    schedule: Schedule = "waves",
) -> tuple[list[ScoredDialogue], dict]:
    """`run`, and what every stage writes beside its results so that every input is accounted
    for: `skipped.jsonl` (bad inputs, dialogues the selection dropped and duplicate ids, each with
    its reason) and `failed.jsonl` (dialogues whose calls or answers failed in this run, written
    as they fail to failed.jsonl.partial, which replaces it when the run ends; the next run tries
    them again). Both describe this run from its start. The
    caller holds the folder's lock (`folder_lock`). Returns the selected dialogues' results
    (resumed ones included) and the run's part of the summary."""
    folder = results.parent
    write_jsonl(folder / "skipped.jsonl", skipped)
    stats = run_reporting_failures(dialogues, machine, backend_factory, results, max_active=max_active, total=len(dialogues),
                                   provenance=provenance, progress=progress, desc=desc, schedule=schedule)
    reports = list(skipped) + [{"id": i, "reason": "duplicate id: done once"} for i in stats.duplicates]
    write_jsonl(folder / "skipped.jsonl", reports)
    scored = read_scored(results, {d.id for d in dialogues}) if results.exists() else []
    run_report = {"inputs_skipped": len(reports), "failed_dialogues": len(stats.failed),
                  "failed_dialogues_scored_turns": sum(f["unscored_turns"] for f in stats.failed),
                  "this_run": {**stats.__dict__, "duplicates": len(stats.duplicates), "failed": len(stats.failed)},
                  "provenance": provenance}
    return scored, run_report
