"""What an operation's endpoint establishes before its handler runs
(`tether.supervisor.api.operation`): the token first (401, 403), then the declared body (400,
413, 422), then the handler, with a `Call` of the caller and the decoded body. So a handler
neither authenticates nor decodes (an ast walk of the handlers' modules), takes the body its
operation declares (its annotation, where the type checker cannot see), and never runs for a
caller without the operation's role, whatever body that caller sent. Each check is shown to
catch its plant."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.conftest import API_TENANT, ApiHarness
from tether.supervisor.api.contract import OPERATIONS
from tether.supervisor.api.errors import ApiError
from tether.supervisor.api.operation import Call, Declared, Endpoint
from tether.supervisor.api.requests import read
from tether.supervisor.ledger import Role
from tether.wire import ERRORS, ErrorCode
from tether.wire import records as m

# -- a handler takes the body its operation declares


def _taken(handler: Any) -> Any:
    """The body type a handler's `Call[...]` parameter names (None's type for `Call[None]`)."""
    [param] = inspect.signature(handler).parameters
    hint = typing.get_type_hints(handler)[param]
    assert typing.get_origin(hint) is Call, f"{handler.__qualname__} does not take a Call"
    [body] = typing.get_args(hint)
    return body


def body_mismatches(operations: Sequence[Declared[Any]]) -> list[str]:
    """Each operation whose handler takes another body than the operation decodes."""
    found = []
    for op in operations:
        declared = op.body if isinstance(op.body, type) else types.NoneType
        taken = _taken(op.handler)
        if taken is not declared:
            found.append(f"{op.method} {op.path}: takes Call[{taken}], decodes {declared}")
    return found


def _operation(name: str) -> Any:
    return next(op for op in OPERATIONS if op.name == name)


def test_each_handler_takes_the_body_its_operation_decodes() -> None:
    assert body_mismatches(OPERATIONS) == []
    assert {_taken(op.handler) for op in OPERATIONS} >= {m.TaskCreate, m.Result, types.NoneType}


async def _takes_a_cancel(call: Call[m.Cancel]) -> m.PoolsAnswer:
    raise NotImplementedError


def test_a_handler_taking_another_body_is_caught() -> None:
    # The type checker catches a record body the handler does not take (contract.py would
    # not check); it cannot see a record taken where none is declared, or a raw body.
    assert body_mismatches([dataclasses.replace(_operation("approve"), body=m.Cancel)]) != []
    pools = dataclasses.replace(_operation("pools"), handler=_takes_a_cancel)
    assert body_mismatches([pools]) != []
    upload = dataclasses.replace(_operation("put_artifact"), handler=_takes_a_cancel)
    assert body_mismatches([upload]) != []


# -- a handler neither authenticates nor decodes

# `auth.require`, `requests.read` and `body_bytes`, the codec's and msgspec's `decode`, and
# Starlette's `Request.body()`, `.json()` and `.form()`. (An artifact's raw bytes are streamed
# by its handler: `request.stream()` is allowed.)
FORBIDDEN = {"require", "read", "body_bytes", "decode", "body", "json", "form"}


def _handler_modules() -> dict[str, str]:
    names = {op.handler.__module__ for op in OPERATIONS}
    return {name: inspect.getsource(importlib.import_module(name)) for name in sorted(names)}


def self_serving(source: str) -> list[str]:
    """Each call or import in `source` by which a handler would authenticate or read a body."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found += [
                f"line {node.lineno}: imports {a.name}" for a in node.names if a.name in FORBIDDEN
            ]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in FORBIDDEN:
                found.append(f"line {node.lineno}: calls {name}()")
    return found


def test_no_handler_authenticates_or_reads_its_body() -> None:
    modules = _handler_modules()
    assert {
        "tether.supervisor.api.operator_routes",
        "tether.supervisor.api.runner_routes",
        "tether.supervisor.api.artifact_routes",
        "tether.supervisor.api.candidate_routes",
        "tether.supervisor.api.health",
    } <= set(modules)
    found = {name: self_serving(source) for name, source in modules.items()}
    assert found == {name: [] for name in modules}


def test_a_handler_that_authenticates_or_reads_its_body_is_caught() -> None:
    source = _handler_modules()["tether.supervisor.api.operator_routes"]
    anchor = "    request, who = call.request, call.who\n"
    assert anchor in source
    for planted in [
        "    await require(call.request, Role.RUNNER)\n",
        "    ask = await rq.read(call.request, Cancel)\n",
        "    raw = await call.request.body()\n",
        "    raw = msgspec.json.decode(b'{}')\n",
    ]:
        assert self_serving(source.replace(anchor, anchor + planted, 1)) != [], planted
    imported = "from tether.supervisor.api.auth import require as check\n" + source
    assert self_serving(imported) == ["line 1: imports require"]


# -- the token first: a caller without the role never reaches the body or the handler

ROLE_TOKENS = {Role.OPERATOR: "operator", Role.RUNNER: "runner", Role.METRICS: "metrics"}
PATH_VALUES = {"digest": "a" * 64, "task_id": "t" * 8, "step_id": "s1"}
MALFORMED = b'{"this is": not json'


