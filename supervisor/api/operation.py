"""One operation of the v1 API: what the OpenAPI document says of it (method, path, who may
call it, the record it reads, what it answers per status, the error codes it can send) beside
the handler that serves it. The app's routes and the document are both made from a table of
these (`tether.supervisor.api.contract`), so neither can name a route the other lacks.

The endpoint made from an operation does, in this order: check the token against the declared
`roles` (401 `unauthorized` without a known token, 403 `forbidden` for another role; no roles:
no token needed), then read and decode the declared record `body` (400, 413, 422), then call
the handler with a `Call`: the request, the caller's principal and the decoded body. A caller
without a valid token never has its body read: no CPU is spent decoding for strangers, and no
detail of a body's fault reaches them. A handler neither authenticates nor decodes
(tests/supervisor/api/test_operation_calls.py holds it to that). A raw body (an artifact's
bytes) is the handler's to stream.

`Operation` is generic in the body it reads and the record it answers, so the type checker
holds each handler to both; the route writes the answer with the one codec.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Generic, TypeVar, cast

from starlette.requests import Request
from starlette.responses import Response

from tether.supervisor.api.auth import require
from tether.supervisor.api.errors import record_response
from tether.supervisor.api.requests import read
from tether.supervisor.ledger import Principal, Role
from tether.wire import ErrorCode
from tether.wire.records import Record

R = TypeVar("R", bound=Record)
# The record an operation's body decodes into; None for an operation without a record body.
B = TypeVar("B", bound=Record | None)
E = ErrorCode


@dataclasses.dataclass(frozen=True)
class Raw:
    """A body that is not a record: bytes of `media_type`, described by `schema`."""

    media_type: str
    schema: Mapping[str, Any]


BYTES: Final = Raw("application/octet-stream", {"type": "string", "format": "binary"})
PROMETHEUS_TEXT: Final = Raw("text/plain", {"type": "string"})
OPENAPI_JSON: Final = Raw("application/json", {"type": "object"})

Body = type[Record] | Raw
# A status's answer: a record, raw bytes, or None for no body at all (204).
Answer = Body | None
Endpoint = Callable[[Request], Awaitable[Response]]


@dataclasses.dataclass(frozen=True)
class Call(Generic[B]):
    """What an operation's endpoint established before calling its handler: the request, its
    decoded `body` (None when the operation declares no record body) and the caller's
    `principal` (None when the operation declares no roles)."""

    request: Request
    body: B
    principal: Principal | None = None

    @property
    def who(self) -> Principal:
        """The caller, who holds one of the operation's roles."""
        if self.principal is None:
            raise TypeError("an operation without roles has no caller to name")
        return self.principal


async def _call(request: Request, roles: tuple[Role, ...], body: type[B] | Raw | None) -> Call[B]:
    """Authenticate against `roles`, then decode `body` (see the module's docstring)."""
    principal = await require(request, roles[0], *roles[1:]) if roles else None
    # A record `body` is a `type[B]` that decodes into a `B`; without one `B` is None.
    decoded = await read(request, cast(type[Record], body)) if isinstance(body, type) else None
    return Call(request, cast(B, decoded), principal)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Param:
    """A path or query parameter; `bound_by` names the `SupervisorSettings` field that is its
    maximum, when a setting is."""

    name: str
    description: str
    schema: Mapping[str, Any]
    bound_by: str | None = None


@dataclasses.dataclass(frozen=True)
class Answered(Generic[R]):
    """A record and the status it goes with, from a handler whose operation declares more
    than one (`POST /v1/tasks`: 201 for a new task, 200 for the one its key made before)."""

    record: R
    status: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Declared(abc.ABC, Generic[B]):
    """What the document says of a route. `roles` empty: no token needed. `errors` are the
    codes particular to the route; `codes` adds the ones its token, body and the server itself
    can send. `bound_by` names, for a field of the body, the `SupervisorSettings` field that
    is its maximum."""

    method: str
    path: str
    name: str
    summary: str
    tag: str
    roles: tuple[Role, ...]
    body: type[B] | Raw | None = None
    errors: tuple[ErrorCode, ...] = ()
    params: tuple[Param, ...] = ()
    query: tuple[Param, ...] = ()
    bound_by: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def codes(self) -> tuple[ErrorCode, ...]:
        """Every error code the route can send, in `ErrorCode`'s order."""
        found = {*self.errors, E.INTERNAL}
        if self.roles:  # authentication reads the ledger
            found |= {E.UNAUTHORIZED, E.FORBIDDEN, E.UNAVAILABLE}
        if isinstance(self.body, type):
            found |= {E.BAD_REQUEST, E.MALFORMED_JSON, E.BODY_TOO_LARGE, E.INVALID_FIELD}
        return tuple(code for code in ErrorCode if code in found)

    @property
    @abc.abstractmethod
    def answers(self) -> Mapping[int, Answer]:
        """What the route answers, by status."""

    @abc.abstractmethod
    def endpoint(self) -> Endpoint:
        """The Starlette endpoint that serves the route."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Operation(Declared[B], Generic[B, R]):
    """A route that reads the record `body` (or none) and answers the record `answer`, with
    each of `statuses` (200 alone by default), and with no body at all under `empty` when its
    handler returns None (a claim that got no lease: 204). Its handler takes a `Call[body]`
    (`Call[None]` without a record body) and returns `answer`, `Answered[answer]` when there
    is more than one status, and `answer | None` when there is an `empty` one."""

    answer: type[R]
    handler: Callable[[Call[B]], Awaitable[R | Answered[R] | None]]
    statuses: tuple[int, ...] = (200,)
    empty: int | None = None

    @property
    def answers(self) -> Mapping[int, Answer]:
        found: dict[int, Answer] = dict.fromkeys(self.statuses, self.answer)
        if self.empty is not None:
            found[self.empty] = None
        return found

    def endpoint(self) -> Endpoint:
        handler, empty, route = self.handler, self.empty, f"{self.method} {self.path}"
        roles, body = self.roles, self.body

        async def answer(request: Request) -> Response:
            found = await handler(await _call(request, roles, body))
            if found is None:
                if empty is None:
                    raise TypeError(f"{route} answered nothing and declares no empty answer")
                return Response(status_code=empty)
            if isinstance(found, Answered):
                return record_response(found.record, found.status)
            return record_response(found)

        return answer


@dataclasses.dataclass(frozen=True, kw_only=True)
class RawOperation(Declared[None]):
    """A route that answers bytes (`answer`: an artifact, a bundle, the metrics, the
    document), written by its handler; it reads no record body."""

    body: Raw | None = None
    answer: Raw
    handler: Callable[[Call[None]], Awaitable[Response]]

    @property
    def answers(self) -> Mapping[int, Answer]:
        return {200: self.answer}

    def endpoint(self) -> Endpoint:
        handler, roles, body = self.handler, self.roles, self.body

        async def answer(request: Request) -> Response:
            return await handler(await _call(request, roles, body))

        return answer
