"""A local fake model that timestamps every request it gets, for `bench.agent_lease`.

It serves `POST /v1/chat/completions` from a thread of the benchmark's own process, so the
arrival times it records (`time.time()`, the clock the supervisor stamps a grant with) need
no second process to be read back. Every request is answered at once with the stand-in's
deterministic echo (`examples.standin_model.answer_for`: no tool call, so an agent loop ends
after its first turn). Bound to 127.0.0.1 only.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from examples.standin_model import answer_for


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    at: float  # time.time() when the request's body had been read
    first_user: str  # the first user message: which step asked


class StampedModel:
    """The fake, started with `start()` and stopped with `stop()`; `requests` as they came."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def first_request_of(self, text: str) -> float | None:
        """When the first request whose first user message is `text` arrived."""
        with self._lock:
            return next((r.at for r in self.requests if r.first_user == text), None)

    def _record(self, body: dict[str, Any]) -> None:
        users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
        first = users[0] if users and isinstance(users[0], str) else ""
        with self._lock:
            self.requests.append(Request(at=time.time(), first_user=first))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the runner's client expects

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                model._record(body)
                self._send(200, answer_for(body))

            def do_GET(self) -> None:
                self._send(200, {"ok": True})

            def _send(self, status: int, document: dict[str, Any]) -> None:
                data = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return  # no line per request on the benchmark's stderr

        return Handler
