"""The rows the rules read most, as typed records: a step with its task's columns, a task, an
attempt, an outbox row. A row becomes a record at one place, `from_row`, which `Tx.one_as` and
`Tx.all_as` (and a `ReadSession`'s) call; the rules then read attributes, which mypy checks.

A record is a msgspec `Struct` built positionally from the row, its fields in the query's
column order (`steps.*` in its table's order, then what the query adds). The first row each
query gives a record type is checked by column name (`RowShapeError` on a missing, extra or
reordered column); later rows of that query are not. A row read without its query (the views,
which run on bare `Statements`) is checked every time.

A query that gives one value (`value`, `n`, `d`, `token_id`, a count or an `EXISTS`) is read
by its column name, `int(row["n"])`, converted where it is read: a one-field record would say
no more than the query's name does, and a `Tx`-only helper (`value_as`) could not serve the
views, whose `Statements` offer only `one` and `all`. The rows of two or more columns that
rules and views read are records; the invariant checks (`invariants`), which only quote a
violating row, and the backend copy (`copy`), which reads catalogs, keep column names.

Why a Struct: per row of 28 columns (Python 3.11) a Struct from `*row` took 0.35 us, a
NamedTuple's `_make` 0.72 us, a slotted dataclass 0.85 us (5.4 us frozen), and reading a field
20 ns against 170 ns for `row["name"]`, so the typed rules cost less, not more: in
`bench.rulecost`, 3.1 % fewer instructions per committed step under callgrind (typed against
keyed, same run); its CPU time, alternating in one run, moved within its noise (medians 0.436
-> 0.407 ms over 8 rounds, 0.448 -> 0.450 ms over 10, on a loaded machine).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

import msgspec

from tether.supervisor.ledger.queries import Query

if TYPE_CHECKING:
    from tether.supervisor.ledger.tx import Row


class RowShapeError(TypeError):
    """A query's columns are not a record's fields, in order: a mistake in the code."""


class Record(msgspec.Struct, frozen=True, gc=False):
    """A row as a record. Rows hold only scalars, so the records need no cycle collection."""


R = TypeVar("R", bound=Record)


def from_row(record: type[R], row: Row, query: Query | None = None) -> R:
    """`row` as a `record`, checked by column name (`RowShapeError`): every row, or when the
    row's `query` is given, the first row that query gives a record of this type."""
    if query is None:
        check_columns(record, row.keys(), "given")
    elif record not in query.read_as:
        check_columns(record, row.keys(), query.name)
        query.read_as.add(record)
    return record(*row)


def check_columns(record: type[Record], columns: Sequence[str], query: str) -> None:
    """`RowShapeError` unless `columns` are `record`'s fields, in order."""
    fields = record.__struct_fields__
    if tuple(columns) != fields:
        missing = [f for f in fields if f not in columns]
        extra = [c for c in columns if c not in fields]
        said = f"missing {missing}, extra {extra}" if missing or extra else "in another order"
        raise RowShapeError(f"the columns of query {query} are not {record.__name__}'s: {said}")


class StepColumns(Record, frozen=True):
    """The columns of `steps`, in the table's order."""

    id: str
    task_id: str
    position: int
    task_order: int
    name: str
    kind: str
    payload_json: str
    payload_hash: str
    state: str
    attempt: int
    burned: int
    fence: int | None
    runner_id: str | None
    lease_deadline: float | None
    accept_deadline: float | None
    output_json: str | None
    candidate_sha: str | None
    committed_at: float | None
    bundle: str | None
    evidence_json: str | None
    verifies: str | None


class StepOutput(Record, frozen=True):
    """The output of a step before the one leased (`earlier_outputs`)."""

    id: str
    name: str
    output_json: str | None


class StartPoint(Record, frozen=True):
    """The candidate and bundle a lease's worktree starts at (`lease_start_point`)."""

    candidate_sha: str
    bundle: str | None


class Candidate(Record, frozen=True):
    """A task's latest candidate, its bundle and the payload of the step that made it
    (`task_candidate`)."""

    candidate_sha: str
    bundle: str | None
    payload_json: str


class CheckpointRow(Record, frozen=True):
    """The columns of `checkpoints`, in the table's order."""

    step_id: str
    fence: int
    turn: int
    transcript: str
    bundle: str | None
    sha: str | None
    step_usage_json: str | None
    created_at: float


class StepEvidence(Record, frozen=True):
    """A committed step's candidate and evidence (`committed_step_evidence`)."""

    id: str
    position: int
    candidate_sha: str | None
    evidence_json: str | None


class CheckRunRow(Record, frozen=True):
    """The columns of `check_runs`, in the table's order."""

    step_id: str
    name: str
    candidate_sha: str
    log_digest: str
    exit_code: int
    duration_s: float


class CheckRunAt(CheckRunRow, frozen=True):
    """A check run with its step's position (`check_runs_at_candidate`)."""

    position: int


class StepInView(StepColumns, frozen=True):
    """A step as the task view shows it, with its task's state and its effect's key
    (`steps_of_task_view`)."""

    task_state: str
    effect_key: str | None


