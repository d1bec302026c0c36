"""Verification (VERIFYING -> SUCCEEDED) and the review verdict: no success, and no acceptance,
without matching evidence (docs/design.md, Verification and Review record).

The adapters observe (they read the repository's head, import the bundle into the supervisor's
mirror, hash the stored logs) and hand the ledger an `Evidence`; the rule here only judges what
is recorded, so it does no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Any, Final

from tether.supervisor.ledger.records import (
    CheckRunAt,
    CheckRunRow,
    CommittingToken,
    StepColumns,
    StepEvidence,
    TaskRow,
    TaskToVerify,
    from_row,
)
from tether.supervisor.ledger.states import TERMINAL, StepState, TaskState
from tether.supervisor.ledger.tx import Statements, Tx, loads

# The names a planted bug of the schedule explorer may swap while a run lasts
# (`tether.sim.plants`): the rules here call each through this module's globals.
SEAMS: Final = frozenset({"problems_of"})


class Finding(enum.StrEnum):
    """Every named reason verification refuses a candidate for; a failed task's reason is
    `<code>: <detail>` of its first finding."""

    STALE_BASE = "stale_base"
    NO_CANDIDATE = "no_candidate"
    UNKNOWN_CANDIDATE = "unknown_candidate"  # not in the mirror, no bundle, bundle head differs
    NOT_DESCENDANT = "not_descendant"
    PATH_NOT_ALLOWED = "path_not_allowed"
    ENTRY_NOT_ALLOWED = "entry_not_allowed"  # a symlink, gitlink or executable not allowed
    MODE_CHANGED = "mode_changed"  # a file's mode changed without "executable" allowed
    BUNDLE_REFUSED = "bundle_refused"  # git refused the bundle, or its ref is taken
    MISSING_CHECK = "missing_check"  # an expected check has no run at the candidate
    MISSING_ARTIFACT = "missing_artifact"  # a log's bytes are not in the store (or not the pool's)
    ARTIFACT_MISMATCH = "artifact_mismatch"  # the stored bytes do not hash to the digest
    CHECK_FAILED = "check_failed"  # exit code != 0
    CHECK_DISPUTED = "check_disputed"  # the verifier's run of a check disagrees with the runner's


@dataclasses.dataclass(frozen=True, kw_only=True)
class Problem:
    code: Finding
    detail: str

    @property
    def reason(self) -> str:
        return f"{self.code}: {self.detail}"

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code.value, "detail": self.detail}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Evidence:
    """What the supervisor's adapters observed about one report of a repository-bound step."""

    head_sha: str  # the repository's head, read just before the commit
    problems: tuple[Problem, ...] = ()  # what the mirror and the store found against the report

    def as_dict(self) -> dict[str, Any]:
        return {"head_sha": self.head_sha, "problems": [p.as_dict() for p in self.problems]}


def problems_of(evidence_json: str | None) -> list[Problem]:
    """The problems of a step's stored evidence (`steps.evidence_json`)."""
    stored: Mapping[str, Any] | None = loads(evidence_json)
    if not stored:
        return []
    return [Problem(code=Finding(p["code"]), detail=p["detail"]) for p in stored["problems"]]


def stale_base(approved: str | None, head: str, repository: str) -> Problem:
    return Problem(
        code=Finding.STALE_BASE,
        detail=f"approved {approved}, repository {repository} is at {head}",
    )


def repository_head(s: Statements, task: TaskRow) -> str | None:
    """The head SHA last known for the task's repository."""
    row = s.one("repository_head_sha", tenant=task.tenant, repository=task.repository)
    return None if row is None else str(row["head_sha"])


def candidate_sha(s: Statements, task_id: str) -> str | None:
    """The candidate SHA the task's result stands for: the last one a committed step reported."""
    row = s.one("task_candidate_sha", task_id=task_id)
    return None if row is None else str(row["candidate_sha"])


def token_label(s: Statements, step_id: str) -> str:
    """The runner token that committed `step_id`, as a line names it: its name (and id), else
    its id."""
    found = s.one("committing_token", step_id=step_id)
    row = None if found is None else from_row(CommittingToken, found)
    if row is None or row.token_id is None:
        return "an unknown token"
    return f"{row.name} ({row.token_id})" if row.name else str(row.token_id)


