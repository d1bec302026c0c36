"""The effect domain: a step's result becomes its one effect, exactly once.

A commit is one transaction: the fence is current, the payload hash equals the intent's, the
task has not ended, the effect is inserted under `effect_key = sha256(step_id, payload_hash)`,
the step is committed and the event appended. A report for a step already committed returns
`replayed` and writes nothing: delivery is at-least-once, the effect is exactly-once.
"""

from __future__ import annotations

from typing import Final

from tether.supervisor.ledger import verifier
from tether.supervisor.ledger.decisions import Decision
from tether.supervisor.ledger.errors import InvalidRequest, PayloadDrift, TerminalState
from tether.supervisor.ledger.journal import append_event
from tether.supervisor.ledger.lifecycle import advance
from tether.supervisor.ledger.operator import observe_head
from tether.supervisor.ledger.records import CommittingAttempt, HeldStep
from tether.supervisor.ledger.states import TERMINAL, AttemptState, StepState, TaskState
from tether.supervisor.ledger.steps import (
    about_step,
    charge,
    end_attempt,
    held_step,
    require_current,
)
from tether.supervisor.ledger.tx import Tx, dumps
from tether.supervisor.ledger.verification import Evidence
from tether.wire import Outcome, effect_key
from tether.wire.records import Report

# The names a planted bug of the schedule explorer may swap while a run lasts
# (`tether.sim.plants`): the rules here call each through this module's globals.
SEAMS: Final = frozenset({"effect_identity", "held_step", "require_current"})


def effect_identity(tx: Tx, step: HeldStep, rep: Report) -> str | None:
    """The key the report's effect is stored under: the step's identity, so a step has one
    effect whichever attempt commits it. None when the step is committed already: a replay."""
    if step.state == StepState.COMMITTED:
        # Only the attempt that committed may hear `replayed`: a fenced-out worker that
        # reports late must learn the step is not its own, and the refusal is recorded.
        require_current(tx, step, rep.fence)
        return None
    return effect_key(rep.step_id, rep.payload_hash)


def report(
    tx: Tx,
    rep: Report,
    pool: str | None = None,
    evidence: Evidence | None = None,
    *,
    token_id: str | None = None,
) -> Outcome:
    """Commit the step's one effect, or return `replayed` if it is already committed. Only
    the token the attempt under `rep.fence` was granted to may report it (`held_step`); the
    report's usage then counts toward the tenant's budget, committed or refused (`charge`).

    A step of a repository-bound task commits only with `evidence`, what the adapters observed
    about this report; it is kept on the step with the bundle and the check runs. When the
    evidence's head is not the approved base, the step still commits (its effect is recorded
    once) and the task fails `stale_base` at once, so no later step runs on a moved base.
    """
    tx.request = "result"
    step = held_step(tx, rep.step_id, rep.fence, token_id, pool)
    spent = charge(tx, step, rep.fence, rep.usage)
    if rep.payload_hash != step.payload_hash:
        raise PayloadDrift(
            f"payload hash {rep.payload_hash} is not step {rep.step_id}'s intent"
            f" {step.payload_hash}"
        ).about(task_id=step.task_id, step_id=rep.step_id, fence=rep.fence)
    key = effect_identity(tx, step, rep)
    if key is None:
        tx.note(Decision.REPLAYED, **_committed_attempt(tx, step))
        return Outcome.REPLAYED
    if TaskState(step.task_state) in TERMINAL:
        raise TerminalState(f"task {step.task_id} is {step.task_state}").about(
            task_id=step.task_id, step_id=rep.step_id, fence=rep.fence
        )
    require_current(tx, step, rep.fence)
    check_report(rep)
    verifying = step.verifies is not None
    if verifying:
        verifier.check_verify_report(step, rep)
    repository = step.repository  # the task's, read with the step
    if repository and evidence is None:
        raise InvalidRequest(
            f"step {rep.step_id} is bound to repository {repository}: its result"
            " commits only with the supervisor's evidence"
        )
    _commit(tx, step, rep, key, evidence)
    tx.many(
        "record_step_artifact",
        [
            {
                "task_id": step.task_id,
                "step_id": rep.step_id,
                "candidate_sha": rep.candidate_sha,
                "name": name,
                "digest": digest,
            }
            for name, digest in rep.artifacts.items()
        ],
    )
    tx.many(
        "record_check_run",
        [
            {
                "step_id": rep.step_id,
                "name": name,
                "candidate_sha": rep.candidate_sha,
                "log_digest": run.log,
                "exit_code": run.exit_code,
                "duration_s": run.duration_s,
            }
            for name, run in rep.checks.items()
        ],
    )
    append_event(
        tx,
        step.task_id,
        "step_committed",
        step.task_state,
        {
            "step_id": rep.step_id,
            "fence": rep.fence,
            "effect_key": key,
            "candidate_sha": rep.candidate_sha,
        },
    )
    tx.note(Decision.COMMITTED, **about_step(tx, step), effect_key=key, tokens=spent)
    if verifying:
        verifier.note_dispute(tx, step)
    if evidence is not None and repository:
        # The head the adapter read is an observation like a webhook's: on a moved base this
        # task (and any other approved on the old one) fails `stale_base` here.
        observe_head(tx, step.tenant, repository, evidence.head_sha)
        if evidence.head_sha != step.approved_base_sha:
            return Outcome.APPLIED
        advance(tx, step)  # the head observed may have moved other tasks: read the state
    else:
        advance(tx, step, TaskState(step.task_state))
    return Outcome.APPLIED


