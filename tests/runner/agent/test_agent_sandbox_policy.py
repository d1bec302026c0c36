"""The agent kind without a working sandbox (runner/agent/sandbox_policy.py): a step that would
run commands is refused as an operator problem unless `commands_without_sandbox` is set, and
runs nothing; with the setting it runs; a step without commands runs either way. The sandbox
the probe would find is replaced by `NoSandbox`, as the runner gets it when bwrap cannot work.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

from examples.standin_model import create_app, read_scenario
from tests.agent_repos import make_origin
from tests.agent_services import FakeServices, ScriptedChat, call, lease_repository
from tests.api_tasks import submitted
from tests.conftest import FakeClock, open_api
from tests.runner.test_runner_fakes import settings
from tether.clocks import LoopClock
from tether.runner.agent import AgentKind, NoSandbox
from tether.runner.agent.sandbox_policy import refusal
from tether.runner.credentials import SecretSource
from tether.runner.daemon import Runner
from tether.runner.errors import OperatorProblem
from tether.runner.kinds.base import StepContext
from tether.runner.kinds.registry import KindRegistry
from tether.runner.model_client import ModelClient
from tether.runner.supervisor_client import SupervisorClient
from tether.wire import ReleaseReason
from tether.wire.records import LeaseRepository

ASK = [{"role": "user", "content": "Make the test pass."}]
WHY = "bwrap is not installed"


def touch(marker: Path) -> str:
    """An allowed command that creates `marker`: proof of whether it ran."""
    return shlex.join([sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"])


def agent(tmp_path: Path, *, allowed: bool) -> AgentKind:
    return AgentKind(
        cache_dir=tmp_path / "cache", sandbox=NoSandbox(why=WHY), commands_without_sandbox=allowed
    )


def context(
    payload: dict[str, Any],
    chat: Any,
    *,
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
        default_model="m",
        chat=chat,
        repository=repository,
        services=FakeServices(),
    )


def leftovers(tmp_path: Path) -> list[str]:
    """What the agent left in its cache: nothing, when it never made a workspace."""
    cache = tmp_path / "cache"
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) if cache.exists() else []


def events(logs: Sequence[Mapping[str, Any]], level: str) -> list[str]:
    return [str(entry["event"]) for entry in logs if entry["log_level"] == level]


async def test_a_step_with_commands_is_refused_uncounted_and_runs_nothing(tmp_path: Path) -> None:
    kind = agent(tmp_path, allowed=False)
    markers = [tmp_path / "ran-1", tmp_path / "ran-2"]
    chats = [ScriptedChat([call("run", command=touch(m))], "done") for m in markers]
    with capture_logs() as logs:
        for n, (marker, chat) in enumerate(zip(markers, chats, strict=True)):
            payload = {"messages": ASK, "allowed_commands": [touch(marker)]}
            with pytest.raises(OperatorProblem) as refused:
                await kind(context(payload, chat, step_id=f"step-{n}"))

    problem = refused.value
    assert (problem.reason, problem.retryable) == (ReleaseReason.OPERATOR, True)
    assert problem.detail == refusal(WHY)
    for words in (
        WHY,
        "read its token and model key",
        "install bubblewrap",
        "systemd/tether-runner-bwrap.conf",
        "commands_without_sandbox = true",
    ):
        assert words in problem.detail
    # The supervisor keeps 500 characters of "<reason>: <detail>"; the ways out always fit.
    assert len(f"operator: {refusal('x' * 1000)}") <= 500
    assert "commands_without_sandbox = true" in problem.action
    assert not any(m.exists() for m in markers)
    assert [len(chat.requests) for chat in chats] == [0, 0]  # not a token spent
    assert leftovers(tmp_path) == []  # refused before any workspace was made
    # One error line for the process, then a short line per refused step.
    (error,) = events(logs, "error")
    assert refusal(WHY) in error
    refused_lines = [e for e in logs if e["event"].startswith("agent step refused")]
    assert [e["step_id"] for e in refused_lines] == ["step-0", "step-1"]


async def test_a_step_whose_lease_carries_checks_is_refused_too(tmp_path: Path) -> None:
    origin, base = make_origin(tmp_path / "origin")
    marker = tmp_path / "checked"
    repo = lease_repository(str(origin), base, checks={"tests": touch(marker)})
    chat = ScriptedChat([call("write_file", path="src/app.py", content="A = 1\n")], "done")
    payload = {"messages": ASK, "allowed_commands": []}
    with pytest.raises(OperatorProblem):
        await agent(tmp_path, allowed=False)(context(payload, chat, repository=repo))
    assert not marker.exists()
    assert chat.requests == []


async def test_with_commands_without_sandbox_the_commands_run_after_one_warning(
    tmp_path: Path,
) -> None:
    kind = agent(tmp_path, allowed=True)
    markers = [tmp_path / "ran-1", tmp_path / "ran-2"]
    with capture_logs() as logs:
        for marker in markers:
            chat = ScriptedChat([call("run", command=touch(marker))], "done")
            payload = {"messages": ASK, "allowed_commands": [touch(marker)]}
            done = await kind(context(payload, chat))
            assert done.output["sandbox"] == "none"
    assert all(m.exists() for m in markers)
    (warning,) = [e for e in events(logs, "warning") if "commands_without_sandbox" in e]
    assert "model-written code can read the runner's credentials" in warning
    assert events(logs, "error") == []


@pytest.mark.parametrize("allowed", [False, True])
async def test_a_step_without_commands_or_checks_runs_either_way(
    tmp_path: Path, allowed: bool
) -> None:
    chat = ScriptedChat([call("write_file", path="notes.txt", content="hello\n")], "written")
    payload = {"messages": ASK, "allowed_commands": []}
    with capture_logs() as logs:
        done = await agent(tmp_path, allowed=allowed)(context(payload, chat))
    assert done.output["text"] == "written"
    assert len(chat.requests) == 2
    assert events(logs, "error") == []


def released(view: Any) -> list[dict[str, Any]]:
    """The released attempts of the task's one step, as `task show` lists them."""
    if view is None:
        return []
    (step,) = view["steps"]
    return [a for a in step["attempts"] if a["state"] == "released"]


