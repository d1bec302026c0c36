"""`tether-supervisor task ...` and `status` as a CI job or an operator uses them (issue 16,
findings 5, 6 and 8), against a scripted supervisor: watch's exit status by the task's end,
`submit --wait`, `TETHER_URL`/`TETHER_TOKEN_FILE`, `task output`, `task list` across pages,
`status`, the waiting line in `show` and `watch`, and watch's step names and durations."""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.clocks import iso
from tether.supervisor import cli
from tether.supervisor import operator_client as oc

Handler = Callable[[httpx.Request], httpx.Response]

RUNNER_WAIT = {
    "reason": "runner",
    "pool": "gpu",
    "kind": "chat",
    "last_seen_s": None,
    "pool_last_seen_s": None,
}


# What every task view and summary holds besides what a test varies.
TASK_FIELDS: dict[str, Any] = {
    "tenant": "acme",
    "idempotency_key": "k1",
    "plan_hash": "h" * 64,
    "base_sha": None,
    "repository": None,
}


def task_json(state: str, seq: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": "t1",
        **TASK_FIELDS,
        "state": state,
        "seq": seq,
        "pool": "gpu",
        "created_at": iso(100.0),
        **extra,
    }


def event(seq: int, kind: str, state: str, at: float = 100.0, **data: Any) -> dict[str, Any]:
    return {"seq": seq, "task_id": "t1", "kind": kind, "state": state, "data": data, "at": iso(at)}


class Script:
    """Answers from lists: each GET of the task takes the next view (the last one repeats),
    each events poll the next batch; other routes from `routes`. Every request is kept."""

    def __init__(
        self,
        views: list[dict[str, Any]],
        polls: list[list[dict[str, Any]]] | None = None,
        routes: dict[tuple[str, str], Any] | None = None,
    ) -> None:
        self.views, self.polls, self.routes = views, polls or [], routes or {}
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if (request.method, path) in self.routes:
            answer = self.routes[(request.method, path)]
            return httpx.Response(200, json=answer(request) if callable(answer) else answer)
        if path == "/v1/tasks/t1/events":
            return httpx.Response(200, json={"events": self.polls.pop(0) if self.polls else []})
        if path == "/v1/tasks/t1":
            return httpx.Response(
                200, json=self.views.pop(0) if len(self.views) > 1 else self.views[0]
            )
        return httpx.Response(404, json={"error": "not_found", "detail": f"no route {path}"})


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "operator-token"
    path.write_text("tok\n")
    return path


def run(monkeypatch: pytest.MonkeyPatch, script: Handler, argv: list[str]) -> int:
    """`tether-supervisor argv` with every request answered by `script`."""
    real = oc.OperatorClient
    monkeypatch.setattr(
        oc,
        "OperatorClient",
        functools.partial(real, transport=httpx.MockTransport(script)),
    )
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def flags(token_file: Path) -> list[str]:
    return ["--url", "http://sup.test", "--token-file", str(token_file)]


# -- watch's exit status (finding 6) -----------------------------------------------------------


@pytest.mark.parametrize(("final", "status"), [("SUCCEEDED", 0), ("FAILED", 3), ("CANCELLED", 4)])
def test_watch_exits_0_only_on_success(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, final: str, status: int
) -> None:
    script = Script([task_json("RUNNING", 3)], [[event(4, "state", final)]])
    assert run(monkeypatch, script, ["task", "watch", "t1", *flags(token_file)]) == status


def test_submit_wait_submits_approves_and_exits_as_watch(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, tmp_path: Path
) -> None:
    task_file = tmp_path / "task.json"
    plan = {"steps": [{"name": "a", "kind": "chat", "payload": {"messages": []}}]}
    task_file.write_text(json.dumps({"idempotency_key": "k", "plan": plan}))
    planned = task_json("PLANNED", 1, plan_hash="h")
    script = Script(
        [task_json("QUEUED", 3)],
        [[event(4, "state", "FAILED")]],
        routes={
            ("POST", "/v1/tasks"): planned,
            ("POST", "/v1/tasks/t1/approve"): task_json("QUEUED", 3),
        },
    )
    argv = ["task", "submit", "--file", str(task_file), "--approve", "--wait", *flags(token_file)]
    assert run(monkeypatch, script, argv) == 3
    asked = [(r.method, r.url.path) for r in script.requests]
    assert asked[:3] == [
        ("POST", "/v1/tasks"),
        ("POST", "/v1/tasks/t1/approve"),
        ("GET", "/v1/tasks/t1"),
    ]
    assert ("GET", "/v1/tasks/t1/events") in asked


