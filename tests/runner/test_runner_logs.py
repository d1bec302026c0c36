"""What the runner says and what it never reads: step context on every step line, no secret in
any line, and no wall-clock time anywhere (docs/design.md, Borrowed servers)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import structlog
import structlog.testing

from tests.runner.test_runner_fakes import (
    MODEL_KEY,
    TOKEN,
    JumpClock,
    Rig,
    error,
    json_response,
    make_lease,
    make_rig,
)
from tests.runner.test_runner_operator import GOOD_KEY, key_checking_model
from tether.logs import configure_logging

STEP_FIELDS = ("task_id", "step_id", "attempt", "fence")


@pytest.fixture
def fresh_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


async def eventful_run(rig: Rig, clock: JumpClock) -> None:
    """A run that logs most of what the runner can say: a 401 from the model (key in the
    Authorization header), a pause, a fixed key, a 429 with Retry-After, a retried result,
    a 409, a stale renew, an outage of the supervisor, and a shutdown."""
    sup = rig.supervisor
    rig.model.default = key_checking_model(GOOD_KEY)
    sup.script("result", error(503, "unavailable", f"echo {TOKEN}"))
    sup.offer(make_lease("s1", task_id="t1", fence=10))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await sup.until(lambda: bool(sup.of("release", "s1")))
        rig.key_file.write_text(GOOD_KEY)
        rig.model.script(json_response(429, {"error": {"code": "rate"}}, {"Retry-After": "0"}))
        clock.jump(3600.0)
        with anyio.fail_after(5):
            await rig.runner.wait_until(
                lambda: [s.outcome for s in rig.runner.recent_steps][-1:] == ["applied"]
            )
        sup.script("result", error(409, "stale_fence"))
        sup.offer(make_lease("s2", task_id="t2", fence=20))
        await sup.until(lambda: bool(sup.of("result", "s2")))
        sup.down = True
        await sup.until(lambda: len(sup.of("claim")) >= 8)
        sup.down = False
        rig.runner.request_shutdown()
    assert rig.exit_code == 0


async def test_step_lines_carry_their_context_and_no_line_carries_a_secret(
    tmp_path: Path,
) -> None:
    clock = JumpClock()
    rig = make_rig(tmp_path, clock=clock, pause_initial_s=3600.0, concurrency=1)
    with structlog.testing.capture_logs() as logs:
        await eventful_run(rig, clock)
    # capture_logs runs no redaction: the runner itself must never put a secret in a line.
    text = repr(logs)
    for secret in (MODEL_KEY, GOOD_KEY, TOKEN):
        assert secret not in text
    step_events = {
        "step leased",
        "releasing the step",
        "step reported",
        "result refused; the step is no longer ours",
    }
    seen = {e["event"] for e in logs}
    assert step_events <= seen
    for entry in logs:
        if entry["event"] in step_events or any(f in entry for f in STEP_FIELDS):
            assert all(f in entry for f in STEP_FIELDS), entry


async def test_the_printed_json_lines_hold_no_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fresh_structlog: None
) -> None:
    configure_logging(json_lines=True, level="debug")
    clock = JumpClock()
    rig = make_rig(tmp_path, clock=clock, pause_initial_s=3600.0, concurrency=1)
    await eventful_run(rig, clock)
    out = capsys.readouterr().out
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) > 10
    for secret in (MODEL_KEY, GOOD_KEY, TOKEN):
        assert secret not in out
    leased = [e for e in lines if e["event"] == "step leased"]
    assert leased
    assert all(all(f in e for f in STEP_FIELDS) for e in leased)


async def test_the_runner_never_reads_the_wall_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A jump of the wall clock cannot change anything the runner does, because it never
    reads it: with time.time() raising, a whole eventful run behaves the same."""
    calls: list[str] = []

    def forbidden(*_args: Any) -> float:
        calls.append("time.time")
        raise AssertionError("the runner read the wall clock")

    clock = JumpClock()
    rig = make_rig(tmp_path, clock=clock, pause_initial_s=3600.0, concurrency=1)
    with structlog.testing.capture_logs():
        monkeypatch.setattr(time, "time", forbidden)
        monkeypatch.setattr(time, "time_ns", forbidden)
        try:
            await eventful_run(rig, clock)
        finally:
            monkeypatch.undo()
    assert calls == []
    assert [s.outcome for s in rig.runner.recent_steps][-2:] == ["applied", "dropped: stale_fence"]


