"""The runner's side of log shipping (issue 26, finding 3; runner/log_shipping.py): which lines
are shipped and what they carry, the bound per attempt with its marker line, and that a
supervisor that is down, or older than the route, costs lines and never the step. The whole
path through real processes is tests/runner/test_runner_log_shipping.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
import structlog

from tests.runner.test_runner_fakes import MODEL_KEY, TOKEN, error, make_lease, make_rig
from tether.clocks import LoopClock
from tether.logs import configure_logging, register_secret
from tether.runner.log_shipping import DROPPED_EVENT, LogBuffer, LogShipper
from tether.runner.supervisor_client import SupervisorClient
from tether.wire.records import LOG_LINES_PER_REQUEST_MAX, LogLine


@pytest.fixture
def fresh_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def test_only_lines_about_an_attempt_are_buffered_masked_and_without_the_runners_clock(
    fresh_structlog: None, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "sk-shipping-secret-123456"
    register_secret(secret)
    buffer = LogBuffer()
    configure_logging(json_lines=True, level="info", tap=buffer)
    log = structlog.get_logger("t")
    log.info("runner starting", runner_id="r")  # about no attempt: not shipped
    with structlog.contextvars.bound_contextvars(task_id="t1", step_id="s1", attempt=2, fence=9):
        log.warning(
            "model call failed",
            error=f"401 for key {secret}",
            cause=ValueError(secret),
            usage={"total_tokens": 5},
            authorization=f"Bearer {secret}",
        )
        try:
            raise RuntimeError(f"boom {secret}")
        except RuntimeError:
            log.exception("step kind crashed")
        log.debug("below the level: not even written")
    printed = capsys.readouterr().out
    assert secret not in printed
    lines = buffer.take()
    assert [(x.step_id, x.fence, x.level, x.event) for x in lines] == [
        ("s1", 9, "warning", "model call failed"),
        ("s1", 9, "error", "step kind crashed"),
    ]
    failed, crashed = lines
    assert failed.fields["usage"] == {"total_tokens": 5}
    assert "timestamp" not in failed.fields  # the runner's clock is never shipped
    assert not {"task_id", "step_id", "attempt", "fence", "event"} & set(failed.fields)
    assert crashed.fields["error_type"] == "RuntimeError"  # the type, never the message
    assert "exception" not in crashed.fields
    assert secret not in json.dumps([x.fields for x in lines], default=str)
    assert len(buffer) == 0


def test_each_attempt_keeps_its_newest_lines_and_says_how_many_it_lost() -> None:
    buffer = LogBuffer(per_attempt=3)
    for n in range(5):
        buffer.add(LogLine(step_id="s1", fence=1, level="info", event=f"line {n}"))
    buffer.add(LogLine(step_id="s2", fence=2, level="info", event="other attempt"))
    first = buffer.take(most=3)
    assert [(x.event, x.fields) for x in first] == [
        (DROPPED_EVENT, {"dropped": 2, "by": "runner"}),
        ("line 2", {}),
        ("line 3", {}),
    ]
    buffer.lost(first)  # that batch got no answer: its lines are lost too, and counted
    rest = buffer.take()
    assert [(x.step_id, x.event, x.fields) for x in rest] == [
        ("s1", DROPPED_EVENT, {"dropped": 4, "by": "runner"}),
        ("s1", "line 4", {}),
        ("s2", "other attempt", {}),
    ]
    assert buffer.take() == []


async def test_a_step_runs_through_a_supervisor_that_drops_log_lines_then_they_flow_again(
    tmp_path: Path,
) -> None:
    """The route refuses (a 503, then no answer at all) while two steps run: both commit; the
    lines of the failed batches come back as a marker line, and the rest arrive."""
    buffer = LogBuffer()
    rig = make_rig(tmp_path, log_buffer=buffer)
    sup = rig.supervisor
    sup.script("logs", error(503, "unavailable", "busy"), httpx.ConnectError("refused"))
    shipper = rig.runner.log_shipper
    assert isinstance(shipper, LogShipper)
    with structlog.testing.capture_logs(
        processors=[structlog.contextvars.merge_contextvars, buffer]
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            sup.offer(make_lease("s1", task_id="t1", fence=11))
            await sup.until(lambda: bool(sup.of("result", "s1")))
            await sup.until(lambda: len(sup.of("logs")) >= 2, within=10)
            sup.offer(make_lease("s2", task_id="t2", fence=12))
            await sup.until(lambda: bool(sup.of("result", "s2")))
            await sup.until(lambda: any(x["step_id"] == "s2" for x in sup.log_lines), within=10)
            rig.runner.request_shutdown()
    assert [s.outcome for s in rig.runner.recent_steps] == ["applied", "applied"]
    shipped = [(x["step_id"], x["event"]) for x in sup.log_lines]
    assert ("s2", "step leased") in shipped
    assert ("s2", "step reported") in shipped
    markers = [x for x in sup.log_lines if x["event"] == DROPPED_EVENT]
    assert markers
    assert all(x["fields"]["by"] == "runner" for x in markers)
    assert all(x["fence"] in (11, 12) for x in sup.log_lines)
    text = json.dumps(sup.log_lines)
    assert MODEL_KEY not in text
    assert TOKEN not in text


async def test_a_supervisor_without_the_route_is_not_asked_again(tmp_path: Path) -> None:
    buffer = LogBuffer()
    rig = make_rig(tmp_path, log_buffer=buffer)
    sup = rig.supervisor
    sup.script("logs", error(404, "not_found", "no such route"))
    with structlog.testing.capture_logs(
        processors=[structlog.contextvars.merge_contextvars, buffer]
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            sup.offer(make_lease("s1", task_id="t1", fence=11))
            await sup.until(lambda: bool(sup.of("result", "s1")))
            await sup.until(lambda: bool(sup.of("logs")), within=10)
            sup.offer(make_lease("s2", task_id="t2", fence=12))
            await sup.until(lambda: bool(sup.of("result", "s2")))
            rig.runner.request_shutdown()
    assert [s.outcome for s in rig.runner.recent_steps] == ["applied", "applied"]
    assert len(sup.of("logs")) == 1
    assert rig.runner.log_shipper is not None
    assert rig.runner.log_shipper.off


async def test_a_turn_ships_what_was_buffered_and_leaves_what_arrives_meanwhile() -> None:
    """Lines logged while a batch is on the wire wait for the next turn, so a busy runner
    sends one request a turn, not one after another; a full batch goes on to the backlog in
    the same turn, and the flush at exit sends everything, what arrives meanwhile too."""
    buffer = LogBuffer()
    sizes: list[int] = []

    def line(event: str) -> LogLine:
        return LogLine(step_id="s1", fence=1, level="info", event=event)

    def answer(request: httpx.Request) -> httpx.Response:
        sizes.append(len(json.loads(request.content)["lines"]))
        if len(sizes) < 6:  # a step logs while the batch is on the wire
            buffer.add(line(f"meanwhile {len(sizes)}"))
        return httpx.Response(200, json={"kept": sizes[-1], "refused": 0, "over_limit": 0})

    clock = LoopClock()
    supervisor = SupervisorClient(
        base_url="http://sup", token=TOKEN, clock=clock, transport=httpx.MockTransport(answer)
    )
    shipper = LogShipper(buffer, supervisor, clock=clock)
    for n in range(3):
        buffer.add(line(f"line {n}"))
    await shipper.ship()
    assert (sizes, len(buffer)) == ([3], 1)
    await shipper.ship()
    assert (sizes, len(buffer)) == ([3, 1], 1)
    for n in range(LOG_LINES_PER_REQUEST_MAX + 1):
        buffer.add(line(f"backlog {n}"))
    await shipper.ship()
    assert (sizes, len(buffer)) == ([3, 1, LOG_LINES_PER_REQUEST_MAX, 3], 1)
    await shipper.flush()
    assert (sizes[4:], len(buffer)) == ([1, 1], 0)
    assert shipper.sent == 3 + 1 + LOG_LINES_PER_REQUEST_MAX + 3 + 1 + 1
