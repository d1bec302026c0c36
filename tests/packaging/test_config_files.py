"""`config/*.toml` document every setting: drift between a file and its dataclass fails CI.

Each file holds every field of its settings class, either as an active `key = value` line or,
for a setting whose built-in default cannot be written in TOML (no value, or computed at start
like the runner's `<hostname>-<pid>` id), as a commented-out `# key = value` example. Active
values are the defaults, except the runner's required URLs and model name, which have none.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tether.runner.settings import RunnerSettings
from tether.settings import load_settings
from tether.supervisor.settings import SupervisorSettings

CONFIG = Path(__file__).resolve().parents[2] / "config"
_COMMENTED = re.compile(r"^#\s?([a-z_]+\s*=\s*.+)$")

# Fields without a default a file could state: required values, and values computed at start.
RUNNER_REQUIRED = {"supervisor_url", "model_url", "model"}
RUNNER_COMMENTED = {"token_file", "model_key_file", "runner_id"}


def _split(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(active settings, commented-out `# key = value` examples) of one TOML file."""
    text = path.read_text(encoding="utf-8")
    examples = "\n".join(
        m.group(1) for line in text.splitlines() if (m := _COMMENTED.match(line.strip()))
    )
    return tomllib.loads(text), tomllib.loads(examples)


def _fields(cls: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_supervisor_toml_holds_every_field_at_its_default() -> None:
    active, examples = _split(CONFIG / "supervisor.toml")
    assert set(active) == _fields(SupervisorSettings)
    assert examples == {}
    loaded = load_settings(SupervisorSettings, config_file=CONFIG / "supervisor.toml", environ={})
    assert loaded == SupervisorSettings()


def test_runner_toml_holds_every_field() -> None:
    active, examples = _split(CONFIG / "runner.toml")
    assert not set(active) & set(examples), "a key is both set and commented out"
    assert set(active) | set(examples) == _fields(RunnerSettings)
    assert set(examples) == RUNNER_COMMENTED
    assert set(active) >= RUNNER_REQUIRED


def test_runner_toml_active_values_are_the_defaults() -> None:
    loaded = load_settings(RunnerSettings, config_file=CONFIG / "runner.toml", environ={})
    defaults = {
        f.name: f.default
        for f in dataclasses.fields(RunnerSettings)
        if f.default is not dataclasses.MISSING
    }
    for name, default in defaults.items():
        if name in RUNNER_REQUIRED:
            continue
        assert getattr(loaded, name) == default, name
    assert loaded.token_file is None
    assert loaded.model_key_file is None


def test_runner_toml_examples_are_valid_values(tmp_path: Path) -> None:
    """Uncommenting every example must still load: the examples are real settings."""
    text = (CONFIG / "runner.toml").read_text(encoding="utf-8")
    uncommented = "\n".join(
        m.group(1) if (m := _COMMENTED.match(line.strip())) else line for line in text.splitlines()
    )
    target = tmp_path / "runner.toml"
    target.write_text(uncommented, encoding="utf-8")
    loaded = load_settings(RunnerSettings, config_file=target, environ={})
    assert loaded.token_file == Path("/etc/tether/credentials/runner-token")
    assert loaded.model_key_file == Path("/etc/tether/credentials/model-key")
    assert loaded.runner_id == "borrowed-box-1"


@pytest.mark.parametrize("name", ["supervisor.toml", "runner.toml"])
def test_no_secret_in_a_config_file(name: str) -> None:
    active, examples = _split(CONFIG / name)
    for key in {**active, **examples}:
        assert not re.search(r"(^|_)(token|key|secret|password)$", key), key


REFERENCE = CONFIG.parent / "docs" / "reference" / "configuration.md"
_ROW = re.compile(r"^\| `([a-z_]+)` \|(.*)$")


def _reference_table(heading: str) -> dict[str, str]:
    """The configuration reference rows under `heading`: key -> rest of the row."""
    text = REFERENCE.read_text(encoding="utf-8").split(heading, 1)[1]
    rows: dict[str, str] = {}
    for line in text.splitlines()[3:]:  # skip the heading's end, the blank line, the header
        if line.startswith("|---"):
            continue
        if not line.startswith("|"):
            break
        match = _ROW.match(line)
        assert match is not None, line
        rows[match.group(1)] = match.group(2)
    return rows


@pytest.mark.parametrize(
    ("heading", "cls"),
    [
        ("Supervisor (`tether-supervisor serve`):", SupervisorSettings),
        ("Runner (`tether-runner run`):", RunnerSettings),
    ],
)
def test_the_reference_lists_every_key_with_its_variable(heading: str, cls: type[Any]) -> None:
    rows = _reference_table(heading)
    assert set(rows) == _fields(cls)
    for key, rest in rows.items():
        assert f"`TETHER_{key.upper()}`" in rest, key
