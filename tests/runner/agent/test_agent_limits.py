"""Limits on every agent command (issue 22, item 4), with real processes, with and without
bubblewrap: a fork storm, a memory balloon, an oversized write and a CPU spinner each run into
their limit and the model is told so in the tool result; a `setsid` daemon does not outlive its
command; a step goes on after its commands hit their limits, and one whose command fills the
worktree past `worktree_max_mb` fails `worktree_too_large`.

Every storm here is bounded by the test itself (at most `FORKS` processes, `BALLOON_MB` of
memory, `WRITE_MB` on disk), so that without the limits it ends too, only bigger.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

from tests.agent_repos import make_origin
from tests.agent_services import FakeServices, ScriptedChat, call, lease_repository
from tests.runner.agent.test_agent_checks import ASK, FIXED, TESTS
from tests.runner.agent.test_agent_tools import (
    PYTHON_TREES,
    _with_marker,
    py,
    workspace,  # noqa: F401 (a fixture)
)
from tests.runner.agent.test_agent_tools import call as call_tool
from tests.runner.test_model_apis_processes import submit
from tests.runner.test_runner_processes import Cluster, wait_for
from tether.runner.agent import (
    AgentKind,
    Bubblewrap,
    NoSandbox,
    Sandbox,
    ToolBox,
    ToolLimits,
    Workspace,
    confine,
)
from tether.runner.agent import cgroups as cg
from tether.runner.agent.confine import CommandLimits, Confiner, host_cgroups
from tether.runner.agent.errors import WorktreeTooLarge
from tether.runner.agent.sandbox import detect_sandbox, private_tmp
from tether.runner.errors import StepRejected
from tether.runner.kinds.base import StepContext

FORKS = 600
BALLOON_MB = 1536
WRITE_MB = 64
RUN_TIMEOUT_S = 60.0
TIGHT = CommandLimits(max_processes=32, max_memory_mb=256, max_file_mb=16, max_cpu_s=1)

FORK_STORM = """
import os, sys, time
made = 0
for _ in range(FORKS):
    try:
        pid = os.fork()
    except OSError as exc:
        print("fork refused after", made, exc.strerror, flush=True)
        break
    if pid == 0:
        time.sleep(120)  # MARKER
        os._exit(0)
    made += 1
print("forked", made, flush=True)
""".replace("FORKS", str(FORKS))

BALLOON = f"""
held = []
for mb in range(64, {BALLOON_MB} + 1, 64):
    held.append(b"x" * (64 * 1024 * 1024))
    print("holding", mb, flush=True)
print("ballooned", flush=True)
"""

BIG_WRITE = f"""
with open("big.bin", "wb") as out:
    for mb in range({WRITE_MB}):
        out.write(b"x" * (1024 * 1024))
        out.flush()
print("wrote", {WRITE_MB}, flush=True)
"""

SPINNER = "while True: pass"

# Starts a daemon in a session of its own (setsid), which forks again and sleeps, and exits.
SETSID_DAEMON = """
import os, subprocess, sys
daemon = "import os, time\\nif os.fork() == 0: time.sleep(120)  # MARKER"
subprocess.Popen([sys.executable, "-c", daemon], start_new_session=True)
print("daemon started", flush=True)
"""


async def sandboxes() -> list[Sandbox]:
    found = await detect_sandbox(PYTHON_TREES)
    return [NoSandbox()] + ([found] if isinstance(found, Bubblewrap) else [])


def toolbox(ws: Workspace, *commands: str, sandbox: Sandbox, confiner: Confiner) -> ToolBox:
    """A box whose commands time out after `RUN_TIMEOUT_S`: a limit that does not hold shows
    as a timeout, not as a test that hangs."""
    return ToolBox(
        ws.tree,
        git=ws.git,
        home=ws.home,
        allowed_paths=["src/"],
        allowed_commands=commands,
        sandbox=sandbox,
        limits=ToolLimits(run_timeout_s=RUN_TIMEOUT_S),
        confiner=confiner,
    )


def bounded_processes() -> Confiner:
    """The tight limits where something bounds a root command's processes; else skip."""
    if os.geteuid() == 0 and host_cgroups() is None:
        pytest.skip("as root with no usable cgroup nothing bounds a command's processes")
    return Confiner(TIGHT)


async def no_marker_left(marker: str) -> list[int]:
    """The processes still carrying `marker` once SIGKILL has had time to land."""
    with anyio.move_on_after(5):
        while _with_marker(marker):  # noqa: ASYNC110 (other processes, no event)
            await anyio.sleep(0.05)
    return _with_marker(marker)