# -- TETHER_URL and TETHER_TOKEN_FILE ----------------------------------------------------------


def test_the_environment_gives_url_and_token_file(
    monkeypatch: pytest.MonkeyPatch, token_file: Path
) -> None:
    monkeypatch.setenv("TETHER_URL", "http://from-env.test")
    monkeypatch.setenv("TETHER_TOKEN_FILE", str(token_file))
    script = Script([task_json("SUCCEEDED", 1)])
    assert run(monkeypatch, script, ["task", "show", "t1"]) == 0
    [request] = script.requests
    assert (request.url.host, request.headers["authorization"]) == ("from-env.test", "Bearer tok")


def test_flags_win_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other-token"
    other.write_text("other\n")
    monkeypatch.setenv("TETHER_URL", "http://from-env.test")
    monkeypatch.setenv("TETHER_TOKEN_FILE", str(other))
    script = Script([task_json("SUCCEEDED", 1)])
    argv = ["task", "show", "t1", "--url", "http://flag.test", "--token-file", str(token_file)]
    assert run(monkeypatch, script, argv) == 0
    [request] = script.requests
    assert (request.url.host, request.headers["authorization"]) == ("flag.test", "Bearer tok")


def test_no_url_anywhere_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TETHER_URL", raising=False)
    script = Script([task_json("SUCCEEDED", 1)])
    assert run(monkeypatch, script, ["task", "show", "t1", "--token-file", str(token_file)]) == 2
    assert "TETHER_URL" in capsys.readouterr().err
    assert script.requests == []


# -- task output -------------------------------------------------------------------------------


# What every step of a task view holds besides what a test varies.
STEP_FIELDS: dict[str, Any] = {
    "payload_hash": "p" * 64,
    "effect_key": None,
    "fence": None,
    "candidate_sha": None,
}


def step(i: int, name: str, kind: str, state: str, output: Any = None) -> dict[str, Any]:
    return {
        "id": f"t1.{i}",
        "name": name,
        "kind": kind,
        "state": state,
        "output": output,
        **STEP_FIELDS,
    }


STEPS = [
    step(0, "draft", "chat", "committed", {"text": "Hello\nworld", "model": "m"}),
    step(1, "count", "tally", "committed", {"words": 2}),
    step(2, "polish", "chat", "skipped"),
]


@pytest.mark.parametrize(
    ("which", "printed"),
    [
        ([], '{\n  "words": 2\n}\n'),
        (["draft"], "Hello\nworld\n"),
        (["0"], "Hello\nworld\n"),
        (["t1.1"], '{\n  "words": 2\n}\n'),
    ],
)
def test_task_output_prints_a_steps_text_or_json(
    monkeypatch: pytest.MonkeyPatch,
    token_file: Path,
    capsys: pytest.CaptureFixture[str],
    which: list[str],
    printed: str,
) -> None:
    script = Script([task_json("FAILED", 9, steps=STEPS)])
    assert run(monkeypatch, script, ["task", "output", "t1", *which, *flags(token_file)]) == 0
    assert capsys.readouterr().out == printed


@pytest.mark.parametrize(("which", "message"), [("polish", "it is skipped"), ("nope", "no step")])
def test_task_output_of_a_step_without_output_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
    token_file: Path,
    capsys: pytest.CaptureFixture[str],
    which: str,
    message: str,
) -> None:
    script = Script([task_json("FAILED", 9, steps=STEPS)])
    assert run(monkeypatch, script, ["task", "output", "t1", which, *flags(token_file)]) == 1
    captured = capsys.readouterr()
    assert (captured.out, message in captured.err) == ("", True)


# -- task list and status (finding 5) ----------------------------------------------------------


