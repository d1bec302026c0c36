"""The runner's spans (docs/design.md, Health and metrics): the step, from its lease to its report
or release, joined to the supervisor's grant by the lease's `traceparent`; inside it the model
calls and the agent's tool calls, as OpenTelemetry's GenAI semantic conventions name them
(`chat <model>`, `execute_tool <tool>`, with `gen_ai.*` attributes), and the checks,
checkpoints and artifact uploads, through `span`.

Off unless an OTLP endpoint is configured (`tether.tracing`): then each helper costs one
check and imports nothing. The text a model is sent or answers, and a tool call's arguments
and result, go into spans only when the runner's `trace_content` setting says so
(`record_content`): they hold whatever the task's repository and prompts hold.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Mapping

from tether import tracing as _tracing
from tether.tracing import Attribute, Span, StandardAttribute, parse_traceparent
from tether.wire.records import Lease

__all__ = [
    "SERVICE",
    "annotate",
    "model_call",
    "record_content",
    "records_content",
    "span",
    "step",
    "tool_call",
    "traceparent",
]

SERVICE = "tether-runner"

# A tool call's id goes into its span only when it is a plain token: the model (or a hostile
# provider) writes it, and a span never carries a model's text unless `trace_content` is on.
_PLAIN_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


@dataclasses.dataclass
class _Content:
    """Whether spans carry the model's and the tools' text (the `trace_content` setting)."""

    on: bool = False


_content = _Content()


def record_content(on: bool) -> None:
    """Let spans carry prompts, answers and tool arguments and results (`trace_content`)."""
    _content.on = on


def records_content() -> bool:
    return _content.on


def span(name: str, /, **attributes: Attribute | None) -> contextlib.AbstractContextManager[Span]:
    """A child of the current span (a step's work), `tether.<key>` attributes from the
    keywords."""
    return _tracing.get(SERVICE).span(name, attributes=attributes)


def model_call(
    *,
    provider: str,
    model: str,
    address: str,
    port: int | None,
    request: Mapping[str, StandardAttribute | None],
) -> contextlib.AbstractContextManager[Span]:
    """The CLIENT span of one model call, retries included: `chat <model>` with the GenAI
    conventions' request attributes; the caller adds the response's."""
    standard: dict[str, StandardAttribute | None] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        "server.address": address,
        "server.port": port,
        **request,
    }
    return _tracing.get(SERVICE).span(f"chat {model}", standard=standard, client=True)


def tool_call(name: str, call_id: str | None) -> contextlib.AbstractContextManager[Span]:
    """The span of one tool call: `execute_tool <name>`; `name` must be one the runner
    offered (a made-up name is the model's text)."""
    plain_id = call_id if call_id is not None and _PLAIN_ID.fullmatch(call_id) else None
    standard: dict[str, StandardAttribute | None] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": plain_id,
    }
    return _tracing.get(SERVICE).span(f"execute_tool {name}", standard=standard)


def step(lease: Lease) -> contextlib.AbstractContextManager[Span]:
    """The span of one attempt at a step: a child of the supervisor's grant when the lease
    carries its `traceparent`, else a root in the task's trace."""
    return _tracing.get(SERVICE).span(
        "tether.step",
        parent=parse_traceparent(lease.traceparent),
        task_id=lease.task_id,
        attributes={
            "step_id": lease.step_id,
            "kind": lease.kind,
            "name": lease.name,
            "attempt": lease.attempt,
            "fence": lease.fence,
        },
    )


def annotate(**attributes: Attribute | None) -> None:
    """Set attributes on the current span, if there is one."""
    _tracing.get(SERVICE).annotate(**attributes)


def traceparent() -> str | None:
    """The current span's `traceparent`, for the headers of a call made inside it."""
    return _tracing.get(SERVICE).traceparent()
