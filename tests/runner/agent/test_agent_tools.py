"""The agent's built-in tools on a real worktree: what each does, every refusal (returned to
the model as a tool error, counted, and nothing changed), and `run`: killed with its process
group on timeout and on cancellation, with no secret in its environment, and, under
bubblewrap, with no network and no write outside the worktree."""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import psutil
import pytest

from tests.agent_repos import make_origin, status
from tether.runner.agent import (
    Bubblewrap,
    NoSandbox,
    RepoCache,
    Sandbox,
    ToolBox,
    ToolLimits,
    ToolResult,
    Workspace,
    detect_sandbox,
)
from tether.runner.agent.schemas import ARGUMENTS

# The interpreter and its installation, readable inside bubblewrap (they live outside /usr).
PYTHON_TREES = (Path(sys.prefix), Path(sys.base_prefix))


def py(code: str) -> str:
    """An allowed-command string that runs `code` with this interpreter."""
    return shlex.join([sys.executable, "-c", code])


@pytest.fixture
async def workspace(tmp_path: Path) -> AsyncIterator[Workspace]:
    url, base = make_origin(tmp_path / "origin")
    async with RepoCache(tmp_path / "cache").attempt(url=str(url), base_sha=base, label="t1") as ws:
        yield ws


def toolbox(
    ws: Workspace, *commands: str, sandbox: Sandbox | None = None, **limits: Any
) -> ToolBox:
    return ToolBox(
        ws.tree,
        git=ws.git,
        home=ws.home,
        allowed_paths=["src/"],
        allowed_commands=commands,
        sandbox=sandbox or NoSandbox(),
        limits=ToolLimits(**limits),
    )


async def call(box: ToolBox, name: str, **arguments: Any) -> tuple[ToolResult, Any]:
    result = await box.call(name, json.dumps(arguments))
    return result, json.loads(result.content)


async def test_the_schemas_match_the_argument_records(workspace: Workspace) -> None:
    box = toolbox(workspace, "true")
    tools = {tool["function"]["name"]: tool["function"]["parameters"] for tool in box.tools()}
    assert set(tools) == set(ARGUMENTS)
    for name, record in ARGUMENTS.items():
        fields = msgspec.structs.fields(record)
        assert set(tools[name]["properties"]) == {f.name for f in fields}, name
        assert set(tools[name]["required"]) == {f.name for f in fields if f.required}, name
        assert tools[name]["additionalProperties"] is False
    assert tools["run"]["properties"]["command"]["enum"] == ["true"]


async def test_list_read_search_write_and_patch_do_their_work(workspace: Workspace) -> None:
    box = toolbox(workspace, read_max_bytes=10)
    _, listed = await call(box, "list_files", path=".", recursive=True)
    assert listed["entries"] == ["README.md", "src/", "tests/", "src/app.py", "tests/test_app.py"]
    _, top = await call(box, "list_files")
    assert top["entries"] == ["README.md", "src/", "tests/"]

    _, read = await call(box, "read_file", path="src/app.py")
    assert read["content"] == "def answer"
    assert "offset=10" in read["truncated"]
    _, rest = await call(box, "read_file", path="src/app.py", offset=10)
    assert rest["content"] == "():\n    re"

    _, found = await call(box, "search", pattern="ANSWER", ignore_case=True, path="src")
    assert found["matches"] == [{"path": "src/app.py", "line": 1, "text": "def answer():"}]
    _, regex = await call(box, "search", pattern="return [0-9]+", regex=True)
    assert [m["path"] for m in regex["matches"]] == ["src/app.py"]

    wrote, body = await call(box, "write_file", path="src/pkg/new.py", content="n = 1\n")
    assert wrote.ok, body
    assert body == {"path": "src/pkg/new.py", "bytes": 6, "created": True}
    assert (workspace.tree / "src/pkg/new.py").read_text() == "n = 1\n"

    patch = (
        "diff --git a/src/app.py b/src/app.py\n--- a/src/app.py\n+++ b/src/app.py\n"
        "@@ -1,2 +1,2 @@\n def answer():\n-    return 41\n+    return 42\n"
    )
    patched, body = await call(box, "apply_patch", patch=patch)
    assert patched.ok, body
    assert body["paths"] == ["src/app.py"]
    assert (workspace.tree / "src/app.py").read_text().endswith("return 42\n")
    assert box.log.refusals == {}
    assert box.log.calls["read_file"] == 2