def test_task_list_follows_the_cursor_one_line_per_task(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def page(request: httpx.Request) -> dict[str, Any]:
        summary = {**TASK_FIELDS, "pool": "gpu", "seq": 1, "created_at": iso(0.0), "steps_total": 2}
        if "cursor" not in request.url.params:
            first = {
                **summary,
                "id": "t9",
                "state": "QUEUED",
                "steps_committed": 1,
                "waiting_for": RUNNER_WAIT,
                "idempotency_key": "deploy-7",
            }
            return {"tasks": [first], "next": "9"}
        last = {**summary, "id": "t1", "state": "SUCCEEDED", "steps_committed": 2}
        return {"tasks": [last], "next": None}

    script = Script([task_json("QUEUED", 1)], routes={("GET", "/v1/tasks"): page})
    argv = ["task", "list", "--state", "QUEUED", *flags(token_file)]
    assert run(monkeypatch, script, argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines] == [
        ["ID", "STATE", "CREATED", "STEPS", "WAITING-FOR", "KEY"],
        ["t9", "QUEUED", "1970-01-01T00:00:00.000Z", "1/2", "runner", "deploy-7"],
        ["t1", "SUCCEEDED", "1970-01-01T00:00:00.000Z", "2/2", "-", "k1"],
    ]
    assert lines[1].index("deploy-7") == lines[0].index("KEY")  # the columns line up
    params = [dict(r.url.params) for r in script.requests]
    assert params == [
        {"limit": "50", "state": "QUEUED"},
        {"limit": "50", "state": "QUEUED", "cursor": "9"},
    ]


def test_status_prints_each_pools_queue_and_runners(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pools = {
        "pools": [
            {"pool": "acme", "queued": 0, "in_flight": 0, "oldest_queued_s": None, "runners": []},
            {
                "pool": "default",
                "queued": 3,
                "in_flight": 1,
                "oldest_queued_s": 42.5,
                "runners": [
                    {
                        "runner_id": "box-1",
                        "kinds": ["agent", "chat"],
                        "last_seen_s": 2.0,
                        "online": True,
                    },
                    {"runner_id": "box-2", "kinds": ["chat"], "last_seen_s": 61.0, "online": False},
                ],
            },
        ]
    }
    script = Script([task_json("QUEUED", 1)], routes={("GET", "/v1/pools"): pools})
    assert run(monkeypatch, script, ["status", *flags(token_file)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "acme: 0 queued, 0 in flight",
        "  no runner claimed recently",
        "default: 3 queued, oldest 42.5 s, 1 in flight",
        "  runner box-1 online, serves agent, chat; last claim 2 s ago",
        "  runner box-2 offline, serves chat; last claim 61 s ago",
    ]


# -- what a task waits for, in show and watch (finding 5) --------------------------------------


def test_show_prints_what_the_task_waits_for_on_stderr(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = Script([task_json("QUEUED", 3, waiting_for=RUNNER_WAIT)])
    assert run(monkeypatch, script, ["task", "show", "t1", *flags(token_file)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["waiting_for"] == RUNNER_WAIT  # stdout stays JSON
    assert captured.err == "waiting for a runner in pool 'gpu': none has ever claimed there\n"


@pytest.mark.parametrize(
    ("waiting", "line"),
    [
        ({"reason": "approval"}, "waiting for approval"),
        (
            {"reason": "budget", "tenant": "acme", "spent": 120, "budget": 100},
            "waiting for budget: tenant 'acme' has spent 120 of its 100 tokens",
        ),
        (
            {**RUNNER_WAIT, "pool_last_seen_s": 4.0},
            "waiting for a runner in pool 'gpu' serving kind 'chat': its runners serve other kinds",
        ),
        (
            {**RUNNER_WAIT, "last_seen_s": 400.0, "pool_last_seen_s": 4.0},
            "waiting for a runner in pool 'gpu': last claim 400 s ago",
        ),
    ],
)
def test_each_wait_reads_as_one_line(waiting: dict[str, Any], line: str) -> None:
    record = oc.view_of(task_json("QUEUED", 1, waiting_for=waiting)).waiting_for
    assert record is not None
    text = oc.waiting_line(record)
    assert text.startswith(line)
    assert "\n" not in text


def test_a_gate_wait_names_the_command_for_this_task() -> None:
    gate = oc.view_of(task_json("RUNNING", 2, waiting_for={"reason": "gate", "step": "deploy"}))
    assert gate.waiting_for is not None
    text = oc.waiting_line(gate.waiting_for, gate.id)
    assert text.endswith(f"(tether-supervisor task gate {gate.id} deploy)"), text


def test_watch_says_at_once_what_a_task_waits_for_and_again_when_it_changes() -> None:
    waits_approval = task_json("PLANNED", 1, waiting_for={"reason": "approval"})
    waits_runner = task_json("QUEUED", 3, waiting_for=RUNNER_WAIT)
    runner_later = task_json(
        "QUEUED", 3, waiting_for={**RUNNER_WAIT, "pool_last_seen_s": 3.0, "last_seen_s": 3.0}
    )
    script = Script(
        [waits_approval, waits_runner, waits_runner, runner_later, task_json("SUCCEEDED", 6)],
        [
            [event(2, "state", "APPROVED"), event(3, "state", "QUEUED")],
            [],
            [],
            [event(4, "step_leased", "RUNNING", step_id="t1.0"), event(5, "state", "SUCCEEDED")],
        ],
    )
    out = io.StringIO()
    assert (
        oc.watch(
            oc.OperatorClient("http://s.test", "tok", transport=httpx.MockTransport(script)),
            "t1",
            after=1,
            out=out,
        )
        == "SUCCEEDED"
    )
    lines = [line.strip() for line in out.getvalue().splitlines()]
    waits = [line for line in lines if "waiting for" in line]
    assert lines[0] == "PLANNED   waiting for approval (tether-supervisor task approve)"
    assert waits == [
        "PLANNED   waiting for approval (tether-supervisor task approve)",
        "QUEUED    waiting for a runner in pool 'gpu': none has ever claimed there",
        "QUEUED    waiting for a runner in pool 'gpu': last claim 3 s ago",
    ]  # the repeated wait was not printed again
    polls = [float(r.url.params["wait"]) for r in script.requests if r.url.path.endswith("/events")]
    assert max(polls) <= oc.WAITING_POLL_S  # a waiting task is polled often


def test_watch_names_steps_and_says_how_long_they_took() -> None:
    steps = [step(0, "draft", "chat", "leased"), step(1, "polish", "chat", "waiting")]
    script = Script(
        [task_json("RUNNING", 2, steps=steps)],
        [
            [
                event(3, "step_leased", "RUNNING", at=101.0, step_id="t1.0", attempt=1, fence=7),
                event(4, "step_committed", "RUNNING", at=103.5, step_id="t1.0", fence=7),
                event(5, "step_leased", "RUNNING", at=104.0, step_id="t1.1", attempt=1, fence=8),
                event(6, "step_requeued", "RUNNING", at=134.0, step_id="t1.1", why="lease expired"),
                event(7, "state", "FAILED", at=140.0),
            ]
        ],
    )
    out = io.StringIO()
    client = oc.OperatorClient("http://s.test", "tok", transport=httpx.MockTransport(script))
    assert oc.watch(client, "t1", after=2, out=out) == "FAILED"
    lines = out.getvalue().splitlines()
    assert "step=draft attempt=1 fence=7" in lines[0]
    assert "t1.0" not in out.getvalue()
    assert lines[1].endswith("step=draft fence=7 took=2.5s")
    assert lines[3].endswith("step=polish why=lease expired took=30.0s")
    assert lines[4].endswith("took=40.0s")  # the task, since it was created


def test_task_output_of_a_chat_answer_that_only_called_tools_prints_it_as_json(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]
    tools_only = step(0, "plan", "chat", "committed", {"text": "", "tool_calls": calls})
    script = Script([task_json("SUCCEEDED", 3, steps=[tools_only])])
    assert run(monkeypatch, script, ["task", "output", "t1", "plan", *flags(token_file)]) == 0
    assert json.loads(capsys.readouterr().out)["tool_calls"] == calls
