"""The runner with a fake supervisor and a fake model: leases, drops, results, shutdown."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import structlog.testing

from tests.runner.test_runner_fakes import (
    TOKEN,
    FakeModel,
    JumpClock,
    Rig,
    completion,
    error,
    hang,
    json_response,
    make_lease,
    make_rig,
)
from tether.runner.kinds.base import StepContext, StepOutput
from tether.runner.kinds.registry import KindRegistry
from tether.wire import content_hash


async def until(rig: Rig, condition: Callable[[], bool], within: float = 5.0) -> None:
    """Wait for a condition on the runner's own state, checked as its steps start and end."""
    with anyio.fail_after(within):
        await rig.runner.wait_until(condition)


class Gate:
    """A model answer that waits for the test, and notes whether it was cancelled."""

    def __init__(self, answer: httpx.Response | None = None) -> None:
        self.open = anyio.Event()
        self.cancelled = False
        self.answer = answer or completion("done", prompt=5, out=1)

    async def __call__(self, _request: httpx.Request) -> httpx.Response:
        try:
            await self.open.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        return self.answer


async def run_until(rig: Rig, condition: Callable[[], bool]) -> None:
    """Serve until `condition`, then shut down gracefully."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await until(rig, condition)
        rig.runner.request_shutdown()
    assert rig.exit_code == 0


def step_outcomes(rig: Rig) -> list[str | None]:
    return [s.outcome for s in rig.runner.recent_steps]


async def test_work_starts_at_once_the_lease_is_renewed_during_it_and_reported(
    tmp_path: Path,
) -> None:
    """The model call does not wait for an acknowledgement; the keeper renews while it runs."""
    rig = make_rig(tmp_path)
    sup = rig.supervisor
    acks_before_model: list[int] = []
    gate = Gate()

    async def model(request: httpx.Request) -> httpx.Response:
        acks_before_model.append(len(sup.of("renew", "s1")))
        return await gate(request)

    rig.model.script(model)
    # 0.05 s: the acknowledgement must come within 1.5 intervals, and a renew now goes through
    # the batch route (tests/supervisor/ledger/test_batched_renewals.py); 30 ms was too tight
    # under load.
    lease = make_lease("s1", fence=41, renew_every_s=0.05)
    sup.offer(lease)
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await sup.until(lambda: len(sup.of("renew", "s1")) >= 5)
        gate.open.set()
        await sup.until(lambda: bool(sup.of("result", "s1")))
        rig.runner.request_shutdown()
    assert rig.exit_code == 0
    assert acks_before_model == [0]
    assert all(c.body == {"fence": 41} for c in sup.of("renew", "s1"))
    assert rig.runner.recent_steps[0].keeper.acknowledged
    (result,) = sup.of("result", "s1")
    assert result.headers["authorization"] == f"Bearer {TOKEN}"
    assert result.body == {
        "fence": 41,
        "payload_hash": content_hash(lease["payload"]),
        "output": {
            "text": "done",
            "finish_reason": "stop",
            "model": "m",
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        },
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
    assert step_outcomes(rig) == ["applied"]
    assert sup.of("release") == []
    first_claim = sup.of("claim")[0].body
    # READY=1 came with the answer to `GET /v1/runner`: the first claim long-polls like any.
    assert first_claim == {
        "runner_id": "test-runner",
        "capacity": 2,
        "wait_s": 0.2,
        "kinds": ["agent", "chat", "verify"],
    }


async def test_a_step_answered_within_half_a_renew_interval_sends_no_renew(
    tmp_path: Path,
) -> None:
    """The result acknowledges the lease by itself: a fast step costs a claim and a result."""
    rig = make_rig(tmp_path, concurrency=1)
    sup = rig.supervisor
    for n in range(3):
        sup.offer(make_lease(f"s{n}", task_id=f"t{n}", ttl_s=30.0, renew_every_s=5.0))
    await run_until(rig, lambda: step_outcomes(rig) == ["applied"] * 3)
    assert sup.of("renew") == []
    assert len(sup.of("result")) == 3


async def test_the_first_renew_goes_out_half_an_interval_after_the_claim_answer(
    tmp_path: Path,
) -> None:
    clock = JumpClock()
    rig = make_rig(tmp_path, clock=clock)
    sup = rig.supervisor
    gate = Gate()
    rig.model.script(gate)
    sup.offer(make_lease("s1", ttl_s=30.0, renew_every_s=4.0))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.model.until(lambda: bool(rig.model.requests))
        clock.jump(1.5)  # real time since the answer adds to it: half a second to spare
        await anyio.sleep(0.05)
        assert sup.of("renew", "s1") == []  # not before half an interval
        clock.jump(0.6)
        await sup.until(lambda: len(sup.of("renew", "s1")) == 1)
        gate.open.set()
        await sup.until(lambda: bool(sup.of("result", "s1")))
        rig.runner.request_shutdown()
    assert step_outcomes(rig) == ["applied"]


async def test_stale_fence_on_renew_drops_the_step_and_reports_nothing(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    gate = Gate()
    rig.model.script(gate)
    rig.supervisor.offer(make_lease("s1", fence=5, renew_every_s=0.02))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.model.until(lambda: bool(rig.model.requests))
        rig.supervisor.fences["s1"] = 6  # another runner holds it now
        await until(rig, lambda: step_outcomes(rig) == ["dropped: stale_fence"])
        rig.runner.request_shutdown()
    assert gate.cancelled
    assert rig.supervisor.of("result") == []
    assert rig.supervisor.of("release") == []


async def test_a_cancelled_task_is_dropped_at_the_next_renew_and_the_slot_is_reused(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path, concurrency=1)
    sup = rig.supervisor
    gate = Gate()
    rig.model.script(gate)
    sup.offer(make_lease("s1", task_id="t1", renew_every_s=0.02))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.model.until(lambda: bool(rig.model.requests))
        renews_at_cancel = len(sup.of("renew", "s1"))
        sup.cancel_task("t1")
        await until(rig, lambda: step_outcomes(rig) == ["dropped: cancelled"])
        assert len(sup.of("renew", "s1")) == renews_at_cancel + 1  # within one renew interval
        assert gate.cancelled
        sup.offer(make_lease("s2", task_id="t2"))
        await sup.until(lambda: bool(sup.of("result", "s2")))
        rig.runner.request_shutdown()
    assert sup.of("result", "s1") == []
    assert step_outcomes(rig) == ["dropped: cancelled", "applied"]


async def test_a_lease_the_runners_clock_says_has_expired_is_dropped(tmp_path: Path) -> None:
    clock = JumpClock()
    rig = make_rig(tmp_path, clock=clock)
    sup = rig.supervisor
    gate = Gate()
    rig.model.script(gate)
    sup.offer(make_lease("s1", ttl_s=5.0, renew_every_s=1.0))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.model.until(lambda: bool(rig.model.requests))
        sup.script("renew", hang, hang, hang)  # the supervisor stops answering renews
        clock.jump(5.0)  # the runner's monotonic clock: five seconds passed (a GC pause)
        await until(rig, lambda: step_outcomes(rig) == ["dropped: expired"])
        rig.runner.request_shutdown()
    assert gate.cancelled
    assert sup.of("result") == []
    assert sup.of("release") == []


async def test_a_lease_never_acknowledged_is_dropped_after_one_and_a_half_renew_intervals(
    tmp_path: Path,
) -> None:
    """Unacknowledged, the supervisor re-queues the step after its accept window (at least two
    renew intervals after the grant): the runner stops a little before that, long before the
    TTL."""
    clock = JumpClock()
    rig = make_rig(tmp_path, clock=clock)
    sup = rig.supervisor
    gate = Gate()
    rig.model.script(gate)
    sup.script("renew", hang, hang, hang)  # no renew is ever answered
    sup.offer(make_lease("s1", ttl_s=30.0, renew_every_s=2.0))
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await rig.model.until(lambda: bool(rig.model.requests))
            clock.jump(2.5)  # real time since the answer adds to it: half a second to spare
            await anyio.sleep(0.05)
            assert step_outcomes(rig) == [None]  # still working inside the bound
            clock.jump(0.6)
            await until(rig, lambda: step_outcomes(rig) == ["dropped: expired"])
            rig.runner.request_shutdown()
    assert gate.cancelled
    assert sup.of("result") == []
    [said] = [e for e in logs if "dropping the step" in e["event"]]
    assert "no renew answered within 1.5 renew intervals" in said["event"]  # not "TTL 30 s"
    assert said["bound_s"] == 3.0


async def test_a_model_400_releases_the_step_as_invalid_and_not_retryable(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.model.script(json_response(400, {"error": {"message": "bad messages", "code": None}}))
    rig.supervisor.offer(make_lease("s1"))
    await run_until(rig, lambda: bool(rig.supervisor.of("release", "s1")))
    (release,) = rig.supervisor.of("release", "s1")
    assert release.body["reason"] == "invalid"
    assert release.body["retryable"] is False
    assert "400" in release.body["detail"]
    assert len(rig.model.requests) == 1
    assert rig.supervisor.of("result") == []


async def test_a_500_is_retried_and_the_step_completes(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.model.script(json_response(500, {"error": {"message": "oops"}}), completion("second"))
    rig.supervisor.offer(make_lease("s1"))
    await run_until(rig, lambda: step_outcomes(rig) == ["applied"])
    assert len(rig.model.requests) == 2
    assert rig.supervisor.of("result", "s1")[0].body["output"]["text"] == "second"


async def test_the_result_is_retried_until_answered(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    sup = rig.supervisor
    sup.script(
        "result",
        error(503, "unavailable"),
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
    )
    sup.offer(make_lease("s1", fence=9))
    await run_until(rig, lambda: step_outcomes(rig) == ["applied"])
    results = sup.of("result", "s1")
    assert len(results) == 4
    assert {(r.body["fence"], r.body["payload_hash"]) for r in results} == {
        (9, results[0].body["payload_hash"])
    }
    assert len(rig.model.requests) == 1  # the work is not redone, only the report
    assert sup.of("release") == []


async def test_replayed_is_success(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.supervisor.script("result", json_response(200, {"outcome": "replayed"}))
    rig.supervisor.offer(make_lease("s1"))
    await run_until(rig, lambda: step_outcomes(rig) == ["replayed"])
    assert rig.supervisor.of("release") == []


async def test_a_409_on_the_result_means_not_ours_and_nothing_is_released(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.supervisor.script("result", error(409, "terminal", "task was cancelled"))
    rig.supervisor.offer(make_lease("s1"))
    await run_until(rig, lambda: step_outcomes(rig) == ["dropped: terminal"])
    assert rig.supervisor.of("release") == []


async def test_a_payload_that_does_not_match_its_hash_is_released_not_run(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.supervisor.offer(make_lease("s1", payload_hash="0" * 64))
    await run_until(rig, lambda: bool(rig.supervisor.of("release", "s1")))
    body = rig.supervisor.of("release", "s1")[0].body
    assert (body["reason"], body["retryable"]) == ("invalid", True)
    assert rig.model.requests == []


async def test_an_unknown_kind_is_released_for_another_runner(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.supervisor.requeue_released = False
    rig.supervisor.offer(make_lease("s1", kind="shell"))
    await run_until(rig, lambda: bool(rig.supervisor.of("release", "s1")))
    body = rig.supervisor.of("release", "s1")[0].body
    assert (body["reason"], body["retryable"]) == ("invalid", True)
    assert "shell" in body["detail"]


async def test_a_custom_kind_gets_earlier_outputs_and_reports_candidate_and_artifacts(
    tmp_path: Path,
) -> None:
    seen: list[StepContext] = []

    async def patch(ctx: StepContext) -> StepOutput:
        seen.append(ctx)
        return StepOutput(
            output={"ok": True},
            usage={"total_tokens": 0},
            candidate_sha="c0ffee",
            artifacts={"tests": "ab" * 32},
        )

    kinds = KindRegistry.default(entry_points=False)
    kinds.register("patch", patch)
    rig = make_rig(tmp_path, kinds=kinds)
    earlier = [{"step_id": "s0", "name": "plan", "output": {"text": "plan it"}}]
    rig.supervisor.offer(make_lease("s1", kind="patch", payload={"x": 1}, outputs=earlier))
    await run_until(rig, lambda: step_outcomes(rig) == ["applied"])
    assert seen[0].outputs[0].output == {"text": "plan it"}
    body = rig.supervisor.of("result", "s1")[0].body
    assert body["candidate_sha"] == "c0ffee"
    assert body["artifacts"] == {"tests": "ab" * 32}


async def test_every_claim_announces_the_kinds_of_the_runners_registry(tmp_path: Path) -> None:
    """The supervisor grants a runner only steps of the kinds it announces (issue 16, 3)."""

    async def deploy(_ctx: StepContext) -> StepOutput:
        return StepOutput(output="deployed")

    kinds = KindRegistry.default(entry_points=False)
    kinds.register("deploy", deploy)
    rig = make_rig(tmp_path, kinds=kinds)
    rig.supervisor.offer(make_lease("s1"))
    await run_until(rig, lambda: len(rig.supervisor.of("claim")) >= 2)
    assert [c.body["kinds"] for c in rig.supervisor.of("claim")[:2]] == [
        ["agent", "chat", "deploy", "verify"]
    ] * 2


async def test_shutdown_lets_an_in_flight_step_finish_within_the_grace(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, shutdown_grace_s=30.0)
    sup = rig.supervisor
    gate = Gate()
    rig.model.script(gate)
    sup.offer(make_lease("s1"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.model.until(lambda: bool(rig.model.requests))
        rig.runner.request_shutdown()
        claims_at_shutdown = len(sup.of("claim"))
        sup.offer(make_lease("s2"))  # must not be claimed any more
        gate.open.set()
    assert rig.exit_code == 0
    assert step_outcomes(rig) == ["applied"]
    assert len(sup.of("claim")) == claims_at_shutdown
    assert sup.of("release") == []


async def test_shutdown_releases_what_did_not_finish_within_the_grace(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, shutdown_grace_s=0.1)
    rig.supervisor.requeue_released = False
    gate = Gate()
    rig.model.script(gate)
    rig.supervisor.offer(make_lease("s1", fence=3))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.model.until(lambda: bool(rig.model.requests))
        rig.runner.request_shutdown()
    assert rig.exit_code == 0
    assert gate.cancelled
    (release,) = rig.supervisor.of("release", "s1")
    assert release.body["fence"] == 3
    assert (release.body["reason"], release.body["retryable"]) == ("shutdown", True)
    assert rig.supervisor.of("result") == []


async def test_a_second_signal_exits_at_once_without_releasing(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, shutdown_grace_s=60.0)
    rig.model.script(Gate())
    rig.supervisor.offer(make_lease("s1"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.model.until(lambda: bool(rig.model.requests))
        rig.runner.request_shutdown()
        rig.runner.force_stop(143)
    assert rig.exit_code == 143
    assert rig.supervisor.of("release") == []


async def test_concurrency_bounds_the_steps_in_flight(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, concurrency=2)
    gates = [Gate(), Gate(), Gate()]
    rig.model.script(*gates)
    for i in range(3):
        rig.supervisor.offer(make_lease(f"s{i}", task_id=f"t{i}"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.model.until(lambda: len(rig.model.requests) == 2)
        assert rig.runner.in_flight == 2
        assert [c.body["capacity"] for c in rig.supervisor.of("claim")][:1] == [2]
        gates[0].open.set()
        gates[1].open.set()
        await rig.model.until(lambda: len(rig.model.requests) == 3)
        gates[2].open.set()
        await until(rig, lambda: step_outcomes(rig) == ["applied"] * 3)
        rig.runner.request_shutdown()


async def test_a_fake_model_default_answer_is_used_when_nothing_is_scripted() -> None:
    model = FakeModel()
    async with httpx.AsyncClient(transport=model.transport) as http:
        answer = await http.post("http://m/v1/chat/completions", json={})
    assert answer.json()["choices"][0]["message"]["content"] == "hello"


async def test_a_crashing_kind_costs_one_release_not_the_daemon(tmp_path: Path) -> None:
    async def broken(_ctx: StepContext) -> StepOutput:
        raise RuntimeError("bug in a deployment's kind")

    kinds = KindRegistry.default(entry_points=False)
    kinds.register("broken", broken)
    rig = make_rig(tmp_path, kinds=kinds)
    rig.supervisor.requeue_released = False
    rig.supervisor.offer(make_lease("s1", kind="broken"))
    rig.supervisor.offer(make_lease("s2", task_id="t2"))
    await run_until(
        rig, lambda: sorted(map(str, step_outcomes(rig))) == ["applied", "released: transient"]
    )
    body = rig.supervisor.of("release", "s1")[0].body
    assert (body["reason"], body["retryable"]) == ("transient", True)
    assert "RuntimeError" in body["detail"]


def garbled(status: int = 200) -> httpx.Response:
    """An answer httpx cannot decode: it says gzip, and is not (a broken proxy, say)."""
    return httpx.Response(
        status,
        headers={"content-encoding": "gzip", "content-type": "application/json"},
        stream=httpx.ByteStream(b"not gzip at all"),  # decoded when read, by the client
    )


async def test_an_undecodable_answer_is_retried_like_a_lost_one(tmp_path: Path) -> None:
    """Claim, model and result answers httpx cannot decode end neither the daemon nor the step:
    each is retried as if no answer had come."""
    rig = make_rig(tmp_path)
    rig.supervisor.script("claim", garbled())
    rig.model.script(garbled(), completion("second"))
    rig.supervisor.script("result", garbled())
    rig.supervisor.offer(make_lease("s1"))
    await run_until(rig, lambda: step_outcomes(rig) == ["applied"])
    assert len(rig.model.requests) == 2
    results = rig.supervisor.of("result", "s1")
    assert len(results) == 2
    assert results[-1].body["output"]["text"] == "second"


async def test_an_unexpected_error_while_claiming_pauses_claiming_not_the_daemon(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path)
    gate = Gate()
    rig.model.script(gate)
    rig.supervisor.offer(make_lease("s1"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.supervisor.until(lambda: len(rig.model.requests) == 1)
        # s1 is in flight when the next claim meets a bug (here: the transport raising)
        rig.supervisor.script("claim", RuntimeError("bug on the claim path"))
        rig.supervisor.offer(make_lease("s2", task_id="t2"))
        await until(rig, lambda: len(rig.runner.recent_steps) == 2)
        gate.open.set()
        await until(rig, lambda: step_outcomes(rig) == ["applied", "applied"])
        rig.runner.request_shutdown()
    assert rig.exit_code == 0
    assert not gate.cancelled  # the step in flight was not ended by the claim's failure


async def test_the_runner_keeps_only_its_recent_steps(tmp_path: Path) -> None:
    from tether.runner import daemon

    rig = make_rig(tmp_path, concurrency=4)
    for i in range(daemon.RECENT_STEPS + 6):
        rig.supervisor.offer(make_lease(f"s{i}", task_id=f"t{i}"))
    await run_until(rig, lambda: len(rig.supervisor.of("result")) == daemon.RECENT_STEPS + 6)
    assert len(rig.runner.recent_steps) == daemon.RECENT_STEPS
    assert rig.runner.recent_steps[-1].lease.step_id == f"s{daemon.RECENT_STEPS + 5}"


async def test_a_failing_provider_shows_in_the_log_without_a_line_per_retry(
    tmp_path: Path,
) -> None:
    """A provider outage must be visible to the operator: the first retry of a model call is a
    warning, then each doubling of its tries; never the request's key."""
    from tests.runner.test_runner_fakes import MODEL_KEY

    rig = make_rig(tmp_path)
    down = ({"error": {"message": "down"}}, {"Retry-After": "0"})  # retried at once
    outage = [json_response(500, *down) for _ in range(5)]
    rig.model.script(*outage, completion("back"))
    rig.supervisor.offer(make_lease("s1"))
    with structlog.testing.capture_logs() as logs:
        await run_until(rig, lambda: step_outcomes(rig) == ["applied"])
    retried = [e for e in logs if e["event"] == "model call failed; retrying with backoff"]
    assert [e["tries"] for e in retried] == [1, 2, 4]  # 5 failures: tries 1..5 retried
    assert all(e["log_level"] == "warning" for e in retried)
    assert all(e["step_id"] == "s1" and "500" in e["error"] for e in retried)
    assert MODEL_KEY not in repr(logs)
    assert len(rig.model.requests) == 6