class StepOfTask(StepColumns, frozen=True):
    """A step with its task's state and tenant, and its pool (`leases_to_reap`)."""

    task_state: str
    tenant: str
    pool: str


class StepWithTask(StepOfTask, frozen=True):
    """A step as a request names it (`step_with_task`): with its task's repository, approved
    base and verifier pool, and the runner token of its current attempt."""

    repository: str | None
    approved_base_sha: str | None
    verify_pool: str | None
    lease_token_id: str | None


class HeldStep(StepWithTask, frozen=True):
    """`StepWithTask`, with the fence, runner token and usage counted of its attempt under the
    fence a request gives, None when it never had that fence (`held_step_with_task`)."""

    held_fence: int | None
    held_token_id: str | None
    held_usage_json: str | None


class QueuedStep(StepOfTask, frozen=True):
    """A queued step with what a lease carries of its task (`claim_queued_steps`); `pool` is
    the task's."""

    repository: str | None
    approved_base_sha: str | None
    allowed_paths_json: str
    checks_json: str
    verify_pool: str | None


class NextStep(Record, frozen=True):
    """A task's first step not yet committed (`first_uncommitted_step`)."""

    id: str
    state: str
    kind: str


class LeaseTask(Record, frozen=True):
    """What a lease carries of a task (`task_for_lease`): the columns `QueuedStep` adds."""

    task_state: str
    tenant: str
    pool: str
    repository: str | None
    approved_base_sha: str | None
    allowed_paths_json: str
    checks_json: str
    verify_pool: str | None


class OutboxColumns(Record, frozen=True):
    """The columns of `outbox`, in the table's order (`outbox_of_task`)."""

    step_id: str
    task_id: str
    kind: str
    effect_key: str
    keyed: int
    request_json: str
    digest: str
    state: str
    deadline_s: float
    deadline_at: float | None
    not_before: float
    holder: str | None
    held_until: float | None
    openings: int
    gate_digest: str | None
    said_no: int
    created_at: float
    ended_at: float | None
    settled_attempts: int


class EffectRow(OutboxColumns, frozen=True):
    """An outbox row with its task's state and tenant (`effect_row`, `ready_effects` and
    their kin)."""

    task_state: str
    tenant: str


class DeliveryRow(Record, frozen=True):
    """The columns of `deliveries`, in the table's order: one attempt to deliver an effect."""

    step_id: str
    attempt: int
    opening: int
    holder: str
    started_at: float
    ended_at: float | None
    answer: str | None
    sent: int | None
    status: int | None
    detail: str | None
    error: str | None


class RemoteRow(Record, frozen=True):
    """The columns of `repository_remotes`, in the table's order."""

    tenant: str
    name: str
    url: str
    added_at: float
    setup_json: str


class TokenRow(Record, frozen=True):
    """The columns of `tokens`, in the table's order."""

    id: str
    scope: str
    role: str
    secret_hash: str
    created_at: float
    revoked_at: float | None
    name: str | None
    last_used_at: float | None


class LiveToken(Record, frozen=True):
    """Who a request's bearer is (`live_token_by_secret_hash`)."""

    id: str
    scope: str
    role: str
    last_used_at: float | None


class TaskRow(Record, frozen=True):
    """The columns of `tasks`, in the table's order."""

    id: str
    tenant: str
    idempotency_key: str
    pool: str
    state: str
    plan_hash: str
    plan_json: str
    repository: str | None
    declared_base_sha: str | None
    approved_base_sha: str | None
    requirement_revision: str | None
    allowed_paths_json: str
    expected_checks_json: str
    owner: str | None
    reason: str | None
    reviewer_decision: str | None
    created_order: int
    created_at: float
    approved_at: float | None
    started_at: float | None
    finished_at: float | None
    last_seq: int
    checks_json: str
    pushed_sha: str | None
    verify_pool: str | None


class TaskOfStep(TaskRow, frozen=True):
    """A step's task, with the candidate the step verifies and the step's pool
    (`task_row_of_step`)."""

    verifies: str | None
    step_pool: str


class TaskCounted(TaskRow, frozen=True):
    """A task with its steps in all and committed (`tenant_tasks_page` and its kin)."""

    steps_total: int
    steps_committed: int


class TaskToVerify(TaskRow, frozen=True):
    """A task with a step of it not committed with exactly one effect, if any
    (`task_to_verify`)."""

    uneven_step: str | None


class AttemptRow(Record, frozen=True):
    """The columns of `attempts`, in the table's order."""

    step_id: str
    attempt: int
    fence: int
    runner_id: str
    state: str
    reason: str | None
    granted_at: float
    ended_at: float | None
    token_id: str | None
    usage_json: str | None


class CommittingAttempt(Record, frozen=True):
    """The attempt that committed a step (`committing_attempt`)."""

    attempt: int
    fence: int
    runner_id: str
    token_id: str | None


class LoggingAttempt(Record, frozen=True):
    """An attempt a log line names, with its step's task and pool, the task's last seq and
    the lines it holds (`attempts_of_fences`)."""

    fence: int
    step_id: str
    token_id: str | None
    task_id: str
    pool: str
    last_seq: int
    kept: int


