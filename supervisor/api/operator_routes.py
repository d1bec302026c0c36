"""Operator routes: tasks of the caller's tenant, their events and review, repository heads,
the pools it may use and its token budget."""

from __future__ import annotations

from starlette.requests import Request

from tether.supervisor.api import requests as rq
from tether.supervisor.api.auth import may_use_pool, require_pool_access
from tether.supervisor.api.errors import ApiError
from tether.supervisor.api.longpoll import LongPolls, unless_disconnected
from tether.supervisor.api.operation import Answered, Call
from tether.supervisor.effects.credentials import Credentials
from tether.supervisor.ledger import LedgerStore, StepSpec, TaskSpec
from tether.supervisor.ledger.identity import credentials_named
from tether.supervisor.repos.evidence import read_head
from tether.wire import ErrorCode
from tether.wire.answers import HeadMoved, ReviewRecord
from tether.wire.payloads import EFFECT_KINDS
from tether.wire.records import (
    MAX_TEXT,
    Approval,
    Budget,
    Cancel,
    CheckSpec,
    EffectHappened,
    Event,
    Events,
    GateOpen,
    PoolsAnswer,
    RepositoryHead,
    ReviewDecision,
    TaskCreate,
    TaskDetail,
    TaskLogs,
    TaskPage,
)


def _ledger(request: Request) -> LedgerStore:
    ledger: LedgerStore = request.app.state.ledger
    return ledger


async def _task_id(request: Request, tenant: str) -> str:
    """The full id of the task the path names, by its id or a unique prefix of it
    (`ledger.prefixes`)."""
    return await _ledger(request).resolve_task_id(tenant, request.path_params["task_id"])


def task_spec(tenant: str, ask: TaskCreate) -> TaskSpec:
    """What the ledger is asked to create, for `tenant`."""
    return TaskSpec(
        tenant=tenant,
        idempotency_key=ask.idempotency_key,
        steps=tuple(StepSpec(name=s.name, kind=s.kind, payload=s.payload) for s in ask.plan.steps),
        repository=ask.repository,
        base_sha=ask.base_sha,
        requirement_revision=ask.requirement_revision,
        allowed_paths=ask.allowed_paths,
        expected_checks=ask.expected_checks,
        checks=tuple(CheckSpec(name=name, command=line) for name, line in ask.checks.items()),
        owner=ask.owner,
        pool=ask.pool or "default",
        verify=None if ask.verify is None else ask.verify.pool,
    )


def require_credentials(request: Request, spec: TaskSpec) -> None:
    """`invalid_field` for a plan whose built-in effect steps name a credential the
    supervisor's credentials folder does not hold (docs/design.md, Effects). A kind a
    deployment registers reads its payload's credentials itself, at send time."""
    settings = request.app.state.settings
    held = Credentials(settings.credentials_folder)
    missing = sorted(n for n in credentials_named(spec, EFFECT_KINDS) if not held.has(n))
    if missing:
        raise ApiError(
            ErrorCode.INVALID_FIELD,
            f"'plan': credential {missing[0]!r} is not in the supervisor's credentials folder"
            " (setting credentials_dir, or LoadCredential= in its unit)",
        )


async def create_task(call: Call[TaskCreate]) -> Answered[TaskDetail]:
    request, who = call.request, call.who
    spec = task_spec(who.scope, call.body)
    shared = request.app.state.settings.shared_pool_names
    require_pool_access(request, who, spec.pool, shared)
    if spec.verify is not None:
        require_pool_access(request, who, spec.verify, shared)
    require_credentials(request, spec)
    created = await _ledger(request).create_task(spec)
    view = await _ledger(request).task(created.task_id, who.scope)
    return Answered(view, 201 if created.created else 200)


async def list_tasks(call: Call[None]) -> TaskPage:
    request, who = call.request, call.who
    cursor_raw = request.query_params.get("cursor")
    cursor = None
    if cursor_raw is not None:
        if not (cursor_raw.isascii() and cursor_raw.isdigit() and len(cursor_raw) <= 18):
            raise ApiError(ErrorCode.INVALID_FIELD, "query parameter 'cursor' is not valid")
        cursor = int(cursor_raw)
    limit = rq.query_int(request, "limit", default=50, low=1, high=200)
    page = await _ledger(request).list_tasks(
        who.scope, request.query_params.get("state"), cursor, limit
    )
    return page


async def get_task(call: Call[None]) -> TaskDetail:
    request, who = call.request, call.who
    return await _ledger(request).task(await _task_id(request, who.scope), who.scope)


