"""Bad input over HTTP (docs/design.md, Errors): each case gets its 4xx with a stable code in the
wire's error
shape, and the ledger file is byte-for-byte the same, row for row, after it as before."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.conftest import ApiHarness, FakeClock, assert_error, ledger_snapshot, open_api, task_body

LIMIT = 1024 * 1024  # the default max_body_bytes


@dataclasses.dataclass(frozen=True, kw_only=True)
class World:
    """What the cases refer to: our running task and its lease, a planned task, a rival's."""

    task: str
    step: str
    fence: int
    payload_hash: str
    planned: str
    planned_hash: str
    rival: str

    def ids(self) -> dict[str, str]:
        return {"task": self.task, "step": self.step, "planned": self.planned, "rival": self.rival}


async def make_world(api: ApiHarness) -> World:
    task = await api.queued("running")
    [lease] = await api.claim()
    planned = await api.create("planned")
    rival = await api.client.post("/v1/tasks", headers=api.auth("rival"), json=task_body("r"))
    return World(
        task=task["id"],
        step=lease["step_id"],
        fence=lease["fence"],
        payload_hash=lease["payload_hash"],
        planned=planned["id"],
        planned_hash=planned["plan_hash"],
        rival=rival.json()["id"],
    )


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def shared(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[ApiHarness, World]]:
    """One supervisor for every refused request: a refusal writes nothing (each case checks
    that), so the cases cannot disturb one another, and the module stays fast."""
    path = tmp_path_factory.mktemp("bad-input") / "api.db"
    async with open_api(path, FakeClock(), synchronous="OFF") as api:
        yield api, await make_world(api)


Body = dict[str, Any] | bytes | Callable[[World], dict[str, Any]] | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    id: str
    method: str
    path: str
    body: Body = None
    status: int
    code: str
    auth: str = "operator"
    headers: tuple[tuple[str, str], ...] = ()
    chunked: bool = False


def result(w: World, **change: Any) -> dict[str, Any]:
    body = {"fence": w.fence, "payload_hash": w.payload_hash, "output": "x", "usage": {}}
    return {k: v for k, v in {**body, **change}.items() if v is not DROP}


def release(w: World, **change: Any) -> dict[str, Any]:
    body = {"fence": w.fence, "reason": "transient", "retryable": True, "detail": ""}
    return {k: v for k, v in {**body, **change}.items() if v is not DROP}


DROP = object()
GOOD_PLAN = task_body("new")["plan"]
RENEW = "/v1/leases/{step}/renew"
RELEASE = "/v1/leases/{step}/release"
RESULT = "/v1/steps/{step}/result"
CLAIM = "/v1/leases/claim"
CREATE = "/v1/tasks"
APPROVE = "/v1/tasks/{planned}/approve"
CANCEL = "/v1/tasks/{task}/cancel"
HEAD = "/v1/repositories/repo/head"
GATE = "/v1/tasks/{task}/steps/s0/gate"
HAPPENED = "/v1/tasks/{task}/steps/s0/happened"

BODY_ROUTES = [
    ("create", "POST", CREATE, "operator"),
    ("approve", "POST", APPROVE, "operator"),
    ("cancel", "POST", CANCEL, "operator"),
    ("head", "PUT", HEAD, "operator"),
    ("gate", "POST", GATE, "operator"),
    ("happened", "POST", HAPPENED, "operator"),
    ("claim", "POST", CLAIM, "runner"),
    ("renew", "POST", RENEW, "runner"),
    ("release", "POST", RELEASE, "runner"),
    ("result", "POST", RESULT, "runner"),
]


