"""A content-addressed cache of completions in sqlite, so that no call is paid twice.

The key hashes the model's name, the content hashes of the model and of the request's adapter
(a retrained adapter at the same path asks again), the dtype they compute in, and the whole request (messages, sampling,
constraint, adapter name).
Each batch is committed as soon as it returns, so a run killed at any point loses no finished call.
Failed completions (`error` set) are not cached: they are tried again next time.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from pathlib import Path

from fastvista.llm import Backend, ChatRequest, Completion


def request_key(model: str, request: ChatRequest, fingerprint: dict | None = None) -> str:
    weights = None
    if fingerprint is not None:
        adapter = fingerprint["adapters"].get(request.lora) if request.lora else None
        weights = [fingerprint["model_sha256"], adapter["sha256"] if adapter else None, fingerprint.get("dtype")]
    payload = json.dumps({"model": model, "weights": weights, "request": request.model_dump()}, sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class CompletionCache:
    def __init__(self, path: str | os.PathLike):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # one connection shared by the threads of the continuous schedule, used under a lock
        self.db = sqlite3.connect(str(path), check_same_thread=False)
        self.lock = threading.Lock()
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS completions (key TEXT PRIMARY KEY, value TEXT)")
        self.db.commit()

    def get_many(self, keys: list[str]) -> dict[str, Completion]:
        found = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            with self.lock:
                rows = self.db.execute(
                    f"SELECT key, value FROM completions WHERE key IN ({','.join('?' * len(chunk))})", chunk
                ).fetchall()
            found.update({k: Completion.model_validate_json(v) for k, v in rows})
        return found

    def put_many(self, items: dict[str, Completion]) -> None:
        with self.lock:
            self.db.executemany(
                "INSERT OR REPLACE INTO completions VALUES (?, ?)",
                [(k, c.model_dump_json()) for k, c in items.items()],
            )
            self.db.commit()

    def __len__(self) -> int:
        with self.lock:
            return self.db.execute("SELECT COUNT(*) FROM completions").fetchone()[0]


class CachedBackend:
    """Wraps any backend: answers from the cache, sends only the misses, stores the answers."""

    def __init__(self, backend: Backend, path: str | os.PathLike, fingerprint: dict | None = None):
        self.backend = backend
        self.fingerprint = fingerprint
        self.cache = CompletionCache(path)
        self.name = backend.name
        self.supports_constraints = backend.supports_constraints
        self.concurrent = backend.concurrent

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        keys = [request_key(self.name, r, self.fingerprint) for r in requests]
        hits = self.cache.get_many(list(set(keys)))
        misses = list(dict.fromkeys(k for k in keys if k not in hits))
        if misses:
            by_key = dict(zip(keys, requests))
            fresh = dict(zip(misses, self.backend.generate([by_key[k] for k in misses])))
            self.cache.put_many({k: c for k, c in fresh.items() if c.error is None})
        else:
            fresh = {}
        return [
            hits[k].model_copy(update={"cached": True}) if k in hits else fresh[k] for k in keys
        ]

    def check(self, adapters: list[str | None]) -> None:
        self.backend.check(adapters)
