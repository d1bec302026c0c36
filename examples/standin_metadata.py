"""A stand-in cloud metadata service: a TEST DOUBLE of the three preemption notices the runner
reads (`runner/preemption/`), each in its provider's documented shape, for tests and the bench.

- AWS IMDSv2: `PUT /latest/api/token` (header `X-aws-ec2-metadata-token-ttl-seconds`, 1..21600;
  refused with 403 when `X-Forwarded-For` is set, as EC2 does) gives a token;
  `GET /latest/meta-data/spot/instance-action` needs it (401 without, or with another) and
  answers 404 until a notice, then `{"action", "time"}`.
- GCP: `GET /computeMetadata/v1/instance/preempted` needs `Metadata-Flavor: Google` (403
  without) and answers `FALSE` or `TRUE`, with `Metadata-Flavor: Google`.
- Azure: `GET /metadata/scheduledevents?api-version=...` and
  `/metadata/instance/compute/name?api-version=...&format=text` need `Metadata: true` (400
  without, or without `api-version`); the events are `{"DocumentIncarnation", "Events"}`, a
  notice a `Preempt` event naming the VM with its `NotBefore`.

Every answer carries the stand-in's `Date` (served in process too), against which the notice's
time is read. One notice
shows in all three shapes at once. Its admin routes have no authentication: bind it to
127.0.0.1 only. It lives outside the installed package, as the stand-in model does.

    POST   /_admin/notice  {"in_s": 120, "action": "terminate", "vm": NAME} -> the notice now
                           (all optional: 120 s ahead, "terminate", this VM)
    DELETE /_admin/notice  no notice any more
    GET    /_admin/stats   {"requests": {route: count}, "refused": n, "tokens": n}
"""

from __future__ import annotations

import dataclasses
import email.utils
import math
import secrets
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tether.cli import Parser

TOKEN_TTL_MAX_S = 21_600
DEFAULT_VM = "spot-vm-1"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Notice:
    """The reclaim the stand-in announces: when (on its own clock) and what."""

    at: float  # time.time() of the interruption
    action: str = "terminate"
    vm: str = DEFAULT_VM


@dataclasses.dataclass
class State:
    vm_name: str = DEFAULT_VM
    notice: Notice | None = None
    tokens: dict[str, float] = dataclasses.field(default_factory=dict)  # token -> expiry
    requests: Counter[str] = dataclasses.field(default_factory=Counter)
    refused: int = 0
    incarnation: int = 1