def verify(tx: Tx, task_id: str) -> str | None:
    """Return None when the task may succeed, else the reason it fails.

    Every step must be committed with exactly one effect. When the task names a repository,
    its findings (`findings`) must be empty; the reason is the first one's `<code>: <detail>`.
    """
    task = tx.one_as(TaskToVerify, "task_to_verify", task_id=task_id)
    assert task is not None
    if task.uneven_step is not None:
        return f"unverified: step {task.uneven_step} does not have exactly one effect"
    found = findings(tx, task)
    if found:
        return found[0].reason
    if task.verify_pool and task.repository:
        sha = candidate_sha(tx, task_id)
        done = None if sha is None else verify_step_at(tx, task_id, sha)
        if done is None or done.state != StepState.COMMITTED:
            return (
                f"unverified: no runner of verifier pool {task.verify_pool!r} re-ran the"
                f" checks at {sha}"
            )
    return None


def findings(s: Statements, task: TaskRow) -> list[Problem]:
    """What stands between a repository-bound task (a row of `tasks`) and success, first
    first; none for a task without a repository.

    In order: a step whose evidence saw the head off the approved base (`stale_base`); no
    candidate at all (`no_candidate`); the problems the adapters found against the report of
    the final candidate (the latest step, by position, that reported one) and against the
    reports of the check runs used; then, for each expected check in order, no run at the
    final candidate (`missing_check`) or a run that exited non-zero (`check_failed`).
    """
    if not task.repository:
        return []
    steps = [from_row(StepEvidence, r) for r in s.all("committed_step_evidence", task_id=task.id)]
    found: list[Problem] = []
    for step in steps:
        evidence = loads(step.evidence_json)
        if evidence and evidence["head_sha"] != task.approved_base_sha:
            approved, head = task.approved_base_sha, evidence["head_sha"]
            found.append(stale_base(approved, head, task.repository))
    failed_on = _stale_failure(task)
    if failed_on is not None and not found:
        # Failed by a head read outside any step's evidence (at grant, or a webhook): the
        # reason the ledger wrote then is the finding.
        found.append(failed_on)
    final = next((s for s in reversed(steps) if s.candidate_sha), None)
    if final is None:
        found.append(Problem(code=Finding.NO_CANDIDATE, detail="no step reported a candidate"))
        return found
    sha = final.candidate_sha
    assert sha is not None  # the step was chosen for its candidate
    runs = check_runs_at(s, task.id, sha)
    reporting = {final.id} | {run.step_id for run in runs.values()}
    for step in steps:
        if step.id in reporting:
            found.extend(problems_of(step.evidence_json))
    expected = loads(task.expected_checks_json)
    for check in expected:
        run = runs.get(check)
        if run is None:
            found.append(
                Problem(code=Finding.MISSING_CHECK, detail=f"no run of check {check!r} at {sha}")
            )
        elif run.exit_code != 0:
            found.append(
                Problem(
                    code=Finding.CHECK_FAILED,
                    detail=f"check {check!r} exited {run.exit_code} at {sha}"
                    f" (log {run.log_digest})",
                )
            )
    if task.verify_pool:
        found.extend(verifier_findings(s, task.id, sha, expected, runs))
    return _unique(found)


def verifier_findings(
    s: Statements, task_id: str, sha: str, expected: list[str], runs: Mapping[str, CheckRunAt]
) -> list[Problem]:
    """What the verifier's committed report at candidate `sha` holds against it (none before
    a verifier reported): the problems its evidence found (its logs not its pool's, a head
    moved), an expected check it did not run (`missing_check`), and each check whose exit
    code is not the one the runner that made the candidate reported (`check_disputed`,
    naming both runners' tokens and logs)."""
    step = verify_step_at(s, task_id, sha)
    if step is None or step.state != StepState.COMMITTED:
        return []
    found = problems_of(step.evidence_json)
    theirs = {
        r.name: r
        for r in (from_row(CheckRunRow, c) for c in s.all("check_runs_of_step", step_id=step.id))
    }
    verifier = token_label(s, step.id)
    for check in expected:
        run, ours = theirs.get(check), runs.get(check)
        if run is None:
            found.append(
                Problem(
                    code=Finding.MISSING_CHECK,
                    detail=f"the verifier (runner token {verifier}) reported no run of check"
                    f" {check!r} at {sha}",
                )
            )
        elif ours is not None and run.exit_code != ours.exit_code:
            maker = token_label(s, ours.step_id)
            found.append(
                Problem(
                    code=Finding.CHECK_DISPUTED,
                    detail=f"check {check!r} at {sha}: runner token {maker} reported exit"
                    f" {ours.exit_code} (log {ours.log_digest}), the verifier's runner"
                    f" token {verifier} exit {run.exit_code} (log {run.log_digest})",
                )
            )
    return found


