"""The operator's client (`tether-supervisor task ...`) against scripted answers: odd servers
give one-line errors, the plan hash is the supervisor's, and `watch` applies events in sequence
order, never showing one twice, through a dropped connection."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.supervisor import operator_client as oc
from tether.supervisor.ledger import StepSpec, TaskSpec
from tether.wire.records import Event

Handler = Callable[[httpx.Request], httpx.Response]


def client(handler: Handler) -> oc.OperatorClient:
    return oc.OperatorClient(
        "http://supervisor.test", "tok", transport=httpx.MockTransport(handler)
    )


@pytest.mark.parametrize(
    ("status", "text"),
    [
        (404, "<html>\n<body>\n<p>Error code: 404</p>\n</body>\n</html>\n"),
        (502, "Bad Gateway\n\nnginx"),
        (200, "<html>not json</html>"),
        (200, "[1, 2"),
    ],
)
def test_an_answer_that_is_not_the_supervisors_is_a_one_line_error(status: int, text: str) -> None:
    http = client(lambda _request: httpx.Response(status, text=text))
    with pytest.raises(oc.ClientError) as caught:
        http.show("t1")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{status} not a tether supervisor's answer")


def test_the_supervisors_error_is_code_and_detail() -> None:
    body = {"error": "not_found", "detail": "no task t1"}
    http = client(lambda _request: httpx.Response(404, json=body))
    with pytest.raises(oc.ClientError, match=r"^404 not_found: no task t1$"):
        http.show("t1")


def test_a_connection_failure_is_unreachable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(oc.Unreachable, match="cannot reach the supervisor"):
        client(refuse).show("t1")


def test_the_token_is_sent_as_a_bearer() -> None:
    seen: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(200, json={"id": "t1"})

    client(record).show("t1")
    assert seen == ["Bearer tok"]


def test_plan_hash_of_a_task_file_is_the_supervisors() -> None:
    body = {
        "idempotency_key": "k",
        "plan": {
            "steps": [{"name": "a", "kind": "chat", "payload": {"q": 1}, "note": "not hashed"}],
            "comment": "not hashed either",
        },
    }
    spec = TaskSpec(
        tenant="acme",
        idempotency_key="k",
        steps=(StepSpec(name="a", kind="chat", payload={"q": 1}),),
    )
    assert oc.plan_hash_of(body) == spec.plan_hash


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe\x00binary", "not UTF-8"),
        (b"{oops", "not valid JSON"),
        (b"[]", "must hold a task object"),
        (b'{"plan": []}', "must hold a task object"),
    ],
)
def test_a_bad_task_file_is_a_one_line_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "task.json"
    path.write_bytes(content)
    with pytest.raises(oc.ClientError, match=message):
        oc.load_task_file(path)


def test_a_missing_task_file_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(oc.ClientError, match="cannot read"):
        oc.load_task_file(tmp_path / "absent.json")


def event(seq: int, kind: str, state: str, **data: Any) -> dict[str, Any]:
    return {
        "seq": seq,
        "task_id": "t1",
        "kind": kind,
        "state": state,
        "data": data,
        "at": "1970-01-01T00:00:00.000Z",
    }


def task_json(state: str, seq: int, **extra: Any) -> dict[str, Any]:
    """A task view as the supervisor sends it, with the fields the client reads."""
    return {
        "id": "t1",
        "tenant": "acme",
        "idempotency_key": "k1",
        "state": state,
        "plan_hash": "h" * 64,
        "base_sha": None,
        "repository": None,
        "seq": seq,
        "pool": "default",
        "created_at": "1970-01-01T00:00:00.000Z",
        **extra,
    }


class ScriptedSupervisor:
    """Answers `GET /v1/tasks/t1` and its events from a script, one answer per poll."""

    def __init__(self, polls: list[list[dict[str, Any]] | Exception], state: str) -> None:
        self.polls = polls
        self.state = state
        self.afters: list[int] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            self.afters.append(int(request.url.params["after"]))
            answer = self.polls.pop(0)
            if isinstance(answer, Exception):
                raise httpx.ConnectError(str(answer), request=request)
            return httpx.Response(200, json={"events": answer})
        return httpx.Response(200, json=task_json(self.state, 2))


def test_watch_prints_each_event_once_in_order_through_a_dropped_connection() -> None:
    script = ScriptedSupervisor(
        [
            [event(1, "state", "PLANNED"), event(2, "state", "APPROVED")],
            RuntimeError("connection dropped"),
            # A redelivery after reconnecting: 2 was already shown, so it is skipped.
            [event(2, "state", "APPROVED"), event(3, "state", "QUEUED")],
            [event(4, "step_leased", "RUNNING", step_id="t1.0", attempt=1, fence=7)],
            [event(5, "state", "SUCCEEDED"), event(6, "late", "SUCCEEDED")],
        ],
        state="RUNNING",
    )
    out = io.StringIO()
    final = oc.watch(client(script), "t1", out=out)
    assert final == "SUCCEEDED"
    lines = out.getvalue().splitlines()
    assert [int(line.split()[0]) for line in lines] == [1, 2, 3, 4, 5]
    assert "step=t1.0 attempt=1 fence=7" in lines[3]  # no name known: the id
    assert script.afters == [0, 2, 2, 3, 4]


def test_watch_after_the_end_of_an_ended_task_returns_at_once() -> None:
    script = ScriptedSupervisor([], state="CANCELLED")
    out = io.StringIO()
    assert oc.watch(client(script), "t1", after=2, out=out) == "CANCELLED"
    assert out.getvalue() == ""
    assert script.afters == []


def test_describe_is_one_readable_line() -> None:
    requeued = event(12, "step_requeued", "RUNNING", step_id="t1.0", why="lease expired")
    line = oc.describe(Event(**requeued))
    assert "\n" not in line
    assert line.split()[0] == "12"
    assert "RUNNING" in line
    assert "step_requeued" in line
    assert "why=lease expired" in line


def test_describe_names_a_committed_steps_candidate_and_a_moved_head() -> None:
    committed = event(
        13,
        "step_committed",
        "RUNNING",
        step_id="t1.0",
        fence=7,
        candidate_sha="c" * 40,
        effect_key="e" * 64,
    )
    line = oc.describe(Event(**committed), {"t1.0": "fix"})
    assert "step=fix fence=7 candidate_sha=" + "c" * 40 in line
    assert "effect_key" not in line
    chat_step = event(14, "step_committed", "RUNNING", step_id="t1.1", candidate_sha=None)
    chat = oc.describe(Event(**chat_step))
    assert "candidate_sha" not in chat
    moved = oc.describe(Event(**event(15, "base_changed", "RUNNING", head_sha="f" * 40)))
    assert "head_sha=" + "f" * 40 in moved


def test_events_without_an_events_list_is_a_client_error() -> None:
    http = client(lambda _request: httpx.Response(200, json={"tasks": []}))
    with pytest.raises(oc.ClientError, match="not a tether supervisor's answer: 'events'"):
        http.events("t1", 0, 0.0)


@pytest.mark.parametrize("url", ["notaurl", "127.0.0.1:8080", "ftp://host", "http://"])
def test_a_url_that_is_not_http_is_refused_at_once(url: str) -> None:
    with pytest.raises(oc.ClientError, match="--url"):
        oc.OperatorClient(url, "tok")


@pytest.mark.parametrize("url", ["http://sup:8080/v1", "https://sup/tether/v1/"])
def test_a_url_ending_in_v1_says_to_leave_it_out(url: str) -> None:
    with pytest.raises(oc.ClientError, match="without /v1"):
        oc.OperatorClient(url, "tok")


def test_watch_fails_at_once_when_the_supervisor_was_never_reached() -> None:
    calls: list[str] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(oc.Unreachable, match="cannot reach the supervisor"):
        oc.watch(client(refuse), "t1", out=io.StringIO())
    assert calls == ["/v1/tasks/t1"]  # one try, not five minutes of them


def test_watch_halves_its_wait_until_the_supervisor_accepts_it() -> None:
    """A supervisor with events_wait_max_s below the watch's 30 s refuses the poll with 422."""
    waits: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/events"):
            return httpx.Response(200, json=task_json("RUNNING", 1))
        wait = float(request.url.params["wait"])
        waits.append(wait)
        if wait > 10:
            detail = "query parameter 'wait' must be in 0.0..10.0"
            return httpx.Response(422, json={"error": "invalid_field", "detail": detail})
        return httpx.Response(200, json={"events": [event(2, "state", "SUCCEEDED")]})

    assert oc.watch(client(handler), "t1", after=1, out=io.StringIO()) == "SUCCEEDED"
    assert waits == [30.0, 15.0, 7.5]


def test_watch_still_refuses_what_a_shorter_wait_cannot_mend() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/events"):
            return httpx.Response(200, json=task_json("RUNNING", 1))
        return httpx.Response(404, json={"error": "not_found", "detail": "no task t1"})

    with pytest.raises(oc.ClientError, match=r"^404 not_found"):
        oc.watch(client(handler), "t1", out=io.StringIO())