class Routes:
    """The stand-in's routes over one `State`."""

    def __init__(self, state: State) -> None:
        self.state = state

    def _refuse(self, status: int, text: str) -> Response:
        self.state.refused += 1
        return PlainTextResponse(text, status_code=status)

    async def aws_token(self, request: Request) -> Response:
        self.state.requests["aws_token"] += 1
        if "x-forwarded-for" in request.headers:
            return self._refuse(403, "Forbidden")
        try:
            ttl = int(request.headers.get("x-aws-ec2-metadata-token-ttl-seconds", ""))
        except ValueError:
            return self._refuse(400, "Missing or Invalid Parameters")
        if not 1 <= ttl <= TOKEN_TTL_MAX_S:
            return self._refuse(400, "Missing or Invalid Parameters")
        token = secrets.token_urlsafe(32)
        self.state.tokens[token] = time.time() + ttl
        return PlainTextResponse(token)

    async def aws_action(self, request: Request) -> Response:
        self.state.requests["aws_action"] += 1
        token = request.headers.get("x-aws-ec2-metadata-token", "")
        if self.state.tokens.get(token, 0.0) <= time.time():
            return self._refuse(401, "Unauthorized")
        notice = self.state.notice
        if notice is None:
            return PlainTextResponse("Not Found", status_code=404)
        at = datetime.fromtimestamp(notice.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return JSONResponse({"action": notice.action, "time": at})

    async def gcp_preempted(self, request: Request) -> Response:
        self.state.requests["gcp_preempted"] += 1
        if request.headers.get("metadata-flavor") != "Google":
            return self._refuse(403, "Missing Metadata-Flavor:Google header.")
        text = "FALSE" if self.state.notice is None else "TRUE"
        return PlainTextResponse(text, headers={"Metadata-Flavor": "Google"})

    def _azure_refusal(self, request: Request) -> Response | None:
        if request.headers.get("metadata", "").lower() != "true":
            return self._refuse(400, "Bad request. Required metadata header not specified")
        if not request.query_params.get("api-version"):
            return self._refuse(400, "Bad request. api-version was not specified")
        return None

    async def azure_events(self, request: Request) -> Response:
        self.state.requests["azure_events"] += 1
        if (refused := self._azure_refusal(request)) is not None:
            return refused
        events: list[dict[str, Any]] = []
        if (notice := self.state.notice) is not None:
            events.append(
                {
                    "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
                    "EventStatus": "Scheduled",
                    "EventType": "Preempt",
                    "ResourceType": "VirtualMachine",
                    "Resources": [notice.vm],
                    "NotBefore": email.utils.formatdate(notice.at, usegmt=True),
                    "Description": "",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            )
        return JSONResponse({"DocumentIncarnation": self.state.incarnation, "Events": events})

    async def azure_name(self, request: Request) -> Response:
        self.state.requests["azure_name"] += 1
        if (refused := self._azure_refusal(request)) is not None:
            return refused
        return PlainTextResponse(self.state.vm_name)

    async def notice(self, request: Request) -> Response:
        state = self.state
        state.incarnation += 1
        if request.method == "DELETE":
            state.notice = None
            return JSONResponse({"notice": None})
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "body is not JSON"}, 400)
        body = {} if body is None else body
        in_s, action = body.get("in_s", 120.0), body.get("action", "terminate")
        vm = body.get("vm", state.vm_name)
        if (
            not isinstance(in_s, int | float)
            or isinstance(in_s, bool)
            or not math.isfinite(in_s)
            or in_s < 0
            or not isinstance(action, str)
            or not isinstance(vm, str)
        ):
            return JSONResponse({"error": "in_s >= 0, action and vm strings"}, 400)
        state.notice = Notice(at=time.time() + in_s, action=action, vm=vm)
        return JSONResponse({"notice": dataclasses.asdict(state.notice)})

    async def stats(self, _request: Request) -> Response:
        state = self.state
        counts = {"refused": state.refused, "tokens": len(state.tokens)}
        return JSONResponse({"requests": dict(state.requests), **counts})


def create_app(vm_name: str = DEFAULT_VM) -> Starlette:
    """The stand-in as an ASGI app; `app.state.metadata` is its live `State`."""
    routes = Routes(State(vm_name=vm_name))
    app = Starlette(
        routes=[
            Route("/latest/api/token", routes.aws_token, methods=["PUT"]),
            Route("/latest/meta-data/spot/instance-action", routes.aws_action, methods=["GET"]),
            Route("/computeMetadata/v1/instance/preempted", routes.gcp_preempted, methods=["GET"]),
            Route("/metadata/scheduledevents", routes.azure_events, methods=["GET"]),
            Route("/metadata/instance/compute/name", routes.azure_name, methods=["GET"]),
            Route("/_admin/notice", routes.notice, methods=["POST", "DELETE"]),
            Route("/_admin/stats", routes.stats, methods=["GET"]),
        ],
        middleware=[Middleware(BaseHTTPMiddleware, dispatch=_dated)],
    )
    app.state.metadata = routes.state
    return app


async def _dated(request: Request, call_next: RequestResponseEndpoint) -> Response:
    response = await call_next(request)
    response.headers["Date"] = email.utils.formatdate(usegmt=True)
    return response


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="python -m examples.standin_metadata",
        description="A stand-in cloud metadata service (AWS, GCP, Azure notices): a test double.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--vm-name", default=DEFAULT_VM, help="this VM's name (Azure)")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        print(f"standin_metadata: --port must be 1..65535, got {args.port}", file=sys.stderr)
        return 2
    import uvicorn

    app = create_app(args.vm_name)
    # The app dates its answers itself (above), so that they carry one Date, in process too.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", date_header=False)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
