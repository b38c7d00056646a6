"""Content fingerprints of models and adapters: a retrained adapter or merged model at the same
path is another model, so its results and cached calls must never be reused."""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path


def content_sha256(path: str | os.PathLike) -> str:
    """sha256 over a file's bytes, or over a folder's files (relative names and bytes, in order)."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    state = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _hash(str(root), state)


@lru_cache(maxsize=64)
def _hash(root: str, state: tuple) -> str:
    """Cached on each file's name, size and modification time, so a run hashes a model once."""
    h = hashlib.sha256()
    for name, _, _ in state:
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
