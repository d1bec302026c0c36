"""schemathesis against a live supervisor (uvicorn on a free port, a fresh ledger): every route
of the served OpenAPI document is called with generated requests, and a task is walked through
its life with real ids; no answer may be a 5xx, and each answer's status and body must be ones
the document gives that route. Bounded: a few examples per operation, no shrinking."""

from __future__ import annotations

import datetime
import hashlib
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import task_body
from tether.supervisor import admin
from tether.supervisor.api import create_app, openapi
from tether.supervisor.api.contract import OPERATIONS
from tether.supervisor.settings import SupervisorSettings

pytestmark = pytest.mark.slow

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
EXAMPLES_PER_OPERATION = 8  # per generation mode, positive and negative
# Per request: a claim or an events read waits at most 0.2 s here (the settings below).
DEADLINE = datetime.timedelta(seconds=5)
START_TIMEOUT_S = 10.0
# The generated run, measured at 8 s on an idle 2-core machine and 25 s with a load average of
# 9 on it; the bound is for a stuck one.
RUN_BUDGET_S = 55.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Live:
    """A supervisor served by uvicorn in a thread, with an operator, a runner and a metrics
    token."""

    def __init__(self, url: str, secrets: dict[str, str]) -> None:
        self.url = url
        self.secrets = secrets

    def headers(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets[role]}"}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    db = tmp_path_factory.mktemp("openapi") / "ledger.db"
    secrets = {
        role: admin.create_token(db, scope, role, init=True).secret
        for role, scope in [("operator", "acme"), ("runner", "default"), ("metrics", "scraper")]
    }
    settings = SupervisorSettings(
        db=db, claim_wait_max_s=0.2, events_wait_max_s=0.2, artifact_max_bytes=4096
    )
    app = create_app(settings, reaper=False)
    port = _free_port()
    server = uvicorn.Server(
        # log_config=None: uvicorn's own would take the process's `uvicorn.*` loggers off the
        # root handler for every later test (tests/test_logs_redaction.py saw no uvicorn line).
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", log_config=None
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped before it started"
        assert time.monotonic() < deadline, "uvicorn did not start in time"
        time.sleep(0.02)
    try:
        yield Live(f"http://127.0.0.1:{port}", secrets)
    finally:
        server.should_exit = True
        thread.join(timeout=START_TIMEOUT_S)


@pytest.fixture(scope="module")
def schema(live: Live) -> Any:
    return schemathesis.openapi.from_url(f"{live.url}{openapi.PATH}")


def _role(operation: Any) -> str | None:
    roles: list[str] = operation.definition.raw.get("x-tether-roles", [])
    return roles[0] if roles else None


def _call(live: Live, case: Any, role: str | None = None) -> Any:
    """`case` sent with the token of `role`, else of the first role its operation names."""
    role = role or _role(case.operation)
    return case.call_and_validate(
        base_url=live.url, headers=live.headers(role) if role else None, checks=CHECKS
    )


def _told(exc: BaseException) -> str:
    """An exception with every sub-exception of a group (schemathesis's failures, hypothesis's
    flaky ones), so the report says what the answer was."""
    told = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, BaseExceptionGroup):
        told += "".join(f"\n  {_told(sub)}" for sub in exc.exceptions)
    return told


def test_generated_requests_get_answers_the_document_allows(live: Live, schema: Any) -> None:
    started = time.monotonic()
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    served = {(operation.method.upper(), operation.path) for operation in operations}
    # schemathesis leaves out the document's own URL
    # (tests/supervisor/api/test_openapi.py reads it).
    assert served == {(op.method, op.path) for op in OPERATIONS if op.path != openapi.PATH}
    for operation, mode in itertools.product(operations, GenerationMode):

        @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
        @hypothesis.settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=DEADLINE,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            _call(live, case)

        try:
            run()
        except hypothesis.errors.Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE, operation.path  # nothing there to break
        except Exception as exc:  # each operation's failure is listed below
            failures.append(f"{operation.method.upper()} {operation.path} ({mode}): {_told(exc)}")
    assert not failures, "\n\n".join(failures)
    assert time.monotonic() - started < RUN_BUDGET_S


