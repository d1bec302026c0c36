"""The routes answer what the OpenAPI document says they answer: each handler returns the record
its operation declares (the type checker holds the handler to it; this test holds the handler's
annotation to the whole declaration, statuses included), the document's schemas are the
records' own, and a field a record gains is in the document without anyone writing it there.
Each check is shown to catch its planted mismatch."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from starlette.requests import Request
from starlette.responses import Response

from tether.supervisor.api import openapi, operator_routes
from tether.supervisor.api.contract import OPERATIONS
from tether.supervisor.api.operation import Answered, Call, Declared, Operation, RawOperation
from tether.supervisor.settings import SupervisorSettings
from tether.wire import records as m
from tether.wire.answers import ReviewRecord
from tether.wire.records import Record


def _documented_return(op: Declared) -> Any:
    """The return type a handler needs for what its operation documents."""
    if isinstance(op, RawOperation):
        return Response
    assert isinstance(op, Operation)
    one: Any = Answered[op.answer] if len(op.statuses) > 1 else op.answer
    return one | None if op.empty is not None else one


def _shape(hint: Any) -> Any:
    """A type as compared here: a union as the set of its members, in any order or spelling."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return frozenset(typing.get_args(hint))
    return hint


def mismatches(operations: Sequence[Declared]) -> list[str]:
    """Each operation whose handler is annotated to return other than it documents."""
    found = []
    for op in operations:
        returned = typing.get_type_hints(op.handler)["return"]
        documented = _documented_return(op)
        if _shape(returned) != _shape(documented):
            found.append(f"{op.method} {op.path}: returns {returned}, documents {documented}")
    return found


def _operation(name: str) -> Any:
    return next(op for op in OPERATIONS if op.name == name)


def _open(name: str, **changes: Any) -> Any:
    """The operation `name`, without roles or a body, changed by `changes`."""
    return dataclasses.replace(_operation(name), roles=(), body=None, **changes)


def test_each_handler_returns_what_its_operation_documents() -> None:
    assert mismatches(OPERATIONS) == []
    assert all(isinstance(op, Operation | RawOperation) for op in OPERATIONS)


def test_a_handler_returning_another_record_than_documented_is_caught() -> None:
    get_task = _operation("get_task")
    assert mismatches([dataclasses.replace(get_task, answer=m.TaskPage)]) != []
    # A claim answers 204 when it got no lease: its handler may return None only for that.
    claim = _operation("claim")
    assert mismatches([dataclasses.replace(claim, empty=None)]) != []
    create = _operation("create_task")
    assert mismatches([dataclasses.replace(create, statuses=(200,))]) != []


def _answered(operations: Sequence[Declared]) -> list[type[Record]]:
    return list(dict.fromkeys(op.answer for op in operations if isinstance(op, Operation)))


def hand_edited(doc: dict[str, Any], records: Sequence[type[Record]]) -> list[str]:
    """Each answered record whose schema in `doc` is not msgspec's own for it."""
    _, generated = msgspec.json.schema_components(records, ref_template=openapi.REF)
    own = openapi.short_names(generated)
    schemas = doc["components"]["schemas"]
    return [
        name
        for name in (r.__name__ for r in records)
        if schemas.get(name) != json.loads(msgspec.json.encode(own[name]))
    ]


@pytest.fixture
def settings(tmp_path: Path) -> SupervisorSettings:
    return SupervisorSettings(db=tmp_path / "x.db")


def _built(settings: SupervisorSettings, operations: Sequence[Declared]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(msgspec.json.encode(openapi.document(settings, operations)))
    return loaded


def test_every_answered_records_schema_is_its_own(settings: SupervisorSettings) -> None:
    doc = _built(settings, OPERATIONS)
    records = _answered(OPERATIONS)
    assert {m.TaskDetail, m.TaskPage, m.Events, ReviewRecord} <= set(records)
    assert hand_edited(doc, records) == []
    # A schema edited after msgspec wrote it no longer passes.
    del doc["components"]["schemas"]["TaskDetail"]["properties"]["rejections"]
    assert hand_edited(doc, records) == ["TaskDetail"]


class GrownTaskDetail(m.TaskDetail, frozen=True, kw_only=True):
    """The task view with one field more."""

    planted: int = 0


async def get_grown_task(call: Call[None]) -> GrownTaskDetail:
    raise NotImplementedError


def test_a_field_added_to_an_answered_record_is_in_the_document(
    settings: SupervisorSettings,
) -> None:
    grown = dataclasses.replace(
        _operation("get_task"), answer=GrownTaskDetail, handler=get_grown_task
    )
    assert mismatches([grown]) == []
    schemas = _built(settings, [grown, _operation("get_task")])["components"]["schemas"]
    added = set(schemas["GrownTaskDetail"]["properties"]) - set(schemas["TaskDetail"]["properties"])
    assert added == {"planted"}


async def test_the_routes_answer_the_records_they_document() -> None:
    """The handler's record reaches the wire through the one codec. (The operations are made
    open and bodiless here: tests/supervisor/api/test_operation_calls.py covers the token and
    the body.)"""
    detail = msgspec.json.decode(
        msgspec.json.encode(m.Budget(tenant="acme", spent=3, budget=None, left=None))
    )

    async def budget(call: Call[None]) -> m.Budget:
        return m.Budget(tenant="acme", spent=3, budget=None, left=None)

    async def created(call: Call[None]) -> Answered[m.Budget]:
        return Answered(m.Budget(tenant="acme", spent=3), 201)

    scope: dict[str, Any] = {"type": "http", "method": "GET", "path": "/", "headers": []}
    request = Request(scope)
    sent = await _open("budget", handler=budget).endpoint()(request)
    assert (sent.status_code, json.loads(sent.body)) == (200, detail)
    replaced = _open("budget", handler=created, statuses=(201, 200))
    sent = await replaced.endpoint()(request)
    assert (sent.status_code, json.loads(sent.body)) == (201, detail)

    async def nothing(call: Call[None]) -> m.ClaimAnswer | None:
        return None

    empty = await _open("claim", handler=nothing).endpoint()(request)
    assert (empty.status_code, empty.body) == (204, b"")
    assert operator_routes.budget is _operation("budget").handler
