"""Configuration as an operator meets it: precedence, mistakes named at start, secrets from files.

Precedence is defaults < TOML file < `TETHER_*` environment < flags, checked both on
`load_settings` and through `tether-supervisor serve` (with the server itself replaced, so only
the command line's wiring runs).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

import tether.supervisor.server
from tether.settings import SettingsError, config_file_from, load_settings, read_secret
from tether.supervisor.cli import main as supervisor_main
from tether.supervisor.settings import SupervisorSettings

SECRET = "tt_0123456789abcdef_do_not_print"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in list(os.environ):
        if var.startswith("TETHER_") or var == "CREDENTIALS_DIRECTORY":
            monkeypatch.delenv(var)


def _toml(tmp_path: Path, text: str, name: str = "supervisor.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- precedence --------------------------------------------------------------------------------


def test_each_layer_overrides_the_one_below(tmp_path: Path) -> None:
    config = _toml(
        tmp_path,
        'host = "0.0.0.0"\nport = 9001\nlease_ttl_s = 20\naccept_window_s = 5\n',
    )
    env = {"TETHER_LEASE_TTL_S": "15", "TETHER_PORT": "9002"}
    settings = load_settings(
        SupervisorSettings,
        config_file=config,
        environ=env,
        flags={"port": 9003, "host": None, "db": None},
    )
    assert settings.max_attempts == 5  # default: nothing set it
    assert settings.accept_window_s == 5.0  # file over default
    assert settings.host == "0.0.0.0"  # file; a flag not given (None) changes nothing
    assert settings.lease_ttl_s == 15.0  # environment over file
    assert settings.port == 9003  # flag over environment


def test_environment_without_a_file_overrides_defaults() -> None:
    settings = load_settings(
        SupervisorSettings, environ={"TETHER_MAX_ATTEMPTS": "2", "TETHER_SYNCHRONOUS": "NORMAL"}
    )
    assert (settings.max_attempts, settings.synchronous) == (2, "NORMAL")
    assert settings.lease_ttl_s == SupervisorSettings().lease_ttl_s


def test_the_other_programs_variables_are_ignored() -> None:
    """Runner and supervisor share the TETHER_ prefix on one machine."""
    settings = load_settings(
        SupervisorSettings, environ={"TETHER_CONCURRENCY": "8", "TETHER_MODEL": "m"}
    )
    assert settings == SupervisorSettings()


def test_config_flag_wins_over_tether_config(tmp_path: Path) -> None:
    flag_file, env_file = tmp_path / "a.toml", tmp_path / "b.toml"
    assert config_file_from(str(flag_file), {"TETHER_CONFIG": str(env_file)}) == flag_file
    assert config_file_from(None, {"TETHER_CONFIG": str(env_file)}) == env_file
    assert config_file_from(None, {}) is None


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[SupervisorSettings]:
    """What `tether-supervisor serve` would have served with, instead of serving."""
    seen: list[SupervisorSettings] = []

    def fake_serve(settings: SupervisorSettings) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr(tether.supervisor.server, "serve", fake_serve)
    return seen


def test_serve_applies_file_env_and_flags_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: list[SupervisorSettings]
) -> None:
    config = _toml(tmp_path, 'db = "from-file.db"\nport = 9001\nlease_ttl_s = 20\n')
    monkeypatch.setenv("TETHER_CONFIG", str(config))
    monkeypatch.setenv("TETHER_PORT", "9002")
    monkeypatch.setenv("TETHER_LEASE_TTL_S", "12")
    assert supervisor_main(["serve", "--port", "9003"]) == 0
    (settings,) = served
    assert settings.db == Path("from-file.db")
    assert settings.lease_ttl_s == 12.0
    assert settings.port == 9003


# -- mistakes stop the program at start, with the key named ------------------------------------


def test_unknown_key_in_the_file_is_named(tmp_path: Path) -> None:
    config = _toml(tmp_path, "lease_ttl = 30\n")
    with pytest.raises(SettingsError, match=r"unknown setting 'lease_ttl'") as caught:
        load_settings(SupervisorSettings, config_file=config, environ={})
    assert "lease_ttl_s" in str(caught.value)  # the known keys are listed to fix the typo


@pytest.mark.parametrize(
    ("text", "env", "key"),
    [
        ('port = "eighty"\n', {}, "port"),
        ("lease_ttl_s = true\n", {}, "lease_ttl_s"),
        ("max_attempts = 2.5\n", {}, "max_attempts"),
        ("", {"TETHER_MAX_ATTEMPTS": "many"}, "max_attempts"),
        ("", {"TETHER_LEASE_TTL_S": "-1"}, "lease_ttl_s"),
        ("port = 70000\n", {}, "port"),
        ('synchronous = "SOMETIMES"\n', {}, "synchronous"),
        ("accept_window_s = 40\n", {}, "accept_window_s"),
    ],
)
def test_bad_value_is_named(tmp_path: Path, text: str, env: dict[str, str], key: str) -> None:
    config = _toml(tmp_path, text)
    with pytest.raises(SettingsError, match=f"'{key}'"):
        load_settings(SupervisorSettings, config_file=config, environ=env)


def test_an_env_error_says_which_variable(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="TETHER_PORT"):
        load_settings(SupervisorSettings, environ={"TETHER_PORT": "http"})


def test_invalid_toml_and_missing_file_are_named(tmp_path: Path) -> None:
    broken = _toml(tmp_path, "port = = 1\n")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_settings(SupervisorSettings, config_file=broken, environ={})
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(SupervisorSettings, config_file=tmp_path / "nope.toml", environ={})
    with pytest.raises(SettingsError, match="cannot be read: Is a directory"):
        load_settings(SupervisorSettings, config_file=tmp_path, environ={})


@pytest.mark.parametrize(
    ("text", "env", "key"),
    [
        ("lease_ttl = 30\n", {}, "lease_ttl"),
        ("", {"TETHER_PORT": "eighty"}, "port"),
    ],
)
def test_serve_refuses_to_start_with_one_line_naming_the_key(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    served: list[SupervisorSettings],
    text: str,
    env: dict[str, str],
    key: str,
) -> None:
    config = _toml(tmp_path, text)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as exited:
        supervisor_main(["serve", "--config", str(config)])
    assert exited.value.code == 2  # a configuration error, like the runner's
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("tether-supervisor: error:")
    assert f"'{key}'" in err
    assert served == []  # nothing was started


# -- secrets: files or systemd credentials, never echoed ----------------------------------------


def test_secret_from_the_credentials_directory(tmp_path: Path) -> None:
    (tmp_path / "runner-token").write_text(SECRET + "\n", encoding="utf-8")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert read_secret(None, "runner-token", env) == SECRET


def test_an_explicit_file_wins_over_the_credentials_directory(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "model-key").write_text("from-credentials", encoding="utf-8")
    chosen = tmp_path / "key"
    chosen.write_text("from-file", encoding="utf-8")
    env = {"CREDENTIALS_DIRECTORY": str(creds)}
    assert read_secret(chosen, "model-key", env) == "from-file"


def test_no_secret_anywhere_says_how_to_provide_it() -> None:
    with pytest.raises(SettingsError, match=r"LoadCredential=runner-token"):
        read_secret(None, "runner-token", {})


def test_secret_errors_name_the_place_not_the_content(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(SettingsError, match=r"cannot read model-key from .*absent"):
        read_secret(missing, "model-key", {})
    empty = tmp_path / "empty"
    empty.write_text("  \n", encoding="utf-8")
    with pytest.raises(SettingsError, match="is empty"):
        read_secret(empty, "model-key", {})
    unreadable = tmp_path / "unreadable"
    unreadable.write_bytes(SECRET.encode() + b"\xff\xfe")  # not UTF-8
    with pytest.raises(SettingsError, match=r"model-key file .*unreadable is not UTF-8") as caught:
        read_secret(unreadable, "model-key", {})
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    "content",
    ["sekrit-one\nsekrit-two", "sekrit one", "sekrit\x00x", "sekrit-\u00e9", "sekrit\tx"],
)
def test_a_secret_file_must_hold_the_secret_alone_on_one_line(tmp_path: Path, content: str) -> None:
    """Whatever is inside would go into an HTTP header, and an error about that header would
    quote it: such a file is refused at once, and the message quotes none of it."""
    path = tmp_path / "runner-token"
    path.write_text(content + "\n", encoding="utf-8")
    with pytest.raises(SettingsError, match="alone on one line") as caught:
        read_secret(path, "runner-token", {})
    assert "sekrit" not in str(caught.value)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity"])
def test_a_float_setting_must_be_finite(value: str) -> None:
    with pytest.raises(SettingsError, match="TETHER_LEASE_TTL_S"):
        load_settings(SupervisorSettings, environ={"TETHER_LEASE_TTL_S": value})


def test_a_byte_order_mark_is_not_part_of_the_secret(tmp_path: Path) -> None:
    path = tmp_path / "runner-token"
    path.write_bytes(b"\xef\xbb\xbf" + SECRET.encode() + b"\r\n")  # an editor on Windows
    assert read_secret(path, "runner-token", {}) == SECRET


def test_a_secret_in_the_toml_is_refused_without_echoing_it(tmp_path: Path) -> None:
    """Secrets are not settings: a pasted token is an unknown key, and its value stays out of
    the error."""
    config = _toml(tmp_path, f'runner_token = "{SECRET}"\n')
    with pytest.raises(SettingsError, match="runner_token") as caught:
        load_settings(SupervisorSettings, config_file=config, environ={})
    assert SECRET not in str(caught.value)


def test_operator_token_from_credentials_is_not_echoed_when_the_call_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "operator-token").write_text(SECRET, encoding="utf-8")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    # Port 9 (discard) on loopback: nothing listens, so the call fails at once.
    with pytest.raises(SystemExit) as exited:
        supervisor_main(["task", "show", "--url", "http://127.0.0.1:9", "abc"])
    assert exited.value.code == 1
    captured: Any = capsys.readouterr()
    assert "cannot reach the supervisor" in captured.err
    assert SECRET not in captured.err + captured.out


# -- the runner's command line reads the same layers --------------------------------------------


@pytest.fixture
def runner_served(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, str]]]:
    """(settings, token) that `tether-runner run` would have served with, instead of serving."""
    import tether.runner.cli

    seen: list[tuple[Any, str]] = []

    async def fake_serve(settings: Any, token_value: str, *_args: Any) -> int:
        seen.append((settings, token_value))
        return 0

    monkeypatch.setattr(tether.runner.cli, "serve", fake_serve)
    yield seen
    structlog.reset_defaults()


RUNNER_TOML = """
supervisor_url = "http://127.0.0.1:8080"
model_url = "http://127.0.0.1:9000/v1"
model = "from-file"
concurrency = 2
shutdown_grace_s = 5
"""


def test_runner_applies_file_env_and_flags_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runner_served: list[tuple[Any, str]]
) -> None:
    from tether.runner.cli import main as runner_main

    config = _toml(tmp_path, RUNNER_TOML, "runner.toml")
    (tmp_path / "runner-token").write_text(SECRET, encoding="utf-8")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    monkeypatch.setenv("TETHER_CONCURRENCY", "3")
    monkeypatch.setenv("TETHER_MODEL", "from-env")
    argv = ["run", "--config", str(config), "--model", "from-flag", "--log-format", "json"]
    assert runner_main(argv) == 0
    ((settings, token),) = runner_served
    assert settings.shutdown_grace_s == 5.0  # file over default
    assert settings.concurrency == 3  # environment over file
    assert settings.model == "from-flag"  # flag over environment
    assert settings.claim_wait_s == 20.0  # default
    assert token == SECRET  # from $CREDENTIALS_DIRECTORY/runner-token


@pytest.mark.parametrize(
    ("extra", "key"),
    [("concurrency_limit = 3\n", "concurrency_limit"), ('concurrency = "four"\n', "concurrency")],
)
def test_runner_refuses_to_start_naming_the_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    runner_served: list[tuple[Any, str]],
    extra: str,
    key: str,
) -> None:
    from tether.runner.cli import main as runner_main

    config = _toml(tmp_path, RUNNER_TOML.replace("concurrency = 2\n", "") + extra, "runner.toml")
    token = tmp_path / "token"
    token.write_text(SECRET, encoding="utf-8")
    assert runner_main(["run", "--config", str(config), "--token-file", str(token)]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"'{key}'" in err
    assert SECRET not in err
    assert runner_served == []


def test_runner_without_a_token_says_where_to_put_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], runner_served: list[tuple[Any, str]]
) -> None:
    from tether.runner.cli import main as runner_main

    config = _toml(tmp_path, RUNNER_TOML, "runner.toml")
    assert runner_main(["run", "--config", str(config)]) != 0
    assert "runner-token" in capsys.readouterr().err
    assert runner_served == []
