"""Operator-side problems: rejected or missing keys, spent quota, a revoked token, an outage.

None of them may burn a step: the lease is released as `operator` (not counted), claiming
pauses with one clear log line naming the operator's action, and fixing the file is enough.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import structlog.testing

from tests.runner.test_runner_fakes import (
    JumpClock,
    Rig,
    completion,
    error,
    json_response,
    make_lease,
    make_rig,
)
from tests.runner.test_runner_steps import step_outcomes, until
from tether.runner.errors import OperatorProblem

GOOD_KEY = "sk-good-key-0b1c2d3e4f"


def key_checking_model(good: str) -> Any:
    async def answer(request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {good}":
            return json_response(401, {"error": {"message": "Incorrect API key", "code": "x"}})
        return completion("with the good key")

    return answer


def paused_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if str(e["event"]).startswith("claiming paused")]


async def test_a_rejected_key_releases_as_operator_pauses_and_the_same_step_completes_after_fix(
    tmp_path: Path,
) -> None:
    clock = JumpClock()
    rig = make_rig(tmp_path, clock=clock, concurrency=1, pause_initial_s=60.0, pause_max_s=600.0)
    sup = rig.supervisor
    rig.model.default = key_checking_model(GOOD_KEY)
    sup.offer(make_lease("s1", fence=10))
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await sup.until(lambda: bool(sup.of("release", "s1")))
            await until(rig, lambda: rig.runner.in_flight == 0)
            assert rig.runner.paused
            claims_while_paused = len(sup.of("claim"))
            with anyio.move_on_after(0.2):  # nothing to await: show that no claim happens
                await sup.until(lambda: len(sup.of("claim")) > claims_while_paused)
            assert len(sup.of("claim")) == claims_while_paused
            rig.key_file.write_text(GOOD_KEY)  # the operator fixes the file
            clock.jump(60.0)
            await sup.until(lambda: bool(sup.of("result", "s1")))
            rig.runner.request_shutdown()
    (release,) = sup.of("release", "s1")
    assert release.body["fence"] == 10
    assert (release.body["reason"], release.body["retryable"]) == ("operator", True)
    (result,) = sup.of("result", "s1")
    assert result.body["fence"] > 10  # the same step id, a new lease
    assert result.body["output"]["text"] == "with the good key"
    assert step_outcomes(rig) == ["released: operator", "applied"]
    (line,) = paused_lines(logs)
    assert "Operator action: put a valid API key in" in line["event"]
    assert str(rig.key_file) in line["event"]
    assert any(e["event"] == "claiming resumed" for e in logs)


async def test_an_exhausted_quota_is_an_operator_problem_not_a_failure(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, pause_initial_s=30.0)
    rig.supervisor.requeue_released = False
    rig.model.script(
        json_response(429, {"error": {"message": "quota", "code": "insufficient_quota"}})
    )
    rig.supervisor.offer(make_lease("s1"))
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await rig.supervisor.until(lambda: bool(rig.supervisor.of("release", "s1")))
            rig.runner.request_shutdown()
    body = rig.supervisor.of("release", "s1")[0].body
    assert (body["reason"], body["retryable"]) == ("operator", True)
    assert len(rig.model.requests) == 1
    (line,) = paused_lines(logs)
    assert "quota" in line["event"]


async def test_a_missing_key_file_is_an_operator_problem(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, key=None, pause_initial_s=30.0)
    rig.supervisor.requeue_released = False
    rig.supervisor.offer(make_lease("s1"))
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await rig.supervisor.until(lambda: bool(rig.supervisor.of("release", "s1")))
            rig.runner.request_shutdown()
    body = rig.supervisor.of("release", "s1")[0].body
    assert (body["reason"], body["retryable"]) == ("operator", True)
    assert rig.model.requests == []
    (line,) = paused_lines(logs)
    assert f"put the model API key in {rig.key_file}" in line["event"]


async def test_pauses_grow_and_a_completed_step_resets_them(tmp_path: Path) -> None:
    clock = JumpClock()
    rig = make_rig(tmp_path, clock=clock, pause_initial_s=10.0, pause_max_s=25.0)
    problem = OperatorProblem("key rejected", action="fix it")
    with structlog.testing.capture_logs() as logs:
        for _ in range(4):
            rig.runner.operator_problem(problem)
            rig.runner.operator_problem(problem)  # a second step, same pause: no new line
            clock.jump(100.0)
        rig.runner.step_succeeded()
        rig.runner.operator_problem(problem)
    assert [e["pause_s"] for e in paused_lines(logs)] == [10.0, 20.0, 25.0, 25.0, 10.0]


async def test_a_revoked_token_pauses_claiming_and_a_new_token_file_resumes(
    tmp_path: Path,
) -> None:
    clock = JumpClock()
    rig = make_rig(tmp_path, clock=clock, pause_initial_s=60.0)
    sup = rig.supervisor
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await sup.until(lambda: bool(sup.of("claim")))
            sup.token = "a-new-runner-token-9z8y"  # the old token is revoked
            await sup.until(lambda: rig.runner.paused)
            (tmp_path / "runner-token").write_text(sup.token + "\n")
            sup.offer(make_lease("s1"))
            clock.jump(60.0)
            await sup.until(lambda: bool(sup.of("result", "s1")))
            rig.runner.request_shutdown()
    (line,) = paused_lines(logs)
    assert "runner token" in line["event"]
    assert "tether-supervisor token create" in line["event"]
    assert sup.of("result", "s1")[0].headers["authorization"] == f"Bearer {sup.token}"


async def test_a_renew_refused_for_the_token_drops_the_step_and_pauses(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, pause_initial_s=30.0)
    sup = rig.supervisor
    sup.script("renew", json_response(200, {"ttl_s": 5, "renew_every_s": 0.02, "cancelled": False}))
    sup.script("renew", error(401, "unauthorized", "token revoked"))
    gate = anyio.Event()

    async def slow(_request: httpx.Request) -> httpx.Response:
        await gate.wait()
        return completion()

    rig.model.script(slow)
    sup.offer(make_lease("s1"))
    await run_and_stop(rig, lambda: step_outcomes(rig) == ["dropped: token_rejected"])
    assert rig.runner.paused
    assert sup.of("result") == []


async def run_and_stop(rig: Rig, condition: Any) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await until(rig, condition)
        rig.runner.request_shutdown()
    assert rig.exit_code == 0


async def test_an_unreachable_supervisor_is_logged_once_and_recovered_from(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    sup = rig.supervisor
    sup.down = True
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await sup.until(lambda: len(sup.of("whoami")) >= 6)  # the first call, retried
            sup.down = False
            sup.offer(make_lease("s1"))
            await sup.until(lambda: bool(sup.of("result", "s1")))
            rig.runner.request_shutdown()
    events = [e["event"] for e in logs]
    assert events.count("supervisor unreachable; retrying with backoff") == 1
    assert events.count("supervisor reachable again") == 1
    assert step_outcomes(rig) == ["applied"]


async def test_a_supervisor_outage_during_a_step_does_not_lose_it(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    sup = rig.supervisor
    gate = anyio.Event()

    async def slow(_request: httpx.Request) -> httpx.Response:
        await gate.wait()
        return completion()

    rig.model.script(slow)
    sup.offer(make_lease("s1", ttl_s=30.0, renew_every_s=0.02))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.model.until(lambda: bool(rig.model.requests))
        await sup.until(lambda: bool(sup.of("renew", "s1")))  # acknowledged, then the outage
        sup.down = True
        failed = len(sup.calls)
        await sup.until(lambda: len(sup.calls) >= failed + 5)
        gate.set()  # the model answers while the supervisor is still down
        await sup.until(lambda: len(sup.of("result", "s1")) >= 2)
        sup.down = False
        await until(rig, lambda: step_outcomes(rig) == ["applied"])
        rig.runner.request_shutdown()
