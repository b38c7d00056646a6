"""Any OpenAI-compatible chat endpoint (`vllm serve`, hosted APIs), requests sent concurrently.

Timeouts and retries with exponential backoff are the `openai` client's own (`timeout`,
`max_retries`); a request that still fails comes back as a Completion with `error` set.
Regex/JSON constraints travel as vLLM's `structured_outputs` extra body.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from fastvista.llm import BackendConfig, ChatRequest, Completion, TokenLogprob


class OpenAIBackend:
    supports_constraints = True
    concurrent = True  # the server batches concurrent requests

    def __init__(self, config: BackendConfig):
        import openai

        self.config = config
        self.name = f"openai:{config.base_url or 'default'}:{config.model}"
        self.client = openai.OpenAI(
            base_url=config.base_url,
            api_key=os.environ.get(config.api_key_env) or "EMPTY",
            timeout=config.timeout,
            max_retries=config.max_retries,
        )
        # one pool for every call, so `concurrency` caps the requests in flight even when several
        # dialogues call at once (the continuous schedule)
        self.pool = ThreadPoolExecutor(max_workers=max(1, config.concurrency))

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        return list(self.pool.map(self._one, requests))

    def _one(self, r: ChatRequest) -> Completion:
        import openai

        extra: dict = {}
        if r.regex:
            extra["structured_outputs"] = {"regex": r.regex}
        elif r.json_schema:
            extra["structured_outputs"] = {"json": r.json_schema}
        kwargs = dict(
            model=r.lora or self.config.model,
            messages=r.messages,
            max_tokens=r.max_tokens,
            temperature=r.temperature,
            stop=r.stop,
            extra_body=extra or None,
        )
        if r.seed is not None:
            kwargs["seed"] = r.seed
        if r.logprobs:
            kwargs.update(logprobs=True, top_logprobs=r.logprobs)
        try:
            resp = self.client.chat.completions.create(**kwargs)
        except openai.OpenAIError as e:
            return Completion(text="", error=f"{type(e).__name__}: {e}")
        choice = resp.choices[0]
        logprobs = None
        if r.logprobs and choice.logprobs and choice.logprobs.content:
            logprobs = [
                TokenLogprob(token=t.token, logprob=t.logprob, top={x.token: x.logprob for x in t.top_logprobs})
                for t in choice.logprobs.content
            ]
        usage = resp.usage
        return Completion(
            text=choice.message.content or "",
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            finish_reason=choice.finish_reason,
            logprobs=logprobs,
        )
