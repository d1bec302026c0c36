"""tether's wheel installs beside supervisord (`pip install supervisor`, whose import package is
`supervisor`): both import, and each uninstalls without touching the other's files. Before the
one-namespace layout tether's own top-level `supervisor/__init__.py` replaced supervisord's, and
uninstalling tether deleted it.

The supervisord wheel comes from the registry when `make venv` builds the environment
(`$(VENV)/wheels`), so the test itself never needs the network."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.wheels import build_wheel


def _supervisord_wheel() -> Path:
    found = sorted((Path(sys.prefix) / "wheels").glob("supervisor-*.whl"))
    if not found:
        line = f"no supervisord wheel in {Path(sys.prefix) / 'wheels'}: run `make venv`"
        if os.environ.get("CI"):
            pytest.fail(line, pytrace=False)
        pytest.skip(line)
    return found[-1]


def _run(*argv: str | Path) -> str:
    """Run a command away from the checkout (whose own `supervisor/` folder would shadow the
    installed packages in `python -c`), with no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=Path(argv[0]).parent if Path(argv[0]).is_absolute() else None,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_tether_and_supervisord_install_import_and_uninstall_side_by_side(tmp_path: Path) -> None:
    supervisord = _supervisord_wheel()
    tether = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    pip = (python, "-m", "pip", "--disable-pip-version-check", "-q")
    site = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip()
    )
    before = sorted(p.name for p in site.iterdir())

    _run(*pip, "install", "--no-index", "--no-deps", supervisord)
    _run(*pip, "install", "--no-index", "--no-deps", tether)
    assert (site / "supervisor" / "supervisord.py").is_file()
    assert (site / "tether" / "supervisor" / "cli.py").is_file()
    assert not (site / "runner").exists()
    # Both import, each its own: supervisord's package, and tether's (its stdlib-only parts:
    # the venv holds no dependencies).
    probe = (
        "import supervisor, supervisor.supervisord, tether, tether.wire.protocol\n"
        "print(supervisor.__file__); print(tether.__file__)"
    )
    where = _run(python, "-c", probe).split()
    assert where == [str(site / "supervisor" / "__init__.py"), str(site / "tether" / "__init__.py")]

    _run(*pip, "uninstall", "-y", "tether")
    assert not (site / "tether").exists()
    _run(python, "-c", "import supervisor.supervisord")  # supervisord's files are all there

    _run(*pip, "uninstall", "-y", "supervisor")
    assert sorted(p.name for p in site.iterdir()) == before  # nothing of either is left
