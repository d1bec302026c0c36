"""One operation of the v1 API: what the OpenAPI document says of it (method, path, who may
call it, the record it reads, what it answers per status, the error codes it can send) beside
the handler that serves it. The app's routes and the document are both made from a table of
these (`tether.supervisor.api.contract`), so neither can name a route the other lacks.

A record operation's handler returns the record its declaration names (`Operation` is generic
in it, so the type checker holds the two together); the route writes it with the one codec.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Generic, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from tether.supervisor.api.errors import record_response
from tether.supervisor.ledger import Role
from tether.wire import ErrorCode
from tether.wire.records import Record

R = TypeVar("R", bound=Record)
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
class Declared(abc.ABC):
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
    body: Body | None = None
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
class Operation(Declared, Generic[R]):
    """A route that answers the record `answer`, with each of `statuses` (200 alone by
    default), and with no body at all under `empty` when its handler returns None (a claim
    that got no lease: 204). Its handler returns `answer`, `Answered[answer]` when there is
    more than one status, and `answer | None` when there is an `empty` one."""

    answer: type[R]
    handler: Callable[[Request], Awaitable[R | Answered[R] | None]]
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

        async def answer(request: Request) -> Response:
            found = await handler(request)
            if found is None:
                if empty is None:
                    raise TypeError(f"{route} answered nothing and declares no empty answer")
                return Response(status_code=empty)
            if isinstance(found, Answered):
                return record_response(found.record, found.status)
            return record_response(found)

        return answer


@dataclasses.dataclass(frozen=True, kw_only=True)
class RawOperation(Declared):
    """A route that answers bytes (`answer`: an artifact, a bundle, the metrics, the
    document), written by its handler."""

    answer: Raw
    handler: Endpoint

    @property
    def answers(self) -> Mapping[int, Answer]:
        return {200: self.answer}

    def endpoint(self) -> Endpoint:
        return self.handler
