"""A step's setup (issue 22, the toolchain for checks), with real processes and real git: a
repository whose check needs a package that is not in the runner's interpreter fails without
setup and passes with it; what setup made is seen by the model's `run` and the checks and is
never committed; a failing setup fails the step `setup_failed` with its log before any model
call; setup reaches the network but sees no secret, while the model's `run` does not reach it.
"""

from __future__ import annotations

import shlex
import socket
import sys
from pathlib import Path

import msgspec
import pytest

from tests.agent_repos import make_origin, sh
from tests.agent_services import FakeServices, ScriptedChat, call, lease_repository
from tether.runner.agent import AgentKind, Bubblewrap, Sandbox
from tether.runner.agent.errors import SetupFailed
from tether.runner.agent.sandbox import detect_sandbox
from tether.runner.errors import LeaseLost, LostBecause
from tether.runner.kinds.base import StepContext
from tether.runner.settings import RunnerSettings
from tether.settings import SettingsError, load_settings
from tether.wire.payloads import AgentPayload, read_payload
from tether.wire.records import ResumePoint

PYTHON = sys.executable
PYTHON_TREES = (Path(sys.prefix), Path(sys.base_prefix))
ASK = [{"role": "user", "content": "Make the test pass."}]
FIXED = "import greet\n\n\ndef answer():\n    return greet.BASE + 1\n"
# The repository: its code needs `greet`, vendored in the repository and installed by setup
# into the tree's own .venv, offline (a copy into the venv's site-packages).
FILES = {
    "src/app.py": "import greet\n\n\ndef answer():\n    return greet.BASE\n",
    "vendor/greet/__init__.py": "BASE = 41\n",
    "vendor/install.py": (
        "import shutil, sysconfig\n"
        "shutil.copytree('vendor/greet', sysconfig.get_paths()['purelib'] + '/greet')\n"
        "print('installed greet')\n"
    ),
    "README.md": "# needs greet\n",
}
MAKE_VENV = shlex.join([PYTHON, "-m", "venv", "--without-pip", ".venv"])
INSTALL = ".venv/bin/python vendor/install.py"
TESTS = shlex.join(
    [
        ".venv/bin/python",
        "-c",
        "import sys; sys.path.insert(0, 'src'); import app; assert app.answer() == 42",
    ]
)
SEES_GREET = ".venv/bin/python -c \"import greet; print('greet', greet.BASE)\""


async def sandbox() -> Sandbox:
    return await detect_sandbox(PYTHON_TREES)


async def agent(tmp_path: Path) -> AgentKind:
    """The kind under bubblewrap where it works here, else without (as the operator allowed)."""
    return AgentKind(
        cache_dir=tmp_path / "cache", sandbox=await sandbox(), commands_without_sandbox=True
    )


def context(
    chat: ScriptedChat,
    services: FakeServices,
    origin: Path,
    base: str,
    *,
    repo_setup: tuple[str, ...] = (),
    payload_setup: tuple[str, ...] = (),
    commands: tuple[str, ...] = (),
    fence: int = 1,
    resume: ResumePoint | None = None,
) -> StepContext:
    repo = lease_repository(
        str(origin), base, allowed_paths=("",), checks={"tests": TESTS}, setup=repo_setup
    )
    payload: dict[str, object] = {"messages": ASK, "allowed_commands": list(commands)}
    if payload_setup:
        payload["setup"] = list(payload_setup)
    return StepContext(
        step_id="step-1",
        task_id="task-1",
        name="fix",
        attempt=fence,
        fence=fence,
        payload=payload,
        outputs=(),
        default_model="m",
        chat=chat,
        repository=repo,
        services=services,
        resume=resume,
    )


def fix_and_run() -> ScriptedChat:
    return ScriptedChat(
        [call("write_file", path="src/app.py", content=FIXED)],
        [call("run", command=SEES_GREET)],
        "fixed",
    )


