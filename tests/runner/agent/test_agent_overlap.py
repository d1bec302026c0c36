"""What an agent step does beside its model calls (issue 17, item 3): the worktree's checkout
beside the first model call, and each turn's checkpoint sent beside the next one, with their
ordering rules: the first tool call (and a resume's changes) wait for the checkout, a failed
checkout fails the step, checkpoints are recorded one after the other in turn order, the step
ends only once the last one is recorded, one that fails is logged and the step goes on, and
a cancelled step finishes them within their bound."""

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
from tether.git import GitError, GitOutput, TreeGit
from tether.runner.agent import AgentKind, NoSandbox, WorkspaceFailed
from tether.runner.agent import checkpoints as checkpoints_module
from tether.runner.agent import workspace as workspace_module
from tether.runner.errors import SupervisorUnreachable
from tether.runner.kinds.base import StepContext, StepOutput
from tether.runner.model_client import Completion
from tether.wire.records import Checkpoint, LeaseRepository, ResumePoint

ASK = [{"role": "user", "content": "Make the test pass."}]


class HangingChat(ScriptedChat):
    """A `ScriptedChat` whose every request after its scripted turns waits until cancelled."""

    def __init__(self, *turns: Any) -> None:
        super().__init__(*turns)
        self.cancelled = 0

    async def __call__(self, body: dict[str, Any]) -> Completion:
        if len(self.requests) < len(self.turns):
            return await super().__call__(body)
        self.requests.append(body)
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        raise AssertionError("unreachable")


class Gate:
    """Holds the worktree's checkout (`git worktree add`) until `open` is set, then runs it,
    or fails it when `fail` is set; `events` tells the order of what happened."""

    def __init__(self, events: list[str]) -> None:
        self.open = anyio.Event()
        self.fail = False
        self.events = events

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = workspace_module.git  # type: ignore[attr-defined]

        async def git(*args: str, **kwargs: Any) -> GitOutput:
            if args[:2] == ("worktree", "add"):
                await self.open.wait()
                if self.fail:
                    raise GitError(args, 128, "fatal: no space left on device")
                done = await real(*args, **kwargs)
                self.events.append("checked out")
                return done
            return await real(*args, **kwargs)

        monkeypatch.setattr(workspace_module, "git", git)


class OpeningChat(ScriptedChat):
    """A `ScriptedChat` that notes each request in `events` and opens `gate` at the first."""

    def __init__(self, gate: Gate, *turns: Any) -> None:
        super().__init__(*turns)
        self.gate = gate

    async def __call__(self, body: dict[str, Any]) -> Completion:
        self.gate.events.append(f"model call {len(self.requests) + 1}")
        self.gate.open.set()
        return await super().__call__(body)


class LoggingServices(FakeServices):
    """`FakeServices` that log uploads and the start and end of each checkpoint's record,
    with a delay per turn and a failure for the turns in `failing`."""

    def __init__(self, delays: dict[int, float] | None = None) -> None:
        super().__init__()
        self.log: list[str] = []
        self.delays = delays or {}
        self.failing: set[int] = set()

    async def upload(self, data: bytes | Path) -> str:
        self.log.append("upload")
        return await super().upload(data)

    async def checkpoint(self, checkpoint: Checkpoint) -> None:
        self.log.append(f"record {checkpoint.turn}")
        await anyio.sleep(self.delays.get(checkpoint.turn, 0.0))
        if checkpoint.turn in self.failing:
            self.log.append(f"refused {checkpoint.turn}")
            raise SupervisorUnreachable("no answer")
        self.checkpoints.append(checkpoint)
        self.log.append(f"recorded {checkpoint.turn}")


