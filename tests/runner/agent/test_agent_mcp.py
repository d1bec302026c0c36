"""MCP tools in an agent step (issue 27): a repository's own MCP server
(examples/mcp_stdio_server.py, committed into a test repository) is started by the `agent`
kind inside bubblewrap, in the worktree; a scripted model calls its tools as
`mcp__<server>__<tool>` through the same dispatcher as the built-in tools. The server sees
only what the sandbox shows (a runner's file outside the tree is not there), a server that
does not start fails the step by name, a runner without the SDK releases the step to an
operator, and a lease lost while servers run reaches the runner as itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.agent_repos import make_origin
from tests.agent_services import ScriptedChat, call, lease_repository
from tests.runner.agent.test_agent_tools import bubblewrap  # noqa: F401 (the fixture)
from tether.runner.agent import AgentKind, NoSandbox
from tether.runner.agent.confine import CommandLimits
from tether.runner.agent.mcp import McpUnavailable
from tether.runner.agent.sandbox import Bubblewrap, Sandbox
from tether.runner.errors import LeaseLost, LostBecause, OperatorProblem, StepRejected
from tether.runner.kinds.base import StepContext, StepOutput
from tether.wire import ReleaseReason
from tether.wire.payloads import AgentPayload, read_payload

SERVER = (Path(__file__).resolve().parents[3] / "examples" / "mcp_stdio_server.py").read_text()
ASK = [{"role": "user", "content": "Use the repository's tools."}]


def payload(*servers: dict[str, Any]) -> dict[str, Any]:
    return {"messages": ASK, "allowed_commands": [], "mcp_servers": list(servers)}


def repo_server(name: str = "repo") -> dict[str, Any]:
    return {"name": name, "command": [sys.executable, "tools/server.py"]}


async def run_step(
    tmp_path: Path,
    sandbox: Sandbox,
    chat: ScriptedChat,
    body: dict[str, Any],
    *,
    commands_without_sandbox: bool = False,
    command_limits: CommandLimits | None = None,
) -> StepOutput:
    origin, base = make_origin(
        tmp_path / "origin", {"src/app.py": "answer = 41\n", "tools/server.py": SERVER}
    )
    kind = AgentKind(
        cache_dir=tmp_path / "cache",
        sandbox=sandbox,
        commands_without_sandbox=commands_without_sandbox,
        command_limits=command_limits,
    )
    ctx = StepContext(
        step_id="step-1",
        task_id="task-1",
        name="fix",
        attempt=1,
        payload=body,
        outputs=(),
        default_model="scripted",
        chat=chat,
        repository=lease_repository(str(origin), base),
    )
    return await kind(ctx)


async def test_a_repositorys_own_server_is_called_inside_bubblewrap(
    tmp_path: Path,
    bubblewrap: Bubblewrap,  # noqa: F811
) -> None:
    secret = tmp_path / "runner-token"  # a runner's file, outside the worktree
    secret.write_text("tok-runner-123")
    chat = ScriptedChat(
        [
            call("mcp__repo__echo", text="hello from the model"),
            call("mcp__repo__read", path=str(secret)),
            call("mcp__repo__read", path="src/app.py"),
            call("mcp__repo__fail"),
        ],
        "done",
    )
    done = await run_step(tmp_path, bubblewrap, chat, payload(repo_server()))

    offered = {t["function"]["name"]: t for t in chat.requests[0]["tools"]}
    assert {"mcp__repo__echo", "mcp__repo__read", "mcp__repo__fail", "read_file"} <= set(offered)
    assert offered["mcp__repo__echo"]["function"]["description"].startswith("[MCP server repo]")
    echoed, hidden, inside, failed = chat.tool_results(1)
    assert echoed == {"content": "hello from the model"}
    assert hidden["error"] == "mcp_tool_error"  # the sandbox shows no runner file
    assert "tok-runner-123" not in json.dumps(chat.requests[1])
    assert inside == {"content": "answer = 41\n"}  # it runs in the worktree
    assert failed == {"error": "mcp_tool_error", "detail": "it failed, as it always does"}
    output: dict[str, Any] = done.output  # type: ignore[assignment]
    assert (output["tool_calls"], output["tool_errors"]) == (4, 2)
    assert [e["name"] for e in output["transcript"] if e["role"] == "tool"] == [
        "mcp__repo__echo",
        "mcp__repo__read",
        "mcp__repo__read",
        "mcp__repo__fail",
    ]


async def test_a_server_runs_under_the_command_limits(
    tmp_path: Path,
    bubblewrap: Bubblewrap,  # noqa: F811
) -> None:
    chat = ScriptedChat(
        [
            call("mcp__repo__write", path="small.bin", size=1000),
            call("mcp__repo__write", path="big.bin", size=2 * 1024 * 1024),
        ],
        "done",
    )
    limits = CommandLimits(max_file_mb=1)  # the runner's command_max_file_mb
    await run_step(tmp_path, bubblewrap, chat, payload(repo_server()), command_limits=limits)
    small, big = chat.tool_results(1)
    assert small == {"content": "written"}
    assert big["error"] == "mcp_tool_error"
    assert "File too large" in big["detail"]  # RLIMIT_FSIZE, as for an allowed command


async def test_without_a_sandbox_no_server_starts_unless_the_operator_allows_it(
    tmp_path: Path,
) -> None:
    chat = ScriptedChat([call("mcp__repo__echo", text="x")], "done")
    with pytest.raises(OperatorProblem, match="sandbox"):
        await run_step(tmp_path, NoSandbox(), chat, payload(repo_server()))
    assert chat.requests == []  # refused before the model was asked anything
    allowed = await run_step(
        tmp_path / "allowed",
        NoSandbox(),
        ScriptedChat([call("mcp__repo__echo", text="x")], "ok"),
        payload(repo_server()),
        commands_without_sandbox=True,
    )
    assert allowed.output["tool_errors"] == 0  # type: ignore[index]


async def test_a_server_that_does_not_start_fails_the_step_by_name(tmp_path: Path) -> None:
    broken = {"name": "broken", "command": [sys.executable, "-c", "raise SystemExit(3)"]}
    with pytest.raises(StepRejected, match="MCP server broken did not start"):
        await run_step(
            tmp_path,
            NoSandbox(),
            ScriptedChat("done"),
            payload(repo_server(), broken),
            commands_without_sandbox=True,
        )


async def test_a_runner_without_the_sdk_releases_the_step_to_an_operator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)  # `import mcp` fails, as where it is absent
    with pytest.raises(McpUnavailable) as refused:
        await run_step(
            tmp_path,
            NoSandbox(),
            ScriptedChat("done"),
            payload(repo_server()),
            commands_without_sandbox=True,
        )
    assert refused.value.reason is ReleaseReason.OPERATOR
    assert "tether[mcp]" in refused.value.action


async def test_a_lease_lost_while_servers_run_reaches_the_runner_unwrapped(
    tmp_path: Path,
) -> None:
    lost = LeaseLost(LostBecause.STALE_FENCE)
    chat = ScriptedChat([call("mcp__repo__echo", text="x")], lost)
    with pytest.raises(LeaseLost) as raised:
        await run_step(
            tmp_path, NoSandbox(), chat, payload(repo_server()), commands_without_sandbox=True
        )
    assert raised.value is lost


@pytest.mark.parametrize(
    ("servers", "said"),
    [
        ([{"name": "Repo", "command": ["x"]}], "mcp_servers[0].name"),
        ([{"name": "a__b", "command": ["x"]}], "mcp_servers[0].name"),
        ([{"name": "repo", "command": []}], "mcp_servers[0].command"),
        ([{"name": "repo", "command": [""]}], "mcp_servers[0].command"),
        ([repo_server(), repo_server()], "mcp_servers[1].name"),
        ([{"name": "repo", "command": ["x"], "env": {"K": "v"}}], "env"),
    ],
)
def test_a_bad_server_list_is_refused_by_its_place(servers: list[Any], said: str) -> None:
    with pytest.raises((ValueError, msgspec.ValidationError), match=said.replace("[", r"\[")):
        read_payload(payload(*servers), AgentPayload)
