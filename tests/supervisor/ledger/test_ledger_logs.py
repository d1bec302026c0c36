"""The runner's log lines on the owned box (issue 26, finding 3; `supervisor/ledger/logs.py`):
kept only under a fence granted to the sending token for that step, bounded per attempt with
one marker line, and read merged with the task's journal in the order the owned box saw them."""

from __future__ import annotations

import pytest

from tests.conftest import FakeClock, queued_task, report_for
from tether.supervisor.ledger import Lease, SqliteLedger
from tether.supervisor.ledger.logs import FIELDS_MAX_CHARS, LINES_PER_ATTEMPT, OVER_LIMIT_EVENT
from tether.wire.records import LogLine, LogLinesKept

pytestmark = pytest.mark.backends

POOL = "default"


def line(lease: Lease, event: str, **fields: object) -> LogLine:
    return LogLine(
        step_id=lease.step_id, fence=lease.fence, level="info", event=event, fields=fields
    )


async def claim_one(ledger: SqliteLedger, runner: str = "r1", token: str = "tok-a") -> Lease:
    [lease] = await ledger.claim(runner, POOL, 1, 0, token_id=token)
    return lease


async def test_lines_are_kept_only_under_a_fence_granted_to_the_sending_token(
    ledger: SqliteLedger,
) -> None:
    task_id = await queued_task(ledger)
    lease = await claim_one(ledger)
    kept = await ledger.keep_log_lines([line(lease, "step leased", kind="chat")], POOL, "tok-a")
    assert kept == LogLinesKept(kept=1, refused=0, over_limit=0)
    forged = [
        line(lease, "forged"),
        LogLine(step_id="other", fence=lease.fence, level="info", event="wrong step"),
    ]
    assert await ledger.keep_log_lines(forged, POOL, "tok-b") == LogLinesKept(
        kept=0, refused=2, over_limit=0
    )
    assert (await ledger.keep_log_lines(forged[1:], POOL, "tok-a")).refused == 1
    assert (await ledger.keep_log_lines([line(lease, "other pool")], "gpu", "tok-a")).refused == 1
    unknown = LogLine(step_id=lease.step_id, fence=lease.fence + 999, level="info", event="x")
    assert (await ledger.keep_log_lines([unknown], POOL, "tok-a")).refused == 1
    log = await ledger.task_log(task_id, "acme", 0, 0)
    runner_lines = [e for e in log.entries if e.source == "runner"]
    assert [(e.event, e.fields) for e in runner_lines] == [("step leased", {"kind": "chat"})]
    (only,) = runner_lines
    assert (only.step_id, only.fence, only.attempt, only.runner_id) == (
        lease.step_id,
        lease.fence,
        1,
        "r1",
    )


async def test_a_lines_fields_past_their_bound_keep_only_their_names(
    ledger: SqliteLedger,
) -> None:
    task_id = await queued_task(ledger)
    lease = await claim_one(ledger)
    big = line(lease, "big", a="x" * (FIELDS_MAX_CHARS + 1), b=1)
    assert (await ledger.keep_log_lines([big], POOL, "tok-a")).kept == 1
    (kept,) = [
        e for e in (await ledger.task_log(task_id, "acme", 0, 0)).entries if e.source == "runner"
    ]
    assert kept.fields == {"fields_cut": ["a", "b"]}


async def test_each_attempt_keeps_at_most_its_limit_then_one_marker(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    lease = await claim_one(ledger)
    batch = [line(lease, f"line {n}") for n in range(200)]
    for _ in range(LINES_PER_ATTEMPT // 200):
        assert (await ledger.keep_log_lines(batch, POOL, "tok-a")).kept == 200
    over = await ledger.keep_log_lines(batch[:3], POOL, "tok-a")
    assert over == LogLinesKept(kept=0, refused=0, over_limit=3)
    assert (await ledger.keep_log_lines(batch[:3], POOL, "tok-a")).over_limit == 3
    entries, after_line = [], 0
    while True:
        page = await ledger.task_log(task_id, "acme", 0, after_line)
        got = [e for e in page.entries if e.source == "runner"]
        if not got:
            break
        entries += got
        after_line = page.next_line
    assert len(entries) == LINES_PER_ATTEMPT + 1
    assert (entries[-1].event, entries[-1].level) == (OVER_LIMIT_EVENT, "warning")
    assert entries[-1].fields == {"limit": LINES_PER_ATTEMPT, "by": "supervisor"}


async def test_lines_sit_among_the_journal_in_receipt_order_not_the_runners_clock(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    task_id = await queued_task(ledger)
    first = await claim_one(ledger)
    await ledger.keep_log_lines([line(first, "step leased")], POOL, "tok-a")
    clock.advance(31)
    await ledger.expire()
    second = await claim_one(ledger, "r2", "tok-b")
    await ledger.keep_log_lines([line(second, "step leased")], POOL, "tok-b")
    # runner-a's last line arrives late, after runner-b's lease: it sorts where it arrived.
    await ledger.keep_log_lines([line(first, "late line")], POOL, "tok-a")
    await ledger.report(report_for(second), POOL, token_id="tok-b")  # the lease is tok-b's
    await ledger.keep_log_lines([line(second, "step reported")], POOL, "tok-b")
    log = await ledger.task_log(task_id, "acme", 0, 0)
    story = [(e.source, e.event, e.runner_id) for e in log.entries]
    granted = [n for n, e in enumerate(log.entries) if e.event == "step_leased"]
    assert len(granted) == 2
    a_line = story.index(("runner", "step leased", "r1"))
    b_line = story.index(("runner", "step leased", "r2"))
    assert granted[0] < a_line < granted[1] < b_line
    assert story.index(("runner", "late line", "r1")) > b_line
    assert story[-1] == ("runner", "step reported", "r2")
    seqs = [e.seq for e in log.entries]
    assert seqs == sorted(seqs)
    # Read again from the cursor: nothing repeats.
    again = await ledger.task_log(task_id, "acme", log.next_seq, log.next_line)
    assert again.entries == ()
    # Another tenant's task is not found.
    with pytest.raises(Exception, match="no task"):
        await ledger.task_log(task_id, "other-tenant", 0, 0)
