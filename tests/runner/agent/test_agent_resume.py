"""Per-turn checkpoints and the resume from one (issue 12, item 7), on real git repositories with
in-memory services: what a checkpoint holds, that a replayed attempt starts from a fresh
worktree with only the checkpoint's changes, that the model is not asked again for completed
turns, that a stale checkpoint ends the attempt, and that a broken resume point means a fresh
start, never a failed step."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.agent_repos import make_origin, sh
from tests.agent_services import USAGE, FakeServices, ScriptedChat, call, lease_repository
from tests.runner.agent.test_agent_overlap import HangingChat
from tether.runner.agent import AgentKind, NoSandbox
from tether.runner.errors import LeaseLost, LostBecause
from tether.runner.kinds.base import StepContext, StepOutput
from tether.wire.records import LeaseRepository, ResumePoint

ASK = [{"role": "user", "content": "Make the test pass."}]


def py(code: str) -> str:
    return shlex.join([sys.executable, "-c", code])


def context(
    chat: ScriptedChat,
    services: FakeServices,
    repo: LeaseRepository | None,
    *,
    fence: int,
    resume: ResumePoint | None = None,
    payload: dict[str, Any] | None = None,
) -> StepContext:
    return StepContext(
        step_id="step-1",
        task_id="task-1",
        name="fix",
        attempt=fence,
        fence=fence,
        payload=payload or {"messages": ASK, "allowed_commands": []},
        outputs=(),
        default_model="m",
        chat=chat,
        repository=repo,
        resume=resume,
        services=services,
    )


def leftovers(cache: Path) -> list[str]:
    folder = cache / "attempts"
    return [p.name for p in folder.iterdir()] if folder.is_dir() else []


async def killed_mid_turn(agent: AgentKind, ctx: StepContext, marker: Path) -> None:
    """Run `ctx` until `marker` exists (a command of the second turn is running), then cancel
    it as a lost lease does."""
    outputs: list[StepOutput] = []

    async def work() -> None:
        outputs.append(await agent(ctx))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(work)
            while not await anyio.Path(marker).exists():  # noqa: ASYNC110 (another process)
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    assert outputs == []


async def test_a_replayed_attempt_resumes_from_the_checkpoint_without_asking_again(
    tmp_path: Path,
) -> None:
    origin, base = make_origin(tmp_path / "origin")
    repo = lease_repository(str(origin), base)
    services = FakeServices()
    marker = tmp_path / "running"
    sleeper = py(f"open({str(marker)!r}, 'w').close(); import time; time.sleep(30)")
    remove = py("import os; os.remove('src/app.py')")
    payload = {"messages": ASK, "allowed_commands": [sleeper, remove]}
    first = ScriptedChat(
        [call("write_file", path="src/a.py", content="A = 1\n"), call("run", command=remove)],
        [call("write_file", path="src/b.py", content="B = 2\n"), call("run", command=sleeper)],
    )
    agent = AgentKind(
        cache_dir=tmp_path / "cache", sandbox=NoSandbox(), commands_without_sandbox=True
    )
    await killed_mid_turn(agent, context(first, services, repo, fence=1, payload=payload), marker)

    # Turn 1 completed and was checkpointed; turn 2 was cut short and was not.
    (cp,) = services.checkpoints
    assert (cp.fence, cp.turn, cp.usage, cp.step_usage) == (1, 1, USAGE, USAGE)
    transcript = json.loads(services.store[cp.transcript])
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "tool"]
    assert transcript == first.requests[1]["messages"]
    assert cp.bundle is not None
    assert cp.sha is not None
    assert leftovers(tmp_path / "cache") == []

    second = ScriptedChat([call("list_files", path="src")], "done")
    resume = services.resume_point()
    done = await agent(context(second, services, repo, fence=2, resume=resume, payload=payload))

    # The model was asked for turns 2 and 3 only, the first time with turn 1's messages.
    assert len(second.requests) == 2
    assert second.requests[0]["messages"] == transcript
    # The fresh worktree holds the checkpoint's changes (a new file, a deletion), not the
    # killed attempt's later write.
    (listed,) = second.tool_results(1)
    assert listed["entries"] == ["src/a.py"]
    out = done.output
    assert out["resumed_from"] == {"turn": 1, "fence": 1}
    assert (out["turns"], out["finish"]) == (3, "answered")
    assert out["usage"]["total_tokens"] == 3 * USAGE["total_tokens"]  # the step's
    assert done.usage == {k: 2 * v for k, v in USAGE.items()}  # this attempt's own
    assert out["attempt_usage"] == done.usage
    # Turn 2 was checkpointed under fence 2; the worktree had not changed, so the bundle
    # stands as it was.
    last = services.checkpoints[-1]
    assert (last.fence, last.turn, last.bundle, last.sha) == (2, 2, cp.bundle, cp.sha)
    assert last.step_usage["total_tokens"] == 2 * USAGE["total_tokens"]
    mirror = agent.cache.mirror_path(str(origin))
    candidate = done.candidate_sha
    assert candidate is not None
    changed = sh("git", "diff", "--name-status", base, candidate, cwd=mirror).split("\n")
    assert changed[:2] == ["A\tsrc/a.py", "D\tsrc/app.py"]


async def test_the_step_budget_counts_the_resumed_turns(tmp_path: Path) -> None:
    origin, base = make_origin(tmp_path / "origin")
    repo = lease_repository(str(origin), base)
    services = FakeServices()
    agent = AgentKind(cache_dir=tmp_path / "cache", sandbox=NoSandbox())
    budget = 2 * USAGE["total_tokens"]
    payload = {"messages": ASK, "allowed_commands": [], "max_tokens_total": budget}
    # Attempt 1 does one turn, then its lease is lost during the next model call.
    lost = ScriptedChat([call("list_files")], LeaseLost(LostBecause.EXPIRED))
    with pytest.raises(LeaseLost):
        await agent(context(lost, services, repo, fence=1, payload=payload))
    assert [c.turn for c in services.checkpoints] == [1]

    again = ScriptedChat([call("list_files")], "never asked")
    resume = services.resume_point()
    done = await agent(context(again, services, repo, fence=2, resume=resume, payload=payload))
    assert len(again.requests) == 1  # 15 + 15 reached the budget before a third call
    assert (done.output["finish"], done.output["turns"]) == ("budget", 2)


async def test_a_stale_checkpoint_ends_the_attempt(tmp_path: Path) -> None:
    origin, base = make_origin(tmp_path / "origin")
    repo = lease_repository(str(origin), base)
    services = FakeServices()
    services.stale = True
    services.checkpoint_delay_s = 0.2  # refused while the next model call is on its way
    chat = HangingChat([call("write_file", path="src/a.py", content="A = 1\n")])
    agent = AgentKind(cache_dir=tmp_path / "cache", sandbox=NoSandbox())
    with anyio.fail_after(10), pytest.raises(LeaseLost):
        await agent(context(chat, services, repo, fence=1))
    # The second call was made beside turn 1's checkpoint and cancelled by its refusal.
    assert len(chat.requests) == 2
    assert chat.cancelled == 1
    assert services.checkpoints == []
    assert leftovers(tmp_path / "cache") == []


async def test_a_resume_point_that_cannot_be_read_means_a_fresh_start(tmp_path: Path) -> None:
    origin, base = make_origin(tmp_path / "origin")
    repo = lease_repository(str(origin), base)
    services = FakeServices()
    broken = ResumePoint(turn=1, fence=1, transcript="0" * 64, usage=USAGE)
    chat = ScriptedChat(
        [call("write_file", path="src/a.py", content="A = 1\n")],
        [call("write_file", path="src/a.py", content="A = 2\n")],
        "done",
    )
    agent = AgentKind(cache_dir=tmp_path / "cache", sandbox=NoSandbox())
    done = await agent(context(chat, services, repo, fence=2, resume=broken))

    out = done.output
    assert "resumed_from" not in out
    assert "no artifact" in out["resume_skipped"]
    assert chat.requests[0]["messages"] == ASK  # from the start
    # The lost turn and its tokens still count toward the step (max_turns, budget), and the
    # turns go on from it, so the step's checkpoints never go back.
    assert out["turns"] == 4
    assert out["usage"]["total_tokens"] == 4 * USAGE["total_tokens"]
    assert [c.turn for c in services.checkpoints] == [2, 3]
    assert done.candidate_sha is not None


async def test_a_resume_bundle_that_does_not_apply_means_a_fresh_start(tmp_path: Path) -> None:
    origin, base = make_origin(tmp_path / "origin")
    repo = lease_repository(str(origin), base)
    services = FakeServices()
    transcript = await services.upload(json.dumps(ASK).encode())
    junk = await services.upload(b"not a bundle")
    resume = ResumePoint(turn=1, fence=1, transcript=transcript, bundle=junk, sha="a" * 40)
    chat = ScriptedChat([call("list_files", path="src")], "done")
    agent = AgentKind(cache_dir=tmp_path / "cache", sandbox=NoSandbox())
    done = await agent(context(chat, services, repo, fence=2, resume=resume))
    assert "bundle" in done.output["resume_skipped"]
    (listed,) = chat.tool_results(1)
    assert listed["entries"] == ["src/app.py"]


async def test_a_scratch_step_checkpoints_its_transcript_only(tmp_path: Path) -> None:
    services = FakeServices()
    chat = ScriptedChat([call("write_file", path="notes.txt", content="x")], "done")
    agent = AgentKind(cache_dir=tmp_path / "cache", sandbox=NoSandbox())
    done = await agent(context(chat, services, None, fence=1))
    (cp,) = services.checkpoints
    assert (cp.turn, cp.bundle, cp.sha) == (1, None, None)
    assert json.loads(services.store[cp.transcript])[-1]["role"] == "tool"
    assert done.candidate_sha is None
    assert done.bundle is None


async def test_a_checkpoint_in_flight_is_finished_when_the_step_is_cancelled(
    tmp_path: Path,
) -> None:
    origin, base = make_origin(tmp_path / "origin")
    services = FakeServices()
    services.checkpoint_delay_s = 0.3
    chat = ScriptedChat([call("write_file", path="src/a.py", content="A = 1\n")], "done")
    agent = AgentKind(cache_dir=tmp_path / "cache", sandbox=NoSandbox())
    ctx = context(chat, services, lease_repository(str(origin), base), fence=1)
    outputs: list[StepOutput] = []

    async def work() -> None:
        outputs.append(await agent(ctx))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(work)
            await services.checkpoint_started.wait()
            tg.cancel_scope.cancel()  # SIGTERM, a lost lease or a spent budget
    (cp,) = services.checkpoints
    assert cp.turn == 1
    assert cp.bundle in services.store
    assert outputs == []  # the cancel took effect once the checkpoint was recorded
    assert leftovers(tmp_path / "cache") == []
