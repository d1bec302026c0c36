"""`ResultSender`: results ready together share a request, each step gets its own answer, and
no answer, a cancellation or a refused batch never leaves a step without one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.runner.test_runner_fakes import completion, make_lease, make_rig
from tether.clocks import LoopClock
from tether.runner.errors import LeaseLost, LostBecause, SupervisorRefused, SupervisorUnreachable
from tether.runner.results import ResultSender
from tether.runner.supervisor_client import ResultReport, SupervisorClient
from tether.wire import Outcome


def report(n: int = 0) -> ResultReport:
    return ResultReport(fence=n, payload_hash="h", output={"n": n}, usage={"total_tokens": 1})


class FakeClient:
    """`report_many` and `report` of a supervisor client, scripted by the test."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.singles: list[str] = []
        self.gate: anyio.Event | None = None  # the first batch waits for it
        self.refuse_batches = False
        self.refuse_status = 413
        self.no_answer = False
        self.crash: Exception | None = None
        self.lost: set[str] = set()

    async def report_many(self, reports: list[tuple[str, bytes]]) -> list[Any]:
        self.batches.append([step_id for step_id, _ in reports])
        if self.gate is not None:
            gate, self.gate = self.gate, None
            await gate.wait()
        if self.refuse_batches:
            raise SupervisorRefused(self.refuse_status, "refused", "whole request refused")
        if self.crash is not None:
            raise self.crash
        if self.no_answer:
            raise SupervisorUnreachable("ConnectError: connection refused")
        return [
            LeaseLost(LostBecause.STALE_FENCE) if step_id in self.lost else Outcome.APPLIED
            for step_id, _ in reports
        ]

    async def report(self, step_id: str, _report: ResultReport) -> Outcome:
        self.singles.append(step_id)
        if step_id in self.lost:
            raise LeaseLost(LostBecause.STALE_FENCE)
        return Outcome.APPLIED


def sender(client: FakeClient, **kwargs: Any) -> ResultSender:
    return ResultSender(client, **kwargs)  # type: ignore[arg-type]


async def report_in_turn(client: FakeClient, names: str, **kwargs: Any) -> dict[str, Any]:
    """A step per name reports, one after another, while the first request is held: the first
    result goes alone and the others queue behind it. Answers each step's outcome, or the
    exception its report raised."""
    client.gate = gate = anyio.Event()
    results = sender(client, **kwargs)
    answers: dict[str, Any] = {}

    async def step(step_id: str) -> None:
        try:
            answers[step_id] = await results.report(step_id, report())
        except Exception as exc:  # the exception is the answer under test
            answers[step_id] = exc

    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(step, name)
            await anyio.wait_all_tasks_blocked()
        gate.set()
    return answers


async def test_results_ready_while_a_request_is_out_go_together_in_the_next() -> None:
    client = FakeClient()
    client.gate = gate = anyio.Event()
    results = sender(client)
    answers: dict[str, Outcome] = {}

    async def step(step_id: str) -> None:
        answers[step_id] = await results.report(step_id, report())

    async with anyio.create_task_group() as tg:
        tg.start_soon(step, "a")
        await anyio.wait_all_tasks_blocked()
        for name in "bcde":
            tg.start_soon(step, name)
        await anyio.wait_all_tasks_blocked()
        assert client.batches == [["a"]]  # b..e wait for a's request, not for a timer
        gate.set()
    assert client.batches == [["a"], ["b", "c", "d", "e"]]
    assert answers == dict.fromkeys("abcde", Outcome.APPLIED)
    assert (results.requests, results.results) == (2, 5)


async def test_a_batch_never_exceeds_the_per_request_bound() -> None:
    client = FakeClient()
    answers = await report_in_turn(client, "abcde", per_request=2)
    assert client.batches == [["a"], ["b", "c"], ["d", "e"]]
    assert answers == dict.fromkeys("abcde", Outcome.APPLIED)


async def test_each_step_gets_its_own_answer_from_a_shared_request() -> None:
    client = FakeClient()
    client.lost = {"b"}
    answers = await report_in_turn(client, "xabc")
    assert client.batches == [["x"], ["a", "b", "c"]]
    assert answers["b"].because is LostBecause.STALE_FENCE
    assert {k: v for k, v in answers.items() if k != "b"} == dict.fromkeys("xac", Outcome.APPLIED)


async def test_no_answer_fails_every_result_in_the_request_each_with_its_own_error() -> None:
    client = FakeClient()
    client.no_answer = True
    answers = await report_in_turn(client, "xab")
    assert all(isinstance(a, SupervisorUnreachable) for a in answers.values())
    assert answers["a"] is not answers["b"]
    assert "connection refused" in str(answers["a"])


async def test_a_refused_batch_is_sent_again_one_result_per_request() -> None:
    client = FakeClient()
    client.refuse_batches = True
    client.lost = {"b"}
    answers = await report_in_turn(client, "xab")
    assert client.batches == [["x"], ["a", "b"]]  # a body over the limit: asked again next time
    assert sorted(client.singles) == ["a", "b", "x"]
    assert answers["b"].because is LostBecause.STALE_FENCE
    assert (answers["x"], answers["a"]) == (Outcome.APPLIED, Outcome.APPLIED)


