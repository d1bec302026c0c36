"""The systemd units in `systemd/`: they verify, stay hardened, and agree with the code.

`systemd-analyze verify` insists that ExecStart's binary exists, and the units name the
production path `/opt/tether/venv/bin/...`. Rather than creating files under /opt, the test
copies each unit into a temporary folder with that prefix rewritten to this environment's own
bin folder (where `pip install` put `tether-supervisor` and `tether-runner`), so verify checks
the real entry points and every other line exactly as shipped. Verify reports unknown or
misspelt directives as warnings with exit 0, so any output naming a unit fails the test too.
The opt-in drop-in `tether-runner-bwrap.conf` is checked the way systemd applies it: appended
to the runner's unit (its settings override or extend the unit's, as a drop-in's do).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tether.runner.agent.loop import default_cache_dir
from tether.runner.settings import RunnerSettings

UNITS = Path(__file__).resolve().parents[2] / "systemd"
NAMES = ("tether-supervisor.service", "tether-runner.service")
BWRAP_DROP_IN = "tether-runner-bwrap.conf"
PROD_BIN = "/opt/tether/venv/bin/"
EXPOSURE_MAX = 2.0
# The opt-in drop-in's price, as its comment states it (2.4 measured with systemd 252).
BWRAP_EXPOSURE_MAX = 2.5

ANALYZE = shutil.which("systemd-analyze")
IN_CI = os.environ.get("CI") == "true"  # .ci/run installs it: there a skip would hide a failure
needs_analyze = pytest.mark.skipif(
    ANALYZE is None and not IN_CI,
    reason="systemd-analyze is not installed (Debian: apt-get install systemd; .ci/run does it)",
)


@pytest.fixture(autouse=True)
def _analyze_present_in_ci() -> None:
    if IN_CI and ANALYZE is None:
        pytest.fail("systemd-analyze is missing in CI: .ci/run should have installed it")


def _directives(name: str) -> list[tuple[str, str, str]]:
    """(section, key, value) for every directive, in order; repeated keys are kept."""
    section, found = "", []
    for raw in _text(name).splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.append((section, key.strip(), value.strip()))
    return found


def _text(name: str) -> str:
    """A unit as shipped; `+` joins the drop-in to the unit it extends, as systemd would."""
    return "".join((UNITS / part).read_text(encoding="utf-8") for part in name.split("+"))


def _service(name: str) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for section, key, value in _directives(name):
        if section == "Service":
            values.setdefault(key, []).append(value)
    return values


@pytest.fixture(scope="module")
def local_units(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("units")
    local_bin = str(Path(sys.executable).parent) + "/"
    for name in NAMES:
        text = _text(name)
        assert PROD_BIN in text
        (folder / name).write_text(text.replace(PROD_BIN, local_bin), encoding="utf-8")
        if name == "tether-runner.service":
            with_bwrap = folder / "bwrap" / name
            with_bwrap.parent.mkdir()
            merged = _text(f"{name}+{BWRAP_DROP_IN}").replace(PROD_BIN, local_bin)
            with_bwrap.write_text(merged, encoding="utf-8")
        binary = re.search(r"^ExecStart=(\S+)", text, re.MULTILINE)
        assert binary is not None
        assert Path(binary.group(1).replace(PROD_BIN, local_bin)).exists()
    return folder


@needs_analyze
def test_systemd_analyze_verify_passes_on_both_units(local_units: Path) -> None:
    assert ANALYZE is not None
    done = subprocess.run(
        [ANALYZE, "verify", "--man=no", *(str(local_units / n) for n in NAMES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    complaints = [line for line in output.splitlines() if "tether-" in line]
    assert complaints == []


@needs_analyze
def test_the_runner_unit_with_the_bwrap_drop_in_verifies(local_units: Path) -> None:
    assert ANALYZE is not None
    unit = local_units / "bwrap" / "tether-runner.service"
    done = subprocess.run(
        [ANALYZE, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert [line for line in output.splitlines() if "tether-" in line] == []


def _exposure(unit: Path) -> float:
    assert ANALYZE is not None
    done = subprocess.run(
        [ANALYZE, "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "--offline" in done.stderr and "unrecognized" in done.stderr:
        if IN_CI:
            pytest.fail("CI's systemd-analyze predates --offline (systemd < 250)")
        pytest.skip("this systemd-analyze predates --offline (systemd < 250)")
    score = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert score is not None, done.stdout + done.stderr
    return float(score.group(1))


@needs_analyze
@pytest.mark.parametrize("name", NAMES)
def test_exposure_is_at_most_two(local_units: Path, name: str) -> None:
    assert _exposure(local_units / name) <= EXPOSURE_MAX


@needs_analyze
def test_the_bwrap_drop_in_costs_what_its_comment_says(local_units: Path) -> None:
    plain = _exposure(local_units / "tether-runner.service")
    with_bwrap = _exposure(local_units / "bwrap" / "tether-runner.service")
    assert plain < with_bwrap <= BWRAP_EXPOSURE_MAX


def test_the_bwrap_drop_in_undoes_only_what_stops_bubblewrap() -> None:
    unit = _service("tether-runner.service")
    merged = _service(f"tether-runner.service+{BWRAP_DROP_IN}")
    changed = {key for key in merged if merged[key] != unit.get(key)}
    blockers = {
        "RestrictNamespaces",
        "SystemCallFilter",
        "ProcSubset",
        "ProtectKernelTunables",
        "ProtectKernelLogs",
    }
    assert changed == blockers
    assert merged["RestrictNamespaces"][-2:] == ["", "user mnt pid net ipc uts cgroup"]
    assert merged["SystemCallFilter"][-1] == "mount umount2 pivot_root capset"
    assert merged["PrivateUsers"] == ["yes"]
    assert merged["NoNewPrivileges"] == ["yes"]


@pytest.mark.parametrize("name", NAMES)
def test_units_have_the_service_contract(name: str) -> None:
    service = _service(name)
    assert service["Type"] == ["notify"]
    assert service["Restart"] == ["on-failure"]
    assert service["DynamicUser"] == ["yes"]
    assert service["ProtectSystem"] == ["strict"]
    assert service["NoNewPrivileges"] == ["yes"]
    assert service["PrivateTmp"] == ["yes"]
    assert service["CapabilityBoundingSet"] == [""]  # no capability at all
    assert service["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    assert "@system-service" in service["SystemCallFilter"]
    assert service["UMask"] == ["0077"]
    assert float(service["WatchdogSec"][0]) > 0


def test_supervisor_keeps_its_ledger_in_the_state_directory() -> None:
    service = _service("tether-supervisor.service")
    assert service["StateDirectory"] == ["tether"]
    (exec_start,) = service["ExecStart"]
    assert "serve --config /etc/tether/supervisor.toml --db /var/lib/tether/tether.db" in exec_start
    assert float(service["TimeoutStopSec"][0]) > 10  # uvicorn's graceful drain


def test_runner_keeps_the_agents_mirrors_in_its_cache_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = _service("tether-runner.service")
    assert service["CacheDirectory"] == ["tether-runner"]
    assert service["CacheDirectoryMode"] == ["0700"]
    assert service["ProtectSystem"] == ["strict"]  # the cache is the one writable folder
    assert "ReadWritePaths" not in service
    # systemd sets $CACHE_DIRECTORY to the folder it made; the agent kind works there.
    monkeypatch.setenv("CACHE_DIRECTORY", "/var/cache/tether-runner")
    assert default_cache_dir() == Path("/var/cache/tether-runner")
    monkeypatch.delenv("CACHE_DIRECTORY")
    assert default_cache_dir() != Path("/var/cache/tether-runner")


def test_the_agents_commands_find_the_runners_own_interpreter_first() -> None:
    service = _service("tether-runner.service")
    (exec_start,) = service["ExecStart"]
    (path,) = [v.removeprefix("PATH=") for v in service["Environment"] if v.startswith("PATH=")]
    folders = path.split(":")
    assert folders[0] + "/" == PROD_BIN  # `python` in an allowed command: the venv's
    assert exec_start.startswith(folders[0])
    assert "/usr/bin" in folders  # git


def test_the_runner_unit_says_what_isolation_its_commands_get() -> None:
    text = _text("tether-runner.service")
    service = _service("tether-runner.service")
    assert service["RestrictNamespaces"] == ["yes"]  # so bwrap cannot run under it
    assert "WITHOUT bwrap" in text
    assert BWRAP_DROP_IN in text
    assert (UNITS / BWRAP_DROP_IN).exists()
    # The two ways out of the refusal: the drop-in above, or the setting, named as it is.
    assert "commands_without_sandbox = true" in text
    assert "commands_without_sandbox" in RunnerSettings.__dataclass_fields__
    assert "commands_without_sandbox = false" in _text(BWRAP_DROP_IN)


def test_runner_loads_its_secrets_as_credentials_and_outlasts_its_grace() -> None:
    service = _service("tether-runner.service")
    names = {value.split(":", 1)[0] for value in service["LoadCredential"]}
    assert names == {"runner-token", "model-key"}  # the names runner/ looks up
    assert not any("TOKEN" in v or "KEY" in v for v in service.get("Environment", []))
    (exec_start,) = service["ExecStart"]
    assert exec_start.endswith("tether-runner run --config /etc/tether/runner.toml")
    grace = RunnerSettings.__dataclass_fields__["shutdown_grace_s"].default
    assert isinstance(grace, float)
    assert float(service["TimeoutStopSec"][0]) > grace
