"""Speed benchmark: the multi-call teacher against the single-pass student on the same engine,
the same base model, the same hardware and the same dialogues.

    fastvista eval speed -c configs/eval/speed_cpu.yaml -o runs/speed \\
        --set model=runs/student/smollm2_cpu/merged --set data.input=runs/speed_input.jsonl \\
        --set window_model=runs/student/smollm2_corpus_window/merged --set max_model_len=8192

Configurations (each on vLLM with prefix caching unless said otherwise):
- `teacher`: the shipped teacher settings (label scores from log-probabilities), batched
  across dialogues in rounds (`schedule: continuous`: each dialogue's next calls join the
  running batch as soon as its last return, for every in-process row); `teacher (text labels)`: labels read from the answer's text. The
  faster of the two is the teacher's strongest configuration.
- `teacher, no prefix cache`: the same pipeline on an engine without prefix caching, as a plain
  per-call pipeline runs.
- `student`: the per-turn single pass, waves of one turn per open dialogue. `student, ended at a
  repeated claim`: the same with each answer ended at its first exactly repeated claim line
  (`student.end_on_repeated_claim`: a looping answer's repeats are merged anyway); claims and
  labels compared with the `student` row's.
- `student + n-gram`: the same with prompt-lookup speculative decoding (drafts copied from the
  prompt: claims copy the turn's words); acceptance counted, greedy outputs compared.
- `prefill alone`: the per-turn student's very prompts, each answered with one token; the rest
  of the student's time is decoding its answers, which no prompt layout can save. `prefill
  alone, reference first`: the same prompts with the reference first, then the store, history
  and turn (the layout a prefix cache reuses most of, `fastvista eval prefix-reuse`): the two
  rows side by side time what that layout would save, without a student trained in it.
- `teacher/student, served, waves|continuous` (with `served: true`): the same pipelines behind
  `vllm serve` (same weights and settings), sent in waves or on the continuous schedule (each
  dialogue's next call leaves as soon as its last returns; the server batches what is in flight).
  Run them alone (`--set served=true --only ...`) so no in-process engine shares the machine.
- `student, dialogue-level` (with `window_model`): one call for up to `window_turns` scored
  turns, its own claims carried as the store, at most `window_max_claims` claims and
  `window_max_tokens` answer tokens a turn (5 x 1,000 need `max_model_len` 8192, for every row of
  the run); and `+ n-gram`. With `window_forced` each window's
  answer is forced to the per-turn student's claims for its turns, so both modes decode the same
  text and the rows measure the mode itself, not how well each model was trained.
The teacher runs on the student's weights (same architecture, same engine), which isolates the
method; with `teacher_model` the teacher rows run on that model instead (the shipped teacher's
own weights: what a user deploying one or the other gets). Each student's recorded format must
match the settings it is scored with. `--only` reruns some rows and keeps
the others from OUT/speed.json, only when those were measured on the same settings, weights and dialogues;
a kept row that replayed or repeated the answers of a row measured again is dropped, and a row
whose base row is neither kept nor asked for is refused before any engine starts.
Every row starts with its engine's prefix cache emptied: no row is served by what an earlier one
cached. Each row's engine stops before the next row's starts (two engines at once do not fit a
small machine), and each row is written to speed.json as soon as it is measured: a run that
stopped is finished with `--only` and the rows it lacks. A dialogue a row could not score is
in ROW.failed.jsonl with its reason; the row's rate counts the turns it scored, and a row that
scored nothing has no rate (`NothingScored`). Prints a markdown table and writes speed.json and
speed.md.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fastvista.config import DataSelection, load_config, load_dialogues
from fastvista.memory import MAX_STORE_CLAIMS, initial_store, stores_before, turn_result
from fastvista.llm import BackendConfig, ChatRequest, make_backend
from fastvista.records_io import read_scored, write_json
from fastvista.protocol import check_completion, usage_of
from fastvista.scheduler import SCHEDULES, Schedule, run_reporting_failures
from fastvista.schema import Usage
from fastvista.models import resolve_model
from fastvista.scoring import scored_dialogue
from fastvista.single_pass import render_messages, student_messages
from fastvista.evaluation.prefix_reuse import LAYOUTS, user_message
from fastvista.window_pass import render_window_target, window_messages, windows
from fastvista.infer.serve import reset_prefix_cache, running, serve_command, served_dtype
from fastvista.infer.run import check_student_format, trained_rendering
from fastvista.infer.student import StudentConfig, check_answer_budget, score_dialogue
from fastvista.synth.pipeline import TeacherConfig, label_dialogue


def forget_prefixes(backend, server: str | None = None) -> None:
    """Each row starts as on a fresh engine: nothing an earlier row cached serves it."""
    if server:
        reset_prefix_cache(server)
    elif hasattr(backend, "reset_prefix_cache"):
        backend.reset_prefix_cache()


class NothingScored(RuntimeError):
    """A row whose every dialogue failed closed: it has no speed, and its failures say why."""

    def __init__(self, row: str, message: str):
        super().__init__(message)
        self.row = row


def failed_rows(configs: dict) -> dict[str, int]:
    """The rows that failed dialogues closed. Their rates count only the turns they scored, while
    the failed dialogues cost time and calls, so no ratio with such a row is a fair comparison."""
    return {name: row["failed_dialogues"] for name, row in configs.items() if row.get("failed_dialogues")}


def measure(name: str, dialogues, machine, backend, out: Path, schedule: str = "waves", server: str | None = None) -> dict:
    path = out / f"{re.sub(r'[^a-z0-9]+', '_', name.lower()).strip('_')}.jsonl"
    failures = path.with_suffix(".failed.jsonl")  # each failed dialogue with its reason, beside the row's results
    path.unlink(missing_ok=True)
    forget_prefixes(backend, server)
    before = backend.speculation() if hasattr(backend, "speculation") else None
    start = time.perf_counter()
    stats = run_reporting_failures(dialogues, machine, lambda: backend, path, failures, total=len(dialogues), progress=True,
                                   desc=name, schedule=schedule)
    wall = time.perf_counter() - start
    turns = [t for d in read_scored(path) for t in d.turns] if path.exists() else []
    if not turns:
        raise NothingScored(name, f"{name}: no dialogue was scored ({len(stats.failed)} failed, e.g. {stats.failed[:1]}; all in {failures}); no speed to report")
    result = {
        "turns": len(turns),
        "wall_seconds": round(wall, 2),
        "turns_per_second": round(len(turns) / wall, 3),
        "rounds": stats.rounds,
        "calls_per_turn": round(stats.calls / len(turns), 2),
        "prompt_tokens_per_turn": round(stats.prompt_tokens / len(turns), 1),
        "completion_tokens_per_turn": round(stats.completion_tokens / len(turns), 1),
        "failed_dialogues": len(stats.failed),
        "schedule": schedule,
        "results": str(path),
        "failures": str(failures),
    }
    after = backend.speculation() if hasattr(backend, "speculation") else None
    if after is not None:
        drafted = {k: after[k] - (before or {}).get(k, 0) for k in ("draft_tokens", "accepted_tokens")}
        result["speculation"] = {**drafted, "acceptance_rate": round(drafted["accepted_tokens"] / drafted["draft_tokens"], 4) if drafted["draft_tokens"] else None}
    return result


def literal_regex(text: str) -> str:
    """A regex that matches `text` only (metacharacters escaped, newlines as \\n)."""
    return "".join(r"\n" if c == "\n" else "\\" + c if c in r"\.^$|?*+()[]{}" else c for c in text)


def forced_windows(dialogue, size: int, claims: dict, history_turns: int):
    """The dialogue-level pass with every window's answer forced to the given claims."""
    store, results = initial_store(dialogue.knowledge_init), []
    for window in windows(dialogue.scored_indices(), size):
        per_turn = [claims[(dialogue.id, i)] for i in window]
        target = render_window_target(per_turn)
        request = ChatRequest(messages=window_messages(dialogue, window, store, history_turns), max_tokens=2048, regex=literal_regex(target))
        [completion] = yield [request]
        check_completion(completion, request)
        errors = [] if completion.text.strip() == target else ["forced answer differs from its target"]
        for k, (index, turn_claims) in enumerate(zip(window, per_turn)):
            result, store = turn_result(index, turn_claims, store, MAX_STORE_CLAIMS, usage_of([completion]) if k == 0 else Usage(), errors)
            results.append(result)
    return scored_dialogue(dialogue, results)