def malformed_cases() -> list[Case]:
    raw = [
        ("truncated", b'{"idempotency_key": '),
        ("array", b"[1, 2]"),
        ("string", b'"a task"'),
        ("number", b"7"),
        ("empty", b""),
        ("nan", b'{"idempotency_key": "k", "fence": NaN}'),
        ("infinity", b'{"idempotency_key": "k", "fence": Infinity}'),
        ("float_overflow", b'{"idempotency_key": "k", "fence": 1e999}'),
        ("deeply_nested", b"[" * 100_000 + b"]" * 100_000),
        ("huge_integer", b'{"fence": ' + b"9" * 5000 + b"}"),
        ("lone_surrogate", b'{"idempotency_key": "\\ud800"}'),
        ("invalid_utf8", b'{"idempotency_key": "\xff\xfe"}'),
    ]
    cases = [
        Case(
            id=f"create_{name}",
            method="POST",
            path=CREATE,
            body=body,
            status=400,
            code="malformed_json",
        )
        for name, body in raw
    ]
    cases += [
        Case(
            id=f"{name}_not_json",
            method=method,
            path=path,
            body=b"{oops",
            status=400,
            code="malformed_json",
            auth=auth,
        )
        for name, method, path, auth in BODY_ROUTES
    ]
    return cases


def oversized_cases() -> list[Case]:
    big = b'{"pad": "' + b"x" * LIMIT + b'"}'
    cases = [
        Case(
            id=f"{name}_oversized",
            method=method,
            path=path,
            body=big,
            status=413,
            code="body_too_large",
            auth=auth,
        )
        for name, method, path, auth in BODY_ROUTES
    ]
    cases += [
        Case(
            id=f"{name}_oversized_chunked",
            method=method,
            path=path,
            body=big,
            status=413,
            code="body_too_large",
            auth=auth,
            chunked=True,
        )
        for name, method, path, auth in BODY_ROUTES
    ]
    cases.append(
        Case(
            id="create_content_length_not_a_number",
            method="POST",
            path=CREATE,
            body=b"{}",
            status=400,
            code="bad_request",
            headers=(("Content-Length", "many"),),
        )
    )
    return cases


def invalid(id: str, method: str, path: str, body: Body, auth: str = "operator") -> Case:
    return Case(
        id=id, method=method, path=path, body=body, status=422, code="invalid_field", auth=auth
    )


def steps(*raw: Any) -> dict[str, Any]:
    return {"idempotency_key": "new", "plan": {"steps": list(raw)}}


