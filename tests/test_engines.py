"""The teacher and the backends on real engines, with a tiny random model built locally."""

import json
import re

import pytest

from fastvista.llm import BackendConfig, ChatRequest, make_backend
from fastvista.records_io import write_jsonl
from fastvista.single_pass import parse_output
from synth.run import main
from tests.test_pipeline import museum_dialogue

pytestmark = pytest.mark.slow


def teacher_run(tmp_path, backend: dict) -> dict:
    inputs = tmp_path / "in.jsonl"
    write_jsonl(inputs, [museum_dialogue(i) for i in range(3)])
    tree = {
        "backend": backend,
        # short answers keep a random model fast; one retry exercises the retry path
        "teacher": {"few_shot": 1, "decompose_max_tokens": 24, "label_max_tokens": 4, "retries": 1, "max_claims": 3},
        "data": {"input": str(inputs), "source": "jsonl"},
    }
    summary = main(tree, tmp_path / "run", progress=False)
    return summary


def check_run(tmp_path, summary):
    labelled = [json.loads(l) for l in (tmp_path / "run/labelled.jsonl").read_text().splitlines()]
    assert sorted(d["id"] for d in labelled) == ["d0", "d1", "d2"]
    for d in labelled:
        for t in d["turns"]:
            n_claims = len(t["claims"])
            unverified = sum(c["label"] != "VERIFIED" for c in t["claims"])
            retried_reads = sum(e.count("attempt") for e in t["errors"])
            # at least one call a step, at most (retries + 1) per step
            assert 1 + n_claims + unverified <= t["usage"]["calls"] <= 2 * (1 + n_claims + unverified)
            assert t["usage"]["prompt_tokens"] > 0
            assert retried_reads <= t["usage"]["calls"]
    assert summary["scored_turns"] == 9
    assert summary["training_examples"] + summary["turns_with_errors"] == 9


def test_teacher_on_the_hf_backend(tmp_path, tiny_model):
    summary = teacher_run(tmp_path, {"kind": "hf", "model": str(tiny_model), "dtype": "float32", "batch_size": 16})
    check_run(tmp_path, summary)


def test_hf_batches_with_left_padding_give_the_same_greedy_text(tiny_model):
    backend = make_backend(BackendConfig(kind="hf", model=str(tiny_model), dtype="float32", batch_size=8))
    requests = [ChatRequest(messages=[{"role": "user", "content": "The Louvre " * k}], max_tokens=10, logprobs=3) for k in (1, 5, 20)]
    batched = backend.generate(requests)
    alone = [backend.generate([r])[0] for r in requests]
    assert [c.text for c in batched] == [c.text for c in alone]
    assert [c.prompt_tokens for c in batched] == [c.prompt_tokens for c in alone]
    assert batched[0].prompt_tokens < batched[1].prompt_tokens < batched[2].prompt_tokens
    for c in batched:
        assert len(c.logprobs) == c.completion_tokens and all(len(t.top) == 3 for t in c.logprobs)
        assert all(t.logprob <= max(t.top.values()) + 1e-5 for t in c.logprobs)


def test_teacher_and_structured_output_on_the_vllm_backend(tmp_path, tiny_model):
    pytest.importorskip("vllm")
    backend = {"kind": "vllm", "model": str(tiny_model), "dtype": "bfloat16", "gpu_memory_utilization": 0.1, "max_model_len": 4096}
    summary = teacher_run(tmp_path, backend)
    check_run(tmp_path, summary)
    # a regex constraint holds even for an untrained model
    engine = make_backend(BackendConfig(**backend))
    regex = "NONE|1\\. [a-z ]{1,20} \\| (VERIFIED|CONTRADICTED)"
    [c] = engine.generate([ChatRequest(messages=[{"role": "user", "content": "Score this."}], max_tokens=200, regex=regex)])
    assert re.fullmatch(regex, c.text), c.text
    assert len(parse_output(c.text)) <= 1
    too_long = engine.generate([ChatRequest(messages=[{"role": "user", "content": "x " * 6000}], max_tokens=4)])
    assert too_long[0].error and "context length" in too_long[0].error
