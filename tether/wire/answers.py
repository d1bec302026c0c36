"""Records for the answers the supervisor's routes still build as plain dicts from the ledger's
views: the whole task view, the events page, the review record, a repository head, health.

`tether.wire.records` holds the records a client reads (`TaskView` names only what the CLI
needs); these name every field the supervisor sends, so the OpenAPI document
(`tether.supervisor.api.openapi`) describes all of it. The schemathesis test holds the live
answers to them.
"""

from __future__ import annotations

from typing import Any, Literal

from tether.wire.records import Record, StepView, TaskSummary, TaskView


class Rejection(Record, frozen=True, kw_only=True):
    """A refused write of a task's step: its fence and the error code it got."""

    step_id: str | None
    fence: int | None
    code: str
    detail: str


class StepDetail(StepView, frozen=True, kw_only=True):
    """A step with its fences, hashes and what its result reported, as the task view shows it."""

    payload_hash: str
    effect_key: str | None
    fence: int | None
    candidate_sha: str | None


class TaskListed(TaskSummary, frozen=True, kw_only=True):
    """An entry of `GET /v1/tasks`: the summary with what it was created with."""

    tenant: str
    idempotency_key: str
    plan_hash: str
    base_sha: str | None
    repository: str | None


class TaskDetail(TaskView, frozen=True, kw_only=True):
    """`GET /v1/tasks/{task_id}` and the answer of every operator write on a task."""

    tenant: str
    idempotency_key: str
    plan_hash: str
    base_sha: str | None
    repository: str | None
    steps: tuple[StepDetail, ...] = ()
    rejections: tuple[Rejection, ...] = ()


class TaskListing(Record, frozen=True, kw_only=True):
    """`GET /v1/tasks`: a page of tasks, newest first; `next` is the cursor of the next page."""

    tasks: tuple[TaskListed, ...]
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


class ReviewField(Record, frozen=True, kw_only=True):
    """A review record's entry: declared before the run, or recorded by the ledger."""

    value: Any
    kind: Literal["expectation", "observation"]


class Verdict(Record, frozen=True, kw_only=True):
    """Whether the task's outcome may be accepted, and why not."""

    acceptable: bool
    reasons: tuple[str, ...]


class ReviewRecord(Record, frozen=True, kw_only=True):
    """`GET /v1/tasks/{task_id}/review` (docs/design.md, Review record)."""

    task_id: str
    owner: ReviewField
    repository: ReviewField
    base_commit: ReviewField
    repository_head: ReviewField
    candidate_sha: ReviewField
    requirement_revision: ReviewField
    allowed_paths: ReviewField
    start_time: ReviewField
    stop_time: ReviewField
    expected_checks: ReviewField
    observed_checks: ReviewField
    checks: ReviewField  # who vouches for them: "attested by runner <token>", or a verifier
    verify_pool: ReviewField
    observed_terminal_state: ReviewField
    reviewer_decision: ReviewField
    cleanup_proof: ReviewField
    effects: ReviewField
    unresolved_questions: ReviewField
    verdict: Verdict


class HeadMoved(Record, frozen=True, kw_only=True):
    """The reply to `PUT /v1/repositories/{name}/head`."""

    repository: str
    head_sha: str


class Alive(Record, frozen=True, kw_only=True):
    """`GET /healthz`."""

    status: Literal["ok"]


class Ready(Record, frozen=True, kw_only=True):
    """`GET /readyz`."""

    status: Literal["ready"]