def field_cases() -> list[Case]:
    good_step = {"name": "s", "kind": "chat", "payload": GOOD_PLAN["steps"][0]["payload"]}
    return [
        invalid("create_missing_key", "POST", CREATE, {"plan": GOOD_PLAN}),
        invalid("create_key_not_string", "POST", CREATE, {"idempotency_key": 7, "plan": GOOD_PLAN}),
        invalid("create_key_empty", "POST", CREATE, {"idempotency_key": "", "plan": GOOD_PLAN}),
        invalid(
            "create_key_too_long", "POST", CREATE, {"idempotency_key": "k" * 201, "plan": GOOD_PLAN}
        ),
        invalid("create_missing_plan", "POST", CREATE, {"idempotency_key": "new"}),
        invalid(
            "create_plan_not_object",
            "POST",
            CREATE,
            {"idempotency_key": "new", "plan": [good_step]},
        ),
        invalid(
            "create_steps_not_list",
            "POST",
            CREATE,
            {"idempotency_key": "new", "plan": {"steps": good_step}},
        ),
        invalid("create_no_steps", "POST", CREATE, steps()),
        invalid("create_step_not_object", "POST", CREATE, steps("s")),
        invalid("create_step_without_payload", "POST", CREATE, steps({"name": "s", "kind": "c"})),
        invalid("create_step_name_not_string", "POST", CREATE, steps({**good_step, "name": 3})),
        invalid("create_step_without_kind", "POST", CREATE, steps({"name": "s", "payload": 1})),
        invalid(
            "create_allowed_paths_not_list",
            "POST",
            CREATE,
            {**task_body("new"), "allowed_paths": "src/"},
        ),
        invalid("create_owner_not_string", "POST", CREATE, {**task_body("new"), "owner": 5}),
        invalid(
            "create_checks_without_repository",
            "POST",
            CREATE,
            {**task_body("new"), "expected_checks": ["tests"]},
        ),
        invalid("approve_missing_plan_hash", "POST", APPROVE, {}),
        invalid("approve_plan_hash_not_string", "POST", APPROVE, {"plan_hash": 5}),
        invalid(
            "approve_base_sha_not_string",
            "POST",
            APPROVE,
            lambda w: {"plan_hash": w.planned_hash, "base_sha": 5},
        ),
        invalid("cancel_reason_not_string", "POST", CANCEL, {"reason": 5}),
        invalid("head_missing_sha", "PUT", HEAD, {}),
        invalid("head_sha_not_string", "PUT", HEAD, {"sha": 5}),
        invalid(
            "claim_capacity_string", "POST", CLAIM, {"runner_id": "r", "capacity": "2"}, "runner"
        ),
        invalid(
            "claim_capacity_bool", "POST", CLAIM, {"runner_id": "r", "capacity": True}, "runner"
        ),
        invalid(
            "claim_capacity_float", "POST", CLAIM, {"runner_id": "r", "capacity": 1.5}, "runner"
        ),
        invalid("claim_capacity_zero", "POST", CLAIM, {"runner_id": "r", "capacity": 0}, "runner"),
        invalid("claim_missing_capacity", "POST", CLAIM, {"runner_id": "r"}, "runner"),
        invalid("claim_missing_runner_id", "POST", CLAIM, {"capacity": 1}, "runner"),
        invalid(
            "claim_wait_negative",
            "POST",
            CLAIM,
            {"runner_id": "r", "capacity": 1, "wait_s": -1},
            "runner",
        ),
        invalid(
            "claim_wait_string",
            "POST",
            CLAIM,
            {"runner_id": "r", "capacity": 1, "wait_s": "1"},
            "runner",
        ),
        invalid(
            "claim_wait_over_the_cap",
            "POST",
            CLAIM,
            {"runner_id": "r", "capacity": 1, "wait_s": 3600},
            "runner",
        ),
        invalid("renew_fence_true", "POST", RENEW, {"fence": True}, "runner"),
        invalid("renew_fence_negative", "POST", RENEW, {"fence": -1}, "runner"),
        invalid("renew_fence_string", "POST", RENEW, lambda w: {"fence": str(w.fence)}, "runner"),
        invalid("renew_fence_float", "POST", RENEW, lambda w: {"fence": float(w.fence)}, "runner"),
        invalid("renew_missing_fence", "POST", RENEW, {}, "runner"),
        invalid(
            "release_unknown_reason",
            "POST",
            RELEASE,
            lambda w: release(w, reason="bored"),
            "runner",
        ),
        invalid(
            "release_missing_reason", "POST", RELEASE, lambda w: release(w, reason=DROP), "runner"
        ),
        invalid(
            "release_missing_retryable",
            "POST",
            RELEASE,
            lambda w: release(w, retryable=DROP),
            "runner",
        ),
        invalid(
            "release_retryable_string",
            "POST",
            RELEASE,
            lambda w: release(w, retryable="yes"),
            "runner",
        ),
        invalid("release_fence_true", "POST", RELEASE, lambda w: release(w, fence=True), "runner"),
        invalid(
            "release_detail_not_string", "POST", RELEASE, lambda w: release(w, detail=5), "runner"
        ),
        invalid(
            "result_missing_output", "POST", RESULT, lambda w: result(w, output=DROP), "runner"
        ),
        invalid(
            "result_missing_payload_hash",
            "POST",
            RESULT,
            lambda w: result(w, payload_hash=DROP),
            "runner",
        ),
        invalid("result_missing_fence", "POST", RESULT, lambda w: result(w, fence=DROP), "runner"),
        invalid("result_fence_true", "POST", RESULT, lambda w: result(w, fence=True), "runner"),
        invalid("result_fence_negative", "POST", RESULT, lambda w: result(w, fence=-1), "runner"),
        invalid(
            "result_usage_negative",
            "POST",
            RESULT,
            lambda w: result(w, usage={"total_tokens": -1}),
            "runner",
        ),
        invalid(
            "result_usage_beyond_any_model",
            "POST",
            RESULT,
            lambda w: result(w, usage={"total_tokens": 10**20}),
            "runner",
        ),
        invalid(
            "result_usage_not_object", "POST", RESULT, lambda w: result(w, usage=[1]), "runner"
        ),
        invalid(
            "result_artifacts_not_strings",
            "POST",
            RESULT,
            lambda w: result(w, candidate_sha="c", artifacts={"tests": 1}),
            "runner",
        ),
        invalid(
            "result_candidate_not_string",
            "POST",
            RESULT,
            lambda w: result(w, candidate_sha=7),
            "runner",
        ),
        invalid(
            "result_artifacts_without_candidate",
            "POST",
            RESULT,
            lambda w: result(w, artifacts={"tests": "d" * 64}),
            "runner",
        ),
        invalid("list_unknown_state", "GET", "/v1/tasks?state=DONE", None),
        invalid("list_lowercase_state", "GET", "/v1/tasks?state=queued", None),
        invalid("list_cursor_word", "GET", "/v1/tasks?cursor=abc", None),
        invalid("list_cursor_superscript_digit", "GET", "/v1/tasks?cursor=%C2%B2", None),
        invalid("list_cursor_negative", "GET", "/v1/tasks?cursor=-1", None),
        invalid("list_limit_zero", "GET", "/v1/tasks?limit=0", None),
        invalid("list_limit_word", "GET", "/v1/tasks?limit=ten", None),
        invalid("list_limit_over_the_cap", "GET", "/v1/tasks?limit=100000", None),
        invalid("events_after_negative", "GET", "/v1/tasks/{task}/events?after=-1", None),
        invalid("events_after_word", "GET", "/v1/tasks/{task}/events?after=last", None),
        invalid("events_after_underscored", "GET", "/v1/tasks/{task}/events?after=1_0", None),
        invalid("events_wait_word", "GET", "/v1/tasks/{task}/events?wait=long", None),
        invalid("events_wait_nan", "GET", "/v1/tasks/{task}/events?wait=nan", None),
        invalid("events_wait_over_the_cap", "GET", "/v1/tasks/{task}/events?wait=3600", None),
    ]


