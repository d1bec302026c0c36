"""OpenTelemetry traces, optional (`pip install 'tether[otel]'`; docs/design.md, Health and
metrics): one trace per task, its id derived from the task id, so every process computes the
same one and the supervisor stores nothing; spans joined across processes by a W3C
`traceparent`.

Tracing is on only when an OTLP endpoint is configured in the environment
(`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`; `OTEL_SDK_DISABLED=true`
turns it off again). The environment is read on the first span a process asks for; while it
is off every span is one shared do-nothing object, and nothing is imported from opentelemetry:
this module imports the standard library only, the SDK inside the functions that switch it on.
The SDK's other standard variables apply as usual (`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`,
`OTEL_EXPORTER_OTLP_HEADERS`, ...); a ratio sampler samples a task in every process alike,
since its trace id is the same everywhere.

A span's attributes are ids, kinds, names, fences, attempts, status codes, durations and token
counts, each named `tether.<key>`: never a payload's text, a credential or an error's message.
Spans that OpenTelemetry's semantic conventions describe (a model call, a tool call) also carry
those conventions' attributes under their own names (`standard`, `set_standard`). An exception
leaving a span marks it failed with its type's name only (`tether.error` and `error.type`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import os
import re
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

import structlog

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.trace import Span as OtelSpan

__all__ = [
    "ENDPOINT_VARIABLES",
    "NO_SPAN",
    "Span",
    "TraceParent",
    "Tracing",
    "parse_traceparent",
    "trace_id_of",
]

log = structlog.get_logger("tether.tracing")

# Either names the collector that spans go to; the traces-only one wins, as in the SDK.
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")

Attribute = str | bool | int | float
# A semantic-convention attribute may also be a list of strings (`gen_ai.response.finish_reasons`).
StandardAttribute = Attribute | tuple[str, ...]

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def trace_id_of(task_id: str) -> str:
    """The trace id of a task's trace: 32 hex digits, the same in every process."""
    return hashlib.sha256(f"tether-trace:{task_id}".encode()).hexdigest()[:32]


