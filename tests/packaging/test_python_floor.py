"""Issue 26, finding 6: the Pythons we promise are the Pythons we test. `requires-python` says
the true floor, 3.11.2, what Debian 12 ships as /usr/bin/python3; the agent demo runs there
(it once needed `TarFile.extractall(filter=)`, new in 3.11.4). .ci/run builds a venv on that
interpreter and runs the three demos and a slice of the suite; this test runs the agent demo
on it from here, with this venv's packages (the same CPython ABI, so the same wheels)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import tomllib
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
DEBIAN_PYTHON = Path("/usr/bin/python3")
FLOOR = (3, 11, 2)
SCRIPTS = {"tether-supervisor": "tether.supervisor.cli", "tether-runner": "tether.runner.cli"}


def test_requires_python_says_the_floor_ci_tests() -> None:
    project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=" + ".".join(map(str, FLOOR))
    assert "/usr/bin/python3" in (CHECKOUT / ".ci" / "run").read_text()


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


def _version(python: Path) -> tuple[int, ...]:
    done = subprocess.run(
        [str(python), "-c", "import sys; print(*sys.version_info[:3])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return tuple(int(part) for part in done.stdout.split())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_agent_demo_runs_on_debians_python(tmp_path: Path) -> None:
    if not DEBIAN_PYTHON.exists():
        pytest.skip("no /usr/bin/python3 here")
    version = _version(DEBIAN_PYTHON)
    if version[:2] != (3, 11) or version >= (3, 11, 4):
        pytest.skip(f"/usr/bin/python3 is {version}, not a 3.11 older than 3.11.4")
    assert version >= FLOOR
    venv = tmp_path / "oldest"
    subprocess.run(
        [str(DEBIAN_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    [site] = (venv / "lib").glob("python3.*/site-packages")
    # This venv's packages (tether, editable, and its dependencies), linked file by file into
    # the new one: the runner's sandbox shows commands its own venv, so they must be in it.
    packages = sysconfig.get_paths()["purelib"]
    shutil.copytree(packages, site, copy_function=_link, dirs_exist_ok=True)
    for script, module in SCRIPTS.items():  # what pip would write for [project.scripts]
        path = venv / "bin" / script
        path.write_text(
            f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom {module} import main\n"
            "sys.exit(main())\n"
        )
        path.chmod(0o755)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "examples.demo_agent"],
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "python -m pytest -q exits 1 (1 failed" in done.stdout  # the base, checked out
