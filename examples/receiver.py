"""A local HTTP receiver that honours `Idempotency-Key`, for tests and demos of `http` effects
(docs/design.md, Effects).

Every request to any path other than `/counts` is a delivery. A delivery with a key it has not
seen is applied (numbered, its body kept) and answered `201` with `{"applied": n, "key": ...}`;
a delivery with a key it has seen is answered with the first answer again plus the header
`Idempotent-Replayed: true`, and applies nothing. A delivery without a key is applied every
time (as a receiver that knows nothing of keys would). `GET /counts` answers what happened:

    {"requests": all deliveries, "applied": effects applied, "replayed": duplicates answered,
     "unkeyed": deliveries without a key, "by_key": {key: deliveries with that key}}

The state is a SQLite file, written before the answer is sent, so it survives a restart of the
receiver (and of whoever sends to it). Two knobs make it misbehave on purpose:
`--fail-first N` answers the first N deliveries `503` without applying them, and `--delay-s S`
applies a delivery and then waits S seconds before answering (a sender killed meanwhile never
learns that it was applied).

    python -m examples.receiver --port 8099 --state /tmp/receiver.db
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

REPLAYED_HEADER = "Idempotent-Replayed"
KEY_HEADER = "Idempotency-Key"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS applied (
    number INTEGER PRIMARY KEY, key TEXT UNIQUE, method TEXT NOT NULL, path TEXT NOT NULL,
    body TEXT NOT NULL, status INTEGER NOT NULL, answer TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS requests (key TEXT, replayed INTEGER NOT NULL, failed INTEGER NOT NULL);
"""


class ReceiverState:
    """The receiver's SQLite file: applied effects and every request seen. One lock serialises
    the writes, so two deliveries of one key at once apply it once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        with self._db() as db:
            db.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(str(self.path), isolation_level=None, timeout=30)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            yield db
        finally:
            db.close()

    def deliver(
        self, key: str | None, method: str, path: str, body: str, *, fail: bool
    ) -> tuple[int, dict[str, Any], bool]:
        """Apply (or replay, or fail) one delivery; its status, answer and whether replayed."""
        with self._lock, self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            seen = None
            if key is not None:
                seen = db.execute(
                    "SELECT status, answer FROM applied WHERE key = ?", (key,)
                ).fetchone()
            if seen is not None:
                db.execute("INSERT INTO requests VALUES (?, 1, 0)", (key,))
                db.execute("COMMIT")
                return int(seen[0]), json.loads(seen[1]), True
            if fail:
                db.execute("INSERT INTO requests VALUES (?, 0, 1)", (key,))
                db.execute("COMMIT")
                return 503, {"error": "unavailable (--fail-first)"}, False
            number = db.execute("SELECT COALESCE(MAX(number), 0) + 1 FROM applied").fetchone()[0]
            answer = {"applied": number, "key": key}
            db.execute(
                "INSERT INTO applied VALUES (?, ?, ?, ?, ?, 201, ?)",
                (number, key, method, path, body, json.dumps(answer)),
            )
            db.execute("INSERT INTO requests VALUES (?, 0, 0)", (key,))
            db.execute("COMMIT")
            return 201, answer, False

    def counts(self) -> dict[str, Any]:
        with self._lock, self._db() as db:
            requests, replayed, unkeyed, failed = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(replayed), 0),"
                " COALESCE(SUM(key IS NULL), 0), COALESCE(SUM(failed), 0) FROM requests"
            ).fetchone()
            applied = db.execute("SELECT COUNT(*) FROM applied").fetchone()[0]
            by_key = dict(
                db.execute(
                    "SELECT key, COUNT(*) FROM requests WHERE key IS NOT NULL GROUP BY key"
                ).fetchall()
            )
        return {
            "requests": requests,
            "applied": applied,
            "replayed": replayed,
            "unkeyed": unkeyed,
            "failed": failed,
            "by_key": by_key,
        }


def create_app(state_path: Path, *, fail_first: int = 0, delay_s: float = 0.0) -> Starlette:
    """The receiver's app on the state file `state_path` (created if need be)."""
    state = ReceiverState(state_path)
    failures_left = [fail_first]

    async def counts(request: Request) -> Response:
        return JSONResponse(await anyio.to_thread.run_sync(state.counts))

    async def deliver(request: Request) -> Response:
        key = request.headers.get(KEY_HEADER)
        body = (await request.body()).decode("utf-8", errors="replace")
        fail = failures_left[0] > 0
        if fail:
            failures_left[0] -= 1
        status, answer, replayed = await anyio.to_thread.run_sync(
            lambda: state.deliver(key, request.method, request.url.path, body, fail=fail)
        )
        if delay_s > 0 and not replayed and not fail:
            await anyio.sleep(delay_s)
        headers = {REPLAYED_HEADER: "true"} if replayed else {}
        return JSONResponse(answer, status_code=status, headers=headers)

    methods = ["POST", "PUT", "PATCH", "DELETE", "GET"]
    return Starlette(
        routes=[
            Route("/counts", counts, methods=["GET"]),
            Route("/{path:path}", deliver, methods=methods),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.receiver", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", type=Path, required=True, help="the receiver's SQLite file")
    parser.add_argument("--fail-first", type=int, default=0, metavar="N")
    parser.add_argument("--delay-s", type=float, default=0.0, metavar="S")
    args = parser.parse_args(argv)

    import uvicorn

    app = create_app(args.state, fail_first=args.fail_first, delay_s=args.delay_s)
    print(f"receiver listening on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
