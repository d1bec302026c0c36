"""The status page's reads: the tenant's tasks, one task, and the part of a task page that
live updates replace. Everything comes through the ledger store, as the API's reads do."""

from __future__ import annotations

from typing import Any, Final

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from tether.supervisor.api import requests as rq
from tether.supervisor.api.auth import may_use_pool
from tether.supervisor.api.errors import ApiError
from tether.supervisor.ledger import LedgerStore, Principal
from tether.supervisor.ledger.views import PAGE_MAX, TaskSearch
from tether.supervisor.plan_reading import task_plan
from tether.supervisor.ui import render, transcript
from tether.supervisor.ui.attempt_logs import lines_by_fence
from tether.supervisor.ui.candidate import shown_diff
from tether.supervisor.ui.effects import shown_effect
from tether.supervisor.ui.guard import signed
from tether.wire import ErrorCode
from tether.wire.answers import Expectation, Observation, ReviewRecord
from tether.wire.codec import encode
from tether.wire.records import Record

PAGE_SIZE: Final = 50
SEARCH_MAX: Final = 200
# What the templates show by name; any other field of a task, step or attempt is shown as a
# key and its value, so a field the ledger adds appears without a template change.
TASK_SHOWN: Final = frozenset(
    {
        "id",
        "tenant",
        "idempotency_key",
        "state",
        "reason",
        "plan_hash",
        "base_sha",
        "repository",
        "pool",
        "seq",
        "created_at",
        "waiting_for",
        "budget",
        "steps",
        "rejections",
        "plan",
    }
)
STEP_SHOWN: Final = frozenset(
    {
        "id",
        "name",
        "kind",
        "state",
        "payload_hash",
        "effect_key",
        "fence",
        "output",
        "candidate_sha",
        "attempts",
        "effect",
    }
)
ATTEMPT_SHOWN: Final = frozenset(
    {
        "attempt",
        "fence",
        "runner_id",
        "token_id",
        "state",
        "reason",
        "granted_at",
        "ended_at",
        "usage",
    }
)


def ledger_of(request: Request) -> LedgerStore:
    ledger: LedgerStore = request.app.state.ledger
    return ledger


def carries_data(value: Any) -> bool:
    """Whether a field is worth a section: not null and not empty."""
    return value is not None and value not in ({}, [], "")


def plain(value: Any) -> Any:
    """A record's value as its JSON reads: mappings and lists, for the `value` macro."""
    return msgspec.json.decode(encode(value))


def _fields(record: Record) -> dict[str, Any]:
    """A record's fields by name, in order; their values as they are."""
    return msgspec.structs.asdict(record)


def extras(record: Record, shown: frozenset[str]) -> dict[str, Any]:
    """The fields of `record` no template names, those carrying data only, as plain data (the
    `value` macro lays out mappings and lists)."""
    found = {k: plain(v) for k, v in _fields(record).items() if k not in shown}
    return {k: v for k, v in found.items() if carries_data(v)}


def review_parts(review: ReviewRecord) -> dict[str, Any]:
    """The review record split for the page: what was declared before the run, what the ledger
    recorded (values as plain data, for the `record` macro), and the verdict."""
    fields = _fields(review)
    return {
        "expectations": {
            k: plain(v.value) for k, v in fields.items() if isinstance(v, Expectation)
        },
        "observations": {
            k: plain(v.value) for k, v in fields.items() if isinstance(v, Observation)
        },
        "checks": plain(review.observed_checks.value),
        "verdict": review.verdict,
    }


def _output_parts(output: Any) -> dict[str, Any]:
    """An agent step's output split for the page: its transcript as a conversation, and the
    rest of its fields; any other output is shown as it is."""
    if isinstance(output, dict):
        talk = transcript.conversation(output.get("transcript"))
        if talk is not None:
            rest = {k: v for k, v in output.items() if k != "transcript"}
            return {"conversation": talk, "output_rest": rest}
    return {"conversation": None, "output_rest": None}