def prompts_alone(dialogue, recorded: dict, student: StudentConfig, order: tuple[str, ...] | None = None):
    """The per-turn student's prompts (stores rebuilt from its recorded answers), each answered
    with one token: the student's time if decoding its answers cost nothing. `order`: its
    sections in another order (a layout of `prefix_reuse.LAYOUTS`), which times that layout's
    prefill without training a student in it."""
    history_turns = student.history_turns
    indices = dialogue.scored_indices()
    replayed = [recorded[(dialogue.id, i)] for i in indices]
    results = []
    for index, result, store in zip(indices, replayed, stores_before(dialogue.knowledge_init, replayed)):
        turn, history = dialogue.turns[index], [(t.role, t.text) for t in dialogue.turns[:index]]
        messages = (student_messages(dialogue, index, store, history_turns, student.layout, student.answer) if order is None
                    else render_messages(user_message(order, history_turns, store, turn.reference, history, turn.text), student.answer))
        request = ChatRequest(messages=messages, max_tokens=1)
        [completion] = yield [request]
        check_completion(completion, request, cut_ok=True)
        results.append(result.model_copy(update={"usage": usage_of([completion])}))
    return scored_dialogue(dialogue, results)


def same_outputs(a: str, b: str) -> dict:
    """How many turns got the very same claims and labels in two runs."""
    x = {(d.id, t.index): [(c.text, c.label) for c in t.claims] for d in read_scored(a) for t in d.turns}
    y = {(d.id, t.index): [(c.text, c.label) for c in t.claims] for d in read_scored(b) for t in d.turns}
    return {"turns": len(x), "identical": sum(x[k] == y.get(k) for k in x)}


