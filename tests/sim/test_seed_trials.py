"""The four trials of the first seed article, against the real ledger: each ends with exactly
one effect per step and the replay outcome the article lists."""

from __future__ import annotations

import pytest

from tests.conftest import FakeClock, queued_task
from tests.plain import plain
from tether.supervisor.ledger import Report, SqliteLedger
from tether.wire import Outcome


async def effects_of(ledger: SqliteLedger, task_id: str) -> int:
    view = plain(await ledger.task(task_id))
    return sum(1 for s in view["steps"] if s["effect_key"])


def report_for(lease: object, output: str = "done") -> Report:
    return Report(
        step_id=lease.step_id,  # type: ignore[attr-defined]
        fence=lease.fence,  # type: ignore[attr-defined]
        payload_hash=lease.payload_hash,  # type: ignore[attr-defined]
        output=output,
        usage={"total_tokens": 3},
    )


@pytest.mark.parametrize(
    ("fault", "replay_outcome"),
    [
        (None, Outcome.REPLAYED),
        ("kill_before_commit", Outcome.APPLIED),
        ("kill_after_commit", Outcome.REPLAYED),
        ("duplicate_delivery", Outcome.REPLAYED),
    ],
)
async def test_seed_trial(
    ledger: SqliteLedger, clock: FakeClock, fault: str | None, replay_outcome: Outcome
) -> None:
    task_id = await queued_task(ledger)
    [lease] = await ledger.claim("runner-a", "default", 1, 0)
    first: Outcome | None = None
    if fault != "kill_before_commit":
        first = await ledger.report(report_for(lease))  # kill_after_commit: ack is lost
        assert first is Outcome.APPLIED
    if fault == "duplicate_delivery":
        # The same result delivered twice by the network before anyone else runs.
        assert await ledger.report(report_for(lease)) is Outcome.REPLAYED

    if fault == "kill_before_commit":
        # The server vanished: the lease expires on the supervisor's clock and is replayed
        # with the same step id, a new attempt and a new fence.
        clock.advance(31)
        assert await ledger.expire() == 1
        [again] = await ledger.claim("runner-b", "default", 1, 0)
        assert again.step_id == lease.step_id
        assert again.fence > lease.fence
        assert again.attempt == lease.attempt + 1
        replay = await ledger.report(report_for(again))
    else:
        replay = await ledger.report(report_for(lease))

    assert replay is replay_outcome
    assert await effects_of(ledger, task_id) == 1
    view = plain(await ledger.task(task_id))
    assert view["state"] == "SUCCEEDED"
    assert view["steps"][0]["state"] == "committed"
    assert await ledger.violations() == []
