"""Engine processes die with the command that started them, even when it is killed with SIGKILL.

vLLM runs its engine in child processes (`VLLM::EngineCore`, `VLLM::Worker`) that outlive a
parent killed without cleanup, holding gigabytes and a core, so the next run cannot get its KV
cache. Before a command starts an engine (in process or `vllm serve`), `watch_children` starts,
once per process, a small watchdog process that notes the command's descendants twice a second
and, once the command is gone (however it ended), stops every one of them still running.
`refuse_leftover_engines` finds an engine whose command is gone (an orphan) before a new one
starts, and says how to stop it; engines of runs still alive are theirs, and left alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

ENGINE_PREFIX = "VLLM::"
POLL_SECONDS = 0.5


_watchdog: subprocess.Popen | None = None


def watch_children() -> None:
    """Start this process's watchdog, once (it exits on its own after this process ends)."""
    global _watchdog
    if _watchdog is None or _watchdog.poll() is not None:
        _watchdog = subprocess.Popen([sys.executable, "-m", "fastvista.reaper", str(os.getpid())],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _is_engine(p) -> bool:
    import psutil

    try:
        cmdline = p.cmdline()
        return p.name().startswith(ENGINE_PREFIX) or bool(cmdline and cmdline[0].startswith(ENGINE_PREFIX))
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _orphaned(p) -> bool:
    """An engine whose command is gone: the first ancestor that is not an engine is init."""
    import psutil

    try:
        while p is not None and _is_engine(p):
            p = p.parent()
        return p is None or p.pid == 1
    except psutil.Error:
        return False


def leftover_engines() -> list:
    """vLLM engine processes whose command is gone."""
    import psutil

    return [p for p in psutil.process_iter() if _is_engine(p) and _orphaned(p)]


def refuse_leftover_engines() -> None:
    from fastvista.llm import ConfigError

    found = leftover_engines()
    if found:
        listed = ", ".join(f"pid {p.pid} ({p.info['name'] if getattr(p, 'info', None) else p.name()}, "
                           f"{p.memory_info().rss / 2**30:.1f} GiB)" for p in found)
        raise ConfigError(f"a vLLM engine left behind by a run that is gone is still running: {listed}; it holds the "
                          f"memory this engine needs. Stop it (kill {' '.join(str(p.pid) for p in found)}) and run again")


def _stop(processes: dict[int, float]) -> None:
    """SIGTERM, then SIGKILL a few seconds later, each process that is still the one noted
    (same pid and start time: a reused pid is left alone)."""
    import psutil

    alive = []
    for pid, started in processes.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == started:
                p.terminate()
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    _, still = psutil.wait_procs(alive, timeout=5)
    for p in still:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def watch(parent: int) -> None:
    import psutil

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # outlive Ctrl-C and a group SIGTERM: clean up after the parent
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    me = os.getpid()
    known: dict[int, float] = {}
    while os.getppid() == parent:
        try:
            for p in psutil.Process(parent).children(recursive=True):
                if p.pid != me:
                    known.setdefault(p.pid, p.create_time())
        except psutil.NoSuchProcess:
            break
        except (psutil.AccessDenied, psutil.ZombieProcess):
            pass
        time.sleep(POLL_SECONDS)
    _stop(known)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
