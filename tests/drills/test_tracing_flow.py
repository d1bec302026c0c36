"""Traces with the OpenTelemetry SDK's in-memory exporter (issue 15, item 3): an agent task run
by a real runner against the in-process supervisor and the stand-in model is one trace, the
task's, with the grant, the step, its model and tool calls, its checkpoint and upload, and the
commit joined by parent links across the wire; no attribute holds a secret or a payload's text.
Effect deliveries and checks are traced in their own rigs."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from examples.standin_model import create_app, read_scenario
from tests.api_tasks import submitted
from tests.conftest import ApiHarness
from tests.effects_fakes import FakeOutbox, Scripted, outgoing
from tests.runner.test_chat_tools import run_steps
from tether import tracing
from tether.runner.agent import AgentKind, NoSandbox
from tether.runner.kinds.registry import KindRegistry
from tether.supervisor.effects.credentials import Credentials
from tether.supervisor.effects.dispatcher import Dispatcher
from tether.supervisor.effects.registry import EffectKinds
from tether.supervisor.ledger.outbox import Delivered, Unanswered
from tether.tracing import parse_traceparent, trace_id_of

sdk_export = pytest.importorskip("opentelemetry.sdk.trace.export")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")

SECRET_TEXT = "the launch code is 7H1S-1S-PAYL0AD"
MODEL_KEY = "sk-SECRET-model-key-0d9e8f"


@pytest.fixture
def exported() -> Iterator[Any]:
    """Tracing on in this process, every span kept in memory; off again afterwards."""
    exporter = in_memory.InMemorySpanExporter()
    tracing.install(sdk_export.SimpleSpanProcessor(exporter))
    yield exporter
    tracing.uninstall()


def by_name(spans: Sequence[Any]) -> dict[str, list[Any]]:
    named: dict[str, list[Any]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


def hex_trace(span: Any) -> str:
    return f"{span.context.trace_id:032x}"


def parent_of(span: Any) -> int | None:
    return None if span.parent is None else int(span.parent.span_id)


async def run_task(api: ApiHarness, tmp_path: Path, model_app: Any, task_id: str) -> Any:
    """Serve one runner (agent steps, no sandbox needed) until the task ends; its view."""
    agent = AgentKind(cache_dir=tmp_path / "cache", sandbox=NoSandbox(why="not needed"))
    kinds = KindRegistry([("agent", agent)])
    return await run_steps(
        api, tmp_path, model_app, task_id, kinds, model_key=MODEL_KEY, within_s=20
    )


SCENARIO = {
    "turns": [
        {
            "name": "look",
            "assistant_turns": 0,
            "tool_calls": [
                {"name": "list_files", "arguments": {"path": "."}},
                {"name": "made_up_tool", "arguments": {"secret": SECRET_TEXT}},
            ],
        },
        {"name": "answer", "assistant_turns": 1, "text": f"done; {SECRET_TEXT}"},
    ]
}


async def test_an_agent_task_is_one_trace_joined_across_runner_and_supervisor(
    api: ApiHarness, tmp_path: Path, exported: Any
) -> None:
    payload = {"messages": [{"role": "user", "content": SECRET_TEXT}], "allowed_commands": []}
    plan = {
        "idempotency_key": "k",
        "plan": {"steps": [{"name": "fix", "kind": "agent", "payload": payload}]},
    }
    task = await submitted(api, plan)
    model_app = create_app(scenario=read_scenario(SCENARIO))
    view = await run_task(api, tmp_path, model_app, task["id"])
    assert view["state"] == "SUCCEEDED", view

    spans = exported.get_finished_spans()
    named = by_name(spans)
    assert {hex_trace(s) for s in spans} == {trace_id_of(task["id"])}
    (grant,) = named["tether.grant"]
    (step,) = named["tether.step"]
    (commit,) = named["tether.commit"]
    (checkpoint,) = named["tether.checkpoint"]
    assert grant.parent is None  # the task's trace starts at its first grant
    assert parent_of(step) == grant.context.span_id
    assert parent_of(commit) == step.context.span_id  # the result carried the step's context
    models = named["chat m"]  # the GenAI conventions' names: `chat <model>`
    tools = [*named["execute_tool list_files"], *named["execute_tool unknown"]]
    assert len(models) == 2
    assert len(tools) == 2
    for child in [*models, *tools, checkpoint]:
        assert parent_of(child) == step.context.span_id, child.name
    uploads = named["tether.artifact.upload"]
    assert uploads
    assert all(parent_of(u) == checkpoint.context.span_id for u in uploads)

    step_id = view["steps"][0]["id"]
    assert grant.attributes["tether.step_id"] == step_id
    assert grant.attributes["tether.outcome"] == "granted"
    assert step.attributes["tether.outcome"] == "applied"
    assert step.attributes["tether.name"] == "fix"
    assert commit.attributes["tether.outcome"] == "applied"
    assert commit.attributes["tether.task_id"] == task["id"]
    assert {t.attributes["gen_ai.tool.name"] for t in tools} == {"list_files", "unknown"}
    assert models[0].attributes["gen_ai.usage.input_tokens"] > 0
    assert checkpoint.attributes["tether.outcome"] == "saved"

    # No secret and no payload text in any attribute of any span.
    forbidden = [SECRET_TEXT, "7H1S", MODEL_KEY, api.secrets["runner"], "made_up_tool", "done;"]
    for span in spans:
        for key, value in span.attributes.items():
            for secret in forbidden:
                assert secret not in str(value), (span.name, key)
        assert not span.events, span.name  # no exception text recorded either


async def test_a_claim_carries_the_grants_traceparent_and_a_batch_finds_each_steps_trace(
    api: ApiHarness, exported: Any
) -> None:
    """Two steps reported in one batch with one header: each commit is in its own task's trace,
    under its grant (the header belongs to neither here)."""
    tasks = [await api.queued(f"k{n}") for n in range(2)]
    leases = await api.claim(capacity=2)
    assert len(leases) == 2
    for lease in leases:
        context = parse_traceparent(lease["traceparent"])
        assert context is not None
        assert context.trace_id == trace_id_of(lease["task_id"])
    results = [
        {
            "step_id": lease["step_id"],
            "fence": lease["fence"],
            "payload_hash": lease["payload_hash"],
            "output": "done",
        }
        for lease in leases
    ]
    header = {**api.runner, "traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}
    answer = await api.client.post("/v1/steps/results", headers=header, json={"results": results})
    assert answer.status_code == 200, answer.text

    named = by_name(exported.get_finished_spans())
    grants = {g.attributes["tether.step_id"]: g for g in named["tether.grant"]}
    commits = named["tether.commit"]
    assert len(commits) == 2
    for commit in commits:
        grant = grants[commit.attributes["tether.step_id"]]
        assert hex_trace(commit) == hex_trace(grant)
        assert parent_of(commit) == grant.context.span_id
    assert {hex_trace(c) for c in commits} == {trace_id_of(t["id"]) for t in tasks}


async def test_without_tracing_a_lease_carries_no_traceparent(api: ApiHarness) -> None:
    await api.queued()
    (lease,) = await api.claim()
    assert lease.get("traceparent") is None


async def test_each_effect_attempt_is_a_span_in_its_tasks_trace(exported: Any) -> None:
    busy = Unanswered(detail="HTTP 503 from a body that says Bearer abc", sent=True, status=503)
    done = Delivered(status=200, detail="HTTP 200 with the receiver's body")
    outbox = FakeOutbox(clock=time.time)
    outbox.add(outgoing(deadline_at=time.time() + 60))
    dispatcher = Dispatcher(
        outbox,
        EffectKinds([Scripted([busy, done])]),
        Credentials(None),
        hold_s=60.0,
        retry_base_s=0.01,
        poll_s=0.05,
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(dispatcher.run)
        with anyio.fail_after(5):
            while outbox.rows["e1"].state != "delivered":  # noqa: ASYNC110
                await anyio.sleep(0.005)
        tg.cancel_scope.cancel()

    attempts = by_name(exported.get_finished_spans())["tether.effect.attempt"]
    assert [a.attributes["tether.attempt"] for a in attempts] == [1, 2]
    assert [a.attributes["tether.outcome"] for a in attempts] == ["unanswered", "delivered"]
    assert [a.attributes["tether.status_code"] for a in attempts] == [503, 200]
    assert {hex_trace(a) for a in attempts} == {trace_id_of("t1")}
    assert all(a.parent is None for a in attempts)
    for attempt in attempts:
        assert not any("body" in str(v) for v in attempt.attributes.values())