def unknown_id_cases() -> list[Case]:
    def not_found(id: str, method: str, path: str, body: Body, auth: str = "operator") -> Case:
        return Case(
            id=id, method=method, path=path, body=body, status=404, code="not_found", auth=auth
        )

    return [
        not_found("get_unknown_task", "GET", "/v1/tasks/nope", None),
        not_found(
            "approve_unknown_task", "POST", "/v1/tasks/nope/approve", {"plan_hash": "0" * 64}
        ),
        not_found("cancel_unknown_task", "POST", "/v1/tasks/nope/cancel", {}),
        not_found("events_unknown_task", "GET", "/v1/tasks/nope/events", None),
        not_found("review_unknown_task", "GET", "/v1/tasks/nope/review", None),
        not_found("renew_unknown_step", "POST", "/v1/leases/nope/renew", {"fence": 1}, "runner"),
        not_found(
            "release_unknown_step",
            "POST",
            "/v1/leases/nope/release",
            {"fence": 1, "reason": "shutdown", "retryable": True},
            "runner",
        ),
        not_found(
            "result_unknown_step",
            "POST",
            "/v1/steps/nope/result",
            {"fence": 1, "payload_hash": "0" * 64, "output": 1},
            "runner",
        ),
        # Another tenant's task, another pool's step: exactly as if they did not exist.
        not_found("get_rivals_task", "GET", "/v1/tasks/{task}", None, "rival"),
        not_found(
            "approve_rivals_task",
            "POST",
            "/v1/tasks/{planned}/approve",
            lambda w: {"plan_hash": w.planned_hash},
            "rival",
        ),
        not_found("cancel_rivals_task", "POST", "/v1/tasks/{task}/cancel", {}, "rival"),
        not_found("events_rivals_task", "GET", "/v1/tasks/{task}/events", None, "rival"),
        not_found("review_rivals_task", "GET", "/v1/tasks/{task}/review", None, "rival"),
        not_found(
            "renew_other_pools_step", "POST", RENEW, lambda w: {"fence": w.fence}, "stranger"
        ),
        not_found("release_other_pools_step", "POST", RELEASE, release, "stranger"),
        not_found("result_other_pools_step", "POST", RESULT, result, "stranger"),
    ]