async def test_a_check_needing_a_package_fails_without_setup_and_passes_with_it(
    tmp_path: Path,
) -> None:
    origin, base = make_origin(tmp_path / "origin", FILES)
    # The package is in no interpreter the runner has.
    assert (
        sh(
            PYTHON, "-c", "import importlib.util as u; print(u.find_spec('greet'))", cwd=tmp_path
        ).strip()
        == "None"
    )

    without = await (await agent(tmp_path / "a"))(
        context(fix_and_run(), FakeServices(), origin, base, commands=(SEES_GREET,))
    )
    assert without.checks["tests"].exit_code != 0
    assert "setup" not in without.output

    services = FakeServices()
    chat = fix_and_run()
    done = await (await agent(tmp_path / "b"))(
        context(
            chat,
            services,
            origin,
            base,
            repo_setup=(MAKE_VENV,),
            payload_setup=(INSTALL,),
            commands=(SEES_GREET,),
        )
    )
    assert done.checks["tests"].exit_code == 0, services.store[done.checks["tests"].log]
    # The model's `run` saw what setup made.
    ran = chat.tool_results(2)[0]
    assert (ran["exit_code"], ran["output"]) == (0, "greet 41\n"), ran
    # The repository's setup ran first, then the payload's; the log is an artifact.
    setup = done.output["setup"]
    assert setup["commands"] == [MAKE_VENV, INSTALL]
    log = services.store[setup["log"]].decode()
    assert log.index(f"$ {MAKE_VENV}") < log.index(f"$ {INSTALL}") < log.index("installed greet")
    assert setup["kept"] == [".venv/"]
    # Never committed, though the whole tree is allowed: the candidate changes src/app.py only.
    mirror = (await agent(tmp_path / "b")).cache.mirror_path(str(origin))
    changed = sh("git", "diff", "--name-only", base, done.candidate_sha or "", cwd=mirror)
    assert changed.split() == ["src/app.py"]


async def test_a_failing_setup_fails_the_step_by_name_before_any_model_call(
    tmp_path: Path,
) -> None:
    origin, base = make_origin(tmp_path / "origin", FILES)
    broken = shlex.join([PYTHON, "-c", "print('no toolchain here'); raise SystemExit(3)"])
    chat = ScriptedChat("never asked")
    services = FakeServices()
    with pytest.raises(SetupFailed) as failed:
        await (await agent(tmp_path))(
            context(chat, services, origin, base, repo_setup=(broken, INSTALL))
        )
    detail = failed.value.detail
    assert detail.startswith(f"setup_failed: `{broken}` exited 3 (log "), detail
    digest = detail.rsplit("(log ", 1)[1].rstrip(")")
    log = services.store[digest].decode()
    assert "no toolchain here" in log
    assert INSTALL not in log  # setup stopped at the failure
    assert chat.requests == []


async def test_setup_reaches_the_network_with_no_secret_and_the_model_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = await sandbox()
    if not isinstance(found, Bubblewrap):
        pytest.skip("bubblewrap is not installed or cannot create namespaces here")
    monkeypatch.setenv("TETHER_RUNNER_TOKEN", "tok-runner-123")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-model-key")
    origin, base = make_origin(tmp_path / "origin", FILES)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        probe = shlex.join(
            [
                PYTHON,
                "-c",
                (
                    "import json, os, socket\n"
                    "try:\n"
                    f"    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
                    "    print('connected')\n"
                    "except OSError as exc:\n"
                    "    print('blocked', exc)\n"
                    "print(json.dumps(dict(os.environ)))\n"
                ),
            ]
        )
        chat = ScriptedChat([call("run", command=probe)], "done")
        services = FakeServices()
        done = await (await agent(tmp_path))(
            context(chat, services, origin, base, repo_setup=(probe,), commands=(probe,))
        )
    log = services.store[done.output["setup"]["log"]].decode()
    assert "\nconnected\n" in log, log
    for secret in ("tok-runner-123", "sk-model-key"):
        assert secret not in log
    ran = chat.tool_results(1)[0]
    assert ran["output"].startswith("blocked"), ran


