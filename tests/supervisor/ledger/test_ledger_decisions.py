"""Every ledger decision is one log line, written once the decision is durable (issue 16,
finding 1: the supervisor logged no task or step activity at all).

Each test drives the real `SqliteLedger` and reads its lines through `capture_logs()`: the
event, the level, and the ids a user follows a step by (`task_id`, `step_id`, `attempt`,
`fence`, `runner_id`, `token_id`, `tenant`, `pool`). No line carries a payload or an output.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.conftest import FakeClock, Sim, ledger_rows, make_spec, queued_task, report_for
from tests.plain import plain
from tests.supervisor.ledger.test_ledger_verification import add_repo
from tether.supervisor.ledger import Report, SqliteLedger, StaleFence, StorageError, TerminalState
from tether.supervisor.ledger.batch import execute_batch
from tether.supervisor.ledger.decisions import Decision
from tether.supervisor.ledger.errors import PayloadDrift
from tether.supervisor.ledger.tx import Tx
from tether.supervisor.ledger.verification import Evidence
from tether.wire import ReleaseReason

pytestmark = pytest.mark.backends

# The runner token the leases here are claimed with: their renew, release and result carry it
# too, since a lease belongs to the token it was granted to.
TOKEN = "tok-a1"
STEP_FIELDS = {"task_id", "step_id", "attempt", "fence", "runner_id", "token_id", "tenant", "pool"}


def ledger_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The decisions' lines, without structlog's own keys."""
    return [line for line in logs if line.get("log_level") in ("info", "warning")]


def only(logs: list[dict[str, Any]], event: str) -> dict[str, Any]:
    found = [line for line in logs if line["event"] == event]
    assert len(found) == 1, f"{event!r} logged {len(found)} times: {logs}"
    return found[0]


def assert_about_attempt(line: dict[str, Any], lease: Any, runner_id: str = "r1") -> None:
    assert set(line) >= STEP_FIELDS, line
    assert line["task_id"] == lease.task_id
    assert line["step_id"] == lease.step_id
    assert line["attempt"] == lease.attempt
    assert line["fence"] == lease.fence
    assert line["runner_id"] == runner_id
    assert line["token_id"] == TOKEN
    assert (line["tenant"], line["pool"]) == ("acme", "default")


def assert_no_payload(logs: list[dict[str, Any]]) -> None:
    text = json.dumps(logs, default=str)
    assert "apply-patch" not in text  # the payload of make_spec's steps
    assert "the secret output" not in text


async def test_a_step_that_succeeds_logs_created_approved_granted_committed_verified(
    ledger: SqliteLedger,
) -> None:
    spec = make_spec("k1")
    with capture_logs() as logs:
        created = await ledger.create_task(spec)
        await ledger.approve("acme", created.task_id, spec.plan_hash, None)
        [lease] = await ledger.claim("r1", "default", 1, 0, token_id=TOKEN)
        await ledger.renew(lease.step_id, lease.fence, token_id=TOKEN)
        await ledger.report(report_for(lease, "the secret output"), token_id=TOKEN)
    task_id = created.task_id
    assert [(line["event"], line["log_level"]) for line in logs] == [
        ("task created", "info"),
        ("task approved", "info"),
        ("step granted", "info"),
        ("step committed", "info"),  # an accepted renewal is not a decision worth a line
        ("task verified", "info"),
    ]
    created_line, approved, granted, committed, verified = logs
    assert (created_line["task_id"], created_line["tenant"], created_line["pool"]) == (
        task_id,
        "acme",
        "default",
    )
    assert created_line["plan_hash"] == spec.plan_hash
    assert (approved["task_id"], approved["plan_hash"]) == (task_id, spec.plan_hash)
    assert_about_attempt(granted, lease)
    assert_about_attempt(committed, lease)
    assert committed["tokens"] == 3
    assert (verified["task_id"], verified["state"]) == (task_id, "SUCCEEDED")
    assert_no_payload(logs)


async def test_a_duplicate_create_and_a_repeated_approval_log_nothing(
    ledger: SqliteLedger,
) -> None:
    spec = make_spec("k1")
    created = await ledger.create_task(spec)
    await ledger.approve("acme", created.task_id, spec.plan_hash, None)
    with capture_logs() as logs:
        await ledger.create_task(spec)
        await ledger.approve("acme", created.task_id, spec.plan_hash, None)
    assert logs == []