@dataclasses.dataclass(frozen=True)
class TraceParent:
    """A W3C trace context (`traceparent`): the trace, the span that is the parent, and whether
    the trace is sampled."""

    trace_id: str
    span_id: str
    sampled: bool = True

    def __str__(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The context a `traceparent` value carries; None for a missing or malformed one (as the
    W3C rules say: a receiver then starts afresh, it never refuses the request)."""
    if not value:
        return None
    match = _TRACEPARENT.fullmatch(value.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id, span_id, sampled=bool(int(flags, 16) & 1))


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces: an OTLP endpoint set, the SDK not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


class Span(Protocol):
    """A span as the code around it sees it."""

    def set(self, **attributes: Attribute | None) -> None:
        """Set `tether.<key>` attributes; a None value is left out."""

    def set_standard(self, attributes: Mapping[str, StandardAttribute | None]) -> None:
        """Set attributes named by OpenTelemetry's semantic conventions
        (`gen_ai.usage.input_tokens`) under those names; a None value is left out."""

    @property
    def recording(self) -> bool:
        """Whether this span is kept: attributes that cost work to build are built only then."""

    @property
    def traceparent(self) -> str | None:
        """This span's context as a `traceparent`, for a child in another process."""


class _NoSpan:
    """The span of a process that does not trace: one shared object that does nothing."""

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def set(self, **attributes: Attribute | None) -> None:
        return None

    def set_standard(self, attributes: Mapping[str, StandardAttribute | None]) -> None:
        return None

    @property
    def recording(self) -> bool:
        return False

    @property
    def traceparent(self) -> str | None:
        return None


NO_SPAN = _NoSpan()


class Tracing:
    """A process's tracing while it is off: every method does nothing. `get` answers the
    process's one instance, an `_OtelTracing` once the environment switched it on."""

    on = False

    def span(
        self,
        name: str,
        /,
        *,
        parent: TraceParent | None = None,
        task_id: str | None = None,
        attributes: Mapping[str, Attribute | None] | None = None,
        standard: Mapping[str, StandardAttribute | None] | None = None,
        client: bool = False,
    ) -> contextlib.AbstractContextManager[Span]:
        """A span around a `with` block, current inside it. Its parent is `parent` when given,
        else the current span, else none: a root in `task_id`'s trace (a random trace without
        a task id). A `task_id` is also the span's `tether.task_id`. `standard` attributes keep
        their own names; `client` makes it a CLIENT span (a call to another service)."""
        return NO_SPAN

    def start(
        self,
        name: str,
        /,
        *,
        parent: TraceParent | None = None,
        task_id: str | None = None,
        attributes: Mapping[str, Attribute | None] | None = None,
    ) -> OpenSpan:
        """A span ended by its `end()`, not made current: for spans that overlap, as the
        leases of one claim do. Its parent is chosen as in `span`."""
        return _NO_OPEN_SPAN

    def annotate(self, **attributes: Attribute | None) -> None:
        """Set attributes on the current span, if there is one."""

    def traceparent(self) -> str | None:
        """The current span's context as a `traceparent` header value, if there is one."""
        return None


class OpenSpan(_NoSpan):
    """A span started by `Tracing.start`; `end()` ends it (more than once is harmless)."""

    def end(self, error: BaseException | None = None) -> None:
        return None


_NO_OPEN_SPAN = OpenSpan()
_OFF = Tracing()


@dataclasses.dataclass
class _Process:
    """The process's tracing once chosen (None until the first span asks)."""

    current: Tracing | None = None


_process = _Process()


def get(service: str) -> Tracing:
    """The process's tracing, switched on or off by the environment on its first call;
    `service` (`tether-runner`, `tether-supervisor`) names the process unless
    `OTEL_SERVICE_NAME` does."""
    current = _process.current
    if current is None:
        current = _from_environment(service)
    return current


def _from_environment(service: str) -> Tracing:
    if not wanted():
        _process.current = _OFF
        return _OFF
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning(
            "an OTLP endpoint is set but tracing is not installed; no traces are sent",
            fix="pip install 'tether[otel]'",
            missing=exc.name,
        )
        _process.current = _OFF
        return _OFF
    tracing = _OtelTracing(BatchSpanProcessor(OTLPSpanExporter()), service=service)
    _process.current = tracing
    log.info("tracing on: spans go to the OTLP endpoint", service=service)
    return tracing


def install(processor: SpanProcessor, *, service: str = "tether") -> Tracing:
    """Switch tracing on in this process with `processor` (an exporter behind a span
    processor), whatever the environment says: for a program that embeds tether and exports
    its own way. Returns the process's tracing."""
    tracing = _OtelTracing(processor, service=service)
    _process.current = tracing
    return tracing


def uninstall() -> None:
    """Flush and forget the process's tracing; the next span reads the environment again."""
    current, _process.current = _process.current, None
    if isinstance(current, _OtelTracing):
        current.shutdown()


# The trace id the next root span takes (`_TaskTraceIds`); set only around its creation.
_root_trace_id: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "tether_root_trace_id", default=None
)


def _attributes(attributes: Mapping[str, Attribute | None]) -> dict[str, Attribute]:
    return {f"tether.{k}": v for k, v in attributes.items() if v is not None}


def _standard(
    attributes: Mapping[str, StandardAttribute | None],
) -> dict[str, StandardAttribute]:
    return {k: v for k, v in attributes.items() if v is not None}


