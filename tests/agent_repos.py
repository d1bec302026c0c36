"""Real git repositories for the agent tests: an origin with a small Python package."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

IDENTITY = {
    "GIT_AUTHOR_NAME": "origin",
    "GIT_AUTHOR_EMAIL": "origin@example.org",
    "GIT_COMMITTER_NAME": "origin",
    "GIT_COMMITTER_EMAIL": "origin@example.org",
    "GIT_AUTHOR_DATE": "@1700000000 +0000",
    "GIT_COMMITTER_DATE": "@1700000000 +0000",
}

FILES = {
    "src/app.py": "def answer():\n    return 41\n",
    "tests/test_app.py": (
        "from app import answer\n\n\ndef test_answer():\n    assert answer() == 42\n"
    ),
    "README.md": "# demo\n",
}


def sh(*args: str, cwd: Path, stdin: bytes | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | IDENTITY
    done = subprocess.run(args, cwd=cwd, env=env, input=stdin, capture_output=True, check=True)
    return done.stdout.decode()


def make_origin(root: Path, files: dict[str, str] = FILES) -> tuple[Path, str]:
    """A repository at `root` with `files` committed on `main`; returns (path, head SHA)."""
    root.mkdir(parents=True)
    sh("git", "init", "--quiet", "--initial-branch=main", ".", cwd=root)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    sh("git", "add", "--all", cwd=root)
    sh("git", "commit", "--quiet", "-m", "base", cwd=root)
    return root, sh("git", "rev-parse", "HEAD", cwd=root).strip()


def add_commit(root: Path, name: str, text: str) -> str:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
    sh("git", "add", "--all", cwd=root)
    sh("git", "commit", "--quiet", "-m", f"change {name}", cwd=root)
    return sh("git", "rev-parse", "HEAD", cwd=root).strip()


def status(tree: Path) -> str:
    return sh("git", "status", "--porcelain", "--untracked-files=all", cwd=tree)