async def test_the_box_tells_which_paths_its_tools_wrote(workspace: Workspace) -> None:
    box = toolbox(workspace, "true")
    assert box.take_written() == frozenset()
    await call(box, "read_file", path="src/app.py")
    await call(box, "write_file", path="src/./pkg/new.py", content="n = 1\n")
    await call(box, "write_file", path="README.md", content="refused\n")  # not under src/
    assert box.take_written() == frozenset({"src/pkg/new.py"})
    assert box.take_written() == frozenset()  # the record starts again
    patch = (
        "diff --git a/src/app.py b/src/app.py\n--- a/src/app.py\n+++ b/src/app.py\n"
        "@@ -1,2 +1,2 @@\n def answer():\n-    return 41\n+    return 42\n"
    )
    patched, body = await call(box, "apply_patch", patch=patch)
    assert patched.ok, body
    assert box.take_written() == frozenset({"src/app.py"})
    ran, body = await call(box, "run", command="true")
    assert ran.ok, body
    assert box.take_written() is None  # a command may have written anything
    assert box.take_written() == frozenset()


async def test_a_long_tool_result_is_cut_with_a_note(workspace: Workspace) -> None:
    (workspace.tree / "src/long.py").write_text("x" * 5_000)
    box = toolbox(workspace, result_max_chars=1_000)
    result = await box.call("read_file", '{"path": "src/long.py"}')
    assert result.ok
    assert len(result.content) < 1_100
    assert result.content.endswith("more characters]")


@pytest.mark.parametrize(
    ("name", "arguments", "code"),
    [
        ("read_file", {"path": "/etc/passwd"}, "path_absolute"),
        ("read_file", {"path": "src/../../origin/README.md"}, "path_escapes"),
        ("list_files", {"path": ".."}, "path_escapes"),
        ("read_file", {"path": "link-out/secret.txt"}, "path_symlink_escape"),
        ("write_file", {"path": "src/link-out/x.py", "content": "x"}, "path_symlink_escape"),
        ("read_file", {"path": ".git"}, "path_git_dir"),
        ("read_file", {"path": "src/../.GIT/config"}, "path_git_dir"),
        ("search", {"pattern": "x", "path": ".git"}, "path_git_dir"),
        ("write_file", {"path": "README.md", "content": "x"}, "path_not_allowed"),
        ("write_file", {"path": "srcx/app.py", "content": "x"}, "path_not_allowed"),
        ("write_file", {"path": "src/../tests/test_app.py", "content": "x"}, "path_not_allowed"),
        ("run", {"command": "rm -rf src"}, "command_not_allowed"),
        ("run", {"command": "true "}, "command_not_allowed"),
    ],
)
async def test_a_call_that_breaks_a_rule_is_refused_and_changes_nothing(
    workspace: Workspace, tmp_path: Path, name: str, arguments: dict[str, Any], code: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("the runner's secret\n")
    (workspace.tree / "link-out").symlink_to(outside)
    (workspace.tree / "src" / "link-out").symlink_to(outside)
    before = status(workspace.tree)
    box = toolbox(workspace, "true")
    result, body = await call(box, name, **arguments)
    assert not result.ok
    assert result.refused
    assert body["error"] == code
    assert "secret" not in body["detail"] or code == "path_symlink_escape"
    assert "the runner's secret" not in result.content
    assert box.log.refusals == {code: 1}
    assert status(workspace.tree) == before
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


async def test_a_patch_touching_a_disallowed_path_is_refused_whole(workspace: Workspace) -> None:
    box = toolbox(workspace)
    patch = (
        "diff --git a/src/app.py b/src/app.py\n--- a/src/app.py\n+++ b/src/app.py\n"
        "@@ -1,2 +1,2 @@\n def answer():\n-    return 41\n+    return 42\n"
        "diff --git a/tests/test_app.py b/tests/test_app.py\n"
        "--- a/tests/test_app.py\n+++ b/tests/test_app.py\n"
        "@@ -4 +4 @@ def test_answer():\n-    assert answer() == 42\n+    assert answer() == 41\n"
    )
    rename = "diff --git a/README.md b/src/README.md\nsimilarity index 100%\n" + (
        "rename from README.md\nrename to src/README.md\n"
    )
    link = (
        "diff --git a/src/l b/src/l\nnew file mode 120000\n--- /dev/null\n+++ b/src/l\n"
        "@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n"
    )
    for text, code in (
        (patch, "patch_path_not_allowed"),
        (rename, "patch_path_not_allowed"),
        (link, "patch_link"),
    ):
        result, body = await call(box, "apply_patch", patch=text)
        assert result.refused, body
        assert body["error"] == code
        assert status(workspace.tree) == ""
    assert box.log.refusals == {"patch_path_not_allowed": 2, "patch_link": 1}


STALE_PATCH = "--- a/src/app.py\n+++ b/src/app.py\n@@ -9 +9 @@\n-q\n+r\n"


async def test_a_models_mistake_is_an_error_result_never_an_exception(
    workspace: Workspace,
) -> None:
    box = toolbox(workspace)
    cases = [
        ("read_file", '{"path": "src/app.py", "mode": "rb"}', "bad_arguments"),
        ("read_file", "{}", "bad_arguments"),
        ("read_file", '{"path": "src/app.py", "offset": -1}', "bad_arguments"),
        ("read_file", "not json", "bad_arguments"),
        ("delete_everything", "{}", "unknown_tool"),
        ("read_file", '{"path": "src/missing.py"}', "not_a_file"),
        ("apply_patch", json.dumps({"patch": STALE_PATCH}), "patch_does_not_apply"),
        ("search", '{"pattern": "(", "regex": true}', "bad_pattern"),
    ]
    for name, arguments, code in cases:
        result = await box.call(name, arguments)
        assert not result.ok
        assert not result.refused
        assert json.loads(result.content)["error"] == code, (name, arguments, result.content)
    assert sum(box.log.failures.values()) == len(cases)
    assert status(workspace.tree) == ""


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _with_marker(marker: str) -> list[int]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(marker in part for part in cmdline) and _alive(process.pid):
            found.append(process.pid)
    return found


SPAWNER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)  # MARKER"])
with open("pids", "w") as handle:
    handle.write(f"{os.getpid()} {child.pid}")