class EventRow(Record, frozen=True):
    """The columns of `events`, in the table's order."""

    seq: int
    task_id: str
    kind: str
    state: str
    data_json: str
    at: float


class RejectionRow(Record, frozen=True):
    """The columns of `rejections`, in the table's order."""

    id: int
    task_id: str | None
    step_id: str | None
    fence: int | None
    code: str
    detail: str
    at: float


class EffectDecisionRow(Record, frozen=True):
    """The columns of `effect_decisions`, in the table's order: an operator's word on an
    effect (`open`, `happened`, `not_happened`)."""

    id: int
    step_id: str
    action: str
    digest: str | None
    by: str
    at: float


class CheckpointHeld(Record, frozen=True):
    """The checkpoint a step holds, as the task view shows it (`checkpoints_of_task`)."""

    step_id: str
    turn: int
    fence: int


class OperatorWord(Record, frozen=True):
    """An effect waiting for an operator: its step's name, its state and request's digest
    (`operator_word_awaited`)."""

    name: str
    state: str
    digest: str


class StepInLine(Record, frozen=True):
    """A task's next queued or leased step (`next_step_in_line`)."""

    kind: str
    state: str


class Spending(Record, frozen=True):
    """A tenant's token budget and the tokens it spent (`tenant_spending`)."""

    token_budget: int | None
    tokens_used: int


class LastSeen(Record, frozen=True):
    """When a pool's runners last claimed: any of them, and those serving a kind
    (`runners_last_seen`)."""

    any_kind: float | None
    this_kind: float | None


class StateCount(Record, frozen=True):
    """How many rows are in a state (`attempts_by_state_of_task`)."""

    state: str
    n: int


class StepName(Record, frozen=True):
    """A step's name (`step_names_of_task`)."""

    id: str
    name: str


class StepOutputOnly(Record, frozen=True):
    """A step's output (`step_outputs_in_state`)."""

    id: str
    output_json: str | None


class StepCount(Record, frozen=True):
    """Steps counted by what `views.shown_state` needs (`step_counts_by_state`); `unrun` is
    0 or 1 on SQLite, a bool on PostgreSQL."""

    task_state: str
    unrun: int
    state: str
    n: int


class PoolQueue(Record, frozen=True):
    """A pool's steps queued and in flight, and when its oldest queued step was queued
    (`pool_queues`)."""

    pool: str
    queued: int
    in_flight: int
    oldest: float | None


class RunnerSeenRow(Record, frozen=True):
    """A runner that claimed recently (`runners_seen_since`)."""

    pool: str
    runner_id: str
    kinds_json: str
    last_seen: float


class RunnerLeases(Record, frozen=True):
    """A runner with its token's name and the leases it holds in its pool
    (`runners_with_leases`)."""

    pool: str
    runner_id: str
    kinds_json: str
    first_seen: float
    last_seen: float
    token_name: str | None
    in_flight: int


class LogLineRow(Record, frozen=True):
    """A runner's log line with its attempt's number and runner (`log_lines_after`)."""

    id: int
    step_id: str
    fence: int
    after_seq: int
    level: str
    event: str
    fields_json: str
    at: float
    attempt: int
    runner_id: str


class OwnerRow(Record, frozen=True):
    """Who uploaded a digest's bytes, and for which tenant (`unreferenced_artifact_owners`)."""

    digest: str
    role: str
    scope: str
    tenant: str
    size: int


class OwnerSince(OwnerRow, frozen=True):
    """`OwnerRow`, with when it was uploaded (`owners_of_artifact`)."""

    created_at: float


class CommittedCandidate(Record, frozen=True):
    """A committed candidate with its bundle, and the effect that names it
    (`committed_candidates_of_url`)."""

    task_id: str
    step_id: str
    fence: int
    candidate_sha: str
    bundle: str


class CommittingToken(Record, frozen=True):
    """The runner token of the attempt that committed a step (`committing_token`)."""

    token_id: str | None
    name: str | None


class TenantSpending(Record, frozen=True):
    """A tenant with its token budget and the tokens it spent (`all_tenant_spending`)."""

    name: str
    token_budget: int | None
    tokens_used: int


class NamedStep(Record, frozen=True):
    """A task's first step of a name (`first_step_named`)."""

    id: str
    kind: str


class TurnHeld(Record, frozen=True):
    """The fence and turn of a step's latest checkpoint (`checkpoint_held`)."""

    fence: int
    turn: int


class RefusalTask(Record, frozen=True):
    """The tenant and pool a refusal's log line names (`refusal_task`)."""

    tenant: str
    pool: str


class RefusalAttempt(Record, frozen=True):
    """The attempt, runner and token a refusal's log line names (`refusal_attempt`)."""

    attempt: int
    runner_id: str
    token_id: str | None


class DeliveryAnswer(Record, frozen=True):
    """Who holds a delivery attempt, and its answer (`unsettled_delivery_attempt`)."""

    holder: str
    answer: str | None


class NamedOutput(Record, frozen=True):
    """A committed step's name and output (`committed_outputs_before`)."""

    name: str
    output_json: str | None