def table(result: dict) -> str:
    rows = ["| configuration | turns | calls/turn | prompt tok/turn | completion tok/turn | rounds | wall s | turns/s | vs strongest teacher | vs plain teacher |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    strongest = result["strongest_teacher"]
    plain = result["configurations"].get("teacher, no prefix cache", {}).get("turns_per_second")
    for name, r in result["configurations"].items():
        rows.append(f"| {name} | {r['turns']} | {r['calls_per_turn']} | {r['prompt_tokens_per_turn']} | {r['completion_tokens_per_turn']} | "
                    f"{r['rounds']} | {r['wall_seconds']} | {r['turns_per_second']} | {r['turns_per_second'] / strongest:.2f}x | "
                    + (f"{r['turns_per_second'] / plain:.2f}x |" if plain else "- |"))
    notes = [f"\nEngine: {result['engine']}; {result['dialogues']} dialogues.",
             f"Strongest teacher: {result['strongest_teacher_name']} ({strongest} turns/s)."]
    for name, r in result["configurations"].items():
        if "speculation" in r:
            same = (f"outputs identical to greedy without drafting on {r['identical']['identical']} of {r['identical']['turns']} turns"
                    if "identical" in r else "outputs not compared with greedy without drafting")
            notes.append(f"{name}: {r['speculation']['accepted_tokens']} of {r['speculation']['draft_tokens']} drafted tokens accepted "
                         f"({r['speculation']['acceptance_rate']}); {same}.")
        elif "identical" in r:
            notes.append(f"{name}: the same claims and labels as the row it varies ({DEPENDS[name]}) on "
                         f"{r['identical']['identical']} of {r['identical']['turns']} turns.")
        if "note" in r:
            notes.append(f"{name}: {r['note']}.")
    for name, failed in result.get("rows_with_failed_dialogues", {}).items():
        where = result["configurations"][name].get("failures", "the row's .failed.jsonl")
        notes.append(f"**Not comparable: {name} failed {failed} dialogue(s) closed** (its rate counts only the turns it scored; "
                     f"reasons in {where}); the same command with --only '{name}' measures it again.")
    return "\n".join(rows + notes)


def engine(model: str, args, **changes):
    return make_backend(BackendConfig(kind="vllm", model=model, dtype=args.dtype, keep_bf16_on_cpu=args.keep_bf16_on_cpu, max_model_len=args.max_model_len,
                                      kv_cache_memory_bytes=int(args.kv_cache_gb * 2**30), **changes))


class SpeedConfig(BaseModel):
    """The speed benchmark's settings (`fastvista eval speed -c configs/eval/speed_cpu.yaml`)."""

    model_config = ConfigDict(extra="forbid")

    model: str  # the per-turn student's merged weights (embedded name, folder or hub id); the teacher runs on them too
    window_model: Optional[str] = None  # a dialogue-level student's merged weights (trained on train_window.jsonl)
    window_turns: int = 5  # scored turns per call of the dialogue-level student
    window_forced: bool = False  # force the dialogue-level answers to the per-turn student's claims
    # its answer budget per turn: window_turns of them must fit max_model_len beside the prompt
    # (5 x 1,000 needs max_model_len 8192; configs/score/window_student_cpu.yaml)
    window_max_tokens: int = 1000
    window_max_claims: int = 8
    teacher_config: str = "configs/synth/teacher_vllm_cpu.yaml"  # its teacher section gives the teacher's settings
    teacher_model: Optional[str] = None  # run the teacher rows on these weights (default: the student's)
    data: DataSelection
    speculative_tokens: int = 4  # draft tokens per step of n-gram speculation (0: skip those rows)
    max_model_len: int = 4096
    kv_cache_gb: float = 1.5
    dtype: str = "bfloat16"  # float32 on a CPU without native bf16 unless keep_bf16_on_cpu (fastvista/precision.py)
    keep_bf16_on_cpu: bool = False
    skip_plain: bool = False  # skip the teacher without prefix caching (the slowest row)
    # of the in-process rows: waves, or continuous (each dialogue's next call joins the running
    # batch as soon as its last returns; the served rows name their own)
    schedule: Schedule = "waves"
    only: list[str] = Field(default_factory=list)  # run only these rows; the others are kept from OUT/speed.json
    served: bool = False  # also run teacher and student behind `vllm serve` (same weights and settings)
    port: int = 8011  # of the server that `served` starts
    concurrency: int = 64  # requests in flight to the server at most

    def window_student(self) -> StudentConfig:
        return StudentConfig(adapter=None, turns_per_call=self.window_turns, max_tokens=self.window_max_tokens,
                             max_claims=self.window_max_claims)

    @model_validator(mode="after")
    def _window_answers_fit(self) -> "SpeedConfig":
        """The dialogue-level row's budget (the forced rows keep their own) must fit the context."""
        rows = {WINDOW, f"{WINDOW} + n-gram"}
        if self.window_model and not self.window_forced and (not self.only or rows & set(self.only)):
            check_answer_budget(self.window_student(), self.max_model_len, ("window_max_tokens", "window_turns", "max_model_len"))
        return self


REFERENCE_FIRST = "reference, store, history (8), turn"  # a layout of prefix_reuse.LAYOUTS
PREFILL = "prefill alone (the student prompts, answers replayed)"
PREFILL_REFERENCE_FIRST = "prefill alone, reference first (the student prompts reordered, answers replayed)"
WINDOW, FORCED = "student, dialogue-level", "student, dialogue-level (forced to the per-turn claims)"
ENDED = "student, ended at a repeated claim"
# a row -> the row whose answers it replays or must repeat: measured after it, never kept beside a newer one
DEPENDS = {PREFILL: "student", PREFILL_REFERENCE_FIRST: "student", "student + n-gram": "student", ENDED: "student",
           f"{WINDOW} + n-gram": WINDOW, FORCED: "student", f"{FORCED} + n-gram": FORCED}
ROWS = ("teacher", "teacher (text labels)", "student", ENDED, PREFILL, PREFILL_REFERENCE_FIRST,
        "teacher, no prefix cache", "student + n-gram", WINDOW, f"{WINDOW} + n-gram", FORCED, f"{FORCED} + n-gram",
        *(f"{who}, served, {schedule}" for who in ("teacher", "student") for schedule in SCHEDULES))


def run_settings(args: SpeedConfig) -> dict:
    """What a speed.json's rows were measured on: the settings, the teacher's, and the contents of
    the input and of every model's weights. Rows measured otherwise never mix, and a student
    rebuilt at the same path is measured again."""
    from fastvista.fingerprint import content_sha256, model_sha256

    models = {"model": args.model, "teacher_model": args.teacher_model, "window_model": args.window_model}
    unused = {"window_max_tokens", "window_max_claims"} if not args.window_model or args.window_forced else set()
    unused |= {"schedule"} if args.schedule == "waves" else set()  # the settings of runs from before the setting stay as they were
    return {**args.model_dump(exclude={"only", "served", "port", "concurrency", "skip_plain", "data", *unused}), "data": args.data.model_dump(),
            "teacher": load_config(args.teacher_config, []).get("teacher", {}),
            **computed_dtype(args),
            "input_sha256": content_sha256(args.data.input) if Path(args.data.input).exists() else None,
            "weights_sha256": {k: model_sha256(m) for k, m in models.items() if m}}


def computed_dtype(args: SpeedConfig) -> dict:
    """The dtype this machine computes in, when it is not the one asked (bf16 on a CPU without native
    bf16, fastvista/precision.py): rows computed in bf16 elsewhere never mix with these. Absent
    otherwise, so the settings of earlier runs stay as they were."""
    computed = served_dtype(args.model, args.dtype, args.keep_bf16_on_cpu)
    return {"computed_dtype": computed} if computed != args.dtype else {}


def main(args: SpeedConfig, out: Path, engines: dict | None = None) -> dict:
    """Every row in one run; `engines` (by configuration, filled as they are built) lets several
    runs on the same weights share their engines (fastvista eval scaling)."""
    out.mkdir(parents=True, exist_ok=True)
    dialogues = load_dialogues(args.data, None)
    ngram = {"method": "ngram", "num_speculative_tokens": args.speculative_tokens, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    student = StudentConfig(adapter=None, **trained_rendering(args.model))
    check_student_format(BackendConfig(kind="vllm", model=args.model), student)
    if args.window_model:
        check_student_format(BackendConfig(kind="vllm", model=args.window_model), args.window_student())
    if args.served and args.teacher_model:
        raise ValueError("the served rows run teacher and student on one server with the student's weights: run them without "
                         "teacher_model (or time each on its own weights with `fastvista eval live-latency`)")
    shipped = TeacherConfig.model_validate(load_config(args.teacher_config, []).get("teacher", {}))
    text_teacher = shipped.model_copy(update={"label_scores": False})
    previous = out / "speed.json"
    unknown = sorted(set(args.only) - set(ROWS))
    if unknown:
        raise ValueError(f"no row named {unknown[0]!r}; the rows: {', '.join(ROWS)}")
    configs: dict = {}
    settings = run_settings(args)
    if args.only and previous.exists():
        before = json.loads(previous.read_text())
        if before.get("settings") != settings:
            raise ValueError(f"{previous} was measured on other settings, weights or dialogues: write to another folder, "
                             "or run every row again (without --only)")
        configs = {name: row for name, row in before["configurations"].items() if name in ROWS}
        for name in sorted(set(before["configurations"]) - set(configs)):
            print(f"{previous}: row {name!r} is no row of this version: not kept", file=sys.stderr)
    def answers_ready(row: str) -> bool:
        """Whether `row`'s answers will exist when a row that replays them runs: measured in this
        run, or kept with its results file, and not dropped by its own base measured again."""
        if row in args.only:
            return True
        kept = Path(configs.get(row, {}).get("results", "")).is_file()
        return kept and DEPENDS.get(row) not in args.only

    for name in args.only:  # before any engine starts
        base = DEPENDS.get(name)
        if base and not answers_ready(base):
            raise ValueError(f"the row {name!r} replays or repeats the answers of {base!r}, which {previous} lacks "
                             "(or this run measures again what it replays): add it to --only")
    own_engines = engines is None
    engines = {} if own_engines else engines

    def wanted(name: str) -> bool:
        return not args.only or name in args.only

    def release() -> None:
        """Rows are grouped by engine, so a run's own engines are stopped before the next starts:
        two or three engines at once need more memory than this machine has (engines shared
        with other runs stay)."""
        while own_engines and engines:
            backend = engines.pop(next(iter(engines)))
            if hasattr(backend, "close"):
                backend.close()

    def on(key: str, model: str, **changes):
        if key not in engines:
            release()
            engines[key] = engine(model, args, **changes)
        return engines[key]

    def measured(name: str, *how, note: str | None = None, **where) -> None:
        """Measure one row and keep it at once, whole: a row that fails later loses none before it
        (`--only` then runs the rest). A drafting row records how many answers are the very ones
        of the row it drafts for; rows kept from before that replayed or repeated this row's
        answers are dropped: those answers are gone. A row measured again is dropped first, so
        if it fails now no figure of the earlier run stays beside the files this run replaced."""
        for row in [name] + [row for row, of in DEPENDS.items() if of == name]:
            configs.pop(row, None)
        keep()
        configs[name] = measure(name, *how, **{"schedule": args.schedule, **where})
        base = DEPENDS.get(name)
        if base and (name.endswith("n-gram") or name == ENDED):
            configs[name]["identical"] = same_outputs(configs[base]["results"], configs[name]["results"])
        if note:
            configs[name]["note"] = note
        keep()

    def keep() -> None:
        save(args, settings, out, len(dialogues), configs)

    def student_turns() -> dict:
        """The per-turn student's results by (dialogue, turn), for the rows that replay them."""
        return {(d.id, t.index): t for d in read_scored(configs["student"]["results"]) for t in d.turns}

    machines = {"teacher": lambda d: label_dialogue(d, shipped), "teacher (text labels)": lambda d: label_dialogue(d, text_teacher),
                "student": lambda d: score_dialogue(d, student, True),
                ENDED: lambda d: score_dialogue(d, student.model_copy(update={"end_on_repeated_claim": True}), True)}
    teacher_weights = args.teacher_model or args.model
    for name, machine in machines.items():
        if wanted(name):
            key, model = ("main", args.model) if name.startswith("student") or not args.teacher_model else ("teacher", teacher_weights)
            measured(name, dialogues, machine, on(key, model), out)
    for name, order in ((PREFILL, None), (PREFILL_REFERENCE_FIRST, LAYOUTS[REFERENCE_FIRST][0])):
        if wanted(name):
            recorded = student_turns()
            measured(name, dialogues, lambda d, recorded=recorded, order=order: prompts_alone(d, recorded, student, order),
                     on("main", args.model), out)
    if not args.skip_plain and wanted("teacher, no prefix cache"):
        measured("teacher, no prefix cache", dialogues, machines["teacher (text labels)"],
                 on("plain", teacher_weights, enable_prefix_caching=False), out)
    if args.speculative_tokens and wanted("student + n-gram"):
        measured("student + n-gram", dialogues, machines["student"], on("ngram", args.model, speculative=ngram), out)
    if args.window_model:
        note = None
        if args.window_forced:
            claims = {key: t.claims for key, t in student_turns().items()} if wanted(FORCED) or wanted(f"{FORCED} + n-gram") else {}
            machine = lambda d: forced_windows(d, args.window_turns, claims, student.history_turns)  # noqa: E731
            base = FORCED
            note = ("forced to the per-turn student's claims with exact repeats merged (distinct_claims), "  # its targets
                    "so it may decode fewer tokens than the per-turn row: compare completion tokens per turn")
        else:
            window = args.window_student()
            machine = lambda d: score_dialogue(d, window, True)  # noqa: E731
            base = WINDOW
        if wanted(base):
            measured(base, dialogues, machine, on("window", args.window_model), out, note=note)
        if args.speculative_tokens and wanted(f"{base} + n-gram"):
            measured(f"{base} + n-gram", dialogues, machine, on("window ngram", args.window_model, speculative=ngram), out, note=note)
    served_rows = [(f"{who}, served, {schedule}", machines[who], schedule) for who in ("teacher", "student") for schedule in SCHEDULES]
    if args.served and any(wanted(name) for name, _, _ in served_rows):
        url = f"http://127.0.0.1:{args.port}/v1"
        cmd = serve_command(resolve_model(args.model), {}, port=args.port, max_model_len=args.max_model_len,
                            dtype=served_dtype(args.model, args.dtype, args.keep_bf16_on_cpu),
                            kv_cache_memory_bytes=int(args.kv_cache_gb * 2**30))  # the in-process rows' settings
        release()
        with running(cmd, url, out / "server.log", benchmark=True):
            backend = make_backend(BackendConfig(kind="openai", model=resolve_model(args.model), base_url=url,
                                                 concurrency=args.concurrency, timeout=600))
            for name, machine, schedule in served_rows:
                if wanted(name):
                    measured(name, dialogues, machine, backend, out, schedule=schedule, server=url)
    result = save(args, settings, out, len(dialogues), configs)
    if "speedup" not in result:
        teachers, students = ratio_rows(configs)
        missing = [kind for kind, rows in (("a teacher row with prefix caching", teachers), ("a student row", students)) if not rows]
        raise ValueError(f"no ratio: {out / 'speed.json'} holds {', '.join(repr(n) for n in configs) or 'no row'}, and the ratios "
                         f"need {' and '.join(missing)}: add {'it' if len(missing) == 1 else 'them'} with --only (or run without --only)")
    print(table(result))
    return result


def ratio_rows(configs: dict) -> tuple[dict, dict]:
    """The rows a ratio is taken between: the teacher's with prefix caching, and the student's."""
    return ({k: v for k, v in configs.items() if k.startswith("teacher") and "no prefix" not in k},
            {k: v for k, v in configs.items() if k.startswith("student")})


def save(args: SpeedConfig, settings: dict, out: Path, dialogues: int, configs: dict) -> dict:
    """speed.json and speed.md as the rows measured so far make them: the ratios once a teacher
    and a student row exist, the rows alone before (so `--only` can add the rest)."""
    result = {
        "engine": f"vllm ({settings.get('computed_dtype', args.dtype)}) on {args.model}" + (f" and {args.window_model}" if args.window_model else "")
                  + (f"; the teacher on {args.teacher_model}" if args.teacher_model else ""),
        "dialogues": dialogues,
        "settings": settings,
        "configurations": configs,
    }
    teachers, students = ratio_rows(configs)
    if teachers and students:
        strongest = max(teachers, key=lambda k: teachers[k]["turns_per_second"])
        best = max(students, key=lambda k: students[k]["turns_per_second"])
        result.update(strongest_teacher_name=strongest, strongest_teacher=teachers[strongest]["turns_per_second"],
                      speedup=round(students[best]["turns_per_second"] / teachers[strongest]["turns_per_second"], 2), best_student=best)
        if "teacher, no prefix cache" in configs:
            result["speedup_over_plain_teacher"] = round(students[best]["turns_per_second"] / configs["teacher, no prefix cache"]["turns_per_second"], 2)
    if failed_rows(configs):
        result["rows_with_failed_dialogues"] = failed_rows(configs)
    write_json(out / "speed.json", result)
    if "speedup" in result:
        (out / "speed.md").write_text(table(result) + "\n")
    else:
        (out / "speed.md").unlink(missing_ok=True)
    return result
