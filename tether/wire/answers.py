"""Records of the answers no client reads back into a record: the review record, a
repository's head, health. The OpenAPI document (`tether.supervisor.api.openapi`) describes
them as it does every record of `tether.wire.records`.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from tether.wire.records import DeliveryView, GateView, Record, ResolvedView

T = TypeVar("T")


class Expectation(Record, Generic[T], frozen=True, kw_only=True):
    """A review record's entry declared before the run."""

    value: T
    kind: Literal["expectation"] = "expectation"


class Observation(Record, Generic[T], frozen=True, kw_only=True):
    """A review record's entry recorded by the ledger or observed by the supervisor and its
    runners."""

    value: T
    kind: Literal["observation"] = "observation"


class ObservedCheck(Record, frozen=True, kw_only=True):
    """An expected check as a runner ran it at the candidate: its log's digest, exit code."""

    log: str
    exit_code: int


class WorkspaceRemoval(Record, frozen=True, kw_only=True):
    """A runner's record of removing a step's workspace (an `agent` step's `cleanup`). The
    values are as the runner's output holds them: an output is not checked against a shape."""

    step_id: str
    path: Any
    bytes_removed: Any
    files_removed: Any
    gone: Any


class CleanupProof(Record, frozen=True, kw_only=True):
    """What shows nothing of the task is left running: its leases still live, its attempts by
    the state they ended in, and the runners' records of removing their workspaces."""

    live_leases: int
    attempts_by_state: dict[str, int]
    removed: tuple[WorkspaceRemoval, ...]


class EffectReview(Record, frozen=True, kw_only=True):
    """An effect of the task as the review record shows it: the `EffectView` of its `step`
    without its request."""

    step: str
    kind: str
    keyed: bool
    state: str
    digest: str
    key: str
    deliveries: tuple[DeliveryView, ...]
    gate: GateView | None
    resolved: ResolvedView | None


class ReviewerDecision(Record, frozen=True, kw_only=True):
    """The reviewer's decision as recorded, `at` in ISO 8601 (its fields in the order the
    ledger stores them)."""

    at: str | None
    decision: str
    note: str


class Verdict(Record, frozen=True, kw_only=True):
    """Whether the task's outcome may be accepted, and why not."""

    acceptable: bool
    reasons: tuple[str, ...]


class ReviewRecord(Record, frozen=True, kw_only=True):
    """`GET /v1/tasks/{task_id}/review` (docs/design.md, Review record)."""

    task_id: str
    owner: Expectation[str | None]
    repository: Expectation[str | None]
    base_commit: Expectation[str | None]
    repository_head: Observation[str | None]
    candidate_sha: Observation[str | None]
    requirement_revision: Expectation[str | None]
    allowed_paths: Expectation[tuple[str, ...]]
    start_time: Observation[str | None]
    stop_time: Observation[str | None]
    expected_checks: Expectation[tuple[str, ...]]
    observed_checks: Observation[dict[str, ObservedCheck | None]]
    # Who vouches for them: `attested by runner <token>` unless a verifier re-ran them.
    checks: Observation[str | None]
    verify_pool: Expectation[str | None]
    observed_terminal_state: Observation[str | None]
    reviewer_decision: Observation[ReviewerDecision | None]
    cleanup_proof: Observation[CleanupProof]
    effects: Observation[tuple[EffectReview, ...]]
    unresolved_questions: Observation[tuple[str, ...]]
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
