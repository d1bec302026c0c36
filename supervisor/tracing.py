"""The supervisor's spans (docs/design.md, Health and metrics): a grant per lease of a claim, whose
context the lease carries to the runner (`Lease.traceparent`); a commit per reported result;
an attempt per effect delivery. All in the task's trace (`tether.tracing.trace_id_of`).

A commit's parent is the runner's step span, from the request's `traceparent`. A batch of
results carries one header for many steps, so there each step's parent is found through the
grant this process made of it (remembered here while tracing is on), and the header serves a
batch of one; a step granted by another supervisor, reported in a batch of several, gets no
commit span. Off unless an OTLP endpoint is configured: then each helper costs one check.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from types import TracebackType

import msgspec
from cachetools import LRUCache

from tether import tracing as _tracing
from tether.supervisor.ledger.outbox import Answer, Delivered, Outgoing, Undeliverable
from tether.tracing import NO_SPAN, OpenSpan, Span, TraceParent, parse_traceparent
from tether.wire.records import Lease

__all__ = ["SERVICE", "Grants", "commit", "effect_answered", "effect_attempt"]

SERVICE = "tether-supervisor"

# Grants remembered for their commits: far more than the steps in flight at once.
REMEMBERED = 100_000


@dataclasses.dataclass(frozen=True)
class _Granted:
    task_id: str
    context: TraceParent


_granted: LRUCache[str, _Granted] = LRUCache(maxsize=REMEMBERED)


class Grants:
    """The grant spans of one claim's leases, from the ledger's answer until the reply."""

    def __init__(self, leases: Sequence[Lease], *, runner_id: str, pool: str) -> None:
        tracing = _tracing.get(SERVICE)
        self._spans: dict[str, OpenSpan] = {}
        if not tracing.on:
            return
        for lease in leases:
            self._spans[lease.step_id] = tracing.start(
                "tether.grant",
                task_id=lease.task_id,
                attributes={
                    "step_id": lease.step_id,
                    "kind": lease.kind,
                    "attempt": lease.attempt,
                    "fence": lease.fence,
                    "runner_id": runner_id,
                    "pool": pool,
                },
            )

    def __enter__(self) -> Grants:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for span in self._spans.values():
            span.end(exc)

    def sent(self, leases: list[Lease]) -> list[Lease]:
        """`leases`, the ones the reply hands out, each carrying its grant's `traceparent`;
        the grants left out (their base moved) are marked so."""
        if not self._spans:
            return leases
        kept = {lease.step_id for lease in leases}
        for step_id, span in self._spans.items():
            span.set(outcome="granted" if step_id in kept else "stale_base")
        carried = []
        for lease in leases:
            traceparent = self._spans[lease.step_id].traceparent
            context = parse_traceparent(traceparent)
            if context is not None:
                _granted[lease.step_id] = _Granted(lease.task_id, context)
            carried.append(msgspec.structs.replace(lease, traceparent=traceparent))
        return carried


@contextlib.contextmanager
def commit(step_id: str, fence: int, *, header: str | None, sole: bool = True) -> Iterator[Span]:
    """The span of one result's commit; `header` is the request's `traceparent`, `sole`
    whether the request reports this step alone (see the module docstring)."""
    tracing = _tracing.get(SERVICE)
    if not tracing.on:
        yield NO_SPAN
        return
    sent = parse_traceparent(header)
    granted = _granted.get(step_id)
    task_id = None if granted is None else granted.task_id
    if granted is not None:
        parent = sent if sent is not None and sent.trace_id == granted.context.trace_id else None
        parent = parent or granted.context
    elif sent is not None and sole:
        parent = sent
    else:
        yield NO_SPAN
        return
    attributes: dict[str, _tracing.Attribute | None] = {"step_id": step_id, "fence": fence}
    with tracing.span(
        "tether.commit", parent=parent, task_id=task_id, attributes=attributes
    ) as span:
        yield span


def effect_attempt(out: Outgoing) -> contextlib.AbstractContextManager[Span]:
    """The span of one delivery attempt of an effect: a root in its task's trace."""
    return _tracing.get(SERVICE).span(
        "tether.effect.attempt",
        task_id=out.task_id,
        attributes={"effect_id": out.effect_id, "kind": out.kind, "keyed": out.keyed},
    )


def effect_answered(span: Span, attempt: int, answer: Answer) -> None:
    """What an attempt came to, on its span: its number, the answer's kind and status, and
    whether it may have sent, was a replay, or the refusal's code (never its detail)."""
    span.set(attempt=attempt, outcome=type(answer).__name__.lower(), status_code=answer.status)
    if isinstance(answer, Delivered):
        span.set(replayed=answer.replayed)
    elif isinstance(answer, Undeliverable):
        span.set(code=answer.code)
    else:
        span.set(sent=answer.sent)