async def test_the_token_that_claimed_is_recorded_on_the_attempt_and_shown_in_the_view(
    ledger: SqliteLedger,
) -> None:
    task_id = await queued_task(ledger)
    [lease] = await ledger.claim("r1", "default", 1, 0, token_id=TOKEN)
    [row] = ledger_rows(ledger, "SELECT token_id FROM attempts WHERE fence = ?", (lease.fence,))
    assert row[0] == TOKEN
    [step] = plain(await ledger.task(task_id))["steps"]
    assert [a["token_id"] for a in step["attempts"]] == [TOKEN]


async def test_expiry_logs_expired_at_warning_then_requeued_and_the_replay_is_granted(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    await queued_task(ledger)
    [first] = await ledger.claim("r1", "default", 1, 0, token_id=TOKEN)
    clock.advance(31)
    with capture_logs() as logs:
        assert await ledger.expire() == 1
        await ledger.claim("r2", "default", 1, 0, token_id="tok-b2")
    expired = only(logs, "lease expired")
    assert expired["log_level"] == "warning"
    assert_about_attempt(expired, first)
    assert expired["why"] == "not acknowledged"
    requeued = only(logs, "step requeued")
    assert requeued["log_level"] == "info"
    assert_about_attempt(requeued, first)
    assert (requeued["counted"], requeued["burned"]) == (True, 1)
    granted = only(logs, "step granted")
    assert (granted["step_id"], granted["attempt"]) == (first.step_id, 2)
    assert (granted["runner_id"], granted["token_id"]) == ("r2", "tok-b2")
    assert granted["fence"] > first.fence


async def test_a_refused_renew_logs_renew_refused_at_warning_with_code_and_attempt(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    await queued_task(ledger)
    [first] = await ledger.claim("r1", "default", 1, 0, token_id=TOKEN)
    clock.advance(31)
    await ledger.expire()
    with capture_logs() as logs, pytest.raises(StaleFence):
        await ledger.renew(first.step_id, first.fence, token_id=TOKEN)
    refused = only(logs, "renew refused")
    assert refused["log_level"] == "warning"
    assert refused["code"] == "stale_fence"
    assert_about_attempt(refused, first)
    assert "request" not in refused


async def test_refused_results_log_result_refused_with_their_codes(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    task_id = await queued_task(ledger)
    [lease] = await ledger.claim("r1", "default", 1, 0, token_id=TOKEN)
    drifted = Report(step_id=lease.step_id, fence=lease.fence, payload_hash="0" * 64, output="x")
    with capture_logs() as logs, pytest.raises(PayloadDrift):
        await ledger.report(drifted, token_id=TOKEN)
    refused = only(logs, "result refused")
    assert (refused["code"], refused["log_level"]) == ("payload_drift", "warning")
    assert_about_attempt(refused, lease)
    await ledger.cancel("acme", task_id, "changed mind")
    with capture_logs() as logs, pytest.raises(TerminalState):
        await ledger.report(report_for(lease), token_id=TOKEN)
    assert only(logs, "result refused")["code"] == "terminal"
    assert only(logs, "result refused")["task_id"] == task_id


async def test_a_replayed_result_logs_replayed_with_the_committing_attempt(
    ledger: SqliteLedger,
) -> None:
    await queued_task(ledger)
    [lease] = await ledger.claim("r1", "default", 1, 0, token_id=TOKEN)
    await ledger.report(report_for(lease), token_id=TOKEN)
    with capture_logs() as logs:
        assert await ledger.report(report_for(lease), token_id=TOKEN) == "replayed"
    replayed = only(logs, "result replayed")
    assert replayed["log_level"] == "info"
    assert_about_attempt(replayed, lease)


async def test_releases_log_released_then_requeued_or_the_task_failed(
    ledger: SqliteLedger,
) -> None:
    await queued_task(ledger, "k1")
    [lease] = await ledger.claim("r1", "default", 1, 0, token_id=TOKEN)
    with capture_logs() as logs:
        await ledger.release(
            lease.step_id, lease.fence, ReleaseReason.SHUTDOWN, True, "bye", token_id=TOKEN
        )
    assert [line["event"] for line in logs] == ["lease released", "step requeued"]
    assert_about_attempt(logs[0], lease)
    assert (logs[0]["reason"], logs[0]["retryable"]) == ("shutdown", True)
    assert logs[1]["counted"] is False

    [again] = await ledger.claim("r1", "default", 1, 0, token_id=TOKEN)
    with capture_logs() as logs:
        await ledger.release(
            again.step_id, again.fence, ReleaseReason.INVALID, False, "400", token_id=TOKEN
        )
    assert [(line["event"], line["log_level"]) for line in logs] == [
        ("lease released", "info"),
        ("task failed", "warning"),
    ]
    assert_about_attempt(logs[1], again)
    assert "failed (invalid)" in logs[1]["reason"]


async def test_a_cancel_logs_cancelled(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    with capture_logs() as logs:
        await ledger.cancel("acme", task_id, "changed mind")
    cancelled = only(logs, "task cancelled")
    assert (cancelled["task_id"], cancelled["tenant"], cancelled["pool"]) == (
        task_id,
        "acme",
        "default",
    )
    assert cancelled["from_state"] == "QUEUED"
    with capture_logs() as logs, pytest.raises(TerminalState):
        await ledger.cancel("acme", task_id, "again")
    assert only(logs, "cancel refused")["code"] == "terminal"


async def test_a_verification_that_fails_logs_task_failed(ledger: SqliteLedger) -> None:
    await add_repo(ledger)
    spec = make_spec("k1", repository="repo", base_sha="a" * 40)
    created = await ledger.create_task(spec)
    await ledger.approve("acme", created.task_id, spec.plan_hash, "a" * 40, "a" * 40)
    [lease] = await ledger.claim("r1", "default", 1, 0, token_id=TOKEN)
    with capture_logs() as logs:
        await ledger.report(report_for(lease), evidence=Evidence(head_sha="a" * 40), token_id=TOKEN)
    failed = only(logs, "task failed")
    assert failed["log_level"] == "warning"
    assert failed["task_id"] == created.task_id
    assert failed["reason"] == "no_candidate: no step reported a candidate"
    assert "task verified" not in [line["event"] for line in logs]


# -- only a durable decision is logged ------------------------------------------------------


def granting_then_refusing(tx: Tx) -> None:
    tx.note(Decision.GRANTED, task_id="t-rolled-back")
    raise StaleFence("refused after noting").about(task_id="t-rolled-back", fence=1)


def granting(tx: Tx) -> None:
    tx.note(Decision.GRANTED, task_id="t-kept")


def test_a_refused_rule_keeps_no_note_of_its_own_only_its_refusal(sim: Sim) -> None:
    result = sim.transactions.run([granting_then_refusing, granting])
    assert [(d, f.get("task_id")) for d, f in result.notes] == [
        (Decision.REFUSED, "t-rolled-back"),
        (Decision.GRANTED, "t-kept"),
    ]
    assert result.notes[0][1]["code"] == "stale_fence"


def test_a_batch_that_does_not_commit_has_no_notes(sim: Sim) -> None:
    result = execute_batch(
        sim.db,
        [granting, granting_then_refusing],
        sim.transactions.tx,
        commit=False,
        backend=sim.backend,
    )
    assert result.notes == []


@pytest.mark.sqlite_only("PRAGMA query_only makes SQLite's first write fail as the storage")
def test_a_batch_whose_commit_fails_has_no_notes(sim: Sim) -> None:
    sim.db.execute("PRAGMA query_only = ON")  # the first write fails; the batch cannot commit

    def writing(tx: Tx) -> None:
        tx.note(Decision.GRANTED, task_id="t-lost")
        tx.db.execute("UPDATE counters SET value = value + 1 WHERE name = 'fence'")

    try:
        result = sim.transactions.run([writing])
    finally:
        sim.db.execute("PRAGMA query_only = OFF")
    assert isinstance(result.outcomes[0].error, StorageError)
    assert result.notes == []


async def test_the_store_logs_nothing_for_a_rule_rolled_back(ledger: SqliteLedger) -> None:
    with capture_logs() as logs, pytest.raises(StaleFence):
        await ledger.write(granting_then_refusing)
    assert [line["event"] for line in logs] == ["request refused"]
    with capture_logs() as logs:
        await ledger.write(granting)
    assert [(line["event"], line["task_id"]) for line in logs] == [("step granted", "t-kept")]