def _commit(tx: Tx, step: HeldStep, rep: Report, key: str, evidence: Evidence | None) -> None:
    """Record the step's one effect under `key`, commit the step with its output and end the
    attempt under `rep.fence`: where the dialect folds the three writes into one statement
    (`commit_result`, PostgreSQL: `queries.FOLDS`), that one."""
    verifying = step.verifies is not None
    output_json = dumps(rep.output)
    # A verify step names no candidate of its own: it keeps the bundle it read.
    step_candidate = None if verifying else rep.candidate_sha
    bundle = step.bundle if verifying else rep.bundle
    evidence_json = None if evidence is None else dumps(evidence.as_dict())
    effect = {
        "effect_key": key,
        "step_id": rep.step_id,
        "task_id": step.task_id,
        "fence": rep.fence,
        "payload_hash": rep.payload_hash,
        "output_json": output_json,
        "usage_json": dumps(rep.usage),
        "now": tx.now,
    }
    if "commit_result" in tx.sql:
        tx.run(
            "commit_result",
            **effect,
            effect_candidate_sha=rep.candidate_sha,
            step_candidate_sha=step_candidate,
            bundle=bundle,
            evidence_json=evidence_json,
        )
        return
    tx.run("insert_effect", **effect, candidate_sha=rep.candidate_sha)
    tx.run(
        "commit_step",
        state=StepState.COMMITTED.value,
        output_json=output_json,
        candidate_sha=step_candidate,
        bundle=bundle,
        evidence_json=evidence_json,
        now=tx.now,
        step_id=rep.step_id,
    )
    end_attempt(tx, rep.step_id, rep.fence, AttemptState.COMMITTED, "committed")


def check_report(rep: Report) -> None:
    """`InvalidRequest` for artifacts, check runs or a bundle that name no candidate, and for
    empty artifact names or digests."""
    for name, digest in rep.artifacts.items():
        if not name or not digest:
            raise InvalidRequest("artifact names and digests must be non-empty")
    if (rep.artifacts or rep.checks or rep.bundle) and not rep.candidate_sha:
        raise InvalidRequest(
            "artifacts, checks and a bundle must name the candidate_sha they were produced for"
        )


def _committed_attempt(tx: Tx, step: HeldStep) -> dict[str, object]:
    """`about_step` for a committed step, whose fence was cleared: the committing attempt's."""
    about = about_step(tx, step)
    row = tx.one_as(CommittingAttempt, "committing_attempt", step_id=step.id)
    if row is not None:
        about.update(
            attempt=row.attempt, fence=row.fence, runner_id=row.runner_id, token_id=row.token_id
        )
    return about