class _OtelTracing(Tracing):
    """Tracing on, through the OpenTelemetry SDK with a provider of tether's own (the global
    provider of an application around it is left alone)."""

    on = True

    def __init__(self, processor: SpanProcessor, *, service: str) -> None:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

        class TaskTraceIds(IdGenerator):
            """Random ids, except a root span's trace id inside `_root`."""

            def __init__(self) -> None:
                self._random = RandomIdGenerator()

            def generate_span_id(self) -> int:
                return self._random.generate_span_id()

            def generate_trace_id(self) -> int:
                chosen = _root_trace_id.get()
                return chosen if chosen is not None else self._random.generate_trace_id()

            def is_trace_id_random(self) -> bool:
                return _root_trace_id.get() is None

        # OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) wins over `service`.
        resource = Resource.create()
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: service}))
        self._provider = TracerProvider(resource=resource, id_generator=TaskTraceIds())
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("tether")

    def shutdown(self) -> None:
        self._provider.shutdown()

    def _open(
        self,
        name: str,
        parent: TraceParent | None,
        task_id: str | None,
        attributes: Mapping[str, Attribute | None],
        standard: Mapping[str, StandardAttribute | None] | None = None,
        client: bool = False,
    ) -> OtelSpan:
        from opentelemetry import context, trace

        attrs: dict[str, StandardAttribute] = {
            **_attributes(attributes),
            **_standard(standard or {}),
        }
        if task_id is not None:
            attrs["tether.task_id"] = task_id
        kind = trace.SpanKind.CLIENT if client else trace.SpanKind.INTERNAL
        if parent is not None:
            remote = trace.SpanContext(
                trace_id=int(parent.trace_id, 16),
                span_id=int(parent.span_id, 16),
                is_remote=True,
                trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED if parent.sampled else 0),
            )
            ctx = trace.set_span_in_context(trace.NonRecordingSpan(remote))
            return self._tracer.start_span(
                name, ctx, kind=kind, attributes=attrs, record_exception=False
            )
        if trace.get_current_span().get_span_context().is_valid:
            return self._tracer.start_span(
                name, kind=kind, attributes=attrs, record_exception=False
            )
        chosen = int(trace_id_of(task_id), 16) if task_id is not None else None
        token = _root_trace_id.set(chosen)
        try:
            return self._tracer.start_span(
                name, context.Context(), kind=kind, attributes=attrs, record_exception=False
            )
        finally:
            _root_trace_id.reset(token)

    def span(
        self,
        name: str,
        /,
        *,
        parent: TraceParent | None = None,
        task_id: str | None = None,
        attributes: Mapping[str, Attribute | None] | None = None,
        standard: Mapping[str, StandardAttribute | None] | None = None,
        client: bool = False,
    ) -> contextlib.AbstractContextManager[Span]:
        otel = self._open(name, parent, task_id, attributes or {}, standard, client)
        return self._current_span(otel)

    @contextlib.contextmanager
    def _current_span(self, otel: OtelSpan) -> Iterator[Span]:
        from opentelemetry import trace

        with trace.use_span(
            otel, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            opened = _OtelOpenSpan(otel)
            try:
                yield opened
            except BaseException as exc:
                opened.end(exc)
                raise
            opened.end()

    def start(
        self,
        name: str,
        /,
        *,
        parent: TraceParent | None = None,
        task_id: str | None = None,
        attributes: Mapping[str, Attribute | None] | None = None,
    ) -> OpenSpan:
        return _OtelOpenSpan(self._open(name, parent, task_id, attributes or {}))

    def annotate(self, **attributes: Attribute | None) -> None:
        from opentelemetry import trace

        current = trace.get_current_span()
        if current.is_recording():
            current.set_attributes(_attributes(attributes))

    def traceparent(self) -> str | None:
        from opentelemetry import trace

        return _traceparent_of(trace.get_current_span())


def _traceparent_of(otel: OtelSpan) -> str | None:
    context = otel.get_span_context()
    if not context.is_valid:
        return None
    sampled = bool(context.trace_flags & 1)
    return str(TraceParent(f"{context.trace_id:032x}", f"{context.span_id:016x}", sampled))


class _OtelOpenSpan(OpenSpan):
    def __init__(self, otel: OtelSpan) -> None:
        self._otel = otel
        self._ended = False

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.end(exc)

    def set(self, **attributes: Attribute | None) -> None:
        self._otel.set_attributes(_attributes(attributes))

    def set_standard(self, attributes: Mapping[str, StandardAttribute | None]) -> None:
        self._otel.set_attributes(_standard(attributes))

    @property
    def recording(self) -> bool:
        return self._otel.is_recording()

    @property
    def traceparent(self) -> str | None:
        return _traceparent_of(self._otel)

    def end(self, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            code = getattr(error, "code", None)  # a refusal's code (`stale_fence`), if any
            if not (isinstance(code, str) and _CODE.fullmatch(code)):
                code = None
            self.set(error=type(error).__name__, error_code=code)
            self.set_standard({"error.type": type(error).__name__})
            self._otel.set_status(Status(StatusCode.ERROR))
        self._otel.end()
