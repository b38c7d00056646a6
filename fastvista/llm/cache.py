"""A content-addressed cache of completions in sqlite, so that no call is paid twice.

The key hashes the model's name, the content hashes of the model and of the request's adapter
(a retrained adapter at the same path asks again), the dtype they compute in, and the whole request (messages, sampling,
constraint, adapter name).
Each batch is committed as soon as it returns, so a run killed at any point loses no finished call.
Failed completions (`error` set) are not cached: they are tried again next time.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sqlite3
import threading
from pathlib import Path

from fastvista.llm import REPEATED_LINE_RULE, Backend, ChatRequest, Completion


def request_key(model: str, request: ChatRequest, fingerprint: dict | None = None) -> str:
    weights = None
    if fingerprint is not None:
        adapter = fingerprint["adapters"].get(request.lora) if request.lora else None
        weights = [fingerprint["model_sha256"], adapter["sha256"] if adapter else None, fingerprint.get("dtype")]
    asked = request.model_dump(exclude=set() if request.end_on_repeated_line else {"end_on_repeated_line"})  # older keys stay valid (numbered answers' too, below)
    if request.end_on_repeated_line:  # an answer ended by one version of the rule is not another's
        # numbered lines keep the keys of the rule's first version, which compared every answer that way
        style = request.end_on_repeated_line
        asked["end_on_repeated_line"] = REPEATED_LINE_RULE if style == "numbered" else f"{REPEATED_LINE_RULE}/{style}"
    payload = json.dumps({"model": model, "weights": weights, "request": asked}, sort_keys=True)
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
        self.stepping = getattr(backend, "stepping", False)
        self.tickets = itertools.count()
        self.open: dict[int, tuple[list[str], dict[str, Completion], list[str]]] = {}  # ticket -> keys, hits, misses
        self.sent: dict[int, int] = {}  # the wrapped backend's ticket -> ours
        self.ready: list[tuple[int, list[Completion]]] = []

    def lookup(self, requests: list[ChatRequest]) -> tuple[list[str], dict[str, Completion], list[str]]:
        """Each request's key, the answers the cache has, and the keys to ask for (once each)."""
        keys = [request_key(self.name, r, self.fingerprint) for r in requests]
        hits = self.cache.get_many(list(set(keys)))
        return keys, hits, list(dict.fromkeys(k for k in keys if k not in hits))

    def answers(self, keys: list[str], hits: dict[str, Completion], misses: list[str], fresh: list[Completion]) -> list[Completion]:
        """The answers in request order; the fresh ones that succeeded are stored first."""
        fresh_by_key = dict(zip(misses, fresh))
        self.cache.put_many({k: c for k, c in fresh_by_key.items() if c.error is None})
        return [hits[k].model_copy(update={"cached": True}) if k in hits else fresh_by_key[k] for k in keys]

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        keys, hits, misses = self.lookup(requests)
        by_key = dict(zip(keys, requests))
        return self.answers(keys, hits, misses, self.backend.generate([by_key[k] for k in misses]) if misses else [])

    def submit(self, requests: list[ChatRequest]) -> int:
        keys, hits, misses = self.lookup(requests)
        ticket = next(self.tickets)
        if misses:
            by_key = dict(zip(keys, requests))
            self.sent[self.backend.submit([by_key[k] for k in misses])] = ticket
            self.open[ticket] = (keys, hits, misses)
        else:
            self.ready.append((ticket, self.answers(keys, hits, [], [])))
        return ticket

    def step(self) -> list[tuple[int, list[Completion]]]:
        """The tickets the cache answered whole first (no engine step), else one step of the engine."""
        if not self.ready:
            for theirs, fresh in self.backend.step():
                ticket = self.sent.pop(theirs)
                self.ready.append((ticket, self.answers(*self.open.pop(ticket), fresh)))
        done, self.ready = self.ready, []
        return done

    def abandon(self) -> None:
        self.backend.abandon()
        self.open.clear()
        self.sent.clear()
        self.ready.clear()

    def check(self, adapters: list[str | None]) -> None:
        self.backend.check(adapters)
