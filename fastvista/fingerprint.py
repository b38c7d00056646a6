"""Content fingerprints of models and adapters: a retrained adapter or merged model at the same
path is another model, so its results and cached calls must never be reused."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def _cache_file() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fastvista" / "sha256.json"


def content_sha256(path: str | os.PathLike) -> str:
    """sha256 over a file's bytes, or over a folder's files (relative names and bytes, in order).
    Remembered (in ~/.cache/fastvista) by each file's name, size and modification time, so a
    multi-GB model is read once, not on every command."""
    root = Path(path).resolve()
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    state = hashlib.sha256(repr([(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]).encode()).hexdigest()
    cache = _cache_file()
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if state not in known:
        known[state] = _hash(str(root), [str(p) for p in files])
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known))
            tmp.replace(cache)
        except OSError:
            pass  # an unwritable cache costs time, never correctness
    return known[state]


def _hash(root: str, files: list[str]) -> str:
    h = hashlib.sha256()
    for name in files:
        h.update(os.path.relpath(name, root).encode() + b"\0")
        with open(name, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return h.hexdigest()


def model_sha256(model: str) -> str | None:
    """The content hash of a local model or adapter; None for a name a server resolves."""
    from fastvista.models import resolve_model

    path = Path(resolve_model(model))
    return content_sha256(path) if path.exists() else None