def _case(schema: Any, method: str, path: str, **parts: Any) -> Any:
    return schema[path][method].Case(**parts)


def test_a_task_walked_through_its_life_gets_answers_the_document_allows(
    live: Live, schema: Any
) -> None:
    """Real ids reach the answers generated ones cannot: 201 and 200 task views, a lease, a
    renewal, a result, events, the review record, an artifact's bytes, a 204 claim."""

    def call(method: str, path: str, role: str | None = None, **parts: Any) -> Any:
        return _call(live, _case(schema, method, path, **parts), role)

    body = task_body("walk")
    created = call("POST", "/v1/tasks", body=body)
    assert created.status_code == 201, created.text
    assert call("POST", "/v1/tasks", body=body).status_code == 200
    task = created.json()
    task_id = {"task_id": task["id"]}
    assert call("GET", "/v1/tasks", query={"limit": 5}).json()["tasks"][0]["id"] == task["id"]
    assert call("GET", "/v1/tasks/{task_id}", path_parameters=task_id).status_code == 200
    approved = call(
        "POST",
        "/v1/tasks/{task_id}/approve",
        path_parameters=task_id,
        body={"plan_hash": task["plan_hash"]},
    )
    assert approved.json()["state"] == "QUEUED", approved.text
    claim = {"runner_id": "r1", "capacity": 1, "kinds": ["chat"]}
    lease = call("POST", "/v1/leases/claim", body=claim).json()["leases"][0]
    step = {"step_id": lease["step_id"]}
    assert call("POST", "/v1/leases/claim", body=claim).status_code == 204
    renewed = call(
        "POST", "/v1/leases/{step_id}/renew", path_parameters=step, body={"fence": lease["fence"]}
    )
    assert renewed.status_code == 200, renewed.text
    # A fence the step never had is no lease of this token's: 404, as the document allows.
    guessed = call("POST", "/v1/leases/{step_id}/renew", path_parameters=step, body={"fence": 0})
    assert guessed.status_code == 404, guessed.text
    log = b"checks passed\n"
    digest = hashlib.sha256(log).hexdigest()
    stored = call(
        "PUT",
        "/v1/artifacts/{digest}",
        path_parameters={"digest": digest},
        body=log,
        media_type="application/octet-stream",
        query={"step_id": lease["step_id"], "fence": lease["fence"]},  # for the task's tenant
    )
    assert stored.json()["created"] is True, stored.text
    for reader in ("operator", "runner"):  # the tenant, and the pool's runners
        read = call("GET", "/v1/artifacts/{digest}", reader, path_parameters={"digest": digest})
        assert read.content == log, reader
    result = {
        "fence": lease["fence"],
        "payload_hash": lease["payload_hash"],
        "output": "done",
        "usage": {"total_tokens": 3},
    }
    applied = call("POST", "/v1/steps/{step_id}/result", path_parameters=step, body=result)
    assert applied.json() == {"outcome": "applied"}
    batch = call("POST", "/v1/steps/results", body={"results": [{**result, **step}]})
    assert batch.json()["results"][0]["outcome"] == "replayed"
    events = call("GET", "/v1/tasks/{task_id}/events", path_parameters=task_id)
    assert events.json()["events"], events.text
    assert call("GET", "/v1/tasks/{task_id}/review", path_parameters=task_id).status_code == 200
    reviewed = call(
        "POST",
        "/v1/tasks/{task_id}/review",
        path_parameters=task_id,
        body={"decision": "accept", "note": "fine"},
    )
    assert reviewed.status_code == 200, reviewed.text
    ended = call("POST", "/v1/tasks/{task_id}/cancel", path_parameters=task_id, body={})
    assert ended.status_code == 409, ended.text
    head = call(
        "PUT",
        "/v1/repositories/{name}/head",
        path_parameters={"name": "app"},
        body={"sha": "a" * 40},
    )
    assert head.status_code == 200, head.text
    for path in ["/v1/pools", "/v1/budget", "/v1/runner", "/healthz", "/readyz", "/metrics"]:
        assert call("GET", path).status_code == 200, path  # /metrics with the metrics token
