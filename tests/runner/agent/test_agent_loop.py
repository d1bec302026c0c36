"""The `agent` kind's tool loop (issue 12, item 2) against the stand-in model's scripted turns
and real git repositories: what it does, what stops it, what its output tells, that a cancelled
loop leaves no worktree and no process, and that a bad agent payload is refused at submit."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil
import pytest

from examples.standin_model import create_app, read_scenario
from tests.agent_repos import make_origin, sh
from tests.agent_services import lease_repository
from tests.api_tasks import submitted
from tests.conftest import ApiHarness, assert_error, ledger_snapshot
from tests.runner.test_chat_tools import run_steps
from tether.clocks import LoopClock
from tether.runner.agent import AgentKind, NoSandbox
from tether.runner.agent.loop import TRANSCRIPT_ENTRIES_MAX, TRANSCRIPT_TEXT_MAX
from tether.runner.errors import StepRejected
from tether.runner.kinds.base import StepContext, StepOutput
from tether.runner.kinds.registry import KindRegistry
from tether.runner.model_client import Completion, ModelClient
from tether.wire.payloads import BUILT_IN_KINDS
from tether.wire.records import LeaseRepository

ASK = [{"role": "user", "content": "Make the test pass."}]
FIXED = "def answer():\n    return 42\n"


def py(code: str) -> str:
    """An allowed-command string that runs `code` with this interpreter."""
    return shlex.join([sys.executable, "-c", code])


CHECK = py("import sys; sys.path.insert(0, 'src'); import app; assert app.answer() == 42")


def model_for(
    scenario: dict[str, Any],
) -> tuple[Any, Callable[[dict[str, Any]], Awaitable[Completion]]]:
    """The stand-in app playing `scenario`, and a `ChatModel` calling it in process."""
    app = create_app(scenario=read_scenario(scenario))
    clock = LoopClock()
    client = ModelClient(
        base_url="http://model.test/v1", clock=clock, transport=httpx.ASGITransport(app=app)
    )

    async def chat(body: dict[str, Any]) -> Completion:
        return await client.chat(body, key=None, deadline=clock.now() + 10)

    return app, chat


def context(
    payload: dict[str, Any],
    chat: Any,
    step_id: str = "step-1",
    repository: LeaseRepository | None = None,
) -> StepContext:
    return StepContext(
        step_id=step_id,
        task_id="task-1",
        name="fix",
        attempt=1,
        payload=payload,
        outputs=(),
        default_model="stand-in",
        chat=chat,
        repository=repository,
    )


def kind(tmp_path: Path) -> AgentKind:
    """An agent kind whose commands run without bubblewrap, as the operator allowed."""
    return AgentKind(
        cache_dir=tmp_path / "cache", sandbox=NoSandbox(), commands_without_sandbox=True
    )


def leftovers(tmp_path: Path) -> list[str]:
    """Attempt and scratch folders still under the cache."""
    found = []
    for sub in ("attempts", "scratch"):
        folder = tmp_path / "cache" / sub
        if folder.is_dir():
            found += [f"{sub}/{p.name}" for p in folder.iterdir()]
    return found


def worktrees(mirror: Path) -> list[str]:
    listed = sh("git", "worktree", "list", "--porcelain", cwd=mirror)
    return [
        line.removeprefix("worktree ")
        for line in listed.splitlines()
        if line.startswith("worktree ")
    ]


def tool_entries(output: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in output["transcript"] if e.get("role") == "tool"]


FIX_SCENARIO = {
    "turns": [
        {
            "name": "list",
            "assistant_turns": 0,
            "tool_calls": [{"name": "list_files", "arguments": {"path": "src"}}],
        },
        {
            "name": "read",
            "assistant_turns": 1,
            "tool_calls": [{"name": "read_file", "arguments": {"path": "src/app.py"}}],
        },
        {
            "name": "write",
            "assistant_turns": 2,
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "src/app.py", "content": FIXED}}
            ],
        },
        {
            "name": "check",
            "assistant_turns": 3,
            "tool_calls": [{"name": "run", "arguments": {"command": CHECK}}],
        },
        {"name": "answer", "assistant_turns": 4, "text": "answer() returns 42 now"},
    ]
}


async def test_a_loop_lists_reads_writes_runs_and_answers_with_a_candidate(
    tmp_path: Path,
) -> None:
    origin, base = make_origin(tmp_path / "origin")
    app, chat = model_for(FIX_SCENARIO)
    payload = {"messages": ASK, "allowed_commands": [CHECK]}
    repo = lease_repository(str(origin), base)
    agent = kind(tmp_path)
    done = await agent(context(payload, chat, repository=repo))

    out = done.output
    assert app.state.turns == ["list", "read", "write", "check", "answer"]
    assert (out["text"], out["finish"], out["turns"]) == ("answer() returns 42 now", "answered", 5)
    assert (out["tool_calls"], out["tool_errors"], out["tool_refusals"]) == (4, 0, 0)
    listed, read, written, ran = (json.loads(e["content"]) for e in tool_entries(out))
    assert listed["entries"] == ["src/app.py"]
    assert read["content"] == "def answer():\n    return 41\n"
    assert written == {"path": "src/app.py", "bytes": len(FIXED), "created": False}
    assert (ran["exit_code"], ran["timed_out"]) == (0, False)
    # Each turn's usage is counted and summed, and goes with the result.
    turns = [e["usage"] for e in out["transcript"] if e["role"] == "assistant"]
    assert len(turns) == 5
    assert out["usage"]["total_tokens"] == sum(u["total_tokens"] for u in turns) > 0
    assert done.usage == out["usage"]
    # The candidate: one commit on the base, changing src/app.py only, in the runner's mirror.
    candidate = out["candidate_sha"]
    assert done.candidate_sha == candidate
    mirror = agent.cache.mirror_path(str(origin))
    assert sh("git", "rev-parse", f"{candidate}^", cwd=mirror).strip() == base
    changed = sh("git", "diff", "--name-only", base, candidate, cwd=mirror).split()
    assert changed == ["src/app.py"]
    assert sh("git", "show", f"{candidate}:src/app.py", cwd=mirror) == FIXED
    # The worktree is gone, and the output carries the proof.
    assert out["cleanup"]["gone"] is True
    assert out["cleanup"]["files_removed"] > 0
    assert not await anyio.Path(out["cleanup"]["path"]).exists()
    assert leftovers(tmp_path) == []
    assert worktrees(mirror) == [str(mirror)]


async def test_the_same_changes_give_the_same_candidate_on_another_attempt(
    tmp_path: Path,
) -> None:
    origin, base = make_origin(tmp_path / "origin")
    payload = {"messages": ASK, "allowed_commands": [CHECK]}
    repo = lease_repository(str(origin), base)
    agent = kind(tmp_path)
    first = await agent(context(payload, model_for(FIX_SCENARIO)[1], repository=repo))
    second = await agent(context(payload, model_for(FIX_SCENARIO)[1], repository=repo))
    assert first.candidate_sha is not None
    assert first.candidate_sha == second.candidate_sha
    assert first.output["cleanup"]["path"] != second.output["cleanup"]["path"]


REFUSED_SCENARIO = {
    "turns": [
        {
            "name": "escape",
            "assistant_turns": 0,
            "tool_calls": [
                {
                    "name": "write_file",
                    "arguments": {"path": "tests/test_app.py", "content": "pass\n"},
                },
                {"name": "write_file", "arguments": {"path": "../outside.txt", "content": "x\n"}},
                {"name": "run", "arguments": {"command": "rm -rf src"}},
            ],
        },
        # Answers only if the last tool result the model got is the refused command.
        {
            "name": "answer",
            "assistant_turns": 1,
            "last_contains": "command_not_allowed",
            "text": "I may not do that",
        },
    ]
}


async def test_a_refused_tool_call_is_counted_answered_as_an_error_and_never_run(
    tmp_path: Path,
) -> None:
    origin, base = make_origin(tmp_path / "origin")
    app, chat = model_for(REFUSED_SCENARIO)
    payload = {"messages": ASK, "allowed_commands": [CHECK]}
    repo = lease_repository(str(origin), base)
    done = await kind(tmp_path)(context(payload, chat, repository=repo))

    out = done.output
    assert app.state.turns == ["escape", "answer"]
    assert (out["finish"], out["text"]) == ("answered", "I may not do that")
    assert (out["tool_calls"], out["tool_errors"], out["tool_refusals"]) == (3, 3, 3)
    entries = tool_entries(out)
    assert [e["error"] for e in entries] == [
        "path_not_allowed",
        "path_escapes",
        "command_not_allowed",
    ]
    assert all(e["refused"] and not e["ok"] for e in entries)
    assert json.loads(entries[2]["content"])["error"] == "command_not_allowed"
    # Nothing changed: no candidate, and the origin's files as they were.
    assert "candidate_sha" not in out
    assert done.candidate_sha is None
    assert (origin / "src" / "app.py").read_text() == "def answer():\n    return 41\n"


ENDLESS = {"turns": [{"name": "again", "tool_calls": [{"name": "list_files"}]}]}


async def test_max_turns_stops_the_loop_in_a_scratch_workspace(tmp_path: Path) -> None:
    app, chat = model_for(ENDLESS)
    payload = {"messages": ASK, "allowed_commands": [], "max_turns": 3}
    done = await kind(tmp_path)(context(payload, chat))

    out = done.output
    assert (out["finish"], out["turns"], out["tool_calls"]) == ("max_turns", 3, 3)
    assert app.state.turns == ["again"] * 3
    # Every call was answered, the last one too, so the transcript ends with a tool result.
    assert out["transcript"][-1]["role"] == "tool"
    assert json.loads(out["transcript"][-1]["content"])["entries"] == []
    assert "candidate_sha" not in out
    assert out["cleanup"]["gone"] is True
    assert leftovers(tmp_path) == []


async def test_the_token_budget_stops_the_loop_before_the_next_model_call(
    tmp_path: Path,
) -> None:
    app, chat = model_for(ENDLESS)
    first = await kind(tmp_path)(
        context({"messages": ASK, "allowed_commands": [], "max_turns": 1}, chat)
    )
    one_turn = first.output["usage"]["total_tokens"]
    app.state.turns.clear()
    # A budget of two turns' tokens: the third call would start past it.
    budget = 2 * one_turn
    payload = {"messages": ASK, "allowed_commands": [], "max_tokens_total": budget}
    done = await kind(tmp_path)(context(payload, chat))

    out = done.output
    assert out["finish"] == "budget"
    assert 1 <= out["turns"] < 20
    assert len(app.state.turns) == out["turns"]
    assert out["usage"]["total_tokens"] >= budget
    spent_before_last = (
        out["usage"]["total_tokens"] - out["transcript"][-2]["usage"]["total_tokens"]
    )
    assert spent_before_last < budget


async def test_the_transcript_is_capped_in_entries_and_in_each_text(tmp_path: Path) -> None:
    long_text = "x" * (3 * TRANSCRIPT_TEXT_MAX)
    scenario = {
        "turns": [
            {
                "name": "long",
                "assistant_turns": 0,
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "notes.txt", "content": long_text}}
                ],
            },
            {
                "name": "again",
                "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
            },
        ]
    }
    _app, chat = model_for(scenario)
    payload = {"messages": ASK, "allowed_commands": [], "max_turns": 100}
    done = await kind(tmp_path)(context(payload, chat))

    transcript = done.output["transcript"]
    # 1 payload message + 100 assistant turns + 100 tool results = 201 entries.
    assert len(transcript) == TRANSCRIPT_ENTRIES_MAX
    head = TRANSCRIPT_ENTRIES_MAX // 4
    assert transcript[head] == {"omitted": 201 - TRANSCRIPT_ENTRIES_MAX + 1}
    assert transcript[0] == {"role": "user", "content": ASK[0]["content"]}
    written = transcript[1]["tool_calls"][0]["arguments"]
    assert written.endswith("more characters]")
    assert len(written) < TRANSCRIPT_TEXT_MAX + 40
    assert all(len(e.get("content", "")) < TRANSCRIPT_TEXT_MAX + 40 for e in transcript)
    assert done.output["turns"] == 100


async def test_a_cancelled_loop_leaves_no_worktree_and_no_process(tmp_path: Path) -> None:
    origin, base = make_origin(tmp_path / "origin")
    pid_file = tmp_path / "pid"
    sleeper = py(
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    scenario = {
        "turns": [
            {"name": "sleep", "tool_calls": [{"name": "run", "arguments": {"command": sleeper}}]}
        ]
    }
    _app, chat = model_for(scenario)
    payload = {"messages": ASK, "allowed_commands": [sleeper]}
    repo = lease_repository(str(origin), base, allowed_paths=("",))
    agent = kind(tmp_path)
    outputs: list[StepOutput] = []

    async def work() -> None:
        outputs.append(await agent(context(payload, chat, repository=repo)))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(work)
            while True:  # the command is running once it wrote its pid
                if pid_file.exists() and pid_file.read_text():
                    break
                await anyio.sleep(0.02)
            pid = int(pid_file.read_text())
            assert psutil.pid_exists(pid)
            assert len(leftovers(tmp_path)) == 1
            tg.cancel_scope.cancel()  # what a lost lease does to the step's scope
    assert outputs == []
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert leftovers(tmp_path) == []
    mirror = agent.cache.mirror_path(str(origin))
    assert worktrees(mirror) == [str(mirror)]


async def test_a_bad_payload_on_the_runner_is_rejected_before_any_model_call(
    tmp_path: Path,
) -> None:
    app, chat = model_for(ENDLESS)
    with pytest.raises(StepRejected, match=r"agent payload: `payload.max_turns`"):
        await kind(tmp_path)(
            context({"messages": ASK, "allowed_commands": [], "max_turns": 0}, chat)
        )
    assert app.state.turns == []
    assert not (tmp_path / "cache").exists()


def test_agent_is_a_built_in_kind_on_both_sides() -> None:
    assert "agent" in BUILT_IN_KINDS
    assert "agent" in KindRegistry.default(entry_points=False).names()


def plan(payload: Any) -> dict[str, Any]:
    return {
        "idempotency_key": "k",
        "plan": {"steps": [{"name": "fix", "kind": "agent", "payload": payload}]},
    }


GOOD = {"messages": ASK, "allowed_commands": ["python -m pytest -q"]}
BAD_AGENT: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "no_allowed_commands",
        {"messages": ASK},
        ["'plan.steps[0].payload'", "missing required field `allowed_commands`", "'fix'"],
    ),
    ("max_turns_zero", {**GOOD, "max_turns": 0}, ["'plan.steps[0].payload.max_turns'", ">= 1"]),
    (
        "max_turns_too_many",
        {**GOOD, "max_turns": 101},
        ["'plan.steps[0].payload.max_turns'", "<= 100"],
    ),
    ("budget_zero", {**GOOD, "max_tokens_total": 0}, ["'plan.steps[0].payload.max_tokens_total'"]),
    ("unknown_key", {**GOOD, "max_turn": 3}, ["`max_turn`", "did you mean `max_turns`"]),
    (
        "empty_command",
        {**GOOD, "allowed_commands": ["  "]},
        ["'plan.steps[0].payload.allowed_commands[0]'", "the command is empty"],
    ),
    (
        "path_climbs",
        {**GOOD, "allowed_paths": ["src/../../etc"]},
        ["'plan.steps[0].payload.allowed_paths[0]'", "not a path inside the repository"],
    ),
    (
        "path_git",
        {**GOOD, "allowed_paths": [".git/hooks"]},
        ["'plan.steps[0].payload.allowed_paths[0]'"],
    ),
    (
        "repository_in_payload",
        {**GOOD, "repository": {"url": "/srv/repo.git", "base_sha": "a" * 40}},
        ["`repository`"],
    ),
    (
        "check_timeout_zero",
        {**GOOD, "check_timeout_s": 0},
        ["'plan.steps[0].payload.check_timeout_s'"],
    ),
    ("timeout_negative", {**GOOD, "run_timeout_s": -1}, ["'plan.steps[0].payload.run_timeout_s'"]),
    (
        "bad_role",
        {**GOOD, "messages": [{"role": "robot", "content": "hi"}]},
        ["'plan.steps[0].payload.messages[0].role'"],
    ),
]


@pytest.mark.parametrize(
    ("payload", "words"), [c[1:] for c in BAD_AGENT], ids=[c[0] for c in BAD_AGENT]
)
async def test_a_bad_agent_payload_is_refused_at_submit_naming_the_field(
    api: ApiHarness, payload: dict[str, Any], words: list[str]
) -> None:
    before = {t: rows for t, rows in ledger_snapshot(api.path).items() if t != "tokens"}
    response = await api.client.post("/v1/tasks", headers=api.operator, json=plan(payload))
    detail = assert_error(response, 422, "invalid_field")["detail"]
    for word in words:
        assert word in detail
    after = {t: rows for t, rows in ledger_snapshot(api.path).items() if t != "tokens"}
    assert after == before


async def test_a_good_agent_payload_is_accepted_at_submit(api: ApiHarness) -> None:
    payload = {
        **GOOD,
        "allowed_paths": ["src/"],
        "max_turns": 5,
        "max_tokens_total": 10_000,
        "run_timeout_s": 60,
        "check_timeout_s": 120,
    }
    response = await api.client.post("/v1/tasks", headers=api.operator, json=plan(payload))
    assert response.status_code == 201, response.text


async def test_a_runner_commits_an_agent_step_whose_output_tells_what_it_did(
    api: ApiHarness, tmp_path: Path
) -> None:
    """Through a real runner and supervisor in process, in a scratch workspace: the committed
    step's output (what `task show` prints) holds the transcript."""
    model_app = create_app(scenario=read_scenario(FIX_SCENARIO))
    payload = {"messages": ASK, "allowed_commands": [CHECK]}
    task = await submitted(api, plan(payload))
    kinds = KindRegistry([("agent", kind(tmp_path))])
    view = await run_steps(api, tmp_path, model_app, str(task["id"]), kinds=kinds)

    assert view["state"] == "SUCCEEDED", view
    (step,) = view["steps"]
    output = step["output"]
    assert (output["finish"], output["turns"], output["tool_calls"]) == ("answered", 5, 4)
    assert [e["name"] for e in output["transcript"] if e["role"] == "tool"] == [
        "list_files",
        "read_file",
        "write_file",
        "run",
    ]
    assert output["cleanup"]["gone"] is True
    # In a scratch folder the model's first two calls find nothing; its write and run work.
    assert [e["ok"] for e in output["transcript"] if e["role"] == "tool"] == [
        False,
        False,
        True,
        True,
    ]
    assert step["candidate_sha"] is None
    assert "candidate_sha" not in output
    assert model_app.state.turns == ["list", "read", "write", "check", "answer"]
    assert leftovers(tmp_path) == []