async def test_a_fork_storm_runs_into_its_process_limit_and_leaves_nothing(
    workspace: Workspace,  # noqa: F811
) -> None:
    confiner = bounded_processes()
    for sandbox in await sandboxes():
        marker = uuid.uuid4().hex
        command = py(FORK_STORM.replace("MARKER", marker))
        box = toolbox(workspace, command, "true", sandbox=sandbox, confiner=confiner)
        result, body = await call_tool(box, "run", command=command)
        assert result.ok, body
        assert "fork refused after" in body["output"], (sandbox.name, body)
        made = int(body["output"].split("fork refused after")[1].split()[0])
        assert made < TIGHT.max_processes, body
        if host_cgroups() is not None:
            assert body["limit_hit"] == "processes", body
            assert body["limits"]["max_processes"] == TIGHT.max_processes
        assert await no_marker_left(marker) == [], sandbox.name
        # The box serves the next command as before.
        _, after = await call_tool(box, "run", command="true")
        assert after["exit_code"] == 0, after


async def test_a_memory_balloon_runs_into_its_memory_limit(
    workspace: Workspace,  # noqa: F811
) -> None:
    command = py(BALLOON)
    for sandbox in await sandboxes():
        box = toolbox(workspace, command, sandbox=sandbox, confiner=Confiner(TIGHT))
        result, body = await call_tool(box, "run", command=command)
        assert result.ok, body
        assert "ballooned" not in body["output"], (sandbox.name, body["output"][-300:])
        assert body["exit_code"] != 0
        assert "MemoryError" in body["output"] or body.get("limit_hit") == "memory", body


async def test_an_oversized_write_stops_at_the_file_size_limit(
    workspace: Workspace,  # noqa: F811
) -> None:
    command = py(BIG_WRITE)
    for sandbox in await sandboxes():
        box = toolbox(workspace, command, sandbox=sandbox, confiner=Confiner(TIGHT))
        result, body = await call_tool(box, "run", command=command)
        assert result.ok, body
        assert "File too large" in body["output"], (sandbox.name, body)
        assert (workspace.tree / "big.bin").stat().st_size <= TIGHT.max_file_mb * 1024 * 1024
        (workspace.tree / "big.bin").unlink()


async def test_what_a_command_writes_to_tmp_counts_toward_the_worktree_limit(
    workspace: Workspace,  # noqa: F811
) -> None:
    """Under bubblewrap /tmp is a folder on disk beside HOME (`private_tmp`), not a tmpfs:
    memory no rlimit counts. Found by attack: 3 x 700 MB in a tmpfs /tmp passed a 256 MB
    memory limit where no cgroup bounds the command."""
    [*_, sandbox] = await sandboxes()
    if not isinstance(sandbox, Bubblewrap):
        pytest.skip("bubblewrap is not installed or cannot create namespaces here")
    fill = py("for n in range(3): open(f'/tmp/fill-{n}.bin', 'wb').write(b'x' * 3 * 1024 * 1024)")
    limits = CommandLimits(max_file_mb=4, worktree_max_mb=8)
    box = toolbox(workspace, fill, sandbox=sandbox, confiner=Confiner(limits, cgroups=lambda: None))
    with pytest.raises(WorktreeTooLarge, match="worktree_too_large: "):
        await box.call("run", json.dumps({"command": fill}))
    written = {p.name for p in private_tmp(workspace.home).iterdir()}
    assert {"fill-0.bin", "fill-1.bin", "fill-2.bin"} <= written  # on disk, outside the tree
    assert not (workspace.tree / "fill-0.bin").exists()


async def test_a_cpu_spinner_is_stopped_at_its_cpu_limit(
    workspace: Workspace,  # noqa: F811
) -> None:
    command = py(SPINNER)
    for sandbox in await sandboxes():
        box = toolbox(workspace, command, sandbox=sandbox, confiner=Confiner(TIGHT))
        _, body = await call_tool(box, "run", command=command)
        # bubblewrap reports its child's signal as 128 + its number
        assert body["exit_code"] in (-signal.SIGXCPU, 128 + signal.SIGXCPU), (sandbox.name, body)
        assert body["limit_hit"] == "cpu"
        assert body["timed_out"] is False