async def task_context(request: Request, who: Principal, task_id: str) -> dict[str, Any]:
    """What the task page and its live fragment show."""
    ledger = ledger_of(request)
    task_id = await ledger.resolve_task_id(who.scope, task_id)
    task = await ledger.task(task_id, who.scope)
    review = await ledger.review(task_id, who.scope)
    shipped = await lines_by_fence(ledger, task_id, who.scope)
    # Each step and attempt with what the page adds to it: where it is, its fields no template
    # names, an attempt's shipped lines, the effect's request laid out, the transcript.
    steps = [
        {
            **_fields(step),
            "anchor": f"step-{number}",
            "extra": extras(step, STEP_SHOWN),
            "attempts": [
                {
                    **_fields(attempt),
                    "extra": extras(attempt, ATTEMPT_SHOWN),
                    "log": shipped.get(attempt.fence, []),
                }
                for attempt in step.attempts
            ],
            "effect": shown_effect(step.effect),
            **_output_parts(step.output),
        }
        for number, step in enumerate(task.steps, start=1)
    ]
    return {
        "who": who,
        "task": task,
        "steps": steps,
        # Where on the page each step is, so that what the task waits for links to it.
        "anchors": {step["name"]: step["anchor"] for step in steps},
        "task_extra": extras(task, TASK_SHOWN),
        "review": review_parts(review),
        "ended": render.is_ended(task.state),
        "plan": task_plan(task),
        "diff": await shown_diff(request, who, task),
    }


async def task_page(
    request: Request,
    who: Principal,
    task_id: str,
    notice: str | None = None,
    status_code: int = 200,
) -> Response:
    """The task page, with `notice` (a refused action) above it."""
    context = await task_context(request, who, task_id)
    return render.page(request, "task.html", {**context, "notice": notice}, status_code)


async def _task(request: Request, who: Principal) -> Response:
    return await task_page(request, who, request.path_params["task_id"])


async def _fragment(request: Request, who: Principal) -> Response:
    context = await task_context(request, who, request.path_params["task_id"])
    return render.page(request, "task_fragment.html", context)


def _cursor(request: Request) -> int | None:
    raw = request.query_params.get("cursor") or None
    if raw is not None and not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise ApiError(ErrorCode.INVALID_FIELD, "query parameter 'cursor' is not valid")
    return None if raw is None else int(raw)


def _search_term(request: Request, name: str) -> str | None:
    """A search field of the list: trimmed, None when empty; a long one is refused."""
    raw = (request.query_params.get(name) or "").strip()
    if len(raw) > SEARCH_MAX:
        raise ApiError(ErrorCode.INVALID_FIELD, f"query parameter {name!r} is too long")
    return raw or None


async def _listing(request: Request, who: Principal) -> dict[str, Any]:
    """What the list of tasks and its live part show: a page of the tenant's tasks, narrowed
    by state and the search fields, each id with its shortest unique prefix."""
    state = request.query_params.get("state") or None
    limit = rq.query_int(request, "limit", default=PAGE_SIZE, low=1, high=PAGE_MAX)
    search = TaskSearch(
        text=_search_term(request, "q"),
        repository=_search_term(request, "repository"),
        pool=_search_term(request, "pool"),
    )
    cursor = _cursor(request)
    found = await ledger_of(request).list_tasks(who.scope, state, cursor, limit, search)
    short = render.short_ids([t.id for t in found.tasks])
    keep = {
        "state": state,
        "q": search.text,
        "repository": search.repository,
        "pool": search.pool,
        "limit": None if limit == PAGE_SIZE else limit,
    }
    return {
        "who": who,
        "tasks": [{**_fields(t), "short_id": short[t.id]} for t in found.tasks],
        "next": found.next,
        "keep": {k: v for k, v in keep.items() if v is not None},
        "cursor": cursor,
        **keep,
    }


async def _tasks(request: Request, who: Principal) -> Response:
    return render.page(request, "tasks.html", await _listing(request, who))


async def _tasks_fragment(request: Request, who: Principal) -> Response:
    return render.page(request, "tasks_fragment.html", await _listing(request, who))


async def _fleet(request: Request, who: Principal) -> dict[str, Any]:
    """What the runners page and its live part show: the queue of every pool the tenant's
    tasks may use (as `GET /v1/pools` lists them) and the runners of those pools."""
    shared: frozenset[str] = request.app.state.settings.shared_pool_names
    ledger = ledger_of(request)
    pools = [
        p
        for p in await ledger.pools(also={*shared, who.scope})
        if may_use_pool(who.scope, p.pool, shared)
    ]
    usable = {p.pool for p in pools}
    seen = [r for r in await ledger.runners() if r.pool in usable]
    return {"who": who, "pools": pools, "runners": seen, "online": sum(r.online for r in seen)}


async def _runners(request: Request, who: Principal) -> Response:
    return render.page(request, "runners.html", await _fleet(request, who))


async def _runners_fragment(request: Request, who: Principal) -> Response:
    return render.page(request, "runners_fragment.html", await _fleet(request, who))


tasks = signed(_tasks)
runners = signed(_runners)
runners_fragment = signed(_runners_fragment, redirect=False)
tasks_fragment = signed(_tasks_fragment, redirect=False)
task = signed(_task)
fragment = signed(_fragment, redirect=False)
