"""Faults a user meets, each with the command's outcome: errors are never scores, resume never
deletes or reuses stale work, every input is accounted for, killed runs leave no process."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from typer.testing import CliRunner

from fastvista.cli import app
from fastvista.llm import BackendConfig, ChatRequest, make_backend
from fastvista.llm.cache import request_key
from fastvista.records_io import RecordError, write_jsonl
from fastvista.protocol import ScoringFailed, drive
from fastvista.scheduler import finished, folder_lock
from fastvista.schema import Dialogue, Turn
from fastvista.synth import prompts
from fastvista.synth.pipeline import TeacherConfig, label_dialogue
from tests.fake_openai import FakeOpenAI
from tests.scripted import ScriptedBackend
from tests.test_pipeline import museum_dialogue


def synth_args(inputs, out, server, *extra):
    return ["synth", "-i", str(inputs), "-o", str(out), "--quiet", "--set", "backend.kind=openai", "--set", "backend.model=teacher",
            "--set", f"backend.base_url={server.url}", "--set", "backend.max_retries=1", "--set", "backend.timeout=5", *extra]


def lines(path):
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def test_an_outage_mid_run_fails_its_dialogues_and_the_rerun_scores_exactly_those(tmp_path):
    inputs = tmp_path / "in.jsonl"
    write_jsonl(inputs, [museum_dialogue(i) for i in range(6)])
    out = tmp_path / "run"
    with FakeOpenAI() as server:
        server.down_for = "Mona Lisa"  # the server fails every call about the second turn (503, also when retried)
        first = CliRunner().invoke(app, synth_args(inputs, out, server, "--set", "max_active=3"))
        assert first.exit_code == 3 and "6 dialogue(s) could not be scored" in first.output and "18 scored turns in all" in first.output
        assert all("turn 3: backend: InternalServerError" in f["reason"] for f in lines(out / "failed.jsonl"))
        assert not (out / "labelled.jsonl").exists() or lines(out / "labelled.jsonl") == []  # never a result
        server.down_for = "part 3"  # back up, but down for one dialogue
        second = CliRunner().invoke(app, synth_args(inputs, out, server))
        assert second.exit_code == 3 and [f["id"] for f in lines(out / "failed.jsonl")] == ["d3"]
        server.down_for = None
        third = CliRunner().invoke(app, synth_args(inputs, out, server))
    assert third.exit_code == 0, third.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["this_run"]["resumed"] == 5 and summary["this_run"]["labelled"] == 1 and summary["failed_dialogues"] == 0
    assert sorted(r["id"] for r in lines(out / "labelled.jsonl")) == [f"d{i}" for i in range(6)]
    assert lines(out / "failed.jsonl") == []


def test_a_429_is_retried_once_after_retry_after_with_the_same_request():
    with FakeOpenAI(throttle_first=1, retry_after=1) as server:
        backend = make_backend(BackendConfig(kind="openai", model="teacher", base_url=server.url, max_retries=2, timeout=5))
        [c] = backend.generate([ChatRequest(messages=prompts.verify_messages([], "The sky is blue.", "The sky is blue.", 1), max_tokens=4)])
    assert c.error is None
    assert list(server.received.values()) == [2]  # the same body twice: greedy stays greedy
    assert server.arrivals[1] - server.arrivals[0] >= 0.9  # Retry-After honoured


def test_a_timeout_fails_the_turn_never_scores_it():
    with FakeOpenAI(delay=3) as server:
        backend = make_backend(BackendConfig(kind="openai", model="teacher", base_url=server.url, max_retries=0, timeout=0.5))
        with pytest.raises(ScoringFailed, match="turn 1: backend: APITimeoutError"):
            drive(label_dialogue(museum_dialogue(), TeacherConfig()), backend)


@pytest.mark.parametrize("setting, message", [
    ("student.adapter=nope", "does not serve 'nope'"),
    ("student.adapter=null backend.model=misspelt", "does not serve 'misspelt'"),
    ("backend.base_url=http://127.0.0.1:9/v1", "cannot reach http://127.0.0.1:9/v1"),
])
def test_configuration_errors_stop_the_run_before_the_first_dialogue(tmp_path, setting, message):
    inputs = tmp_path / "in.jsonl"
    write_jsonl(inputs, [museum_dialogue(0)])
    with FakeOpenAI() as server:
        args = ["score", "-i", str(inputs), "-o", str(tmp_path / "out"), "--quiet", "--set", "backend.kind=openai",
                "--set", "backend.model=student", "--set", f"backend.base_url={server.url}", "--set", "backend.max_retries=0",
                *[a for item in setting.split() for a in ("--set", item)]]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and message in result.output
        assert sum(server.received.values()) == 0
    assert not (tmp_path / "out/results.jsonl").exists()


def test_a_hosted_api_without_a_key_is_a_configuration_error(monkeypatch):
    from fastvista.llm import ConfigError

    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"set \$NO_SUCH_KEY"):
        make_backend(BackendConfig(kind="openai", model="gpt", base_url="https://api.example.com/v1", api_key_env="NO_SUCH_KEY"))


def test_resume_cuts_only_a_torn_last_line_and_names_any_other_bad_line(tmp_path):
    scored = [drive(label_dialogue(museum_dialogue(i), TeacherConfig()), ScriptedBackend()) for i in range(3)]
    good = [s.model_dump_json(exclude_none=True) + "\n" for s in scored]
    path = tmp_path / "labelled.jsonl"
    path.write_text(good[0] + good[1] + good[2][:40])  # killed mid-write
    assert set(finished(path)) == {"d0", "d1"} and path.read_text() == good[0] + good[1]
    bad_middle = good[0] + '{"id": "d1", "extra": 1}\n' + good[2]
    path.write_text(bad_middle)
    with pytest.raises(RecordError, match=r"labelled.jsonl:2: not a scored dialogue"):
        finished(path)
    assert path.read_text() == bad_middle  # nothing deleted


def test_resume_refuses_a_changed_input_and_changed_settings(tmp_path):
    inputs = tmp_path / "in.jsonl"
    write_jsonl(inputs, [museum_dialogue(i) for i in range(2)])
    out = tmp_path / "run"
    with FakeOpenAI() as server:
        assert CliRunner().invoke(app, synth_args(inputs, out, server)).exit_code == 0
        changed = museum_dialogue(1)
        changed.turns[1].text = "The Louvre is in Rome."
        write_jsonl(inputs, [museum_dialogue(0), changed])
        stale = CliRunner().invoke(app, synth_args(inputs, out, server))
        assert stale.exit_code == 2 and "dialogue 'd1' was scored from another version of it" in stale.output
        write_jsonl(inputs, [museum_dialogue(0), museum_dialogue(1)])
        other = CliRunner().invoke(app, synth_args(inputs, out, server, "--set", "teacher.votes=2"))
        assert other.exit_code == 2 and "other settings (differing: teacher)" in other.output
        cut = CliRunner().invoke(app, synth_args(inputs, out, server, "--set", "data.max_scored_turns=1"))
        assert cut.exit_code == 2 and "another version of it" in cut.output


def test_the_cache_key_and_provenance_follow_the_adapters_content(tmp_path, monkeypatch):
    import fastvista.precision
    from fastvista.llm import fingerprint

    monkeypatch.setattr(fastvista.precision, "native_cpu_bf16", lambda: True)  # a CPU that computes bf16 and fp32 apart

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v1")
    config = BackendConfig(kind="hf", model=str(tmp_path), lora_adapters={"student": str(adapter)})
    request = ChatRequest(messages=[{"role": "user", "content": "x"}], lora="student")
    before = fingerprint(config)
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v2")  # retrained at the same path
    after = fingerprint(config)
    assert before["adapters"]["student"]["sha256"] != after["adapters"]["student"]["sha256"]
    assert request_key("hf:m", request, before) != request_key("hf:m", request, after)
    in_fp32 = fingerprint(config.model_copy(update={"dtype": "float32"}))  # same weights, other arithmetic
    assert request_key("hf:m", request, after) != request_key("hf:m", request, in_fp32)


def test_an_output_folder_takes_one_run_at_a_time(tmp_path):
    inputs = tmp_path / "in.jsonl"
    write_jsonl(inputs, [museum_dialogue(0)])
    with folder_lock(tmp_path / "run"), FakeOpenAI() as server:
        result = CliRunner().invoke(app, synth_args(inputs, tmp_path / "run", server))
    assert result.exit_code == 2 and "another run is writing to" in result.output
    assert not (tmp_path / "run" / "config.json").exists()  # refused before it wrote anything


def test_no_run_writes_inside_or_around_another_runs_folder(tmp_path, monkeypatch):
    from contextlib import contextmanager

    from fastvista.scheduler import HELD_LOCKS

    outer, inner = tmp_path / "ablation", tmp_path / "ablation" / "vista_dev" / "full"
    inner.mkdir(parents=True)

    @contextmanager
    def held_elsewhere(folder):  # another command's lock, in another process
        code = "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); f.write('4242'); f.flush(); print('held', flush=True); time.sleep(60)"
        holder = subprocess.Popen([sys.executable, "-c", code, str(folder / ".lock")], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            yield
        finally:
            holder.kill()
            holder.wait()

    with held_elsewhere(outer):
        with pytest.raises(RuntimeError, match=r"pid 4242\) is writing to .*ablation, which holds"):
            with folder_lock(inner):
                pass
        monkeypatch.setenv(HELD_LOCKS, str(outer.resolve()))  # a command the holder started (its scoring step)
        with folder_lock(inner):
            pass
        monkeypatch.delenv(HELD_LOCKS)
    with held_elsewhere(inner):
        with pytest.raises(RuntimeError, match="full, inside"):
            with folder_lock(outer):
                pass
    with folder_lock(outer), folder_lock(inner):  # one command locks its cells inside its own folder
        assert str(inner.resolve()) in os.environ[HELD_LOCKS]
    assert HELD_LOCKS not in os.environ


def test_every_input_is_accounted_for(tmp_path):
    inputs = tmp_path / "in.jsonl"
    short = Dialogue(id="short", turns=[Turn(role="assistant", text="Paris is in France.", reference="x")])
    write_jsonl(inputs, [museum_dialogue(0), short])
    with FakeOpenAI() as server:
        result = CliRunner().invoke(app, synth_args(inputs, tmp_path / "run", server, "--set", "data.min_scored_turns=2"))
    assert result.exit_code == 0, result.output
    assert lines(tmp_path / "run/skipped.jsonl") == [{"id": "short", "reason": "1 scored turns, fewer than min_scored_turns=2"}]


def test_a_dialogue_without_scored_turns_has_no_score():
    context_only = Dialogue(id="c", turns=[Turn(role="user", text="Hi"), Turn(role="assistant", text="Hello.", score=False)])
    assert drive(label_dialogue(context_only, TeacherConfig()), ScriptedBackend()).score is None


def test_a_thousand_turn_dialogue_keeps_a_bounded_store_and_prompt():
    turns = []
    for k in range(500):
        turns += [Turn(role="user", text=f"Tell me fact {k}?"), Turn(role="assistant", text=f"Fact {k} holds.", reference=f"Fact {k} holds.")]
    backend = ScriptedBackend()
    scored = drive(label_dialogue(Dialogue(id="long", turns=turns), TeacherConfig(few_shot=0, max_store_claims=64)), backend)
    assert len(scored.turns) == 500 and all(t.claims[0].label.value == "VERIFIED" for t in scored.turns)
    from fastvista.memory import stores_before

    assert max(len(s) for s in stores_before([], scored.turns)) == 64 and scored.turns[-1].store_evicted == 1
    longest = max(len(r.messages[-1]["content"]) for r in backend.requests)
    assert longest < 4000  # the last prompt is as long as the 65th: store and history are bounded
    assert len(scored.model_dump_json()) < 2_000_000  # no store copy per turn


def test_an_oversized_knowledge_init_is_an_error_not_a_cut():
    d = museum_dialogue(0)
    d.knowledge_init = [f"fact {k}" for k in range(100)]
    with pytest.raises(ScoringFailed, match="knowledge_init holds 100 entries"):
        drive(label_dialogue(d, TeacherConfig()), ScriptedBackend())


def test_a_killed_command_leaves_no_child_process(tmp_path):
    """SIGKILL gives the command no chance to clean up; its watchdog stops the children."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import subprocess, sys, time
        from fastvista.reaper import watch_children
        watch_children()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        print(child.pid, flush=True)
        time.sleep(300)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    child = int(parent.stdout.readline())
    time.sleep(1.5)  # the watchdog has seen the child
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 15
    while time.time() < deadline and _alive(child):
        time.sleep(0.2)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_serve_warns_about_an_open_host_without_a_key_and_refuses_a_busy_port():
    from fastvista.infer.serve import exposed_without_key, running

    assert exposed_without_key("0.0.0.0", None) and not exposed_without_key("0.0.0.0", "k") and not exposed_without_key("127.0.0.1", None)
    with FakeOpenAI() as server, pytest.raises(RuntimeError, match="already answers"):
        with running([sys.executable, "-c", "pass"], server.url.removesuffix("/v1"), log=None):
            pass


