"""The v1 API's operations, each declared once beside its handler: method, path, who may
call it, the record it reads, what it answers per status, and the error codes it can send.

The app's routes (`tether.supervisor.api.app`) and the OpenAPI document
(`tether.supervisor.api.openapi`, from these declarations and the records' JSON Schemas) are
both made from `OPERATIONS`; each route checks the caller against `roles` and decodes `body`
before its handler runs (`tether.supervisor.api.operation`). The type checker holds each
handler to the body and the record its operation declares, as do
tests/supervisor/api/test_openapi_answers.py and test_operation_calls.py where it cannot see;
tests/supervisor/api/test_openapi_live.py runs schemathesis against a live supervisor to hold
its answers to the document.
"""

from __future__ import annotations

from typing import Final

from tether.supervisor.api import (
    artifact_routes,
    candidate_routes,
    health,
    openapi,
    operator_routes,
    runner_routes,
)
from tether.supervisor.api.operation import (
    BYTES,
    OPENAPI_JSON,
    PROMETHEUS_TEXT,
    Operation,
    Param,
    RawOperation,
)
from tether.supervisor.ledger import Role, TaskState
from tether.supervisor.ledger.views import PAGE_MAX
from tether.wire import ErrorCode
from tether.wire import answers as a
from tether.wire import records as m

E = ErrorCode

OPERATOR: Final = (Role.OPERATOR,)
RUNNER: Final = (Role.RUNNER,)
PUBLIC: Final[tuple[Role, ...]] = ()


def _id(name: str, what: str) -> Param:
    return Param(name=name, description=what, schema={"type": "string", "minLength": 1})


TASK_ID: Final = _id("task_id", "The task's id, or a unique prefix of it (at least 8 characters).")
STEP_ID: Final = _id("step_id", "The step's id (a lease's `step_id`).")
DIGEST: Final = Param(
    name="digest",
    description="The sha256 of the artifact's bytes, 64 lowercase hex digits.",
    schema={"type": "string", "pattern": "^[0-9a-f]{64}$"},
)
STEP_NAME: Final = _id("step_name", "The name of one of the task's steps, as its plan gives it.")
REPOSITORY: Final = Param(
    name="name",
    description="The repository's name, as the tenant's tasks name it.",
    schema={"type": "string", "minLength": 1},
)

CANDIDATE_STEP: Final = Param(
    name="step",
    description="The step's name, id or 0-based position (default: the last with a candidate).",
    schema={"type": "string", "minLength": 1},
)

_TASK_WRITE: Final = (E.NOT_FOUND, E.INVALID_TRANSITION, E.TERMINAL)
_LEASE_WRITE: Final = (E.NOT_FOUND, E.STALE_FENCE)