async def test_a_step_cancelled_while_waiting_is_never_sent() -> None:
    client = FakeClient()
    client.gate = gate = anyio.Event()
    results = sender(client)
    async with anyio.create_task_group() as tg:
        tg.start_soon(results.report, "a", report())
        await anyio.wait_all_tasks_blocked()
        async with anyio.create_task_group() as doomed:
            doomed.start_soon(results.report, "c", report())
            await anyio.wait_all_tasks_blocked()
            doomed.cancel_scope.cancel()  # c's step is cancelled while a's request is out
        tg.start_soon(results.report, "b", report())
        await anyio.wait_all_tasks_blocked()
        gate.set()
    assert client.batches == [["a"], ["b"]]


async def test_the_sender_cancelled_mid_request_fails_the_others_in_it_so_they_retry() -> None:
    client = FakeClient()
    client.gate = gate = anyio.Event()
    results = sender(client)
    errors: dict[str, BaseException] = {}

    async def other(step_id: str) -> None:
        try:
            await results.report(step_id, report())
        except SupervisorUnreachable as exc:
            errors[step_id] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(results.report, "x", report())  # holds the line while a, b queue
        await anyio.wait_all_tasks_blocked()
        async with anyio.create_task_group() as doomed:
            doomed.start_soon(results.report, "a", report())
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(other, "b")
            await anyio.wait_all_tasks_blocked()
            client.gate = second = anyio.Event()  # a's request [a, b] will hang too
            gate.set()  # x answered; a now sends [a, b]
            await anyio.wait_all_tasks_blocked()
            assert client.batches == [["x"], ["a", "b"]]
            doomed.cancel_scope.cancel()  # a's step (the sender) is cancelled mid-request
        await anyio.wait_all_tasks_blocked()
        second.set()
    assert set(errors) == {"b"}  # told it got no answer: its step retries the report
    assert "cancelled before its answer" in str(errors["b"])


async def test_a_failure_nobody_foresaw_fails_each_result_without_crashing_the_sender() -> None:
    client = FakeClient()
    client.crash = RuntimeError("boom")
    answers = await report_in_turn(client, "xab")
    assert all(isinstance(a, SupervisorUnreachable) for a in answers.values())
    assert "RuntimeError: boom" in str(answers["a"])


async def test_a_supervisor_without_the_batch_route_gets_single_reports_from_then_on() -> None:
    client = FakeClient()
    client.refuse_batches = True
    client.refuse_status = 404
    results = sender(client)
    for name in "abc":
        assert await results.report(name, report()) is Outcome.APPLIED
    assert client.batches == [["a"]]  # asked once
    assert client.singles == ["a", "b", "c"]
    assert not results.batch_route


async def test_a_result_that_cannot_be_encoded_is_refused_to_its_own_step_only() -> None:
    """A lone surrogate in a model's text (JSON allows it escaped; UTF-8 does not) must not
    spoil the request it would have shared with a healthy step."""
    seen: list[list[str]] = []
    gate = anyio.Event()

    async def supervisor(request: httpx.Request) -> httpx.Response:
        items = json.loads(request.content)["results"]
        seen.append([i["step_id"] for i in items])
        if len(seen) == 1:
            await gate.wait()
        answers = [{"step_id": i["step_id"], "outcome": "applied"} for i in items]
        return httpx.Response(200, json={"results": answers})

    client = SupervisorClient(
        base_url="http://supervisor.test",
        token="t",
        clock=LoopClock(),
        transport=httpx.MockTransport(supervisor),
    )
    results = ResultSender(client)
    out: dict[str, Any] = {}

    async def step(step_id: str, text: str) -> None:
        body = ResultReport(fence=1, payload_hash="h", output={"text": text}, usage={})
        try:
            out[step_id] = await results.report(step_id, body)
        except SupervisorRefused as exc:
            out[step_id] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(step, "first", "ok")
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(step, "healthy", "ok")
        tg.start_soon(step, "poisoned", "\ud800")
        await anyio.wait_all_tasks_blocked()
        gate.set()
    await client.aclose()
    assert seen == [["first"], ["healthy"]]
    assert out["first"] is Outcome.APPLIED
    assert out["healthy"] is Outcome.APPLIED
    assert isinstance(out["poisoned"], SupervisorRefused)
    assert "cannot be sent as JSON" in str(out["poisoned"])


@pytest.mark.parametrize("missing", [False, True])
async def test_a_runner_reports_concurrent_results_with_fewer_requests(
    tmp_path: Path, missing: bool
) -> None:
    """Through the real runner and the fake supervisor, with and without the batch route."""
    rig = make_rig(tmp_path, concurrency=6)
    sup = rig.supervisor
    sup.batch_route_missing = missing
    sup.batch_gate = first_out = anyio.Event()
    gate = anyio.Event()

    async def model(_request: httpx.Request) -> httpx.Response:
        await gate.wait()
        return completion()

    rig.model.script(*[model] * 6)
    for n in range(6):
        sup.offer(make_lease(f"s{n}", task_id=f"t{n}", ttl_s=30.0, renew_every_s=10.0))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.model.until(lambda: len(rig.model.requests) == 6)
        gate.set()
        await sup.until(lambda: len(sup.batches) == 1)
        await anyio.wait_all_tasks_blocked()  # the other five results queue behind it
        first_out.set()
        await sup.until(lambda: len(sup.of("result")) == 6)
        with anyio.fail_after(5):
            await rig.runner.wait_until(lambda: rig.runner.in_flight == 0)
        rig.runner.request_shutdown()
    assert [s.outcome for s in rig.runner.recent_steps] == ["applied"] * 6
    sizes = [len(json.loads(b.content)["results"]) for b in sup.batches]
    assert sizes == ([1] if missing else [1, 5])  # without the route: asked once, then singly