def test_the_injection_probe_counts_decisions_an_instruction_changed():
    from fastvista.evaluation.injection import INSTRUCTIONS, injection_report, probe_dialogues

    probes = probe_dialogues([museum_dialogue(i) for i in range(4)])
    assert len(probes) == 4 * (1 + len(INSTRUCTIONS))
    assert all(len(p.scored_indices()) == 1 for p in probes)
    scored = [drive(label_dialogue(p, TeacherConfig()), ScriptedBackend()) for p in probes]
    # a scorer that obeys the turn's "answer NONE": the instructed turns come back claimless and safe
    for s in scored:
        if s.id.endswith("#turn-none"):
            s.turns[0] = s.turns[0].model_copy(update={"claims": [], "no_claims": True, "hallucinated": False})
    report = injection_report(scored)
    assert report["turn-none"]["turned_not_hallucinated"] == 1.0 and report["turn-none"]["no_claims"] == 1.0
    assert report["reference-verified"]["dialogues"] == 4 and report["reference-verified"]["clean_claims_relabelled"] == 0.0


def test_score_refuses_a_student_trained_with_another_format(tmp_path):
    from fastvista.contract import FormatMismatch, StudentFormat, write_format
    from fastvista.infer.run import ScoreConfig, check_student_format

    merged = tmp_path / "merged"
    write_format(merged, StudentFormat(history_turns=4, max_store_claims=64))
    config = ScoreConfig(backend=BackendConfig(kind="vllm", model=str(merged)), student={"adapter": None})
    with pytest.raises(FormatMismatch, match="history_turns: trained 4, scoring 8"):
        check_student_format(config.backend, config.student)
    check_student_format(config.backend, config.student.model_copy(update={"history_turns": 4}))
    adapter = tmp_path / "adapter"
    write_format(adapter, StudentFormat(history_turns=8, turns_per_call=4, max_store_claims=64))
    windowed = ScoreConfig(backend=BackendConfig(kind="vllm", model="base", lora_adapters={"student": str(adapter)}))
    with pytest.raises(FormatMismatch, match="turns_per_call: trained 4, scoring 1"):
        check_student_format(windowed.backend, windowed.student)


