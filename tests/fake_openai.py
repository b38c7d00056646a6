"""A local OpenAI-compatible chat endpoint on loopback that answers with the scripted rules,
counts every request it receives, and can fail or stall on purpose."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fastvista.llm import ChatRequest
from fastvista.single_pass import SYSTEM_PROMPT
from tests.scripted import answer, student_answer


class FakeOpenAI:
    def __init__(self, delay: float = 0.0, fail_first: int = 0):
        self.delay, self.fail_first = delay, fail_first
        self.received: Counter = Counter()
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.received[json.dumps(body, sort_keys=True)] += 1
                    failing = server.fail_first > 0
                    server.fail_first -= failing
                if failing:
                    self.send_response(503)
                    self.end_headers()
                    return
                time.sleep(server.delay)
                request = ChatRequest(messages=body["messages"], temperature=body.get("temperature", 0.0))
                text = (student_answer if body["messages"][0]["content"] == SYSTEM_PROMPT else answer)(request)
                reply = {
                    "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
                }
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