def checks_standing(s: Statements, task: TaskRow) -> str | None:
    """Who vouches for the checks at the task's candidate (a row of `tasks`), in words the
    task view, the review record and the status page show: `attested by runner <token>` (the
    runner that made the candidate, alone: the supervisor holds its word and its logs, and
    has run nothing), `verified by runner <token> of pool <pool>` once a verifier agreed,
    `disputed` when it did not. None before any check ran."""
    sha = candidate_sha(s, task.id)
    runs = check_runs_at(s, task.id, sha) if sha else {}
    if not runs:
        return None
    maker = token_label(s, next(iter(runs.values())).step_id)
    attested = f"attested by runner {maker}"
    pool = task.verify_pool
    if not pool:
        return attested
    expected = loads(task.expected_checks_json)
    assert sha is not None
    step = verify_step_at(s, task.id, sha)
    if step is None or step.state != StepState.COMMITTED:
        return f"{attested}; a runner of verifier pool {pool!r} has not re-run them yet"
    disputes = verifier_findings(s, task.id, sha, expected, runs)
    if disputes:
        return f"disputed: {disputes[0].reason}"
    return f"verified by runner {token_label(s, step.id)} of pool {pool!r}; {attested}"


def _stale_failure(task: TaskRow) -> Problem | None:
    """The `stale_base` finding of a task that failed with it, from its recorded reason."""
    prefix = f"{Finding.STALE_BASE.value}: "
    reason = task.reason or ""
    if task.state != TaskState.FAILED or not reason.startswith(prefix):
        return None
    return Problem(code=Finding.STALE_BASE, detail=reason.removeprefix(prefix))


def check_runs_at(s: Statements, task_id: str, sha: str | None) -> dict[str, CheckRunAt]:
    """The task's check runs at candidate `sha` by name: the latest step's run of each."""
    rows = s.all("check_runs_at_candidate", task_id=task_id, sha=sha)
    return {r.name: r for r in (from_row(CheckRunAt, row) for row in rows)}


def verify_step_at(s: Statements, task_id: str, sha: str) -> StepColumns | None:
    """The task's latest verify step of candidate `sha`, whatever its state."""
    row = s.one("verify_step_at", task_id=task_id, sha=sha)
    return None if row is None else from_row(StepColumns, row)


def _unique(problems: Iterable[Problem]) -> list[Problem]:
    return list(dict.fromkeys(problems))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    """Whether a reviewer may accept a task's result, with the observations it rests on.

    A reviewer may reject anything, but accept only what the ledger can vouch for: a task that
    succeeded, whose runners' authority is revoked, and whose repository is at the approved
    base or the candidate that names the reviewed revision.
    """

    head_sha: str | None
    candidate_sha: str | None
    live_leases: int
    reasons: tuple[str, ...]

    @property
    def acceptable(self) -> bool:
        return not self.reasons


def review_verdict(s: Statements, task: TaskRow) -> Verdict:
    """The verdict on `task` (a row of `tasks`), from what the ledger holds now."""
    state = TaskState(task.state)
    head = repository_head(s, task)
    candidate = candidate_sha(s, task.id)
    leases = s.one("live_leases_of_task", task_id=task.id)
    live_leases = int(leases["n"]) if leases is not None else 0
    reasons: list[str] = []
    if state in TERMINAL and live_leases:
        reasons.append("a runner still holds a lease on an ended task: authority not revoked")
    if task.repository and state is TaskState.SUCCEEDED:
        if head not in (task.approved_base_sha, candidate):
            reasons.append(f"repository head {head} is neither the approved base nor the candidate")
        if candidate is None:
            reasons.append("the evidence names no candidate revision")
    if state is not TaskState.SUCCEEDED:
        reasons.append(f"task ended {state}" if state in TERMINAL else "task has not ended")
    return Verdict(
        head_sha=head, candidate_sha=candidate, live_leases=live_leases, reasons=tuple(reasons)
    )