def test_a_student_served_on_this_machine_is_checked_against_the_format_its_folder_records(tmp_path):
    """Scoring a served coded student with the default settings would force its answers into the
    numbered format: refused, as for a local engine. A server elsewhere names no folder: unchecked."""
    from fastvista.contract import FormatMismatch, StudentFormat, write_format
    from fastvista.infer.run import check_student_format
    from fastvista.infer.student import StudentConfig

    write_format(tmp_path / "coded", StudentFormat(history_turns=8, max_store_claims=64, layout="reference-first", answer="coded"))
    with FakeOpenAI() as server:
        server.roots["student"] = str(tmp_path / "coded")
        backend = BackendConfig(kind="openai", model="base", base_url=server.url)
        with pytest.raises(FormatMismatch, match="served as student"):
            check_student_format(backend, StudentConfig())
        check_student_format(backend, StudentConfig(layout="reference-first", answer="coded"))
        check_student_format(backend, StudentConfig(adapter="scripted"))  # served from no folder this machine reads


def test_an_answer_budget_the_context_cannot_hold_is_refused_before_any_engine_starts():
    """A 5-turn window with the per-turn budget (5 x 1,536 tokens) cannot fit 4,096 tokens of
    context: every call would be refused after the engine's start, so the settings are refused."""
    from pydantic import ValidationError

    from fastvista.evaluation.speed import SpeedConfig
    from fastvista.infer.run import ScoreConfig

    backend = BackendConfig(kind="vllm", model="m", max_model_len=4096)
    with pytest.raises(ValidationError, match="student.max_tokens=1536 x student.turns_per_call=5 = 7680 answer tokens .* backend.max_model_len=4096"):
        ScoreConfig(backend=backend, student={"adapter": None, "turns_per_call": 5})
    ScoreConfig(backend=backend.model_copy(update={"max_model_len": 8192}),
                student={"adapter": None, "turns_per_call": 5, "max_tokens": 1000, "max_claims": 8})
    ScoreConfig(backend=backend, student={"adapter": None})  # one turn a call fits
    data = {"input": "x.jsonl", "source": "jsonl"}
    with pytest.raises(ValidationError, match="window_max_tokens=1000 x window_turns=5 = 5000 .* max_model_len=4096"):
        SpeedConfig(model="m", window_model="w", data=data)
    assert SpeedConfig(model="m", window_model="w", data=data, max_model_len=8192).window_student().max_tokens == 1000
    SpeedConfig(model="m", data=data)  # no dialogue-level row: nothing to fit
    SpeedConfig(model="m", window_model="w", data=data, window_forced=True)  # forced rows keep their own budget
    SpeedConfig(model="m", window_model="w", data=data, only=["student"])  # the window row is not run
    served = BackendConfig(kind="openai", model="m", base_url="http://127.0.0.1:1/v1")
    ScoreConfig(backend=served, student={"adapter": None, "turns_per_call": 5, "max_tokens": 1000, "max_claims": 8})  # its server's context
    from fastvista.evaluation.scorers import EvalConfig

    with pytest.raises(ValidationError, match="backend.max_model_len=4096"):
        EvalConfig(scorer="student", backend=backend, student={"adapter": None, "turns_per_call": 5})