def route_cases() -> list[Case]:
    return [
        Case(id="unknown_route", method="GET", path="/v1/nothing", status=404, code="not_found"),
        Case(id="unknown_version", method="GET", path="/v2/tasks", status=404, code="not_found"),
        Case(
            id="unknown_route_post",
            method="POST",
            path="/v1/tasks/{task}/retry",
            body={},
            status=404,
            code="not_found",
        ),
        Case(
            id="delete_a_task",
            method="DELETE",
            path="/v1/tasks/{task}",
            status=405,
            code="method_not_allowed",
        ),
        Case(
            id="get_claim",
            method="GET",
            path=CLAIM,
            status=405,
            code="method_not_allowed",
            auth="runner",
        ),
        Case(
            id="put_a_task",
            method="PUT",
            path="/v1/tasks/{task}",
            body={},
            status=405,
            code="method_not_allowed",
        ),
        Case(
            id="post_healthz",
            method="POST",
            path="/healthz",
            body={},
            status=405,
            code="method_not_allowed",
        ),
        Case(
            id="post_head",
            method="POST",
            path=HEAD,
            body={"sha": "a"},
            status=405,
            code="method_not_allowed",
        ),
    ]


CASES = malformed_cases() + oversized_cases() + field_cases() + unknown_id_cases() + route_cases()


async def send(api: ApiHarness, world: World, case: Case) -> Any:
    headers = {**api.auth(case.auth), **dict(case.headers)}
    path = case.path.format(**world.ids())
    body = case.body(world) if callable(case.body) else case.body
    if body is None:
        return await api.client.request(case.method, path, headers=headers)
    if isinstance(body, dict):
        return await api.client.request(case.method, path, headers=headers, json=body)
    if case.chunked:
        raw = body

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(raw), 64 * 1024):
                yield raw[start : start + 64 * 1024]

        return await api.client.request(case.method, path, headers=headers, content=chunks())
    return await api.client.request(case.method, path, headers=headers, content=body)


def test_case_ids_are_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_bad_input_is_refused_and_writes_nothing(
    shared: tuple[ApiHarness, World], case: Case
) -> None:
    api, world = shared
    before = ledger_snapshot(api.path)
    response = await send(api, world, case)
    assert_error(response, case.status, case.code)
    assert ledger_snapshot(api.path) == before


async def test_the_same_requests_well_formed_are_accepted(api: ApiHarness) -> None:
    """The cases above fail for the reason they name, not because the world is wrong."""
    world = await make_world(api)
    ok = [
        await api.client.post(CREATE, headers=api.operator, json=task_body("fresh")),
        await api.client.post(
            APPROVE.format(**world.ids()),
            headers=api.operator,
            json={"plan_hash": world.planned_hash},
        ),
        await api.client.post(
            RENEW.format(**world.ids()), headers=api.runner, json={"fence": world.fence}
        ),
        await api.client.put(HEAD, headers=api.operator, json={"sha": "a" * 40}),
        await api.client.get(
            f"/v1/tasks/{world.task}/events?after=1&wait=0.5", headers=api.operator
        ),
        await api.client.post(RESULT.format(**world.ids()), headers=api.runner, json=result(world)),
    ]
    assert [r.status_code for r in ok] == [201, 200, 200, 200, 200, 200]


async def test_another_tenants_task_is_indistinguishable_from_an_unknown_one(
    api: ApiHarness,
) -> None:
    world = await make_world(api)
    for suffix in ("", "/events", "/review"):
        theirs = await api.client.get(f"/v1/tasks/{world.rival}{suffix}", headers=api.operator)
        unknown = await api.client.get(f"/v1/tasks/{'f' * 32}{suffix}", headers=api.operator)
        assert theirs.status_code == unknown.status_code == 404
        assert theirs.json()["detail"].replace(world.rival, "ID") == unknown.json()[
            "detail"
        ].replace("f" * 32, "ID")