async def pools(call: Call[None]) -> PoolsAnswer:
    """The queues and recent runners of the pools the caller's tenant may use: the shared
    pools and its own, listed even when empty. A shared pool's counts include other tenants'
    steps (its runners serve them all), never their tasks."""
    request, who = call.request, call.who
    shared = request.app.state.settings.shared_pool_names
    found = await _ledger(request).pools(also={*shared, who.scope})
    usable = tuple(p for p in found if may_use_pool(who.scope, p.pool, shared))
    return PoolsAnswer(pools=usable)


async def budget(call: Call[None]) -> Budget:
    """The caller's tenant's tokens spent, budget and what is left (`tether-supervisor budget
    --show` reads the same)."""
    request, who = call.request, call.who
    return await _ledger(request).budget(who.scope)


async def approve(call: Call[Approval]) -> TaskDetail:
    request, who, ask = call.request, call.who, call.body
    task_id = await _task_id(request, who.scope)
    ledger = _ledger(request)
    # A repository task's base must be the repository's head now: read here (git is an
    # adapter's I/O), judged by the ledger's rule (StaleBase).
    binding = await ledger.binding_of_task(who.scope, task_id)
    head = None if binding is None else await read_head(request.app.state.mirrors, binding)
    await ledger.approve(who.scope, task_id, ask.plan_hash, ask.base_sha, head)
    return await _ledger(request).task(task_id, who.scope)


async def cancel(call: Call[Cancel]) -> TaskDetail:
    request, who, ask = call.request, call.who, call.body
    task_id = await _task_id(request, who.scope)
    await _ledger(request).cancel(who.scope, task_id, ask.reason[:MAX_TEXT] or "cancelled")
    return await _ledger(request).task(task_id, who.scope)


async def events(call: Call[None]) -> Events:
    request, who = call.request, call.who
    settings = request.app.state.settings
    after = rq.query_int(request, "after", default=0, low=0, high=2**62)
    wait = rq.query_float(request, "wait", default=0.0, low=0.0, high=settings.events_wait_max_s)
    polls: LongPolls = request.app.state.long_polls
    found: list[Event] = []
    ledger, task_id = _ledger(request), await _task_id(request, who.scope)
    with polls.until_drained() as scope:
        found = await unless_disconnected(
            request,
            scope,
            lambda: ledger.events(task_id, who.scope, after, 0.0 if polls.draining else wait),
        )
    return Events(events=tuple(found))


async def task_log(call: Call[None]) -> TaskLogs:
    """The task's journal and its runners' lines after the cursor, merged in the owned box's
    order (`ledger.logs.task_log`); `tether-supervisor logs` pages through it."""
    request, who = call.request, call.who
    after_seq = rq.query_int(request, "after_seq", default=0, low=0, high=2**62)
    after_line = rq.query_int(request, "after_line", default=0, low=0, high=2**62)
    task_id = await _task_id(request, who.scope)
    return await _ledger(request).task_log(task_id, who.scope, after_seq, after_line)


async def review(call: Call[None]) -> ReviewRecord:
    request, who = call.request, call.who
    task_id = await _task_id(request, who.scope)
    return await _ledger(request).review(task_id, who.scope)


async def record_review(call: Call[ReviewDecision]) -> ReviewRecord:
    request, who, ask = call.request, call.who, call.body
    task_id = await _task_id(request, who.scope)
    await _ledger(request).record_review(who.scope, task_id, ask.decision, ask.note[:MAX_TEXT])
    return await _ledger(request).review(task_id, who.scope)


async def open_gate(call: Call[GateOpen]) -> TaskDetail:
    """Open an unkeyed effect's gate for the digest of the request the operator was shown.
    `task submit --approve` never opens a gate: only this does."""
    request, who, ask = call.request, call.who, call.body
    task_id, step = await _task_id(request, who.scope), request.path_params["step_name"]
    await _ledger(request).open_gate(who.scope, task_id, step, ask.digest, who.token_id)
    return await _ledger(request).task(task_id, who.scope)


async def effect_happened(call: Call[EffectHappened]) -> TaskDetail:
    """An operator's word on an uncertain effect: it happened, or (once) it did not."""
    request, who, ask = call.request, call.who, call.body
    task_id, step = await _task_id(request, who.scope), request.path_params["step_name"]
    await _ledger(request).resolve_effect(who.scope, task_id, step, ask.happened, who.token_id)
    return await _ledger(request).task(task_id, who.scope)


async def repository_head(call: Call[RepositoryHead]) -> HeadMoved:
    request, who = call.request, call.who
    sha = call.body.sha
    name = request.path_params["name"]
    await _ledger(request).set_repository_head(who.scope, name, sha)
    return HeadMoved(repository=name, head_sha=sha)