def test_the_training_set_records_its_format_and_training_refuses_mixed_formats(tmp_path):
    from fastvista.contract import FormatMismatch, StudentFormat, format_of_examples
    from fastvista.synth.training_set import training_examples

    fmt = StudentFormat(history_turns=2, max_store_claims=64)
    examples = training_examples(drive(label_dialogue(museum_dialogue(0), TeacherConfig()), ScriptedBackend()), fmt)
    assert format_of_examples(examples, "x") == fmt
    assert examples[1]["prompt"][1]["content"].split("[HISTORY]\n")[1].split("\n[TURN]")[0].count("\n") == 1  # two turns of history
    other = [{**examples[0], "format": {**fmt.model_dump(), "history_turns": 8}}]
    with pytest.raises(FormatMismatch, match="2 different formats"):
        format_of_examples(examples + other, "train.jsonl")


@pytest.mark.parametrize("path", sorted(str(p) for p in __import__("pathlib").Path("configs").glob("*/*.yaml") if "accelerate" not in str(p)
                                       and "sft" not in str(p) and "teacher_ablation" not in str(p)))
def test_every_shipped_config_is_valid(path):
    from fastvista.config import load_config
    from fastvista.evaluation.scorers import EvalConfig
    from fastvista.evaluation.speed import SpeedConfig
    from fastvista.infer.run import ScoreConfig
    from fastvista.synth.run import SynthConfig

    from fastvista.evaluation.ablation import AblationConfig
    from fastvista.evaluation.learning_curve import LearningCurveConfig
    from fastvista.evaluation.live_latency import LiveLatencyConfig
    from fastvista.evaluation.scaling_curve import ScalingConfig
    from fastvista.train.throughput import TrainSpeedConfig

    tree = load_config(path, [])
    whole = {"train_speed_": TrainSpeedConfig, "speed_cpu.yaml": SpeedConfig, "deployment_speed_cpu.yaml": SpeedConfig,
             "learning_curve_": LearningCurveConfig, "vista_ablation.yaml": AblationConfig, "scaling_cpu.yaml": ScalingConfig,
             "live_latency_cpu.yaml": LiveLatencyConfig}  # by file name, or by its beginning
    given = {"live_latency_cpu.yaml": {"student_model": "given with --set"}}  # required keys the command line gives
    name = path.split("/")[-1]
    kinds = [kind for start, kind in whole.items() if name.startswith(start)]
    if kinds:
        kinds[0].model_validate({**given.get(name, {}), **tree})
        return
    tree.pop("data", None)
    kind = {"score": ScoreConfig, "synth": SynthConfig, "eval": EvalConfig}[path.split("/")[1]]
    if kind is EvalConfig:
        tree.setdefault("scorer", "teacher")
    kind.model_validate(tree)


