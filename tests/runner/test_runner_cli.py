"""`tether-runner`: help, bad usage, settings precedence, a light import, SIGTERM as a process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream

import tether.runner
from tether.runner.cli import main
from tether.runner.kinds.registry import KindRegistry
from tether.runner.settings import RunnerSettings
from tether.settings import SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "cli-runner-token-31337abc"
REQUIRED = {
    "supervisor_url": "http://127.0.0.1:1",
    "model_url": "http://127.0.0.1:1/v1",
    "model": "m",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TETHER_") or name in ("CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET"):
            monkeypatch.delenv(name)


def test_the_public_surface_is_deliberate() -> None:
    assert sorted(tether.runner.__all__) == [
        "KindRegistry",
        "Runner",
        "RunnerSettings",
        "StepContext",
        "StepKind",
        "StepOutput",
    ]
    for name in tether.runner.__all__:
        assert getattr(tether.runner, name) is not None


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"]])
def test_help_exits_zero(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    assert "usage: tether-runner" in capsys.readouterr().out


def test_the_installed_script_answers_help() -> None:
    script = Path(sys.executable).parent / "tether-runner"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "runner"]
    done = subprocess.run(
        [*argv, "--help"], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert "run" in done.stdout


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], "required: COMMAND"),
        (["serve"], "invalid choice"),
        (["run", "--concurrency", "many"], "--concurrency"),
        (["run", "--log-level", "loud"], "--log-level"),
        (["run", "--bogus"], "--bogus"),
    ],
)
def test_bad_usage_is_one_clear_line(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert words in err


def _flags(**extra: str) -> list[str]:
    argv = ["run", "--supervisor", REQUIRED["supervisor_url"]]
    argv += ["--model-url", REQUIRED["model_url"], "--model", "m"]
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}", value]
    return argv


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["run"], "'supervisor_url' is required"),
        (_flags(), "no runner-token: set token_file"),
        (_flags(token_file="/nonexistent/token"), "cannot read runner-token"),
        (_flags(concurrency="0"), "'concurrency' must be 1..256"),
        (["run", "--config", "/nonexistent.toml"], "does not exist"),
        (["run", "--config", "/tmp"], "config file /tmp cannot be read: Is a directory"),
    ],
)
def test_bad_configuration_is_one_clear_line(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert words in err


def test_settings_precedence_defaults_toml_environment_flags(tmp_path: Path) -> None:
    config = tmp_path / "runner.toml"
    config.write_text(
        'supervisor_url = "http://sup:8080"\nmodel_url = "http://m/v1"\nmodel = "toml"\n'
        "concurrency = 3\n"
    )
    env = {"TETHER_CONCURRENCY": "5", "TETHER_MODEL": "env"}
    only_toml = load_settings(RunnerSettings, config_file=config, environ={})
    assert (only_toml.concurrency, only_toml.model) == (3, "toml")
    assert only_toml.shutdown_grace_s == 20.0  # the default
    with_env = load_settings(RunnerSettings, config_file=config, environ=env)
    assert (with_env.concurrency, with_env.model) == (5, "env")
    flagged = load_settings(
        RunnerSettings, config_file=config, environ=env, flags={"concurrency": 7, "model": None}
    )
    assert (flagged.concurrency, flagged.model) == (7, "env")
    assert flagged.runner_id.endswith(f"-{os.getpid()}")


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ("concurency = 2\n", "unknown setting 'concurency'"),
        ('concurrency = "two"\n', "'concurrency' must be int"),
        ('supervisor_url = "ftp://x"\n', "http:// or https://"),
        ("claim_wait_s = 120\n", "claim_wait_s"),
        ('log_format = "xml"\n', "log_format"),
    ],
)
def test_a_bad_config_file_names_the_key(tmp_path: Path, toml: str, words: str) -> None:
    config = tmp_path / "runner.toml"
    base = {k: v for k, v in REQUIRED.items() if f"{k} =" not in toml}
    config.write_text("".join(f'{k} = "{v}"\n' for k, v in base.items()) + toml)
    with pytest.raises(SettingsError) as caught:
        load_settings(RunnerSettings, config_file=config, environ={})
    assert words in str(caught.value)


def test_commands_without_sandbox_is_false_unless_the_file_or_the_environment_says_true(
    tmp_path: Path,
) -> None:
    config = tmp_path / "runner.toml"
    base = "".join(f'{k} = "{v}"\n' for k, v in REQUIRED.items())

    def loaded(env: dict[str, str]) -> bool:
        return load_settings(
            RunnerSettings, config_file=config, environ=env
        ).commands_without_sandbox

    config.write_text(base)
    assert loaded({}) is False
    config.write_text(base + "commands_without_sandbox = true\n")
    assert loaded({}) is True
    for raw, expected in (("1", True), ("true", True), ("0", False), ("no", False)):
        assert loaded({"TETHER_COMMANDS_WITHOUT_SANDBOX": raw}) is expected, raw


@pytest.mark.parametrize(
    ("toml", "env", "words"),
    [
        ('commands_without_sandbox = "maybe"\n', {}, "'commands_without_sandbox' must be bool"),
        ("commands_without_sandbox = 1\n", {}, "'commands_without_sandbox' must be bool"),
        ("", {"TETHER_COMMANDS_WITHOUT_SANDBOX": "maybe"}, "TETHER_COMMANDS_WITHOUT_SANDBOX"),
    ],
)
def test_commands_without_sandbox_must_be_a_boolean(
    tmp_path: Path, toml: str, env: dict[str, str], words: str
) -> None:
    config = tmp_path / "runner.toml"
    config.write_text("".join(f'{k} = "{v}"\n' for k, v in REQUIRED.items()) + toml)
    with pytest.raises(SettingsError) as caught:
        load_settings(RunnerSettings, config_file=config, environ=env)
    assert words in str(caught.value)
    assert "commands_without_sandbox" in str(caught.value)


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [([], None, False), (["--commands-without-sandbox"], None, True), ([], "true", True)],
)
def test_the_runner_hands_commands_without_sandbox_to_the_agent_kind(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flag: list[str],
    env: str | None,
    expected: bool,
) -> None:
    import tether.runner.cli
    from tether.runner.agent import AgentKind

    token_file = tmp_path / "runner-token"
    token_file.write_text(TOKEN + "\n")
    if env is not None:
        monkeypatch.setenv("TETHER_COMMANDS_WITHOUT_SANDBOX", env)
    served: list[tuple[RunnerSettings, KindRegistry]] = []

    async def fake_serve(
        settings: RunnerSettings,
        _token: str,
        _t: Any,
        _k: Any,
        kinds: KindRegistry,
        *_transports_and_buffer: Any,
    ) -> int:
        served.append((settings, kinds))
        return 0

    monkeypatch.setattr(tether.runner.cli, "serve", fake_serve)
    try:
        assert main([*_flags(token_file=str(token_file)), *flag]) == 0
    finally:
        structlog.reset_defaults()
    ((settings, kinds),) = served
    assert settings.commands_without_sandbox is expected
    agent = kinds.get("agent")
    assert isinstance(agent, AgentKind)
    assert agent.policy.commands_without_sandbox is expected


LIGHT_CHECK = textwrap.dedent(
    """
    import importlib, pkgutil, sys

    ALLOWED = set(sys.stdlib_module_names) | {
        "tether", "anyio", "httpx", "httpcore", "h11", "idna", "sniffio",
        "certifi", "structlog", "tenacity", "typing_extensions", "exceptiongroup", "msgspec",
    }
    # Each check below imports only the runner's side; this finder refuses the rest.
    FORBIDDEN = {"supervisor", "starlette", "aiosqlite", "uvicorn"}
    FORBIDDEN_PACKAGES = ("tether.supervisor", "tether.sim")

    def forbidden(name):
        top = name.split(".")[0]
        inside = any(name == p or name.startswith(p + ".") for p in FORBIDDEN_PACKAGES)
        return top in FORBIDDEN or inside

    class OnlyTheRunnersDependencies:
        def find_spec(self, name, path=None, target=None):
            if forbidden(name) or name.split(".")[0] not in ALLOWED:
                raise ImportError(f"the runner imported {name!r}")
            return None

    sys.meta_path.insert(0, OnlyTheRunnersDependencies())
    try:
        import starlette  # the control: the finder does refuse
    except ImportError:
        pass
    else:
        raise SystemExit("the finder let starlette in")
    import tether.runner, tether.runner.cli
    for info in pkgutil.walk_packages(tether.runner.__path__, "tether.runner."):
        if info.name != "tether.runner.__main__":  # it would run the CLI
            importlib.import_module(info.name)
    for name in ("tether.wire", "tether.settings", "tether.logs"):
        importlib.import_module(name)

    import anyio
    from tether.clocks import LoopClock
    from tether.runner.errors import SupervisorUnreachable
    from tether.runner.supervisor_client import SupervisorClient

    async def touch_the_network_stack():
        client = SupervisorClient(
            base_url="http://127.0.0.1:%(port)d", token="t", clock=LoopClock(),
            timeout_s=5,
        )
        try:
            await client.claim("r", 1, 0)
        except SupervisorUnreachable:
            pass
        finally:
            await client.aclose()

    anyio.run(touch_the_network_stack)
    try:
        tether.runner.cli.main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    bad = sorted(m for m in sys.modules if forbidden(m))
    assert not bad, bad
    print("light")
    """
)


def test_the_runner_imports_only_its_own_dependencies() -> None:
    code = LIGHT_CHECK % {"port": free_port()}
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("light")


@pytest.mark.slow
async def test_sigterm_with_an_unreachable_supervisor_exits_zero(tmp_path: Path) -> None:
    token_file = tmp_path / "runner-token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    argv = [sys.executable, "-m", "runner", "run", "--supervisor", f"http://127.0.0.1:{port}"]
    argv += ["--token-file", str(token_file), "--model-url", f"http://127.0.0.1:{port}/v1"]
    argv += ["--model", "m", "--runner-id", "cli-test"]
    env = {**os.environ, "TETHER_LOG_FORMAT": "json", "TETHER_SHUTDOWN_GRACE_S": "5"}
    lines: list[dict[str, object]] = []
    with anyio.fail_after(30):
        async with await anyio.open_process(argv, env=env, cwd=ROOT) as proc:
            try:
                assert proc.stdout is not None
                stream = BufferedByteReceiveStream(proc.stdout)
                while not any(str(e["event"]).startswith("supervisor unr") for e in lines):
                    lines.append(json.loads(await stream.receive_until(b"\n", 65536)))
                proc.send_signal(signal.SIGTERM)
                rest = b""
                async for chunk in stream:
                    rest += chunk
                code = await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
    lines += [json.loads(line) for line in rest.decode().splitlines()]
    events = [e["event"] for e in lines]
    assert code == 0, events
    assert "runner starting" in events
    assert events[-1] == "runner stopped"
    assert "shutting down: claiming stopped" in events
    assert TOKEN not in json.dumps(lines)


def test_the_event_loop_is_uvloop_only_when_it_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    from tether.runner import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    assert cli.event_loop_options() == {}
    monkeypatch.setattr(importlib.util, "find_spec", real)
    expected = {"use_uvloop": True} if real("uvloop") is not None else {}
    assert cli.event_loop_options() == expected
