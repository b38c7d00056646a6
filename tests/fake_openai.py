"""A local OpenAI-compatible chat endpoint on loopback that answers with the scripted rules,
counts every request it receives, lists the models it serves, and can fail, throttle (429 with
Retry-After) or stall on purpose."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fastvista.llm import ChatRequest
from fastvista.single_pass import SYSTEM_PROMPTS
from tests.scripted import answer, student_answer


class FakeOpenAI:
    def __init__(self, delay: float = 0.0, fail_first: int = 0, throttle_first: int = 0, retry_after: float = 1.0,
                 models: tuple[str, ...] = ("teacher", "student", "scripted", "m")):
        self.delay, self.fail_first, self.models = delay, fail_first, models
        self.roots: dict[str, str] = {}  # served name -> the folder it is served from (vLLM lists it as `root`)
        self.down_for: str | None = None  # while set, every request whose body holds this text gets a 503
        self.garbled_for: str | None = None  # ... gets a 200 reply with no choices
        self.throttle_first, self.retry_after = throttle_first, retry_after
        self.arrivals: list[float] = []  # when each chat request arrived (monotonic clock)
        self.received: Counter = Counter()
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status: int, payload: dict, headers: dict | None = None):
                data = json.dumps(payload).encode()
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    self.reply(200, {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "x",
                                                                 **({"root": server.roots[m]} if m in server.roots else {})}
                                                                for m in server.models]})
                else:
                    self.reply(404, {"error": {"message": "not found"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.received[json.dumps(body, sort_keys=True)] += 1
                    server.arrivals.append(time.monotonic())
                    failing = server.fail_first > 0 or (server.down_for is not None and server.down_for in json.dumps(body))
                    server.fail_first -= server.fail_first > 0
                    throttled = not failing and server.throttle_first > 0
                    server.throttle_first -= throttled
                if failing:
                    self.reply(503, {"error": {"message": "overloaded"}})
                    return
                if throttled:
                    self.reply(429, {"error": {"message": "slow down"}}, {"Retry-After": str(server.retry_after)})
                    return
                if body["model"] not in server.models:
                    self.reply(404, {"error": {"message": f"model {body['model']} does not exist"}})
                    return
                if server.garbled_for is not None and server.garbled_for in json.dumps(body):
                    self.reply(200, {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"], "choices": []})
                    return
                time.sleep(server.delay)
                request = ChatRequest(messages=body["messages"], temperature=body.get("temperature", 0.0))
                text = (student_answer if body["messages"][0]["content"] in SYSTEM_PROMPTS.values() else answer)(request)  # in the asked style
                reply = {
                    "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
                }
                self.reply(200, reply)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