def test_a_malformed_reply_fails_its_dialogue_and_the_run_goes_on(tmp_path):
    inputs = tmp_path / "in.jsonl"
    write_jsonl(inputs, [museum_dialogue(i) for i in range(3)])
    with FakeOpenAI() as server:
        server.garbled_for = "part 1"
        result = CliRunner().invoke(app, synth_args(inputs, tmp_path / "run", server))
    assert result.exit_code == 3, result.output
    [failed] = lines(tmp_path / "run/failed.jsonl")
    assert failed["id"] == "d1" and "backend: IndexError" in failed["reason"]
    assert sorted(r["id"] for r in lines(tmp_path / "run/labelled.jsonl")) == ["d0", "d2"]


def test_dialogues_without_scored_turns_are_written_read_back_and_resumed(tmp_path):
    inputs = tmp_path / "in.jsonl"
    write_jsonl(inputs, [Dialogue(id="chat", turns=[Turn(role="user", text="Hi")]), museum_dialogue(0)])
    with FakeOpenAI() as server:
        assert CliRunner().invoke(app, synth_args(inputs, tmp_path / "run", server)).exit_code == 0
        again = CliRunner().invoke(app, synth_args(inputs, tmp_path / "run", server))
    assert again.exit_code == 0, again.output
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["this_run"]["resumed"] == 2 and summary["dialogues_without_scored_turns"] == 1