@pytest.mark.parametrize("with_cgroup", [True, False], ids=["cgroup", "reaper-only"])
async def test_a_setsid_daemon_does_not_outlive_its_command(
    workspace: Workspace,  # noqa: F811
    with_cgroup: bool,
) -> None:
    confiner = Confiner(TIGHT) if with_cgroup else Confiner(TIGHT, cgroups=lambda: None)
    for sandbox in await sandboxes():
        marker = uuid.uuid4().hex
        command = py(SETSID_DAEMON.replace("MARKER", marker))
        box = toolbox(workspace, command, sandbox=sandbox, confiner=confiner)
        result, body = await call_tool(box, "run", command=command)
        assert result.ok, body
        assert (body["exit_code"], body["output"]) == (0, "daemon started\n"), body
        assert await no_marker_left(marker) == [], sandbox.name


def context(
    chat: ScriptedChat, services: FakeServices, tmp_path: Path, *commands: str
) -> StepContext:
    origin, base = make_origin(tmp_path / "origin")
    repo = lease_repository(str(origin), base, checks={"tests": TESTS})
    payload = {"messages": ASK, "allowed_commands": list(commands)}
    return StepContext(
        step_id="step-1",
        task_id="task-1",
        name="fix",
        attempt=1,
        fence=1,
        payload=payload,
        outputs=(),
        default_model="m",
        chat=chat,
        repository=repo,
        services=services,
    )


async def agent(tmp_path: Path, limits: CommandLimits) -> AgentKind:
    found = await detect_sandbox(PYTHON_TREES)
    return AgentKind(
        cache_dir=tmp_path / "cache",
        sandbox=found,
        commands_without_sandbox=True,
        command_limits=limits,
    )


async def test_a_step_goes_on_after_its_commands_hit_their_limits(tmp_path: Path) -> None:
    bounded_processes()
    storm, balloon = py(FORK_STORM.replace("MARKER", uuid.uuid4().hex)), py(BALLOON)
    chat = ScriptedChat(
        [call("run", command=storm)],
        [call("run", command=balloon)],
        [call("write_file", path="src/app.py", content=FIXED)],
        [call("run", command=TESTS)],
        "fixed",
    )
    services = FakeServices()
    done = await (await agent(tmp_path, TIGHT))(
        context(chat, services, tmp_path, storm, balloon, TESTS)
    )
    stormed, ballooned, _, tested = (chat.tool_results(n)[0] for n in (1, 2, 3, 4))
    assert "fork refused after" in stormed["output"], stormed
    assert "ballooned" not in ballooned["output"]
    assert tested["exit_code"] == 0, tested
    assert done.output["finish"] == "answered"
    assert done.candidate_sha is not None
    assert done.checks["tests"].exit_code == 0


async def test_a_command_that_fills_the_worktree_fails_the_step_by_name(tmp_path: Path) -> None:
    # Four files of 3 MB each: every one within max_file_mb, together past worktree_max_mb.
    fill = py("for n in range(4): open(f'fill-{n}.bin', 'wb').write(b'x' * 3 * 1024 * 1024)")
    chat = ScriptedChat([call("run", command=fill)], "never asked")
    limits = CommandLimits(max_file_mb=4, worktree_max_mb=8)
    with pytest.raises(StepRejected) as failed:
        await (await agent(tmp_path, limits))(context(chat, FakeServices(), tmp_path, fill))
    assert failed.value.detail.startswith("worktree_too_large: "), failed.value.detail
    assert "worktree_max_mb is 8" in failed.value.detail
    assert len(chat.requests) == 1  # the model was not asked again


def test_a_delegated_cgroup_v2_is_used_with_the_runner_moved_into_a_leaf(
    tmp_path: Path,
) -> None:
    """cgroup v2 is not what this machine offers (it has v1), so its folders are imitated:
    the runner moves itself into a leaf, enables the controllers for its siblings, and each
    command's cgroup gets its limits."""
    mount = tmp_path / "cgroup"
    own = mount / "system.slice" / "runner.service"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text("")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"30 25 0:26 / {mount} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        "31 25 0:27 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    )
    own_file = tmp_path / "own"
    own_file.write_text("0::/system.slice/runner.service\n")
    found, why = cg.find_cgroups(mountinfo, own_file)
    assert found is not None, why
    assert (found.version, found.controllers) == (2, ("memory", "pids"))
    leaf = own / f"runner-{os.getpid()}"
    assert (leaf / "cgroup.procs").read_text() == str(os.getpid())
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids"
    group = found.create(max_processes=32, max_memory_bytes=256 * 1024 * 1024)
    (folder,) = group.folders
    assert folder.parent == own
    assert (folder / "pids.max").read_text() == "32"
    assert (folder / "memory.max").read_text() == str(256 * 1024 * 1024)
    assert group.procs == (folder / "cgroup.procs",)


