"""A task's plan laid out for the operator who approves it: each step's prompt as text, its
tools, the commands and paths it may use, an effect's request, and the task's checks. The CLI
(`task show --plan`, `task approve`) and the status page's approval form read the same parts.

Every string passes through `reveal`, so a bidi control or a zero-width character in a prompt
shows as its escape instead of reordering or hiding what is read. A credential appears only by
name (a plan holds `{{ credential.<name> }}` placeholders, never values), and a header whose
name says it carries a secret is masked as on the effect's view.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Final

from tether.git import redact
from tether.supervisor.shown import reveal, reveal_json, shown_header
from tether.wire.payloads import EFFECT_KINDS
from tether.wire.records import EffectView, PlanView, TaskDetail

# Payload fields laid out as parts of their own; the rest are listed as settings.
_MESSAGES: Final = "messages"
_LAID_OUT: Final = frozenset({_MESSAGES, "tools", "allowed_commands", "allowed_paths"})
_REQUEST: Final = frozenset({"method", "url", "headers", "body"})


@dataclasses.dataclass(frozen=True)
class Part:
    """One labelled part of a step: each entry is a block of text, shown as it is."""

    label: str
    entries: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class StepReading:
    """One step of the plan as an approver reads it."""

    number: int
    name: str
    kind: str
    payload_hash: str
    parts: tuple[Part, ...]


@dataclasses.dataclass(frozen=True)
class PlanReading:
    """The whole plan: its hash, its steps, and the task's own parts (paths, checks)."""

    hash: str
    steps: tuple[StepReading, ...]
    parts: tuple[Part, ...]


def _text(value: Any) -> str:
    """A value as one revealed block: a string as it is, anything else as indented JSON."""
    return reveal(value) if isinstance(value, str) else reveal_json(value)


def _message(message: Any) -> str:
    """A chat message as `role: text`, with each tool call it makes on a line of its own."""
    if not isinstance(message, dict):
        return _text(message)
    role = reveal(str(message.get("role", "?")))
    called = message.get("tool_call_id")
    head = f"{role} (answering {reveal(str(called))})" if called else role
    lines = []
    content = message.get("content")
    if content is not None:
        lines.append(f"{head}: {_text(content)}")
    for call in message.get("tool_calls") or ():
        function = call.get("function", {}) if isinstance(call, dict) else {}
        name = reveal(str(function.get("name", "?")))
        lines.append(f"{head} calls {name}({_text(function.get('arguments', ''))})")
    return "\n".join(lines) or f"{head}: (no text)"


