"""transformers `generate`, batched with left padding: for CPU tests and small GPUs.

Requests are grouped by sampling settings and adapter, then generated `batch_size` at a time.
It cannot force a regex or a JSON schema (`supports_constraints` is False): callers that need the
format check it and retry instead.
"""

from __future__ import annotations

from collections import defaultdict

from fastvista.llm import BackendConfig, ChatRequest, Completion, ConfigError, TokenLogprob, compute_dtype
from fastvista.models import resolve_model


class HFBackend:
    supports_constraints = False
    concurrent = False
    stepping = False

    def __init__(self, config: BackendConfig):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        path = resolve_model(config.model)
        self.name = f"hf:{path}"
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        computed = compute_dtype(config)  # float32 for bf16 on a CPU without native bf16 (fastvista/precision.py)
        dtype = "auto" if computed == "auto" else getattr(torch, computed)
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        for name, adapter in config.lora_adapters.items():
            self.model.load_adapter(adapter, adapter_name=name)
        self.model.eval()

    def check(self, adapters: list[str | None]) -> None:
        unknown = sorted({a for a in adapters if a is not None and a not in self.config.lora_adapters})
        if unknown:
            raise ConfigError(f"unknown LoRA adapter {unknown[0]!r}: configured {sorted(self.config.lora_adapters) or 'none'} "
                              "(backend.lora_adapters), or set student.adapter=null for the base model")

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        self.check([r.lora for r in requests])
        for r in requests:
            if r.regex or r.json_schema:
                raise ValueError("the hf backend cannot force a regex or JSON schema; use vllm or openai")
        results: list[Completion | None] = [None] * len(requests)
        groups = defaultdict(list)
        for i, r in enumerate(requests):
            reason = self._too_long(r)
            if reason:
                results[i] = Completion(text="", error=reason)
            else:
                groups[(r.temperature, r.seed, r.lora)].append(i)
        size = max(1, self.config.batch_size)
        for indices in groups.values():
            for start in range(0, len(indices), size):
                chunk = indices[start : start + size]
                for i, c in zip(chunk, self._generate_batch([requests[i] for i in chunk])):
                    results[i] = c
        return results  # type: ignore[return-value]

    def _too_long(self, r: ChatRequest) -> str | None:
        """The reason a prompt cannot be answered within max_model_len, or None."""
        if self.config.max_model_len is None:
            return None
        text = self.tokenizer.apply_chat_template(r.messages, tokenize=False, add_generation_prompt=True)
        tokens = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if tokens + r.max_tokens > self.config.max_model_len:
            return f"prompt too long: {tokens} prompt tokens + max_tokens {r.max_tokens} exceed max_model_len {self.config.max_model_len}"
        return None

    def _generate_batch(self, batch: list[ChatRequest]) -> list[Completion]:
        import torch

        first = batch[0]
        if self.config.lora_adapters:  # the base model answers requests that name no adapter
            if first.lora:
                self.model.enable_adapters()
                self.model.set_adapter(first.lora)
            else:
                self.model.disable_adapters()
        prompts = [
            self.tokenizer.apply_chat_template(r.messages, tokenize=False, add_generation_prompt=True)
            for r in batch
        ]
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        if first.seed is not None:
            torch.manual_seed(first.seed)
        sampling = first.temperature > 0
        with torch.no_grad():
            out = self.model.generate(
                **enc,
                max_new_tokens=max(r.max_tokens for r in batch),
                do_sample=sampling,
                temperature=first.temperature if sampling else None,
                top_p=None,
                top_k=None,
                pad_token_id=self.tokenizer.pad_token_id,
                output_scores=any(r.logprobs for r in batch),
                return_dict_in_generate=True,
            )
        prompt_len = enc["input_ids"].shape[1]
        completions = []
        for row, r in enumerate(batch):
            ids = out.sequences[row, prompt_len:].tolist()[: r.max_tokens]
            ids, finish = self._until_eos(ids, r.max_tokens)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            for s in r.stop or []:
                if s in text:
                    text, finish = text[: text.index(s)], "stop"
            logprobs = self._logprobs(out.scores, row, ids, r.logprobs) if r.logprobs else None
            completions.append(
                Completion(
                    text=text,
                    prompt_tokens=int(enc["attention_mask"][row].sum()),
                    completion_tokens=len(ids),
                    finish_reason=finish,
                    logprobs=logprobs,
                )
            )
        return completions

    def _until_eos(self, ids: list[int], max_tokens: int) -> tuple[list[int], str]:
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos]) | {self.tokenizer.eos_token_id}
        for k, t in enumerate(ids):
            if t in eos:
                return ids[:k], "stop"
        return ids, "length" if len(ids) >= max_tokens else "stop"

    def _logprobs(self, scores, row: int, ids: list[int], k: int) -> list[TokenLogprob]:
        import torch

        result = []
        for step, token_id in enumerate(ids):
            logp = torch.log_softmax(scores[step][row].float(), dim=-1)
            best = torch.topk(logp, k)
            top: dict[str, float] = {}
            for t, v in zip(best.indices, best.values):  # best first: a text shared by two tokens keeps the better
                top.setdefault(self.tokenizer.decode([int(t)]), float(v))
            result.append(TokenLogprob(token=self.tokenizer.decode([token_id]), logprob=float(logp[token_id]), top=top))
        return result