def test_a_setup_command_that_is_not_a_command_line_is_refused_at_submit() -> None:
    with pytest.raises(ValueError, match=r"setup\[1\]"):
        read_payload(
            {"messages": ASK, "allowed_commands": [], "setup": ["true", "'open"]}, AgentPayload
        )
    with pytest.raises((ValueError, msgspec.ValidationError)):
        read_payload({"messages": ASK, "allowed_commands": [], "setup": [""]}, AgentPayload)


async def test_a_toolchain_named_in_sandbox_read_only_is_seen_and_not_written(
    tmp_path: Path,
) -> None:
    if not isinstance(await sandbox(), Bubblewrap):
        pytest.skip("bubblewrap is not installed or cannot create namespaces here")
    toolchain = tmp_path / "toolchain"
    toolchain.mkdir()
    (toolchain / "greet.py").write_text("BASE = 41\n")
    origin, base = make_origin(tmp_path / "origin", FILES)
    probe = shlex.join(
        [
            PYTHON,
            "-c",
            (
                "import sys\n"
                f"sys.path.insert(0, {str(toolchain)!r})\n"
                "try:\n"
                "    import greet\n"
                "    print('seen', greet.BASE)\n"
                f"    open({str(toolchain / 'planted')!r}, 'w')\n"
                "except OSError as exc:\n"
                "    print('not written', exc.errno)\n"
                "except ImportError:\n"
                "    print('not seen')\n"
            ),
        ]
    )
    outputs = []
    for read_only in ((), (toolchain,)):
        chat = ScriptedChat([call("run", command=probe)], "done")
        kind = AgentKind(
            cache_dir=tmp_path / f"cache-{len(read_only)}",
            commands_without_sandbox=True,
            sandbox_read_only=read_only,
        )
        await kind(context(chat, FakeServices(), origin, base, commands=(probe,)))
        outputs.append(chat.tool_results(1)[0]["output"])
    assert outputs == ["not seen\n", "seen 41\nnot written 30\n"]
    assert not (toolchain / "planted").exists()


def test_sandbox_read_only_takes_absolute_folders() -> None:
    base = {
        "TETHER_SUPERVISOR_URL": "http://s",
        "TETHER_MODEL_URL": "http://m",
        "TETHER_MODEL": "x",
    }
    env = base | {"TETHER_SANDBOX_READ_ONLY": "/opt/a, /opt/b"}
    loaded = load_settings(RunnerSettings, environ=env)
    assert loaded.sandbox_read_only_paths == (Path("/opt/a"), Path("/opt/b"))
    with pytest.raises(SettingsError, match="'opt/c' is not an absolute path"):
        load_settings(RunnerSettings, environ=base | {"TETHER_SANDBOX_READ_ONLY": "opt/c"})


async def test_a_resumed_attempt_runs_setup_before_the_checkpoint_is_applied(
    tmp_path: Path,
) -> None:
    """Setup never sees what the model wrote: attempt 1 writes src/app.py and checkpoints it,
    then loses its lease; attempt 2's setup, which fails if it finds that write, runs in the
    fresh worktree before the checkpoint's changes are applied."""
    origin, base = make_origin(tmp_path / "origin", FILES)
    pristine = shlex.join(
        [PYTHON, "-c", "assert 'BASE + 1' not in open('src/app.py').read(), 'saw the write'"]
    )
    services = FakeServices()
    kind = await agent(tmp_path)
    first = ScriptedChat(
        [call("write_file", path="src/app.py", content=FIXED)], LeaseLost(LostBecause.EXPIRED)
    )
    with pytest.raises(LeaseLost):
        await kind(context(first, services, origin, base, payload_setup=(pristine,)))
    second = ScriptedChat("resumed")
    done = await kind(
        context(
            second,
            services,
            origin,
            base,
            payload_setup=(pristine,),
            fence=2,
            resume=services.resume_point(),
        )
    )
    assert done.output["resumed_from"]["turn"] == 1
    assert done.output["setup"]["commands"] == [pristine]
    mirror = kind.cache.mirror_path(str(origin))
    assert sh("git", "show", f"{done.candidate_sha}:src/app.py", cwd=mirror) == FIXED
