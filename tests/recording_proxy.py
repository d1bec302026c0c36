"""A reverse proxy that records every answer the supervisor acknowledged, for
tests/drills/test_power_loss.py: what operators and runners were told is in its record, whatever the
supervisor's disk kept.

`python -m tests.recording_proxy --port P --upstream URL --record FILE` forwards every request
to URL. Each 2xx answer is appended to FILE as one JSON line (method, path, status, the
request's JSON body or an uploaded body's sha256, the answer's JSON body) and flushed before
the client gets it: a client that saw an answer finds it recorded. A supervisor that cannot be
reached is a 502, recorded nowhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from typing import IO, Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


def create_app(upstream: str, record: IO[str]) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=300, trust_env=False)

    async def forward(request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        try:
            answer = await client.request(
                request.method,
                request.url.path,
                params=request.query_params,
                content=body,
                headers=headers,
            )
        except httpx.HTTPError as exc:
            return Response(f"upstream: {exc!r}", status_code=502)
        if 200 <= answer.status_code < 300:
            entry: dict[str, Any] = {
                "method": request.method,
                "path": request.url.path,
                "status": answer.status_code,
                "request": _body(body, request.headers.get("content-type", "")),
                "answer": _body(answer.content, answer.headers.get("content-type", "")),
            }
            record.write(json.dumps(entry) + "\n")
            record.flush()
        out = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
        out.pop("content-encoding", None)  # httpx decoded it
        return Response(answer.content, status_code=answer.status_code, headers=out)

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


def _body(data: bytes, content_type: str) -> Any:
    if "json" in content_type:
        try:
            return json.loads(data)
        except ValueError:
            pass
    if not data:
        return None
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.recording_proxy")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--record", required=True)
    args = parser.parse_args()
    with open(args.record, "a", encoding="utf-8") as record:
        app = create_app(args.upstream, record)
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