print("started", flush=True)
time.sleep(300)
"""


async def _gone(*pids: int) -> None:
    """Wait (briefly: SIGKILL was sent, the kernel is tearing them down) until no pid lives."""
    with anyio.fail_after(5):
        while any(_alive(pid) for pid in pids):  # noqa: ASYNC110 (other processes, no event)
            await anyio.sleep(0.02)


async def _pids(tree: Path) -> list[int]:
    with anyio.fail_after(10):
        while not (tree / "pids").is_file() or not (tree / "pids").read_text():  # noqa: ASYNC110
            await anyio.sleep(0.05)
    return [int(p) for p in (tree / "pids").read_text().split()]


async def test_run_past_its_timeout_is_killed_with_its_process_group(
    workspace: Workspace,
) -> None:
    marker = uuid.uuid4().hex
    command = py(SPAWNER.replace("MARKER", marker))
    box = toolbox(workspace, command, run_timeout_s=1.5)
    with anyio.fail_after(20):
        result, body = await call(box, "run", command=command)
    assert result.ok
    assert body["timed_out"] is True
    assert body["exit_code"] is None
    assert "started" in body["output"]
    parent, child = await _pids(workspace.tree)
    await _gone(parent, child)
    assert _with_marker(marker) == []


async def test_run_is_killed_with_its_process_group_when_the_step_is_cancelled(
    workspace: Workspace,
) -> None:
    marker = uuid.uuid4().hex
    command = py(SPAWNER.replace("MARKER", marker))
    box = toolbox(workspace, command, run_timeout_s=300)
    with anyio.move_on_after(20) as lease:  # the lease is lost once the command has started
        async with anyio.create_task_group() as group:
            group.start_soon(box.call, "run", json.dumps({"command": command}))
            parent, child = await _pids(workspace.tree)
            assert _alive(child)
            lease.cancel()
    assert lease.cancel_called
    await _gone(parent, child)
    assert _with_marker(marker) == []


async def _sandboxes() -> list[Sandbox]:
    found = await detect_sandbox(PYTHON_TREES)
    return [NoSandbox()] + ([found] if isinstance(found, Bubblewrap) else [])


async def test_run_holds_no_secret_in_its_environment(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_TEST_SECRET", "s3cret-value")
    monkeypatch.setenv("TETHER_RUNNER_TOKEN", "tok-runner-123")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-model-key")
    command = py("import json, os; print(json.dumps(dict(os.environ)))")
    for sandbox in await _sandboxes():
        box = toolbox(workspace, command, sandbox=sandbox)
        result, body = await call(box, "run", command=command)
        assert result.ok, body
        assert body["exit_code"] == 0, body
        seen = json.loads(body["output"])
        # bubblewrap adds PWD for its --chdir
        assert set(seen) <= {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "PWD"}, sandbox
        assert seen["HOME"] == str(workspace.home)
        for secret in ("s3cret-value", "tok-runner-123", "sk-model-key"):
            assert secret not in body["output"]


@pytest.fixture
async def bubblewrap() -> Bubblewrap:
    found = await detect_sandbox(PYTHON_TREES)
    if not isinstance(found, Bubblewrap):
        pytest.skip("bubblewrap is not installed or cannot create namespaces here")
    return found


async def test_under_bubblewrap_the_network_is_unreachable(
    workspace: Workspace, bubblewrap: Bubblewrap
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
            "    print('connected')\n"
            "except OSError as exc:\n"
            "    print('blocked', exc)\n"
        )
        command = py(code)
        outside = await call(toolbox(workspace, command), "run", command=command)
        inside = await call(toolbox(workspace, command, sandbox=bubblewrap), "run", command=command)
    assert outside[1]["output"].startswith("connected")  # the probe itself works
    assert inside[1]["output"].startswith("blocked"), inside[1]
    assert inside[1]["sandbox"] == "bwrap"


async def test_under_bubblewrap_only_the_worktree_is_writable(
    workspace: Workspace, bubblewrap: Bubblewrap, tmp_path: Path
) -> None:
    # Outside the worktree: a host folder (the sandbox has a private /tmp, so the write lands
    # there at most, never on the host), the mirror, and /etc (read-only).
    targets = [
        tmp_path / "outside.txt",
        workspace.mirror / "planted",
        Path("/etc/tether-planted"),
        Path("src/inside.txt"),
    ]
    code = (
        "import sys\n"
        f"for target in {[str(t) for t in targets]!r}:\n"
        "    try:\n"
        "        open(target, 'w').write('x')\n"
        "        print('wrote', target)\n"
        "    except OSError as exc:\n"
        "        print('refused', target, exc.errno)\n"
    )
    command = py(code)
    box = toolbox(workspace, command, sandbox=bubblewrap)
    result, body = await call(box, "run", command=command)
    assert result.ok, body
    lines = body["output"].splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["refused", "refused", "wrote"], lines
    assert not (tmp_path / "outside.txt").exists()
    assert not (workspace.mirror / "planted").exists()
    assert not await anyio.Path("/etc/tether-planted").exists()
    assert (workspace.tree / "src" / "inside.txt").read_text() == "x"


async def test_under_bubblewrap_a_timed_out_command_leaves_nothing_running(
    workspace: Workspace, bubblewrap: Bubblewrap
) -> None:
    marker = uuid.uuid4().hex
    command = py(SPAWNER.replace("MARKER", marker))
    box = toolbox(workspace, command, sandbox=bubblewrap, run_timeout_s=1.5)
    with anyio.fail_after(20):
        result, body = await call(box, "run", command=command)
    assert body["timed_out"] is True, body
    with anyio.fail_after(5):
        while _with_marker(marker):  # noqa: ASYNC110 (other processes, no event)
            await anyio.sleep(0.02)
    assert result.ok


async def test_a_bwrap_that_cannot_make_namespaces_falls_back_to_no_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    assert isinstance(await detect_sandbox(), NoSandbox)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert isinstance(await detect_sandbox(), NoSandbox)


def test_the_agent_package_exports_its_surface() -> None:
    import tether.runner.agent

    assert sorted(tether.runner.agent.__all__) == sorted(
        [
            "AgentKind",
            "BaseNotFound",
            "Bubblewrap",
            "CheckLimits",
            "Checkpointer",
            "CleanupRecord",
            "Confinement",
            "FetchFailed",
            "Finish",
            "LoopResult",
            "NoSandbox",
            "RepoCache",
            "Sandbox",
            "Snapshot",
            "Start",
            "ToolBox",
            "ToolError",
            "ToolFailed",
            "ToolLimits",
            "ToolLog",
            "ToolRefused",
            "ToolResult",
            "Workspace",
            "WorkspaceFailed",
            "commit_date",
            "detect_sandbox",
            "resume_start",
            "run_checks",
            "run_loop",
        ]
    )
    for name in tether.runner.agent.__all__:
        assert getattr(tether.runner.agent, name) is not None
