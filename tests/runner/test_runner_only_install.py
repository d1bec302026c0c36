"""A runner-only install (`pip install tether`, the base dependencies alone) imports nothing it
lacks: every module of `tether` but the supervisor's and the explorer's imports, and
`tether-runner --help` runs, while the supervisor's and the developers' distributions and the
checkout-only packages are refused. And the wheel holds the one package `tether` only: no demo,
no stand-in model."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

from packaging.markers import Marker

from tests.wheels import build_wheel

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "runner_only_probe.py"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

# Supervisor-side distributions, listed even before they are dependencies so that no runner
# module starts importing one unnoticed; the extras below add whatever pyproject.toml lists.
ALWAYS_FORBIDDEN = frozenset(
    {
        "starlette",
        "uvicorn",
        "httptools",
        "prometheus_client",
        "cachetools",
        "jinja2",
        "psycopg",
        "aiosqlite",
        "opentelemetry",  # the otel extra: tracing is optional on a runner too
        # what a runner never imports: the supervisor and the schedule explorer (both in the
        # wheel), and packages of the checkout that a borrowed server never has
        "tether.supervisor",
        "tether.sim",
        "examples",
        "bench",
        "tests",
    }
)


# In the dev extra to build the wheel, but any virtual environment may hold them, and
# setuptools' start-up hook (_distutils_hack) is imported by site before any code runs.
VENV_TOOLS = frozenset({"pip", "setuptools"})


def _distribution_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _with_their_requirements(names: set[str]) -> set[str]:
    """`names` and every distribution they require, all the way down (extras and markers that
    do not hold here left out): what `pip install` of `names` puts on a server."""
    found: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            _, _, marker = requirement.partition(";")
            if "extra" in marker or (marker.strip() and not _marker_holds(marker)):
                continue
            todo.append(_distribution_name(requirement))
    return found


def _marker_holds(marker: str) -> bool:
    return Marker(marker.strip()).evaluate()


def forbidden_modules() -> frozenset[str]:
    """The top-level modules of the `supervisor`, `otel` and `dev` extras' distributions (less
    any the base dependencies also install, e.g. h11 under httpx's httpcore, and the venv's own
    tools), with the ones named above: tracing is optional on a runner too, so no runner module
    may need it."""
    project = PYPROJECT["project"]
    base = _with_their_requirements({_distribution_name(r) for r in project["dependencies"]})
    extras = project["optional-dependencies"]
    optional = [*extras["supervisor"], *extras["otel"], *extras["dev"]]
    wanted = {_distribution_name(r) for r in optional}
    wanted -= base | VENV_TOOLS
    modules: set[str] = set()
    for module, dists in importlib.metadata.packages_distributions().items():
        if {_distribution_name(d) for d in dists} & wanted:
            modules.add(module)
    modules |= {name.replace("-", "_") for name in wanted}  # not installed here: its own name
    return frozenset(modules | ALWAYS_FORBIDDEN)


def probe(*args: str, pythonpath: Path | None = None) -> dict[str, Any]:
    """Run the probe in a fresh interpreter; `pythonpath` replaces PYTHONPATH."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    done = subprocess.run(
        [sys.executable, str(PROBE), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_the_forbidden_list_covers_the_supervisor_and_dev_extras() -> None:
    forbidden = forbidden_modules()
    assert {"starlette", "uvicorn", "httptools", "pytest", "hypothesis", "psutil"} <= forbidden
    assert "opentelemetry" in forbidden
    assert not {"anyio", "httpx", "structlog", "tenacity", "sniffio", "tether", "tether.runner"} & (
        forbidden
    )


def test_every_runner_module_imports_and_help_runs_without_them() -> None:
    result = probe(
        "--forbid",
        ",".join(sorted(forbidden_modules())),
        "--walk",
        "tether",
        "--runner-help",
    )
    assert result["failures"] == []
    imported = set(result["imported"])
    runner = {"tether.runner.cli", "tether.runner.daemon", "tether.runner.step"}
    assert {"tether.wire", "tether.wire.records", "tether.logs", *runner} <= imported
    assert not [name for name in imported if name.startswith(("tether.supervisor", "tether.sim"))]
    assert {"tether.tracing", "tether.runner.tracing"} <= imported
    assert result["helped"] == [["--help"], ["run", "--help"]]


def test_the_probe_catches_a_module_that_imports_a_refused_one(tmp_path: Path) -> None:
    assert importlib.util.find_spec("starlette") is not None  # installed: refusing is the probe's
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    (planted / "light.py").write_text("import json\n")
    (planted / "heavy.py").write_text("from starlette.applications import Starlette\n")

    allowed = probe("--walk", "planted", pythonpath=tmp_path)
    refused = probe("--forbid", "starlette", "--walk", "planted", pythonpath=tmp_path)

    assert allowed["failures"] == []
    assert [name for name, _ in refused["failures"]] == ["planted.heavy"]
    assert "starlette" in refused["failures"][0][1]
    assert set(refused["imported"]) == {"planted", "planted.light", "planted.heavy"}


def test_the_wheel_holds_the_one_package_and_no_demo_or_stand_in(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    modules = [n for n in names if ".dist-info/" not in n]

    assert {n.split("/", 1)[0] for n in modules} == {"tether"}
    wanted = {"tether/wire/records.py", "tether/runner/cli.py", "tether/supervisor/cli.py"}
    assert wanted | {"tether/sim/explore.py", "tether/supervisor/ledger/sql/queries/batch.sql"} <= (
        set(modules)
    )
    assert [n for n in modules if "standin" in n or "demo" in n] == []
    assert (ROOT / "examples" / "standin_model.py").exists()  # it was there to leave out