# Not annotated: as `tuple[Operation[Any], ...]` the type checker would read every answer as
# Any, and no longer hold each handler to the record its operation answers.
OPERATIONS: Final = (
    # -- operator (docs/design.md, Operator API)
    Operation(
        method="POST",
        path="/v1/tasks",
        name="create_task",
        tag="operator",
        roles=OPERATOR,
        summary="Create a task from its plan (201), or find the one this key created (200).",
        body=m.TaskCreate,
        answer=m.TaskDetail,
        handler=operator_routes.create_task,
        statuses=(201, 200),
        errors=(E.IDEMPOTENCY_CONFLICT, E.FORBIDDEN),
    ),
    Operation(
        method="GET",
        path="/v1/tasks",
        name="list_tasks",
        tag="operator",
        roles=OPERATOR,
        summary="The tenant's tasks, newest first, a page at a time.",
        answer=m.TaskPage,
        handler=operator_routes.list_tasks,
        errors=(E.INVALID_FIELD,),
        query=(
            Param(
                name="state",
                description="Only tasks in this state.",
                schema={"type": "string", "enum": [s.value for s in TaskState]},
            ),
            Param(
                name="cursor",
                description="The `next` of the previous page.",
                schema={"type": "string", "pattern": "^[0-9]{1,18}$"},
            ),
            Param(
                name="limit",
                description="Tasks per page.",
                schema={"type": "integer", "minimum": 1, "maximum": PAGE_MAX, "default": 50},
            ),
        ),
    ),
    Operation(
        method="GET",
        path="/v1/tasks/{task_id}",
        name="get_task",
        tag="operator",
        roles=OPERATOR,
        summary="A task with its steps, attempts, rejections and budget.",
        answer=m.TaskDetail,
        handler=operator_routes.get_task,
        errors=(E.NOT_FOUND, E.INVALID_FIELD),
        params=(TASK_ID,),
    ),
    Operation(
        method="POST",
        path="/v1/tasks/{task_id}/approve",
        name="approve",
        tag="operator",
        roles=OPERATOR,
        summary="Approve the plan by its hash (and the base commit it binds).",
        body=m.Approval,
        answer=m.TaskDetail,
        handler=operator_routes.approve,
        errors=(*_TASK_WRITE, E.PLAN_MISMATCH, E.STALE_BASE),
        params=(TASK_ID,),
    ),
    Operation(
        method="POST",
        path="/v1/tasks/{task_id}/cancel",
        name="cancel",
        tag="operator",
        roles=OPERATOR,
        summary="Cancel a task that has not ended.",
        body=m.Cancel,
        answer=m.TaskDetail,
        handler=operator_routes.cancel,
        errors=_TASK_WRITE,
        params=(TASK_ID,),
    ),
    Operation(
        method="GET",
        path="/v1/tasks/{task_id}/events",
        name="events",
        tag="operator",
        roles=OPERATOR,
        summary="The task's events after `after`, waiting up to `wait` s for one.",
        answer=m.Events,
        handler=operator_routes.events,
        errors=(E.NOT_FOUND, E.INVALID_FIELD),
        params=(TASK_ID,),
        query=(
            Param(
                name="after",
                description="The last `seq` already seen.",
                schema={"type": "integer", "minimum": 0, "maximum": 2**62, "default": 0},
            ),
            Param(
                name="wait",
                description="Seconds to wait for the first event.",
                schema={"type": "number", "minimum": 0, "default": 0},
                bound_by="events_wait_max_s",
            ),
        ),
    ),
    Operation(
        method="GET",
        path="/v1/tasks/{task_id}/logs",
        name="task_log",
        tag="operator",
        roles=OPERATOR,
        summary="The task's journal and its runners' log lines after the cursor, merged.",
        answer=m.TaskLogs,
        handler=operator_routes.task_log,
        errors=(E.NOT_FOUND, E.INVALID_FIELD),
        params=(TASK_ID,),
        query=(
            Param(
                name="after_seq",
                description="The `next_seq` of the previous answer.",
                schema={"type": "integer", "minimum": 0, "maximum": 2**62, "default": 0},
            ),
            Param(
                name="after_line",
                description="The `next_line` of the previous answer.",
                schema={"type": "integer", "minimum": 0, "maximum": 2**62, "default": 0},
            ),
        ),
    ),
    Operation(
        method="GET",
        path="/v1/tasks/{task_id}/review",
        name="review",
        tag="operator",
        roles=OPERATOR,
        summary="The task's review record: expectations and observations.",
        answer=a.ReviewRecord,
        handler=operator_routes.review,
        errors=(E.NOT_FOUND, E.INVALID_FIELD),
        params=(TASK_ID,),
    ),
    Operation(
        method="POST",
        path="/v1/tasks/{task_id}/review",
        name="record_review",
        tag="operator",
        roles=OPERATOR,
        summary="Record the reviewer's decision on an ended task.",
        body=m.ReviewDecision,
        answer=a.ReviewRecord,
        handler=operator_routes.record_review,
        errors=(E.NOT_FOUND, E.INVALID_TRANSITION),
        params=(TASK_ID,),
    ),
    Operation(
        method="POST",
        path="/v1/tasks/{task_id}/steps/{step_name}/gate",
        name="open_gate",
        tag="operator",
        roles=OPERATOR,
        summary="Open an unkeyed effect's gate for exactly the request with this digest.",
        body=m.GateOpen,
        answer=m.TaskDetail,
        handler=operator_routes.open_gate,
        errors=(*_TASK_WRITE, E.GATE_MISMATCH),
        params=(TASK_ID, STEP_NAME),
    ),
    Operation(
        method="POST",
        path="/v1/tasks/{task_id}/steps/{step_name}/happened",
        name="effect_happened",
        tag="operator",
        roles=OPERATOR,
        summary="Say whether an uncertain effect happened (`no` re-opens its gate, once).",
        body=m.EffectHappened,
        answer=m.TaskDetail,
        handler=operator_routes.effect_happened,
        errors=_TASK_WRITE,
        params=(TASK_ID, STEP_NAME),
    ),
    Operation(
        method="GET",
        path="/v1/tasks/{task_id}/candidate",
        name="candidate_diff",
        tag="operator",
        roles=OPERATOR,
        summary="A step's candidate against the approved base: files, counts, the patch.",
        answer=m.CandidateDiffView,
        handler=candidate_routes.candidate_diff,
        errors=(E.NOT_FOUND, E.INVALID_FIELD),
        params=(TASK_ID,),
        query=(CANDIDATE_STEP,),
    ),
    RawOperation(
        method="GET",
        path="/v1/tasks/{task_id}/candidate/bundle",
        name="candidate_bundle",
        tag="operator",
        roles=OPERATOR,
        summary="A git bundle of the candidate whose one head is `tether/<task_id>`.",
        answer=BYTES,
        handler=candidate_routes.candidate_bundle,
        errors=(E.NOT_FOUND, E.INVALID_FIELD),
        params=(TASK_ID,),
        query=(CANDIDATE_STEP,),
    ),
    Operation(
        method="PUT",
        path="/v1/repositories/{name}/head",
        name="repository_head",
        tag="operator",
        roles=OPERATOR,
        summary="Report the commit a repository's head is now at (a forge webhook's news).",
        body=m.RepositoryHead,
        answer=a.HeadMoved,
        handler=operator_routes.repository_head,
        params=(REPOSITORY,),
    ),
    Operation(
        method="GET",
        path="/v1/pools",
        name="pools",
        tag="operator",
        roles=OPERATOR,
        summary="The queues and recent runners of the pools the tenant may use.",
        answer=m.PoolsAnswer,
        handler=operator_routes.pools,
    ),
    Operation(
        method="GET",
        path="/v1/budget",
        name="budget",
        tag="operator",
        roles=OPERATOR,
        summary="The tenant's tokens spent, budget and what is left.",
        answer=m.Budget,
        handler=operator_routes.budget,
        errors=(E.NOT_FOUND,),
    ),
    # -- runner (docs/design.md, Runner API)
    Operation(
        method="GET",
        path="/v1/runner",
        name="whoami",
        tag="runner",
        roles=RUNNER,
        summary="The pool and token id behind the caller's runner token.",
        answer=m.RunnerIdentity,
        handler=runner_routes.whoami,
    ),
    Operation(
        method="POST",
        path="/v1/leases/claim",
        name="claim",
        tag="runner",
        roles=RUNNER,
        summary="Leases on queued steps of the runner's pool, waiting up to `wait_s` for one.",
        body=m.ClaimRequest,
        answer=m.ClaimAnswer,
        handler=runner_routes.claim,
        empty=204,
        bound_by={"wait_s": "claim_wait_max_s"},
    ),
    Operation(
        method="POST",
        path="/v1/leases/{step_id}/renew",
        name="renew",
        tag="runner",
        roles=RUNNER,
        summary="Extend a lease under its fence.",
        body=m.RenewRequest,
        answer=m.Renewal,
        handler=runner_routes.renew,
        errors=_LEASE_WRITE,
        params=(STEP_ID,),
    ),
    Operation(
        method="POST",
        path="/v1/leases/renewals",
        name="renewals",
        tag="runner",
        roles=RUNNER,
        summary="Extend many leases at once; each lease gets its own answer.",
        body=m.Renewals,
        answer=m.RenewalsAnswer,
        handler=runner_routes.renewals,
    ),
    Operation(
        method="POST",
        path="/v1/leases/{step_id}/release",
        name="release",
        tag="runner",
        roles=RUNNER,
        summary="Hand a lease back, with the tokens the attempt spent.",
        body=m.ReleaseRequest,
        answer=m.Released,
        handler=runner_routes.release,
        errors=_LEASE_WRITE,
        params=(STEP_ID,),
    ),
    Operation(
        method="POST",
        path="/v1/steps/{step_id}/result",
        name="result",
        tag="runner",
        roles=RUNNER,
        summary="Report a step's output under the fence that made it.",
        body=m.Result,
        answer=m.ResultAnswer,
        handler=runner_routes.result,
        errors=(*_LEASE_WRITE, E.PAYLOAD_DRIFT, E.TERMINAL),
        params=(STEP_ID,),
    ),
    Operation(
        method="POST",
        path="/v1/steps/results",
        name="results",
        tag="runner",
        roles=RUNNER,
        summary="Report many steps' results at once; each item gets its own answer.",
        body=m.Results,
        answer=m.ResultsAnswer,
        handler=runner_routes.results,
    ),
    Operation(
        method="PUT",
        path="/v1/steps/{step_id}/checkpoint",
        name="checkpoint",
        tag="runner",
        roles=RUNNER,
        summary="Record an agent step's state after its completed turns.",
        body=m.Checkpoint,
        answer=m.Checkpointed,
        handler=runner_routes.checkpoint,
        errors=(*_LEASE_WRITE, E.TERMINAL),
        params=(STEP_ID,),
    ),
    Operation(
        method="POST",
        path="/v1/logs",
        name="log_lines",
        tag="runner",
        roles=RUNNER,
        summary="Keep lines the runner wrote about its attempts, under fences it was granted.",
        body=m.LogLines,
        answer=m.LogLinesKept,
        handler=runner_routes.log_lines,
    ),
    # -- artifacts (docs/design.md, Artifacts)
    Operation(
        method="PUT",
        path="/v1/artifacts/{digest}",
        name="put_artifact",
        tag="artifacts",
        roles=(Role.RUNNER, Role.OPERATOR),
        summary="Store bytes under their sha256 (never overwritten), for a runner's lease.",
        body=BYTES,
        answer=m.ArtifactStored,
        handler=artifact_routes.put_artifact,
        errors=(
            E.BAD_REQUEST,
            E.BODY_TOO_LARGE,
            E.QUOTA_EXCEEDED,
            E.INVALID_FIELD,
            E.DIGEST_MISMATCH,
            *_LEASE_WRITE,
        ),
        params=(DIGEST,),
        query=(
            Param(
                name="step_id",
                description="A runner's upload: the step of the lease it"
                " uploads for (only that task's tenant may read the bytes).",
                schema={"type": "string", "minLength": 1},
            ),
            Param(
                name="fence",
                description="A runner's upload: that lease's fence.",
                schema={"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
            ),
        ),
    ),
    RawOperation(
        method="GET",
        path="/v1/artifacts/{digest}",
        name="get_artifact",
        tag="artifacts",
        roles=(Role.OPERATOR, Role.RUNNER),
        summary="The bytes of an artifact the caller's tenant or pool may see.",
        answer=BYTES,
        handler=artifact_routes.get_artifact,
        errors=(E.NOT_FOUND, E.INVALID_FIELD),
        params=(DIGEST,),
    ),
    # -- health (docs/design.md, Health and metrics) and this contract
    Operation(
        method="GET",
        path="/healthz",
        name="healthz",
        tag="health",
        roles=PUBLIC,
        summary="Alive: the process answers and its ledger is open.",
        answer=a.Alive,
        handler=health.healthz,
        errors=(E.UNAVAILABLE,),
    ),
    Operation(
        method="GET",
        path="/readyz",
        name="readyz",
        tag="health",
        roles=PUBLIC,
        summary="Ready: the ledger can be read.",
        answer=a.Ready,
        handler=health.readyz,
        errors=(E.UNAVAILABLE,),
    ),
    RawOperation(
        method="GET",
        path="/metrics",
        name="metrics",
        tag="health",
        roles=(Role.METRICS,),
        summary="Prometheus text: leases, commits, refusals, queues, budgets.",
        answer=PROMETHEUS_TEXT,
        handler=health.metrics,
        errors=(E.UNAVAILABLE,),
    ),
    RawOperation(
        method="GET",
        path="/v1/openapi.json",
        name="openapi",
        tag="contract",
        roles=PUBLIC,
        summary="This document.",
        answer=OPENAPI_JSON,
        handler=openapi.openapi_json,
    ),
)
