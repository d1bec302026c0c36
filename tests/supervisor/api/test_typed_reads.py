"""The read path is typed end to end: what the ledger's views and the store's reads return, and
every record a route answers, is a record whose fields have types, down to the leaves. `Any`
is left only where the value is JSON someone else wrote and nobody reads into a shape (a step's
output, a plan's payload, an effect's request, an event's data, a runner's log fields), each
named below. A `dict[str, Any]` anywhere else fails, and so does a new `Any` field."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, Final

import msgspec

from tether.supervisor.api.contract import OPERATIONS
from tether.supervisor.ledger import view_rows, views
from tether.supervisor.ledger.store import LedgerStore
from tether.wire import answers
from tether.wire import records as m

# (record, field): JSON written by a plan, a runner, a model or a receiver, shown as it is.
FREE_JSON: Final = {
    (m.EarlierOutput, "output"),
    (m.Lease, "payload"),
    (m.StepDetail, "output"),
    (m.PlanStepView, "payload"),
    (m.EffectView, "request"),
    (m.Event, "data"),
    (m.TaskLogEntry, "fields"),
    (answers.WorkspaceRemoval, "path"),
    (answers.WorkspaceRemoval, "bytes_removed"),
    (answers.WorkspaceRemoval, "files_removed"),
    (answers.WorkspaceRemoval, "gone"),
}
READS: Final = (
    "task",
    "list_tasks",
    "events",
    "review",
    "task_log",
    "pools",
    "runners",
    "budget",
    "queue_depth",
)


def untyped(hint: Any, where: str, bound: dict[Any, Any] | None = None) -> Iterator[str]:
    """Where, under `hint`, a value is typed `Any` (free JSON aside)."""
    bound = bound or {}
    if isinstance(hint, typing.TypeVar):
        hint = bound.get(hint, Any)
    if hint is Any:
        yield where
        return
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        yield from untyped(args[0], where, bound)
    elif origin is typing.Literal:
        return
    elif origin in (typing.Union, types.UnionType, dict, list, tuple, set, frozenset):
        for arg in args:
            if arg is not Ellipsis:
                yield from untyped(arg, where, bound)
    elif isinstance(origin, type) and issubclass(origin, msgspec.Struct):
        yield from _fields(origin, where, dict(zip(origin.__parameters__, args, strict=True)))
    elif isinstance(hint, type) and (
        issubclass(hint, msgspec.Struct) or dataclasses.is_dataclass(hint)
    ):
        yield from _fields(hint, where, {})


def _fields(cls: type, where: str, bound: dict[Any, Any]) -> Iterator[str]:
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        if (cls, name) in FREE_JSON or name.startswith("__"):
            continue
        yield from untyped(hint, f"{where} -> {cls.__name__}.{name}", bound)


def _returned(function: Callable[..., Any]) -> Any:
    return typing.get_type_hints(function)["return"]


def read_path() -> dict[str, Any]:
    """Every return type of the read path, by where it comes from."""
    found = {
        f"views.{name}": _returned(f)
        for name, f in inspect.getmembers(views, inspect.isfunction)
        if f.__module__ == views.__name__ and not name.startswith("_")
    }
    found |= {
        f"view_rows.{name}": _returned(f)
        for name, f in inspect.getmembers(view_rows, inspect.isfunction)
        if f.__module__ == view_rows.__name__
    }
    found |= {f"LedgerStore.{name}": _returned(getattr(LedgerStore, name)) for name in READS}
    found |= {f"{op.method} {op.path}": _returned(op.handler) for op in OPERATIONS}
    return found


def test_nothing_on_the_read_path_is_untyped() -> None:
    found = read_path()
    assert {"views.task_view", "LedgerStore.review", "GET /v1/tasks/{task_id}"} <= set(found)
    problems = [spot for where, hint in found.items() for spot in untyped(hint, where)]
    assert problems == []


class PlantedView(m.Record, frozen=True, kw_only=True):
    step: m.StepDetail
    extra: dict[str, Any]


def test_an_untyped_field_anywhere_below_a_read_is_found() -> None:
    assert list(untyped(dict[str, Any], "r")) == ["r"]
    assert list(untyped(PlantedView, "r")) == ["r -> PlantedView.extra"]
    assert list(untyped(tuple[PlantedView, ...] | None, "r")) == ["r -> PlantedView.extra"]
    assert list(untyped(answers.Observation[dict[str, Any]], "r")) == ["r -> Observation.value"]
    assert list(untyped(answers.Observation[tuple[str, ...]], "r")) == []
    assert list(untyped(m.StepDetail, "r")) == []  # its output is free JSON, named above
