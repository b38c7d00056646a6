"""One small interface to every LLM engine: a batch of chat requests in, completions out.

Backends: `openai` (any OpenAI-compatible endpoint, `vllm serve` included), `vllm` (in-process
`vllm.LLM`), `hf` (transformers generate). `make_backend` builds one from a BackendConfig and wraps
it in the content-addressed cache when the config names one.
"""

from __future__ import annotations

from typing import Literal, Optional, Protocol

from pydantic import BaseModel, ConfigDict, Field


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[dict[str, str]]
    max_tokens: int = 256
    temperature: float = 0.0
    seed: Optional[int] = None
    stop: Optional[list[str]] = None
    regex: Optional[str] = None
    json_schema: Optional[dict] = None
    lora: Optional[str] = None  # name of a LoRA adapter the backend was configured with
    logprobs: int = 0  # top-k log-probabilities per generated token (0: none)


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    top: dict[str, float] = Field(default_factory=dict)


class Completion(BaseModel):
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: Optional[str] = None
    logprobs: Optional[list[TokenLogprob]] = None
    cached: bool = False
    # Set when the engine could not answer this request (the batch's other requests still are).
    error: Optional[str] = None


class Backend(Protocol):
    name: str  # identifies the model for the cache: the same name must mean the same weights
    supports_constraints: bool  # can force `regex` / `json_schema`
    concurrent: bool  # `generate` may be called from several threads at once (the continuous schedule)

    def generate(self, requests: list[ChatRequest]) -> list[Completion]: ...


class BackendConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["openai", "vllm", "hf"] = "vllm"
    # A registered embedded model (see `fastvista models list`), a local folder, a hub id, or the
    # name an OpenAI-compatible server serves.
    model: str
    cache: Optional[str] = None  # sqlite file of completions; null disables caching
    # openai
    base_url: Optional[str] = None
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 16
    timeout: float = 120.0
    max_retries: int = 5
    # vllm and hf
    dtype: str = "auto"
    max_model_len: Optional[int] = 4096
    gpu_memory_utilization: float = 0.2
    # vllm: KV-cache size in bytes, instead of a share of memory (on CPU the share is counted
    # against the whole process, so a second engine in one process needs this)
    kv_cache_memory_bytes: Optional[int] = None
    tensor_parallel_size: int = 1
    enable_prefix_caching: bool = True
    # vllm: speculative decoding, e.g. {method: ngram, num_speculative_tokens: 4, prompt_lookup_max: 4}
    # (prompt lookup: the student's claims copy spans of the turn it scores)
    speculative: Optional[dict] = None
    batch_size: int = 8  # hf only: sequences per generate call
    lora_adapters: dict[str, str] = Field(default_factory=dict)  # name -> adapter folder
    max_lora_rank: int = 64


def make_backend(config: BackendConfig) -> Backend:
    if config.kind == "openai":
        from fastvista.llm.openai_backend import OpenAIBackend

        backend: Backend = OpenAIBackend(config)
    elif config.kind == "vllm":
        from fastvista.llm.vllm_backend import VLLMBackend

        backend = VLLMBackend(config)
    else:
        from fastvista.llm.hf_backend import HFBackend

        backend = HFBackend(config)
    if config.cache:
        from fastvista.llm.cache import CachedBackend

        backend = CachedBackend(backend, config.cache)
    return backend