async def test_a_root_command_whose_cgroup_cannot_be_made_is_refused_not_run_unbounded(
    workspace: Workspace,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host offers cgroups, but this command's cannot be made (here its parent is gone,
    as after a sweep): as root nothing else bounds its processes, so it is not run, and the
    model and the log are told why. Where rlimits bound processes (not root) it runs."""
    broken = cg.Cgroups(1, {"pids": workspace.home.parent / "gone"})
    confiner = Confiner(TIGHT, cgroups=lambda: broken)
    command = "touch ran"
    box = toolbox(workspace, command, sandbox=NoSandbox(), confiner=confiner)
    monkeypatch.setattr(confine, "rlimits_bound_processes", lambda: False)
    with capture_logs() as logged:
        result, body = await call_tool(box, "run", command=command)
    assert (result.ok, body["error"]) == (False, "command_unbounded"), body
    assert "could not make this command's cgroup (No such file or directory)" in body["detail"]
    assert not (workspace.tree / "ran").exists()
    assert [e["log_level"] for e in logged if e["event"].startswith("command refused")] == ["error"]
    monkeypatch.setattr(confine, "rlimits_bound_processes", lambda: True)
    with capture_logs() as logged:
        result, body = await call_tool(box, "run", command=command)
    assert (result.ok, body["exit_code"]) == (True, 0), body
    assert (workspace.tree / "ran").exists()
    assert any(e["event"].startswith("no cgroup for this command") for e in logged), logged


def test_commands_asking_at_once_share_one_cgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Concurrent steps' first commands ask for the host's cgroups from two threads at once:
    one `Cgroups` answers both, so their command cgroups never share a name (two each named
    their first `cmd-<pid>-1`, and the second command ran without one)."""

    def slow_find() -> tuple[cg.Cgroups, str]:
        time.sleep(0.2)
        return cg.Cgroups(1, {}), "imitated"

    monkeypatch.setattr(cg, "find_cgroups", slow_find)
    confine._find_host_cgroups.cache_clear()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first, second = pool.map(lambda _: host_cgroups(), range(2))
    finally:
        confine._find_host_cgroups.cache_clear()  # the next test finds the real ones
    assert first is second


def test_a_command_cgroup_name_left_by_an_earlier_process_is_skipped(tmp_path: Path) -> None:
    """A killed runner's command cgroup stays until swept, and a later runner may get its
    pid: the name it left is taken, the next one is used."""
    found = cg.Cgroups(2, {"pids": tmp_path})
    (tmp_path / f"cmd-{os.getpid()}-1").mkdir()
    group = found.create(max_processes=32, max_memory_bytes=256 * 1024 * 1024)
    assert group.folders == (tmp_path / f"cmd-{os.getpid()}-2",)
    assert (tmp_path / f"cmd-{os.getpid()}-2" / "pids.max").read_text() == "32"