async def test_a_lease_deadline_is_counted_from_when_the_renew_was_sent(tmp_path: Path) -> None:
    """A renew answered late does not stretch the lease: the deadline starts at the send."""
    clock = JumpClock()
    rig = make_rig(tmp_path, clock=clock)
    sup = rig.supervisor
    answered = anyio.Event()

    async def late_ack(_request: httpx.Request) -> httpx.Response:
        clock.jump(2.0)  # the answer takes two seconds to arrive
        answered.set()
        return json_response(200, {"ttl_s": 5.0, "renew_every_s": 10.0, "cancelled": False})

    sup.script("renew", late_ack)
    rig.model.script(hang_model := _Hang())
    sup.offer(make_lease("s1", ttl_s=5.0, renew_every_s=2.0))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.model.until(lambda: bool(rig.model.requests))
        keeper = rig.runner.recent_steps[0].keeper
        clock.jump(1.0)  # the first renew is due half an interval after the claim answer
        with anyio.fail_after(5):
            while not keeper.acknowledged:  # noqa: ASYNC110 (a plain attribute, no event)
                await anyio.sleep(0.01)
        sent_at = keeper.expires_at - 5.0
        assert clock.now() - sent_at >= 2.0
        clock.jump(3.0)  # five seconds after the send: expired, though three after the answer
        with anyio.fail_after(5):
            await rig.runner.wait_until(lambda: rig.runner.in_flight == 0)
        rig.runner.request_shutdown()
    assert answered.is_set()
    assert hang_model.cancelled
    assert rig.runner.recent_steps[0].outcome == "dropped: expired"


class _Hang:
    def __init__(self) -> None:
        self.cancelled = False

    async def __call__(self, _request: httpx.Request) -> httpx.Response:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


def tool_call(name: str, **arguments: Any) -> httpx.Response:
    """A model answer asking for one tool call."""
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return json_response(
        200,
        {
            "model": "m",
            "choices": [
                {
                    "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        },
    )


async def test_a_step_kinds_own_lines_checkpoint_and_resuming_carry_the_steps_ids(
    tmp_path: Path,
) -> None:
    """Issue 26, finding 3: lines the agent kind writes through its own module loggers (no
    binding of their own) carry the step's ids, because the step binds them for all it runs.
    The attempt resuming from an earlier one's checkpoint names that one as `from_fence`, so
    its `fence` stays the attempt's own."""
    from tether.runner.agent import AgentKind, NoSandbox
    from tether.runner.kinds.registry import KindRegistry

    agent = AgentKind(cache_dir=tmp_path / "cache", sandbox=NoSandbox())
    rig = make_rig(tmp_path, kinds=KindRegistry([("agent", agent)]))
    sup = rig.supervisor
    payload = {"messages": [{"role": "user", "content": "write notes"}], "allowed_commands": []}
    rig.model.script(tool_call("write_file", path="notes.txt", content="x"))
    sup.offer(make_lease("s1", task_id="t1", kind="agent", fence=41, payload=payload))
    with structlog.testing.capture_logs(
        processors=[structlog.contextvars.merge_contextvars]
    ) as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await sup.until(lambda: bool(sup.of("result", "s1")))
            (saved,) = sup.checkpoints["s1"]
            resume = {"turn": 1, "fence": 41, "transcript": saved["transcript"]}
            sup.offer(
                make_lease(
                    "s1",
                    task_id="t1",
                    kind="agent",
                    fence=42,
                    attempt=2,
                    payload=payload,
                    resume=resume,
                )
            )
            await sup.until(lambda: len(sup.of("result", "s1")) == 2)
            rig.runner.request_shutdown()
    (checkpoint,) = [e for e in logs if e["event"] == "checkpoint"]
    (resuming,) = [e for e in logs if e["event"] == "resuming"]
    assert {f: checkpoint.get(f) for f in STEP_FIELDS} == {
        "task_id": "t1",
        "step_id": "s1",
        "attempt": 1,
        "fence": 41,
    }
    assert {f: resuming.get(f) for f in STEP_FIELDS} == {
        "task_id": "t1",
        "step_id": "s1",
        "attempt": 2,
        "fence": 42,
    }
    assert resuming["from_fence"] == 41
    done = [e for e in logs if e["event"] == "agent step done"]
    assert [e["fence"] for e in done] == [41, 42]
    # Nothing the runner says outside a step carries a step's ids.
    assert all("step_id" not in e for e in logs if e["event"] == "runner stopped")