def _path(op: Declared[Any]) -> str:
    return re.sub(r"\{(\w+)\}", lambda found: PATH_VALUES.get(found[1], "x"), op.path)


Ran = list[tuple[str, Call[Any]]]


def _spy(name: str, ran: Ran) -> Any:
    """A handler that records its call, then refuses with `not_found` "the handler ran"."""

    async def handler(call: Call[Any]) -> Any:
        ran.append((name, call))
        raise ApiError(ErrorCode.NOT_FOUND, "the handler ran")

    return handler


def _serve(api: ApiHarness, *served: tuple[Declared[Any], Endpoint]) -> None:
    api.app.router.routes[:] = [
        Route(op.path, endpoint, methods=[op.method]) for op, endpoint in served
    ]


def _spied(api: ApiHarness, ran: Ran) -> None:
    """Serve every operation with its handler spied on (`_spy`)."""
    _serve(
        api,
        *(
            (op, dataclasses.replace(op, handler=_spy(op.name, ran)).endpoint())
            for op in OPERATIONS
        ),
    )


async def strangers_answered(api: ApiHarness, guarded: Sequence[Declared[Any]]) -> list[str]:
    """Each request to a `guarded` operation, by a caller without one of its roles, that was
    not refused 401 or 403 as such, though its body is malformed or too large."""
    too_large = b"x" * (api.app.state.settings.max_body_bytes + 1)
    found = []
    for op in guarded:
        callers: list[tuple[str, dict[str, str], bytes, str]] = [
            ("no token", {}, MALFORMED, "unauthorized"),
            ("no token, too large", {}, too_large, "unauthorized"),
            ("unknown token", {"Authorization": "Bearer nobody"}, MALFORMED, "unauthorized"),
        ] + [
            (f"{token} token", api.auth(token), MALFORMED, "forbidden")
            for role, token in ROLE_TOKENS.items()
            if role not in op.roles
        ]
        for who, headers, body, code in callers:
            sent = await api.client.request(
                op.method,
                _path(op),
                headers={**headers, "content-type": "application/json"},
                content=body,
            )
            answer = (sent.status_code, sent.json()["error"])
            if answer != (ERRORS[ErrorCode(code)].status, code):
                found.append(f"{op.name}, {who}: {answer}")
    return found


async def test_no_token_or_another_roles_token_never_reaches_the_body_or_the_handler(
    api: ApiHarness,
) -> None:
    ran: Ran = []
    _spied(api, ran)
    guarded = [op for op in OPERATIONS if op.roles]
    assert {op.name for op in guarded} >= {"create_task", "claim", "put_artifact", "metrics"}
    assert await strangers_answered(api, guarded) == []
    assert ran == []


def _body_first(op: Declared[Any]) -> Endpoint:
    """`op`'s endpoint, behind a plant that decodes its body before the token is checked."""
    endpoint = op.endpoint()

    async def planted(request: Request) -> Response:
        if isinstance(op.body, type):
            await read(request, op.body)
        return await endpoint(request)

    return planted


async def test_a_stranger_reaching_the_body_or_the_handler_is_caught(api: ApiHarness) -> None:
    ran: Ran = []
    create, budget = _operation("create_task"), _operation("budget")
    _serve(api, (create, _body_first(dataclasses.replace(create, handler=_spy("create", ran)))))
    assert await strangers_answered(api, [create]) != []
    assert ran == []
    opened = dataclasses.replace(budget, roles=(), handler=_spy("budget", ran))
    _serve(api, (budget, opened.endpoint()))
    assert await strangers_answered(api, [budget]) != []
    assert ran != []


async def test_the_role_reaches_the_body_and_then_the_handler(api: ApiHarness) -> None:
    """The other side of the test above: with the operation's role a malformed body is refused
    before the handler, a well-formed one reaches it decoded, beside the caller."""
    ran: Ran = []
    _spied(api, ran)
    refused = {}
    for op in OPERATIONS:
        if not isinstance(op.body, type):
            continue
        token = ROLE_TOKENS[op.roles[0]]
        sent = await api.client.request(
            op.method, _path(op), headers=api.auth(token), content=MALFORMED
        )
        refused[op.name] = sent.json()["error"]
    assert len(refused) == sum(isinstance(op.body, type) for op in OPERATIONS) > 10
    assert set(refused.values()) == {"malformed_json"}
    assert ran == []
    cancel = _operation("cancel")
    sent = await api.client.post(_path(cancel), headers=api.operator, json={"reason": "no"})
    assert sent.json()["detail"] == "the handler ran"
    [(name, call)] = ran
    assert (name, call.body, call.who.role, call.who.scope) == (
        "cancel",
        m.Cancel(reason="no"),
        Role.OPERATOR,
        API_TENANT,
    )


async def test_an_open_operation_runs_without_a_token(api: ApiHarness) -> None:
    ran: Ran = []
    _spied(api, ran)
    opened = [op for op in OPERATIONS if not op.roles]
    assert {op.name for op in opened} == {"healthz", "readyz", "openapi"}
    for op in opened:
        assert (await api.client.get(op.path)).status_code == 404
    assert [(name, call.principal, call.body) for name, call in ran] == [
        (op.name, None, None) for op in opened
    ]