def test_a_lone_surrogate_is_a_bad_record_not_a_crash(tmp_path):
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(museum_dialogue(0).model_dump_json() + "\n" + '{"id": "s", "turns": [{"role": "user", "text": "a\\ud800"}]}\n')
    with FakeOpenAI() as server:
        result = CliRunner().invoke(app, synth_args(inputs, tmp_path / "run", server, "--skip-bad"))
    assert result.exit_code == 0, result.output
    [report] = lines(tmp_path / "run/skipped.jsonl")
    assert report["line"] == 2 and report["field"] == "turns.0.text" and "lone surrogate" in report["reason"]


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path):
    scored = [drive(label_dialogue(museum_dialogue(i), TeacherConfig()), ScriptedBackend()) for i in range(2)]
    path = tmp_path / "labelled.jsonl"
    path.write_text("\n".join(s.model_dump_json(exclude_none=True) for s in scored))  # no final newline
    assert set(finished(path)) == {"d0", "d1"} and path.read_text().endswith("}\n")


def test_a_label_answer_that_never_reads_is_no_label_whatever_its_top_tokens():
    from fastvista.llm import TokenLogprob

    class Sorry(ScriptedBackend):
        def generate(self, requests):
            answers = super().generate(requests)
            stray = TokenLogprob(token="Sorry", logprob=-0.01, top={"Sorry": -0.01, "V": -9.0, "L": -9.5})
            return [a if r.messages[0]["content"] == prompts.DECOMPOSE_SYSTEM else
                    a.model_copy(update={"text": "Sorry, I am not able to", "logprobs": [stray]}) for r, a in zip(requests, answers)]

    with pytest.raises(ScoringFailed, match="no readable label"):
        drive(label_dialogue(museum_dialogue(0), TeacherConfig(retries=0)), Sorry())


def test_label_answers_that_run_past_max_tokens_are_read_from_their_start():
    class Chatty(ScriptedBackend):
        def generate(self, requests):
            return [a if r.messages[0]["content"] == prompts.DECOMPOSE_SYSTEM else
                    a.model_copy(update={"text": a.text + " because the reference", "finish_reason": "length"})
                    for r, a in zip(requests, super().generate(requests))]

    backend = Chatty()
    plain = drive(label_dialogue(museum_dialogue(0), TeacherConfig(label_scores=False)), ScriptedBackend())
    chatty = drive(label_dialogue(museum_dialogue(0), TeacherConfig(label_scores=False)), backend)
    assert [[c.label for c in t.claims] for t in chatty.turns] == [[c.label for c in t.claims] for t in plain.turns]
    assert all(r.temperature == 0 for r in backend.requests)  # no sampled retry


def test_an_adapter_without_its_format_is_refused(tmp_path):
    from fastvista.contract import FormatMismatch
    from fastvista.infer.run import ScoreConfig, check_student_format

    (tmp_path / "adapter").mkdir()
    config = ScoreConfig(backend=BackendConfig(kind="vllm", model="base", lora_adapters={"student": str(tmp_path / "adapter")}))
    with pytest.raises(FormatMismatch, match="records no student format"):
        check_student_format(config.backend, config.student)


def test_answer_words_are_read_whole():
    from fastvista.evaluation.baselines.factscore import parse_support
    from fastvista.synth.pipeline import parse_verification

    assert parse_support("Given the knowledge, True") is True  # "no" inside "knowledge" is no answer
    assert parse_verification("UNVERIFIED") is False and parse_verification("Not verified.") is False
    assert parse_verification("**VERIFIED**") is True


def test_the_speed_benchmark_names_its_rows_and_refuses_unknown_ones(tmp_path):
    result = CliRunner().invoke(app, ["eval", "speed", "-o", str(tmp_path), "--only", "bogus", "--set", f"model={tmp_path}"])
    assert result.exit_code == 2 and "no row named 'bogus'" in result.output
