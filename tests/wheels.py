"""The project's wheel, built once per test session from a copy of the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Never copied into the build: the checkout's own virtual environments, caches and ledgers.
_NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".peers-venv",
    ".runner-venv",
    ".litellm-venv",
    "__pycache__",
    "*.egg-info",
    "build",
    "site",
    ".*_cache",
    ".hypothesis",
    "*.db",
    "*.db-*",
)


def build_wheel(workdir: Path) -> Path:
    """Build tether's wheel from a copy of the checkout (so the build's own folders never land
    in the working tree), offline, with the venv's setuptools; the wheel's path."""
    source = workdir / "src"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE, symlinks=True)
    out = workdir / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    built = subprocess.run(
        [*pip, str(source), "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = out.glob("tether-*.whl")
    return wheel
