"""An agent step's transcript (the `transcript` of its output, docs/design.md, The agent kind)
read as a conversation for the status page: the prompt, then each turn numbered, with the
model's text, each tool call with its arguments and the result that answered it. The entries
are the runner's word, shown as text (the page escapes every value)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Call:
    """A tool call the model made, with the result that answered it (None: none came)."""

    id: str | None
    name: str
    arguments: str
    result: dict[str, Any] | None = None


@dataclasses.dataclass
class Turn:
    """One model answer: its number, its text and its tool calls; `omitted` counts entries the
    runner left out of a long transcript just before this turn."""

    number: int | None
    text: str
    calls: list[Call]
    finish_reason: str | None = None
    omitted: int = 0


@dataclasses.dataclass
class Conversation:
    prompt: list[dict[str, str]]
    turns: list[Turn]
    omitted_at_end: int = 0


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def conversation(entries: Any) -> Conversation | None:
    """The conversation `entries` hold, or None when they are not a transcript's list of
    entries (then the page shows the output as it is)."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return None
    prompt: list[dict[str, str]] = []
    turns: list[Turn] = []
    calls: dict[str, Call] = {}
    omitted = 0
    for entry in entries:
        role = entry.get("role")
        if "omitted" in entry and role is None:
            omitted += int(entry["omitted"]) if isinstance(entry["omitted"], int) else 0
        elif role == "assistant":
            made = [
                Call(id=c.get("id"), name=_text(c.get("name")), arguments=_text(c.get("arguments")))
                for c in entry.get("tool_calls") or []
                if isinstance(c, dict)
            ]
            calls.update((c.id, c) for c in made if c.id is not None)
            number = entry.get("turn")
            turns.append(
                Turn(
                    number=number if isinstance(number, int) else None,
                    text=_text(entry.get("content")),
                    calls=made,
                    finish_reason=entry.get("finish_reason"),
                    omitted=omitted,
                )
            )
            omitted = 0
        elif role == "tool":
            call = calls.get(entry.get("tool_call_id"))
            if call is not None:
                call.result = entry
        elif not turns and isinstance(role, str):
            prompt.append({"role": role, "content": _text(entry.get("content"))})
    return Conversation(prompt=prompt, turns=turns, omitted_at_end=omitted)