async def test_through_a_supervisor_the_task_waits_with_the_reason_in_its_attempts(
    tmp_path: Path,
) -> None:
    """A real supervisor that fails a task on its first counted release (max_attempts 1): the
    refused step is released again and again, uncounted, and its task waits."""
    marker = tmp_path / "ran"
    model_app = create_app(
        scenario=read_scenario(
            {
                "turns": [
                    {
                        "name": "run",
                        "assistant_turns": 0,
                        "tool_calls": [{"name": "run", "arguments": {"command": touch(marker)}}],
                    },
                    {"name": "done", "assistant_turns": 1, "text": "done"},
                ]
            }
        )
    )
    payload = {"messages": ASK, "allowed_commands": [touch(marker)]}
    plan = {
        "idempotency_key": "k",
        "plan": {"steps": [{"name": "fix", "kind": "agent", "payload": payload}]},
    }
    async with open_api(tmp_path / "api.db", FakeClock(), max_attempts=1) as api:
        task = await submitted(api, plan)
        token = tmp_path / "runner-token"
        token.write_text(api.secrets["runner"] + "\n")
        cfg = settings(token_file=token, claim_wait_s=0.05, pause_initial_s=0.05)
        clock = LoopClock()
        runner = Runner(
            settings=cfg,
            supervisor=SupervisorClient(
                base_url=cfg.supervisor_url,
                token=api.secrets["runner"],
                clock=clock,
                transport=httpx.ASGITransport(app=api.app),
            ),
            model=ModelClient(
                base_url=cfg.model_url, clock=clock, transport=httpx.ASGITransport(app=model_app)
            ),
            model_key=SecretSource(
                path=None, credential="model-key", setting="model_key_file", optional=True
            ),
            kinds=KindRegistry([("agent", agent(tmp_path, allowed=False))]),
            clock=clock,
            backoff_max_s=0.05,
        )
        view: Any = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run)
            with anyio.fail_after(30):
                while len(released(view)) < 2 and (view is None or view["state"] != "FAILED"):
                    await anyio.sleep(0.02)
                    path = f"/v1/tasks/{task['id']}"
                    view = (await api.client.get(path, headers=api.operator)).json()
            runner.request_shutdown()

    assert view["state"] not in ("FAILED", "SUCCEEDED"), view
    assert len(released(view)) >= 2  # more than max_attempts: none of them counted
    assert {a["reason"] for a in released(view)} == {f"operator: {refusal(WHY)}"}
    assert not marker.exists()
    assert model_app.state.turns == []  # the model was never asked
