"""Every message of the v1 API as a typed record: what a runner, an operator and the supervisor
send each other, with the limits each field must keep.

Both sides import these classes, so a message has one shape in one place. A field a client
adds that is not here is ignored, so either side may add one without breaking the other;
except in a task's creation, where an unknown key is the operator's mistake and is refused.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec
from msgspec import UNSET, UnsetType

from tether.wire import RESULTS_PER_REQUEST_MAX, Outcome, ReleaseReason
from tether.wire.payloads import check_payload

MAX_CAPACITY: Final = 256  # leases one claim may ask for
MAX_FENCE: Final = 2**62
# Tokens in one step's report. Bounded so that a tenant's running total always fits SQLite's
# 64-bit integers: an unbounded count would fail the commit itself, and the runner could never
# report that step.
MAX_USAGE: Final = 10**12
# Kinds one claim may announce.
MAX_KINDS: Final = 64
# Free text (a release's detail, a cancel's reason, a review's note) is cut to this length.
MAX_TEXT: Final = 10_000

# A string the ledger keeps as it is (an id, a name, a key, a reason, a detail) may not hold
# NUL, which PostgreSQL's text cannot store: `tether.wire.codec` refuses a body with one in a string
# of a type marked `NO_NUL`. A JSON value the ledger stores as JSON text (an output, a payload:
# `Any` here) may hold one; it is escaped as \u0000 there.
NO_NUL: Final = {"nul": False}

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200, extra=NO_NUL)]
Hash = Annotated[str, msgspec.Meta(min_length=1, max_length=64, extra=NO_NUL)]
Sha = Annotated[str, msgspec.Meta(min_length=1, max_length=128, extra=NO_NUL)]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1, extra=NO_NUL)]
Text = Annotated[str, msgspec.Meta(extra=NO_NUL)]  # free text, and other unbounded strings
Fence = Annotated[int, msgspec.Meta(ge=0, le=MAX_FENCE)]
Tokens = Annotated[int, msgspec.Meta(ge=0, le=MAX_USAGE)]
Seconds = Annotated[float, msgspec.Meta(ge=0)]
Interval = Annotated[float, msgspec.Meta(gt=0)]  # 0 would make a runner's keeper spin
Kinds = Annotated[tuple[Name, ...], msgspec.Meta(min_length=1, max_length=MAX_KINDS)]


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """The base of every message: frozen, keyword-only. (Each record repeats the two flags:
    type checkers read them per class.)"""


# -- the runner's API (docs/design.md, Runner API) -----------------------------------------


class ClaimRequest(Record, frozen=True, kw_only=True):
    """`POST /v1/leases/claim`: up to `capacity` leases of steps whose kind is in `kinds`,
    waiting up to `wait_s` for one.

    `kinds` are the step kinds the runner serves; a claim without it (from a runner older than
    the field) announces only `chat`, the one kind such a runner has built in.
    """

    runner_id: Name
    capacity: Annotated[int, msgspec.Meta(ge=1, le=MAX_CAPACITY)]
    wait_s: Seconds = 0.0  # at most the supervisor's `claim_wait_max_s`, checked there
    kinds: Kinds = ("chat",)


class EarlierOutput(Record, frozen=True, kw_only=True):
    """A committed output of an earlier step of the same task, carried by a lease."""

    step_id: str
    name: str
    output: Any


class CheckSpec(Record, frozen=True, kw_only=True):
    """An expected check of a repository-bound task: its name and the command line the runner
    runs in the worktree at the candidate (docs/design.md, Repositories and candidates)."""

    name: Name
    command: NonEmpty


class LeaseRepository(Record, frozen=True, kw_only=True):
    """What the approval bound, carried by each lease of a repository-bound task's step.

    The worktree starts at `start_sha`: the approved base for the first step that writes, else
    the candidate of the latest earlier committed step that reported one, whose bundle
    (`base_sha..start_sha`, uploaded by a runner of the same pool) is `start_bundle`. The
    runner reads the repository at `url` (read access only) and writes nothing to it. `setup`
    are the repository's setup commands (`repo add --setup`), run in the worktree before the
    first model call.
    """

    name: Name
    url: NonEmpty
    base_sha: Sha
    start_sha: Sha
    start_bundle: Hash | None = None
    allowed_paths: tuple[str, ...] = ()
    checks: tuple[CheckSpec, ...] = ()
    setup: tuple[NonEmpty, ...] = ()


class ResumePoint(Record, frozen=True, kw_only=True):
    """The step's last accepted checkpoint, carried by the lease of a replayed attempt: the
    attempt resumes after turn `turn` instead of starting again (docs/design.md, Checkpoints).

    `transcript` is the digest of the messages so far (the JSON list the model's next request
    holds); `bundle` that of a bundle `start_sha..sha` holding the worktree's changes as commit
    `sha` (both null when the worktree had none). `usage` is what the completed turns spent, in
    all attempts, so the step's token budget goes on from there. `fence` is the attempt that
    wrote it.
    """

    turn: Annotated[int, msgspec.Meta(ge=1)]
    fence: Fence
    transcript: Hash
    bundle: Hash | None = None
    sha: Sha | None = None
    usage: dict[str, Tokens] = {}


class Lease(Record, frozen=True, kw_only=True):
    """A lease as it crosses the wire: the supervisor grants it, the runner holds it.

    `ttl_s` and `renew_every_s` are durations, never deadlines: the runner measures them on its
    own monotonic clock. `repository` is set for a step of a repository-bound task, `resume`
    for a replayed attempt of a step that has an accepted checkpoint. `traceparent` is the W3C
    trace context of the task's trace, set by the supervisor when tracing is on, so the
    runner's spans join the supervisor's.
    """

    step_id: str
    task_id: str
    name: str
    kind: str
    attempt: int
    fence: int
    payload: Any
    payload_hash: str
    ttl_s: float
    renew_every_s: Interval
    outputs: tuple[EarlierOutput, ...] = ()
    repository: LeaseRepository | None = None
    resume: ResumePoint | None = None
    traceparent: str | None = None

    def __post_init__(self) -> None:
        if self.renew_every_s > self.ttl_s:
            raise ValueError("a lease needs renew_every_s <= ttl_s")


class ClaimAnswer(Record, frozen=True, kw_only=True):
    """The reply to a claim that got leases (one that got none is a bare 204)."""

    leases: tuple[Lease, ...]


class RenewRequest(Record, frozen=True, kw_only=True):
    """`POST /v1/leases/{step_id}/renew`."""

    fence: Fence


class LeaseRef(Record, frozen=True, kw_only=True):
    """One lease a runner holds: its step and the fence it was granted under."""

    step_id: Name
    fence: Fence


class Renewals(Record, frozen=True, kw_only=True):
    """`POST /v1/leases/renewals`: renew many leases of one runner in one request, each by the
    same rule as `POST /v1/leases/{step_id}/renew`."""

    leases: Annotated[tuple[LeaseRef, ...], msgspec.Meta(min_length=1, max_length=MAX_CAPACITY)]


class Renewal(Record, frozen=True, kw_only=True):
    """The reply to a renew: the lease runs `ttl_s` more, unless the task was cancelled.

    `budget_exhausted`: the task's tenant has spent its token budget; the runner should stop
    spending and release the step uncounted (`operator`, retryable), so the task waits until
    the budget is raised (docs/design.md, Budgets). False from a supervisor older than it.
    """

    ttl_s: Seconds
    renew_every_s: Interval
    cancelled: bool
    budget_exhausted: bool = False


class RenewalItem(Record, frozen=True, kw_only=True, omit_defaults=True):
    """One lease's answer in `POST /v1/leases/renewals`: the `Renewal` fields, or the
    `status`, `error` and `detail` the single renew would have sent."""

    step_id: str
    ttl_s: Seconds | None = None
    renew_every_s: Interval | None = None
    cancelled: bool | None = None
    budget_exhausted: bool | None = None
    status: int | None = None
    error: str | None = None
    detail: str | None = None


class RenewalsAnswer(Record, frozen=True, kw_only=True):
    """The reply to `POST /v1/leases/renewals`: one item per lease, in order."""

    leases: tuple[RenewalItem, ...]


class ReleaseRequest(Record, frozen=True, kw_only=True):
    """`POST /v1/leases/{step_id}/release`: the runner hands the lease back."""

    fence: Fence
    reason: ReleaseReason
    retryable: bool
    detail: Text = ""
    # The tokens the attempt spent before it let go, counted once per attempt like a result's.
    usage: dict[str, Tokens] = {}


class Released(Record, frozen=True, kw_only=True):
    """The reply to a release."""

    released: bool = True


class CheckRun(Record, frozen=True, kw_only=True):
    """One expected check as the runner ran it at the candidate: the digest of its full log
    (uploaded to the artifact store first), its exit code and how long it took."""

    log: Hash
    exit_code: int
    duration_s: Seconds


class WantLeases(Record, frozen=True, kw_only=True):
    """With a result: the next leases the runner can start (eager dispatch, docs/design.md,
    Runner API), granted in the result's own group-commit batch like a claim's (`kinds`, the
    pool, the tenant's budget), and none when no result of the request was accepted.

    `leases` is the runner's free capacity counting the slots its results free. An older
    supervisor ignores the field and answers no leases, so the runner's claim finds them.
    """

    runner_id: Name
    leases: Annotated[int, msgspec.Meta(ge=0, le=MAX_CAPACITY)]
    kinds: Kinds = ("chat",)


class Result(Record, frozen=True, kw_only=True, omit_defaults=True):
    """`POST /v1/steps/{step_id}/result`: one step's output, under the fence that made it.

    A step that produced a candidate names it (`candidate_sha`) with the digest of its bundle
    (`bundle`: `start_sha..candidate_sha`, uploaded first) and the checks it ran there
    (`checks`, by name). `artifacts` names any other uploads. `want` asks for the next leases
    with the answer (`WantLeases`); an item of `POST /v1/steps/results` asks at the top level,
    and an item's own `want` is ignored.
    """

    fence: Fence
    payload_hash: Hash
    output: Any
    usage: dict[str, Tokens] = {}
    candidate_sha: Sha | None = None
    artifacts: dict[Text, Text] = {}
    bundle: Hash | None = None
    checks: dict[Name, CheckRun] = {}
    want: WantLeases | None = None

    def for_step(self, step_id: str) -> Report:
        """This result naming its step, as the batch route and the ledger take it."""
        return Report(
            step_id=step_id,
            fence=self.fence,
            payload_hash=self.payload_hash,
            output=self.output,
            usage=self.usage,
            candidate_sha=self.candidate_sha,
            artifacts=self.artifacts,
            bundle=self.bundle,
            checks=self.checks,
        )


class Report(Result, frozen=True, kw_only=True, omit_defaults=True):
    """A result that names its step: an item of `POST /v1/steps/results`, and what the
    ledger commits."""

    step_id: Name


class Results(Record, frozen=True, kw_only=True, omit_defaults=True):
    """`POST /v1/steps/results`: the results ready at the same moment, each its own step's;
    `want` asks for the next leases with the answer (`WantLeases`)."""

    results: Annotated[
        tuple[Report, ...], msgspec.Meta(min_length=1, max_length=RESULTS_PER_REQUEST_MAX)
    ]
    want: WantLeases | None = None


class ResultAnswer(Record, frozen=True, kw_only=True, omit_defaults=True):
    """The reply to a result: `applied`, or `replayed` for a step already committed; `leases`
    are those its `want` was granted (absent when none)."""

    outcome: Outcome
    leases: tuple[Lease, ...] = ()


class ItemAnswer(Record, frozen=True, kw_only=True, omit_defaults=True):
    """One result's reply in a batch: `outcome`, or the `status`, `error` and `detail` the
    single route would have sent."""

    step_id: str
    outcome: Outcome | None = None
    status: int | None = None
    error: str | None = None
    detail: str | None = None


class ResultsAnswer(Record, frozen=True, kw_only=True, omit_defaults=True):
    """The reply to `POST /v1/steps/results`: one item per result, in order, and the leases
    the request's `want` was granted (absent when none)."""

    results: tuple[ItemAnswer, ...]
    leases: tuple[Lease, ...] = ()


class Checkpoint(Record, frozen=True, kw_only=True):
    """`PUT /v1/steps/{step_id}/checkpoint`: an `agent` step's state after `turn` completed
    turns, under the attempt's fence; refused like any stale write when the fence is not
    current. The transcript and the bundle are uploaded to the artifact store first.

    `usage` is this attempt's own spend so far (counted toward the tenant's budget, like a
    release's, so a killed attempt's turns are not lost from it); `step_usage` is what all the
    completed turns of the step spent, in every attempt (the next `ResumePoint.usage`).
    """

    fence: Fence
    turn: Annotated[int, msgspec.Meta(ge=1)]
    transcript: Hash
    bundle: Hash | None = None
    sha: Sha | None = None
    usage: dict[str, Tokens] = {}
    step_usage: dict[str, Tokens] = {}


class Checkpointed(Record, frozen=True, kw_only=True):
    """The reply to a checkpoint: the turn the step will resume after."""

    turn: int


# One log-lines request carries at most this many lines; a line at most this many fields, and
# an event of at most this many characters.
LOG_LINES_PER_REQUEST_MAX: Final = 200
LOG_FIELDS_MAX: Final = 64
LOG_EVENT_MAX: Final = 1_000


class LogLine(Record, frozen=True, kw_only=True):
    """One line a runner wrote about an attempt, as it ships it (`POST /v1/logs`): the step and
    the attempt's fence, the line's level and event, and its other fields, after the runner
    masked its secrets. The task, the attempt's number and the runner's id are not sent: the
    supervisor reads them from the attempt the fence names."""

    step_id: Name
    fence: Fence
    level: Annotated[str, msgspec.Meta(min_length=1, max_length=16, extra=NO_NUL)]
    event: Annotated[str, msgspec.Meta(min_length=1, max_length=LOG_EVENT_MAX, extra=NO_NUL)]
    fields: Annotated[dict[str, Any], msgspec.Meta(max_length=LOG_FIELDS_MAX)] = {}


class LogLines(Record, frozen=True, kw_only=True):
    """`POST /v1/logs`: lines about attempts of the caller's token, oldest first."""

    lines: Annotated[
        tuple[LogLine, ...], msgspec.Meta(min_length=1, max_length=LOG_LINES_PER_REQUEST_MAX)
    ]


class LogLinesKept(Record, frozen=True, kw_only=True):
    """The reply to `POST /v1/logs`: lines kept; lines refused because their fence was not
    granted to the caller's token (or names another step); lines over the attempt's limit."""

    kept: int
    refused: int
    over_limit: int


class RunnerIdentity(Record, frozen=True, kw_only=True):
    """The reply to `GET /v1/runner`: the pool the caller's runner token serves, and the
    token's id. A runner asks once at start: a reply of this shape is how it knows that its
    `supervisor_url` is a supervisor's."""

    pool: str
    token_id: str


class ErrorBody(Record, frozen=True, kw_only=True):
    """Every error on the wire: a stable code (a `tether.wire.ErrorCode`) and a sentence."""

    error: str
    detail: str = ""


# -- the operator's API (docs/design.md, Operator API) -------------------------------------


class PlanStep(Record, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One step of a plan; these three fields are the step's part of the plan and its hash.

    The payload of a built-in kind must be that kind's record (`tether.wire.payloads`); it is kept
    as sent, so the plan's hash is over what the operator wrote.
    """

    name: Name
    kind: Name
    payload: Any

    def __post_init__(self) -> None:
        try:
            check_payload(self.kind, self.payload)
        except ValueError as exc:
            raise ValueError(f"{exc} (step {self.name!r}, kind {self.kind!r})") from None


class Plan(Record, frozen=True, kw_only=True, forbid_unknown_fields=True):
    steps: Annotated[tuple[PlanStep, ...], msgspec.Meta(min_length=1)]


class VerifySpec(Record, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The verifier a task names (docs/design.md, Verification): the runners of `pool`, none
    of whose tokens made the candidate, re-run the task's checks before it may succeed."""

    pool: Name


class TaskCreate(Record, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/tasks`. The fields after `plan` are declarations for the review record; a key
    not here is refused."""

    idempotency_key: Name
    plan: Plan
    repository: Name | None = None
    base_sha: Name | None = None
    requirement_revision: Name | None = None
    allowed_paths: tuple[NonEmpty, ...] = ()
    expected_checks: tuple[NonEmpty, ...] = ()
    # Named command lines the runner runs at the candidate; their names are the expected
    # checks (an `expected_checks` given beside them must name the same ones).
    checks: dict[Name, NonEmpty] = {}
    owner: Name | None = None
    pool: Name | None = None  # the tenant's `default` pool when absent
    # Bound into the plan hash; when absent, the tenant's default verifier pool, if it set one.
    verify: VerifySpec | None = None


class Approval(Record, frozen=True, kw_only=True):
    """`POST /v1/tasks/{task_id}/approve`: the plan approved, by its hash."""

    plan_hash: Hash
    base_sha: Name | None = None


class Cancel(Record, frozen=True, kw_only=True):
    """`POST /v1/tasks/{task_id}/cancel`."""

    reason: Text = ""


class GateOpen(Record, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/tasks/{task_id}/steps/{step_name}/gate`: open an unkeyed effect's gate for
    exactly the request whose digest this is (docs/design.md, Effects)."""

    digest: Hash


class EffectHappened(Record, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/tasks/{task_id}/steps/{step_name}/happened`: an operator's word on an
    uncertain effect."""

    happened: bool


class ReviewDecision(Record, frozen=True, kw_only=True):
    """`POST /v1/tasks/{task_id}/review`: `accept` or `reject`, with a note."""

    decision: Name
    note: Text = ""


class RepositoryHead(Record, frozen=True, kw_only=True):
    """`PUT /v1/repositories/{name}/head`: the commit the repository's head is now at."""

    sha: Sha


# -- what the operator reads (docs/design.md, Operator API) --------------------------------
# The supervisor's replies to the operator's reads: the ledger's views build these records,
# the routes write them, the status page shows them and the CLI reads them back. A field the
# supervisor adds later is ignored, so an older CLI keeps working; a field with a default is
# one a supervisor older than the field did not send.


class WaitingFor(Record, frozen=True, kw_only=True):
    """Why a task's next step is not running. `reason` says which fields it carries:
    `approval` none; `gate` (the effect `step` waits for an operator to open its gate for
    `digest`) and `uncertain` (the effect `step` may have been sent; an operator says whether
    it happened) `step` and `digest`; `budget` the `tenant` that has spent `spent` >= `budget`;
    `runner` the `pool` and `kind` a runner must serve, with `last_seen_s` since such a runner
    last claimed and `pool_last_seen_s` since any runner of the pool did (null: never).

    A field its reason does not carry is left out of the JSON (unset), never null."""

    reason: str
    step: str | UnsetType = UNSET
    digest: str | UnsetType = UNSET
    pool: str | UnsetType = UNSET
    kind: str | UnsetType = UNSET
    last_seen_s: float | UnsetType | None = UNSET
    pool_last_seen_s: float | UnsetType | None = UNSET
    tenant: str | UnsetType = UNSET
    spent: int | UnsetType = UNSET
    budget: int | UnsetType = UNSET


class Budget(Record, frozen=True, kw_only=True):
    """`GET /v1/budget`, and a task view's `budget`: the tokens the tenant's attempts spent
    (committed or not), its budget and what is left; `budget` and `left` are null when it has
    none. `left` is never below 0: a step in flight may finish past the budget."""

    tenant: str
    spent: int
    budget: int | None = None
    left: int | None = None


class AttemptView(Record, frozen=True, kw_only=True):
    """One lease of a step; times are ISO 8601 in UTC."""

    attempt: int
    fence: int
    runner_id: str
    token_id: str | None = None
    state: str
    reason: str | None = None
    granted_at: str | None = None
    ended_at: str | None = None
    usage: dict[str, int] | None = None


class CheckRunView(Record, frozen=True, kw_only=True):
    """A check a committed step ran at its candidate: its log's digest, exit code, duration."""

    name: str
    log: str
    exit_code: int
    duration_s: float


class ProblemView(Record, frozen=True, kw_only=True):
    """A named reason verification holds against a result (docs/design.md, Verification)."""

    code: str
    detail: str


class CheckpointView(Record, frozen=True, kw_only=True):
    """A step's last accepted checkpoint: the turns done, under the attempt `fence`."""

    turn: int
    fence: int


class DeliveryView(Record, frozen=True, kw_only=True):
    """One delivery attempt of an effect: `answer` is `delivered`, `refused`, `unanswered`, or
    null while in flight or never answered; `sent` whether it may have reached the receiver."""

    attempt: int
    started_at: str | None = None
    ended_at: str | None = None
    answer: str | None = None
    sent: bool | None = None
    status: int | None = None
    detail: str | None = None
    error: str | None = None
    opening: int = 0


class GateView(Record, frozen=True, kw_only=True):
    """The last opening of an unkeyed effect's gate: by which operator token, when, for which
    request digest."""

    opened_by: str
    opened_at: str | None = None
    digest: str | None = None


class ResolvedView(Record, frozen=True, kw_only=True):
    """An operator's word on an uncertain effect."""

    by: str
    at: str | None = None
    happened: bool


class EffectView(Record, frozen=True, kw_only=True):
    """An effect step's delivery (docs/design.md, Effects). `state` is the outbox's: `due`,
    `gated`, `open`, `sending`, `uncertain`, `delivered`, `failed` or `withdrawn`. `request`
    is as rendered when the step became due: credentials appear only as their
    `{{ credential.<name> }}` placeholders, never their values."""

    kind: str
    keyed: bool
    state: str
    request: Any = None
    digest: str
    key: str
    deadline_at: str | None = None
    openings: int = 0
    deliveries: tuple[DeliveryView, ...] = ()
    gate: GateView | None = None
    resolved: ResolvedView | None = None


class StepDetail(Record, frozen=True, kw_only=True):
    """A step as `GET /v1/tasks/{task_id}` shows it, with its payload's hash, its effect key,
    the fence of its last lease and what its result reported. `state` is `skipped` for a
    failed or cancelled task's steps that never ran. A step of a repository-bound task also
    shows its candidate, the digest of its bundle, its check runs, the problems the
    supervisor's evidence found against its result, and its last checkpoint."""

    id: str
    name: str
    kind: str
    state: str
    payload_hash: str
    effect_key: str | None
    fence: int | None
    output: Any = None
    candidate_sha: str | None
    bundle: str | None = None
    checks: tuple[CheckRunView, ...] = ()
    problems: tuple[ProblemView, ...] = ()
    checkpoint: CheckpointView | None = None
    attempts: tuple[AttemptView, ...] = ()
    effect: EffectView | None = None


class Rejection(Record, frozen=True, kw_only=True):
    """A refused write of a task's step: its fence and the error code it got."""

    step_id: str | None
    fence: int | None
    code: str
    detail: str


class FileChangeView(Record, frozen=True, kw_only=True):
    """A file a candidate changes: lines added and removed (null for a binary file)."""

    path: str
    added: int | None = None
    removed: int | None = None


class CandidateDiffView(Record, frozen=True, kw_only=True):
    """`GET /v1/tasks/{task_id}/candidate`: a step's candidate against the task's approved
    base, read from the supervisor's mirror: each file's counts, and the patch (cut at 512 KiB,
    `truncated` then). `branch` is the one head of `GET .../candidate/bundle`."""

    task_id: str
    step: str
    base_sha: str
    candidate_sha: str
    branch: str
    files: tuple[FileChangeView, ...] = ()
    patch: str = ""
    truncated: bool = False


class PlanStepView(Record, frozen=True, kw_only=True):
    """One step of a task's plan as it was submitted: its payload beside the hash the plan
    hash is made of, so an approver reads what the hash binds."""

    name: str
    kind: str
    payload_hash: str
    payload: Any = None


class PlanView(Record, frozen=True, kw_only=True):
    """A task's plan as submitted (`hash` is its plan hash), with the task's declarations the
    runner acts on: the paths a candidate may change and the checks it runs."""

    hash: str
    steps: tuple[PlanStepView, ...]
    allowed_paths: tuple[str, ...] = ()
    checks: tuple[CheckSpec, ...] = ()


class TaskHeader(Record, frozen=True, kw_only=True):
    """The fields every read of a task starts with: who submitted it and with what key, where
    it stands, its plan's hash, the base it binds and the last sequence number of its events.
    `created_at` is ISO 8601 in UTC, as every time on the wire."""

    id: str
    tenant: str
    idempotency_key: str
    state: str
    reason: str | None = None
    plan_hash: str
    base_sha: str | None
    repository: str | None
    pool: str
    seq: int
    created_at: str


class TaskSummary(TaskHeader, frozen=True, kw_only=True):
    """A task as `GET /v1/tasks` lists it: its steps committed and in all, and what it waits
    for."""

    steps_committed: int | None = None
    steps_total: int | None = None
    waiting_for: WaitingFor | None = None


class TaskDetail(TaskHeader, frozen=True, kw_only=True):
    """`GET /v1/tasks/{task_id}`, and the answer of every operator write on a task: the task
    with its plan as submitted, what it waits for, its tenant's token budget, its steps, what
    verification holds against it (`findings`, empty unless it failed on evidence) and its
    refused writes. `plan` is null from a supervisor older than it."""

    plan: PlanView | None = None
    waiting_for: WaitingFor | None = None
    budget: Budget | None = None
    steps: tuple[StepDetail, ...] = ()
    findings: tuple[ProblemView, ...] = ()
    # The pool whose runners re-run the checks (docs/design.md, Verification), and who vouches
    # for the checks at the candidate: `attested by runner <token>` (the runner that made it,
    # alone), `verified by runner <token> of pool <pool>`, or `disputed: ...`.
    verify_pool: str | None = None
    checks_standing: str | None = None
    rejections: tuple[Rejection, ...] = ()


class TaskPage(Record, frozen=True, kw_only=True):
    """`GET /v1/tasks`: a page of tasks, newest first; `next` is the cursor of the next page."""

    tasks: tuple[TaskSummary, ...]
    next: str | None


class Event(Record, frozen=True, kw_only=True):
    """One entry of a task's journal; `at` is the supervisor's clock, ISO 8601 in UTC."""

    seq: int
    task_id: str
    kind: str
    state: str
    data: Any
    at: str


class Events(Record, frozen=True, kw_only=True):
    """`GET /v1/tasks/{task_id}/events`: at most 500 events after `after`, in order."""

    events: tuple[Event, ...]


class RunnerSeen(Record, frozen=True, kw_only=True):
    """A runner that claimed in a pool recently: the kinds it serves, seconds since, and
    whether it is online (it holds a lease or claimed within the last 45 s; null from a
    supervisor older than the field)."""

    runner_id: str
    kinds: tuple[str, ...]
    last_seen_s: float
    online: bool | None = None


class PoolStatus(Record, frozen=True, kw_only=True):
    """One pool's queue: steps queued and in flight, the oldest queued step's wait in seconds
    (null when none is queued), and its recent runners."""

    pool: str
    queued: int
    in_flight: int
    oldest_queued_s: float | None = None
    runners: tuple[RunnerSeen, ...] = ()


class PoolsAnswer(Record, frozen=True, kw_only=True):
    """`GET /v1/pools`: the pools the caller's tenant may use."""

    pools: tuple[PoolStatus, ...]


class TaskLogEntry(Record, frozen=True, kw_only=True):
    """One entry of a task's log on the owned box: an event of its journal (`source`
    "journal": `event` is the event's kind, `fields` its data) or a line a runner shipped about
    one of its attempts (`source` "runner"). `seq` is the event's sequence number, or for a
    runner line the task's last one when the line arrived, and `line` the line's number
    (receipt order): entries are in the owned box's order, never the runner's clock. `at` is
    the supervisor's clock, ISO 8601 UTC."""

    source: str
    seq: int
    line: int | None = None
    at: str
    level: str
    event: str
    state: str | None = None
    step_id: str | None = None
    attempt: int | None = None
    fence: int | None = None
    runner_id: str | None = None
    fields: dict[str, Any] = {}


class TaskLogs(Record, frozen=True, kw_only=True):
    """`GET /v1/tasks/{task_id}/logs`: the task's journal and runner lines after the cursor
    (`after_seq`, `after_line`), merged in order; ask again with `next_seq` and `next_line`."""

    entries: tuple[TaskLogEntry, ...]
    next_seq: int
    next_line: int


# -- the artifact store (docs/design.md, Artifacts) -----------------------------------------


class ArtifactStored(Record, frozen=True, kw_only=True):
    """`PUT /v1/artifacts/{sha256}`: the bytes are kept under `digest`; `created` is false when
    the store already held them (the upload only made them readable by its sender too)."""

    digest: Hash
    size: Annotated[int, msgspec.Meta(ge=0)]
    created: bool
