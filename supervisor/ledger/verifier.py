"""The verifier (docs/design.md, Verification): a task that names a verifier pool has its
checks re-run at its candidate by a runner of that pool before any effect of it falls due and
before it may succeed. The runner that made the candidate reports its checks; without a
verifier the supervisor holds only that runner's word for them.

The rule here adds the built-in `verify` step when the task reaches such a point with a
candidate no verifier has seen; the step is leased only to that pool's runners, and never to a
runner token that holds an attempt of another step of the task (`claim_queued_steps`). What
the verifier reports is judged with the rest of the evidence (`verification.findings`): a
check whose exit code differs fails the task `check_disputed`.
"""

from __future__ import annotations

from tether.supervisor.ledger.decisions import Decision
from tether.supervisor.ledger.errors import InvalidRequest
from tether.supervisor.ledger.identity import step_id_for
from tether.supervisor.ledger.journal import append_event
from tether.supervisor.ledger.records import (
    Candidate,
    CommittingToken,
    StepColumns,
    StepWithTask,
    TaskRow,
    from_row,
)
from tether.supervisor.ledger.tx import Statements, Tx, dumps, loads
from tether.supervisor.ledger.verification import check_runs_at, findings, verifier_findings
from tether.wire import content_hash
from tether.wire.payloads import VERIFY_KIND
from tether.wire.records import Report

VERIFY_STEP_NAME = "verify"


def ask_verifier(tx: Tx, step: StepWithTask) -> bool:
    """Add a verify step for the candidate of the task of `step` (a row of `find_step`) when
    the task names a verifier pool, its evidence holds nothing against it so far, and no
    verifier has reported at that candidate; True when one was added (the task waits for it).
    Called where an effect would fall due or the task would end (`lifecycle.advance`)."""
    if not step.verify_pool or not step.repository:
        return False  # read with the step: a task without a verifier pays no read here
    task_id = step.task_id
    task = tx.one_as(TaskRow, "task_by_id", task_id=task_id)
    assert task is not None
    candidate = tx.one_as(Candidate, "task_candidate", task_id=task_id)
    if candidate is None or candidate.bundle is None:
        return False  # verification fails on its own (`no_candidate`, `unknown_candidate`)
    sha = candidate.candidate_sha
    if tx.one("verify_step_at", task_id=task_id, sha=sha) is not None:
        return False  # reported: its word is in `findings`
    if findings(tx, task):
        return False  # the candidate fails on the runner's own report
    _add_verify_step(tx, task, sha, candidate.bundle, _setup_of(candidate.payload_json))
    return True


def _setup_of(payload_json: str) -> list[str]:
    """The setup commands the making step's payload added (an `agent` payload's `setup`): the
    verifier runs them too, after the repository's, so its checks see the same toolchain."""
    payload = loads(payload_json)
    setup = payload.get("setup") if isinstance(payload, dict) else None
    if not isinstance(setup, list):
        return []
    return [c for c in setup if isinstance(c, str)]


def _add_verify_step(tx: Tx, task: TaskRow, sha: str, bundle: str, setup: list[str]) -> None:
    """The verify step's intent, durable in this transaction, queued for the verifier pool."""
    task_id, pool = task.id, task.verify_pool
    assert pool is not None, "asked only for a task that names a verifier pool"
    payload: dict[str, object] = {"candidate_sha": sha, "bundle": bundle}
    if setup:
        payload["setup"] = setup
    position = tx.one("next_step_position", task_id=task_id)
    assert position is not None
    step_id = step_id_for(task_id, position["n"])
    tx.run(
        "insert_verify_step",
        step_id=step_id,
        task_id=task_id,
        position=position["n"],
        task_order=task.created_order,
        name=VERIFY_STEP_NAME,
        kind=VERIFY_KIND,
        payload_json=dumps(payload),
        payload_hash=content_hash(payload),
        verifies=sha,
        bundle=bundle,
    )
    append_event(
        tx,
        task_id,
        "verifier_asked",
        task.state,
        {"step_id": step_id, "candidate_sha": sha, "pool": pool},
    )
    tx.note(
        Decision.VERIFIER_ASKED,
        task_id=task_id,
        step_id=step_id,
        candidate_sha=sha,
        tenant=task.tenant,
        pool=pool,
    )
    tx.wake(pool)


def check_verify_report(step: StepColumns, rep: Report) -> None:
    """`InvalidRequest` unless a verify step's report names the candidate it was given."""
    if rep.candidate_sha != step.verifies:
        raise InvalidRequest(
            f"step {step.id} verifies candidate {step.verifies}: its report must name"
            f" that candidate_sha, not {rep.candidate_sha}"
        )


def note_dispute(tx: Tx, step: StepColumns) -> None:
    """Log a warning naming both runners' tokens when the verify step `step`, just committed,
    disagrees with the runner that made its candidate (the task fails on it in `advance`)."""
    task = tx.one_as(TaskRow, "task_by_id", task_id=step.task_id)
    assert task is not None
    sha = step.verifies
    assert sha is not None, "a verify step names the candidate it verifies"
    expected = loads(task.expected_checks_json)
    disputes = verifier_findings(tx, task.id, sha, expected, check_runs_at(tx, task.id, sha))
    if disputes:
        tx.note(
            Decision.CHECKS_DISPUTED,
            task_id=task.id,
            step_id=step.id,
            candidate_sha=sha,
            tenant=task.tenant,
            pool=task.verify_pool,
            reason=disputes[0].reason,
            maker_token=_maker_token(tx, task.id, sha),
            verifier_token=_token(tx, step.id),
        )


def _maker_token(s: Statements, task_id: str, sha: str) -> str | None:
    runs = check_runs_at(s, task_id, sha)
    return _token(s, next(iter(runs.values())).step_id) if runs else None


def _token(s: Statements, step_id: str) -> str | None:
    row = s.one("committing_token", step_id=step_id)
    return None if row is None else from_row(CommittingToken, row).token_id
