"""The student scorer: one call per turn, on vLLM (offline or `vllm serve`) or transformers."""
