"""Tracing's shared rules (tether/tracing.py): the trace id a task id gives, the W3C
`traceparent` written and read, the switch read from the environment; with no endpoint (or
without the extra) nothing is imported from opentelemetry, in a fresh interpreter; and the
spans of a repository step's checks."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_repos import make_origin
from tests.agent_services import FakeServices, ScriptedChat, call, lease_repository
from tether import tracing
from tether.runner.agent import AgentKind, NoSandbox
from tether.runner.kinds.base import StepContext
from tether.tracing import TraceParent, parse_traceparent, trace_id_of, wanted

ROOT = Path(__file__).resolve().parent.parent
ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def test_a_task_id_gives_one_trace_id_everywhere() -> None:
    trace = trace_id_of("task-1")
    assert trace == trace_id_of("task-1")
    assert trace != trace_id_of("task-2")
    assert len(trace) == 32
    assert int(trace, 16) != 0
    # Any process (or a person with sha256sum) computes it from the task id alone.
    assert trace == hashlib.sha256(b"tether-trace:task-1").hexdigest()[:32]


def test_a_traceparent_is_written_and_read_back() -> None:
    context = TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
    assert str(context) == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert parse_traceparent(str(context)) == context
    unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
    assert parse_traceparent(unsampled) == TraceParent(
        context.trace_id, context.span_id, sampled=False
    )
    # A later version may append fields; version 00 may not.
    later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes"
    assert parse_traceparent(later) == context


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # forbidden version
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",  # short span
    ],
)
def test_a_malformed_traceparent_is_none(value: str | None) -> None:
    assert parse_traceparent(value) is None


def test_the_switch_is_an_otlp_endpoint_unless_the_sdk_is_disabled() -> None:
    assert not wanted({})
    assert not wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "})
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "True"}
    )


# Every helper the runner and the supervisor call, driven once; then which modules came in.
PROBE = """
import json, sys, time
if sys.argv[1] == "refuse":
    import importlib.abc
    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.partition(".")[0] == "opentelemetry":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Refuse())
import tether.runner.step, runner.agent, supervisor.api.runner_routes, supervisor.effects.dispatcher
from tether.runner import tracing as runner_tracing
from tether.supervisor import tracing as supervisor_tracing
from tether.wire.records import Lease
from tether.supervisor.ledger.outbox import Outgoing, Delivered
lease = Lease(step_id="s1", task_id="t1", name="n", kind="chat", attempt=1, fence=1,
              payload={}, payload_hash="h", ttl_s=30.0, renew_every_s=5.0)
with supervisor_tracing.Grants([lease], runner_id="r", pool="p") as grants:
    [sent] = grants.sent([lease])
with runner_tracing.step(sent) as step:
    with runner_tracing.span("tether.model.call", model="m") as span:
        span.set(total_tokens=3)
    header = runner_tracing.traceparent()
with supervisor_tracing.commit("s1", 1, header=header) as span:
    span.set(outcome="applied")
out = Outgoing(effect_id="e1", task_id="t1", tenant="a", kind="http", effect_key="k",
               keyed=True, request={}, digest="d", deadline_at=time.time() + 60)
with supervisor_tracing.effect_attempt(out) as span:
    supervisor_tracing.effect_answered(span, 1, Delivered(status=200, detail="ok"))
loaded = sorted(m for m in sys.modules if m.partition(".")[0] == "opentelemetry")
print(json.dumps({"loaded": loaded, "traceparent": sent.traceparent, "header": header}))
"""


def probe(mode: str, **environment: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(environment)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    result["output"] = done.stdout + done.stderr  # structlog writes to stdout by default
    return result


def test_with_no_endpoint_nothing_is_imported_from_opentelemetry() -> None:
    off = probe("allow")
    assert off["loaded"] == []
    assert (off["traceparent"], off["header"]) == (None, None)


def test_with_an_endpoint_the_same_run_traces() -> None:
    """The counterpart that shows the probe above can fail: spans are made (and their export
    to a closed port fails quietly, bounded by the exporter's timeout)."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    on = probe(
        "allow",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
    )
    assert "opentelemetry.sdk.trace" in on["loaded"]
    sent = parse_traceparent(on["traceparent"])
    assert sent is not None
    assert sent.trace_id == trace_id_of("t1")
    header = parse_traceparent(on["header"])
    assert header is not None
    assert header.trace_id == sent.trace_id
    assert header.span_id != sent.span_id  # the step's own span, a child of the grant


def test_an_endpoint_without_the_extra_warns_and_runs_untraced() -> None:
    """A runner-only install (no opentelemetry) with an endpoint set: one warning, no spans."""
    refused = probe("refuse", OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert refused["loaded"] == []
    assert refused["traceparent"] is None
    assert "pip install 'tether[otel]'" in refused["output"]
    assert "tracing is not installed" in refused["output"]


@pytest.fixture
def exported() -> Iterator[Any]:
    export = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    exporter = memory.InMemorySpanExporter()
    tracing.install(export.SimpleSpanProcessor(exporter))
    yield exporter
    tracing.uninstall()


CHECK = 'python3 -c "import sys; sys.exit(3)"'


async def test_checks_are_spans_with_their_names_and_exit_codes(
    tmp_path: Path, exported: Any
) -> None:
    origin, base = make_origin(tmp_path / "origin")
    repo = lease_repository(str(origin), base, checks={"lint": CHECK, "tests": "true"})
    chat = ScriptedChat([call("write_file", path="src/app.py", content="x = 1\n")], "fixed")
    ctx = StepContext(
        step_id="step-1",
        task_id="task-1",
        name="fix",
        attempt=1,
        fence=1,
        payload={"messages": [{"role": "user", "content": "go"}], "allowed_commands": []},
        outputs=(),
        default_model="m",
        chat=chat,
        repository=repo,
        services=FakeServices(),
    )
    kind = AgentKind(
        cache_dir=tmp_path / "cache", sandbox=NoSandbox(), commands_without_sandbox=True
    )
    with tracing.get("test").span("tether.step", task_id="task-1") as step:
        done = await kind(ctx)
        assert step.traceparent is not None
    assert done.checks["lint"].exit_code == 3

    spans = exported.get_finished_spans()
    (checks,) = [s for s in spans if s.name == "tether.checks"]
    each = {s.attributes["tether.check"]: s for s in spans if s.name == "tether.check"}
    assert checks.attributes["tether.checks"] == 2
    assert {name: s.attributes["tether.exit_code"] for name, s in each.items()} == {
        "lint": 3,
        "tests": 0,
    }
    assert all(
        s.parent is not None and s.parent.span_id == checks.context.span_id for s in each.values()
    )
    assert {f"{s.context.trace_id:032x}" for s in spans} == {trace_id_of("task-1")}