def test_no_usable_cgroup_is_said_with_the_reason(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("22 1 0:21 / /proc rw - proc proc rw\n")
    own = tmp_path / "own"
    own.write_text("0::/\n")
    found, why = cg.find_cgroups(mountinfo, own)
    assert found is None
    assert why == "no cgroup v2 with the pids or memory controller"


def test_the_limits_are_the_runner_settings_rlimits() -> None:
    rlimits = CommandLimits().rlimits()
    assert rlimits["RLIMIT_NPROC"] == (256, 256)
    assert rlimits["RLIMIT_AS"] == (2048 * 1024 * 1024,) * 2
    assert rlimits["RLIMIT_FSIZE"] == (1024 * 1024 * 1024,) * 2
    assert rlimits["RLIMIT_CPU"] == (600, 601)
    assert json.dumps(CommandLimits().as_dict())


def ran(name: str, turn: int, command: str, **match: str) -> dict[str, object]:
    """A stand-in turn that runs `command` as the `turn`-th answer."""
    call = {"name": "run", "arguments": {"command": command}}
    return {"name": name, "assistant_turns": turn, "tool_calls": [call], **match}


@pytest.mark.slow
def test_a_runner_process_serves_on_after_its_commands_hit_their_limits(tmp_path: Path) -> None:
    """A real supervisor, stand-in model and runner (limits from its TETHER_* settings): an
    agent step whose commands storm, balloon and write past their limits SUCCEEDS with the hits
    in its transcript; one that fills the worktree FAILS `worktree_too_large`; a chat task
    after both succeeds on the same runner process."""
    bounded_processes()
    storm, balloon = py(FORK_STORM.replace("MARKER", uuid.uuid4().hex)), py(BALLOON)
    big = py(BIG_WRITE)
    fill = py("for n in range(4): open(f'fill-{n}.bin', 'wb').write(b'x' * 3 * 1024 * 1024)")
    scenario = {
        "turns": [
            ran("storm", 0, storm, last_contains="Storm"),
            ran("balloon", 1, balloon),
            ran("big", 2, big),
            {"name": "done", "assistant_turns": 3, "text": "survived"},
            ran("fill", 0, fill, last_contains="Fill"),
        ]
    }
    cluster = Cluster(tmp_path)
    try:
        cluster.start_supervisor()
        cluster.start_model()
        answer = httpx.post(f"{cluster.model_url}/_admin/scenario", json=scenario, trust_env=False)
        assert answer.status_code == 200, answer.text
        runner = cluster.start_runner(
            "r1",
            XDG_CACHE_HOME=str(tmp_path / "cache"),
            TETHER_COMMANDS_WITHOUT_SANDBOX="true",  # used only where bwrap does not work
            TETHER_COMMAND_MAX_PROCESSES=str(TIGHT.max_processes),
            TETHER_COMMAND_MAX_MEMORY_MB=str(TIGHT.max_memory_mb),
            TETHER_COMMAND_MAX_FILE_MB="4",
            TETHER_WORKTREE_MAX_MB="8",
        )

        def agent(key: str, ask: str, commands: list[str]) -> str:
            payload = {"messages": [{"role": "user", "content": ask}], "allowed_commands": commands}
            return submit(cluster, key, {"name": "work", "kind": "agent", "payload": payload})

        stormy = agent("stormy", "Storm, balloon and write.", [storm, balloon, big])
        filling = agent("filling", "Fill the tree.", [fill])
        ended = ("SUCCEEDED", "FAILED")
        for task_id in (stormy, filling):
            wait_for(lambda t=task_id: cluster.state(t) in ended, "the task", 120, cluster)
        assert cluster.state(stormy) == "SUCCEEDED", cluster.task(stormy)
        output = cluster.task(stormy)["steps"][0]["output"]
        results = [
            json.loads(e["content"])["output"]
            for e in output["transcript"]
            if e.get("role") == "tool"
        ]
        assert "fork refused after" in results[0], results[0]
        assert "ballooned" not in results[1]
        assert "File too large" in results[2], results[2]
        failed = cluster.task(filling)
        assert failed["state"] == "FAILED"
        assert "worktree_too_large" in json.dumps(failed), failed
        still = {"messages": [{"role": "user", "content": "still there?"}]}
        chat = submit(cluster, "chat", {"name": "ask", "kind": "chat", "payload": still})
        wait_for(lambda: cluster.state(chat) == "SUCCEEDED", "the chat task", 60, cluster)
        assert runner.popen.poll() is None  # the same runner process served all three
        cluster.check_ledger()
    finally:
        cluster.stop_all()


def test_a_gone_runners_cgroups_are_swept_with_what_is_left_in_them(tmp_path: Path) -> None:
    """A runner killed outright leaves its cgroup folders, and perhaps a command's process
    in one: the next runner's first look at the cgroups kills it and removes them."""
    found = host_cgroups()
    if found is None or found.version != 1:
        pytest.skip("needs cgroup v1 folders this user may make (as root on a v1 host)")
    probe = subprocess.Popen(["true"])
    probe.wait()
    dead = probe.pid  # a pid no process holds now
    parent = found.parents["pids"].parent / f"tether-runner-{dead}"
    command = parent / f"cmd-{dead}-1"
    command.mkdir(parents=True)
    left = subprocess.Popen(["sleep", "120"])
    try:
        (command / "cgroup.procs").write_text(str(left.pid))
        cg.sweep(parent.parent, "tether-runner-")
        assert left.wait(timeout=10) == -signal.SIGKILL
        assert not parent.exists()
    finally:
        left.kill()
        left.wait()
        if command.exists():
            command.rmdir()
            parent.rmdir()