def context(
    chat: Any,
    services: FakeServices,
    repo: LeaseRepository | None,
    *,
    fence: int = 1,
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


@pytest.fixture
def origin(tmp_path: Path) -> LeaseRepository:
    url, base = make_origin(tmp_path / "origin")
    return lease_repository(str(url), base)


def agent_kind(tmp_path: Path) -> AgentKind:
    return AgentKind(
        cache_dir=tmp_path / "cache", sandbox=NoSandbox(), commands_without_sandbox=True
    )


def leftovers(tmp_path: Path) -> list[str]:
    folder = tmp_path / "cache" / "attempts"
    return [p.name for p in folder.iterdir()] if folder.is_dir() else []


def files_of(tmp_path: Path, repo: LeaseRepository, sha: str) -> list[str]:
    mirror = AgentKind(cache_dir=tmp_path / "cache").cache.mirror_path(repo.url)
    return sh("git", "ls-tree", "-r", "--name-only", sha, cwd=mirror).split()


async def test_the_first_model_call_is_made_before_the_checkout_and_the_first_tool_waits(
    tmp_path: Path, origin: LeaseRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    gate = Gate(events)
    gate.install(monkeypatch)  # the checkout starts only once the model was asked
    chat = OpeningChat(gate, [call("list_files", path="src")], "done")
    with anyio.fail_after(20):
        done = await agent_kind(tmp_path)(context(chat, FakeServices(), origin))
    assert events[:3] == ["model call 1", "checked out", "model call 2"]
    (listed,) = chat.tool_results(1)
    assert listed["entries"] == ["src/app.py"]  # the tool ran in the finished worktree
    assert done.output["tool_errors"] == 0
    assert leftovers(tmp_path) == []


async def test_a_resume_without_changes_asks_the_model_before_the_checkout(
    tmp_path: Path, origin: LeaseRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = FakeServices()
    transcript = await services.upload(json.dumps(ASK).encode())
    resume = ResumePoint(turn=1, fence=1, transcript=transcript, usage=USAGE)
    events: list[str] = []
    gate = Gate(events)
    gate.install(monkeypatch)
    chat = OpeningChat(gate, [call("read_file", path="src/app.py")], "done")
    with anyio.fail_after(20):
        done = await agent_kind(tmp_path)(context(chat, services, origin, fence=2, resume=resume))
    assert events[:2] == ["model call 1", "checked out"]
    assert done.output["resumed_from"] == {"turn": 1, "fence": 1}
    (read,) = chat.tool_results(1)
    assert "return 41" in read["content"]


async def test_a_failed_checkout_fails_the_step_and_stops_the_model_call(
    tmp_path: Path, origin: LeaseRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    gate = Gate(events)
    gate.fail = True
    gate.install(monkeypatch)
    chat = HangingChat()  # its first call waits until cancelled

    async def opener() -> None:
        while not chat.requests:  # noqa: ASYNC110 (the chat has no event of its own)
            await anyio.sleep(0.01)
        gate.open.set()

    failures: list[WorkspaceFailed] = []
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(opener)
            try:
                await agent_kind(tmp_path)(context(chat, FakeServices(), origin))
            except WorkspaceFailed as exc:
                failures.append(exc)
    (failure,) = failures
    assert "no space left" in str(failure)
    assert chat.cancelled == 1
    assert "checked out" not in events
    assert leftovers(tmp_path) == []


async def test_the_next_model_call_does_not_wait_for_the_checkpoint_but_the_step_does(
    tmp_path: Path, origin: LeaseRepository
) -> None:
    services = LoggingServices(delays={1: 0.5})
    asked_with: list[int] = []

    class Watching(ScriptedChat):
        async def __call__(self, body: dict[str, Any]) -> Completion:
            asked_with.append(len(services.checkpoints))
            return await super().__call__(body)

    chat = Watching([call("write_file", path="src/a.py", content="A = 1\n")], "done")
    done = await agent_kind(tmp_path)(context(chat, services, origin))
    assert asked_with == [0, 0]  # the second call went out before turn 1 was recorded
    (cp,) = services.checkpoints  # ... and the step ended only once it was
    assert cp.turn == 1
    assert cp.sha is not None
    assert "src/a.py" in files_of(tmp_path, origin, cp.sha)
    assert done.candidate_sha is not None


async def test_the_next_turns_tools_wait_for_the_last_turns_snapshot(
    tmp_path: Path, origin: LeaseRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    model_asked = anyio.Event()
    real = TreeGit.__call__

    async def git(self: TreeGit, *args: str, **kwargs: Any) -> GitOutput:
        if "add" in args:  # held until the next model call
            await model_asked.wait()
            done = await real(self, *args, **kwargs)
            events.append("staged")
            return done
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(TreeGit, "__call__", git)

    class Noting(ScriptedChat):
        async def __call__(self, body: dict[str, Any]) -> Completion:
            events.append(f"model call {len(self.requests) + 1}")
            if len(self.requests) == 1:
                model_asked.set()
            return await super().__call__(body)

    services = FakeServices()
    chat = Noting(
        [call("write_file", path="src/a.py", content="A = 1\n")],
        [call("write_file", path="src/a.py", content="A = 2\n")],
        "done",
    )
    with anyio.fail_after(20):
        await agent_kind(tmp_path)(context(chat, services, origin))
    assert events[:3] == ["model call 1", "model call 2", "staged"]
    mirror = AgentKind(cache_dir=tmp_path / "cache").cache.mirror_path(origin.url)
    one, two = services.checkpoints
    # Turn 2's write waited: turn 1's checkpoint holds the file as turn 1 left it.
    assert sh("git", "show", f"{one.sha}:src/a.py", cwd=mirror) == "A = 1\n"
    assert sh("git", "show", f"{two.sha}:src/a.py", cwd=mirror) == "A = 2\n"


async def test_checkpoints_are_recorded_one_after_the_other_in_turn_order(
    tmp_path: Path, origin: LeaseRepository
) -> None:
    # Turn 1's record is slow, the later ones fast: sent at once they would overtake it.
    services = LoggingServices(delays={1: 0.4, 2: 0.0, 3: 0.1})
    chat = ScriptedChat(
        [call("write_file", path="src/a.py", content="A = 1\n")],
        [call("write_file", path="src/b.py", content="B = 2\n")],
        [call("list_files", path="src")],
        "done",
    )
    done = await agent_kind(tmp_path)(context(chat, services, origin))
    assert [c.turn for c in services.checkpoints] == [1, 2, 3]
    records = [e for e in services.log if e.startswith("record")]
    assert records == ["record 1", "recorded 1", "record 2", "recorded 2", "record 3", "recorded 3"]
    # Nothing of turn N+1's checkpoint was uploaded while turn N's was being recorded.
    for turn in (1, 2):
        start, end = services.log.index(f"record {turn}"), services.log.index(f"recorded {turn}")
        assert "upload" not in services.log[start:end]
    # Each checkpoint holds every change so far though each turn added only its own file;
    # turn 3 changed nothing, so its bundle is turn 2's.
    one, two, three = services.checkpoints
    assert "src/b.py" not in files_of(tmp_path, origin, one.sha or "")
    assert {"src/a.py", "src/b.py"} <= set(files_of(tmp_path, origin, two.sha or ""))
    assert (three.sha, three.bundle) == (two.sha, two.bundle)
    assert done.output["turns"] == 4


async def test_a_failed_checkpoint_is_logged_and_the_next_one_stands(
    tmp_path: Path, origin: LeaseRepository
) -> None:
    services = LoggingServices()
    services.failing = {1}
    chat = ScriptedChat(
        [call("write_file", path="src/a.py", content="A = 1\n")],
        [call("write_file", path="src/b.py", content="B = 2\n")],
        "done",
    )
    done = await agent_kind(tmp_path)(context(chat, services, origin))
    assert "refused 1" in services.log
    (cp,) = services.checkpoints
    assert cp.turn == 2
    assert {"src/a.py", "src/b.py"} <= set(files_of(tmp_path, origin, cp.sha or ""))
    assert cp.bundle in services.store
    assert done.output["finish"] == "answered"
    assert done.candidate_sha is not None


async def test_a_turn_that_ran_a_command_checkpoints_what_the_command_wrote(
    tmp_path: Path, origin: LeaseRepository
) -> None:
    generate = shlex.join([sys.executable, "-c", "open('src/gen.py', 'w').write('G = 1\\n')"])
    services = FakeServices()
    chat = ScriptedChat([call("run", command=generate)], "done")
    payload = {"messages": ASK, "allowed_commands": [generate]}
    await agent_kind(tmp_path)(context(chat, services, origin, payload=payload))
    (cp,) = services.checkpoints
    assert "src/gen.py" in files_of(tmp_path, origin, cp.sha or "")


async def test_a_resumed_attempt_checkpoints_the_resumed_changes_with_its_own(
    tmp_path: Path, origin: LeaseRepository
) -> None:
    services = FakeServices()
    agent = agent_kind(tmp_path)
    first = HangingChat([call("write_file", path="src/a.py", content="A = 1\n")])
    with anyio.move_on_after(5) as scope:
        await agent(context(first, services, origin, fence=1))
    assert scope.cancelled_caught  # stopped during its second model call
    resume = services.resume_point()
    second = ScriptedChat([call("write_file", path="src/b.py", content="B = 2\n")], "done")
    await agent(context(second, services, origin, fence=2, resume=resume))
    last = services.checkpoints[-1]
    assert (last.fence, last.turn) == (2, 2)
    assert {"src/a.py", "src/b.py"} <= set(files_of(tmp_path, origin, last.sha or ""))


async def test_a_cancelled_step_gives_up_a_hanging_checkpoint_within_its_bound(
    tmp_path: Path, origin: LeaseRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "CHECKPOINT_TIMEOUT_S", 1.0)
    services = FakeServices()
    services.checkpoint_delay_s = 60  # the supervisor never answers
    chat = HangingChat([call("write_file", path="src/a.py", content="A = 1\n")])
    outputs: list[StepOutput] = []

    async def work() -> None:
        outputs.append(await agent_kind(tmp_path)(context(chat, services, origin)))

    started = anyio.current_time()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(work)
            await services.checkpoint_started.wait()
            tg.cancel_scope.cancel()  # SIGTERM while turn 1's checkpoint is on its way
    assert anyio.current_time() - started < 5
    assert outputs == []
    assert services.checkpoints == []
    assert chat.cancelled == 1
    assert leftovers(tmp_path) == []
