"""The runner's spans (docs/design.md, Health and metrics): the step, from its lease to its report
or release, joined to the supervisor's grant by the lease's `traceparent`; inside it the model
calls, the agent's tool calls, checks, checkpoints and artifact uploads, through `span`.

Off unless an OTLP endpoint is configured (`tether.tracing`): then each helper costs one
check and imports nothing.
"""

from __future__ import annotations

import contextlib

from tether import tracing as _tracing
from tether.tracing import Attribute, Span, parse_traceparent
from tether.wire.records import Lease

__all__ = ["SERVICE", "annotate", "span", "step", "traceparent"]

SERVICE = "tether-runner"


def span(name: str, /, **attributes: Attribute | None) -> contextlib.AbstractContextManager[Span]:
    """A child of the current span (a step's work), `tether.<key>` attributes from the
    keywords."""
    return _tracing.get(SERVICE).span(name, attributes=attributes)


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