def _tool(tool: Any) -> str:
    """A tool offered to the model: its name, description and parameters' schema."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict):
        return _text(tool)
    line = reveal(str(function.get("name", "?")))
    if function.get("description"):
        line += f": {_text(function['description'])}"
    if function.get("parameters") is not None:
        line += f"\nparameters {reveal(json.dumps(function['parameters'], sort_keys=True))}"
    return line


def _request(kind: str, request: Mapping[str, Any]) -> tuple[str, ...]:
    """An effect's request: the method and URL (no userinfo), each header (a secret one
    masked, a credential by name), the body."""
    entries = []
    url = request.get("url")
    shown_url = reveal(redact(url)) if isinstance(url, str) else _text(url)
    if kind == "http":
        entries.append(f"{reveal(str(request.get('method', 'POST')))} {shown_url}")
        for name, value in sorted((request.get("headers") or {}).items()):
            header = shown_header(reveal(str(name)), value)
            note = "".join(f" (credential {c}, filled at send time)" for c in header["credentials"])
            note += " (masked: a secret written in the plan)" if header["masked"] else ""
            entries.append(f"{header['name']}: {reveal(header['value'])}{note}")
        if request.get("body") is not None:
            entries.append(f"body {reveal_json(request['body'])}")
    elif url is not None:
        entries.append(f"url {shown_url}")
    return tuple(entries)


def _settings(fields: Mapping[str, Any]) -> Part | None:
    entries = tuple(f"{reveal(str(k))}: {_text(v)}" for k, v in sorted(fields.items()))
    return Part("Settings", entries) if entries else None


def step_parts(kind: str, payload: Any, effect: EffectView | None = None) -> list[Part]:
    """The parts of one step: for a chat or agent step its messages, tools, allowed commands
    and paths; for an effect its request (as rendered, once `effect` holds it; else as the
    plan wrote it); then every other field as a setting."""
    if not isinstance(payload, dict):
        return [Part("Payload", (_text(payload),))]
    parts: list[Part] = []
    rest = dict(payload)
    if kind in EFFECT_KINDS:
        rendered = effect.request if effect else None
        source = rendered if isinstance(rendered, dict) else payload
        label = "Request as rendered" if rendered is not None else "Request (rendered when due)"
        parts.append(Part(label, _request(kind, source)))
        for key in _REQUEST:
            rest.pop(key, None)
    else:
        messages = rest.pop(_MESSAGES, None)
        if isinstance(messages, list):
            parts.append(Part("Messages", tuple(_message(m) for m in messages)))
        for key, label in (
            ("tools", "Tools"),
            ("allowed_commands", "Allowed commands"),
            ("allowed_paths", "Allowed paths"),
        ):
            value = rest.pop(key, None)
            if isinstance(value, list):
                shown = _tool if key == "tools" else _text
                parts.append(Part(label, tuple(shown(v) for v in value) or ("(none)",)))
            elif value is not None:
                parts.append(Part(label, (_text(value),)))
    settings = _settings({k: v for k, v in rest.items() if k not in _LAID_OUT})
    return [*parts, *([settings] if settings else [])]


def read_plan(plan: PlanView, effects: Mapping[str, EffectView] | None = None) -> PlanReading:
    """The plan of a task view (`plan`), with each effect step's request as rendered so far
    (`effects`, by step name)."""
    effects = effects or {}
    steps = tuple(
        StepReading(
            number=number,
            name=reveal(step.name),
            kind=reveal(step.kind),
            payload_hash=step.payload_hash,
            parts=tuple(step_parts(step.kind, step.payload, effects.get(step.name))),
        )
        for number, step in enumerate(plan.steps, start=1)
    )
    parts = []
    if plan.allowed_paths:
        parts.append(
            Part("Allowed paths of the candidate", tuple(_text(p) for p in plan.allowed_paths))
        )
    if plan.checks:
        parts.append(
            Part(
                "Checks run at the candidate",
                tuple(f"{_text(c.name)}: {_text(c.command)}" for c in plan.checks),
            )
        )
    return PlanReading(hash=plan.hash, steps=steps, parts=tuple(parts))


def _indented(text: str, by: str) -> str:
    return "\n".join(by + line for line in text.splitlines() or [""])


def plan_text(reading: PlanReading) -> str:
    """The plan as the CLI prints it: each step, then its parts, each entry indented."""
    count = len(reading.steps)
    lines = [f"plan {reading.hash} ({count} step{'s' if count != 1 else ''})"]
    for step in reading.steps:
        lines.append(f"{step.number}. {step.name} ({step.kind}) payload hash {step.payload_hash}")
        for part in step.parts:
            lines.append(f"   {part.label}:")
            lines.extend(_indented(entry, "     ") for entry in part.entries)
    for part in reading.parts:
        lines.append(f"{part.label}:")
        lines.extend(_indented(entry, "  ") for entry in part.entries)
    return "\n".join(lines)


def task_plan(task: TaskDetail) -> PlanReading | None:
    """The plan of a task view as read, with its effects rendered so far; None from a
    supervisor whose view carries no plan."""
    if task.plan is None:
        return None
    effects = {step.name: step.effect for step in task.steps if step.effect is not None}
    return read_plan(task.plan, effects)
