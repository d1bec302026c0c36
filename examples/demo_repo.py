"""The agent demo's repository (`make demo-agent`): a small Python package whose test fails, in
a local bare repository that the supervisor and the runners read as a remote, and the git reads
the demo makes itself to check what the supervisor says about a candidate.

Git runs with tether's own environment for it (`tether.git.git_env`), a fixed identity and no
user or system configuration, so the demo behaves the same on every machine.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from examples.processes import DemoError
from tether.git import git_env

TEST_COMMAND = "python -m pytest -q"
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
FILES = {
    "src/__init__.py": "",
    "src/calc.py": BUGGY,
    "tests/test_calc.py": (
        "from src.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    ),
    "README.md": "# calc\n\nAdds numbers (the tests say how well).\n",
}
_IDENTITY = {
    "GIT_AUTHOR_NAME": "a colleague",
    "GIT_AUTHOR_EMAIL": "colleague@example.org",
    "GIT_COMMITTER_NAME": "a colleague",
    "GIT_COMMITTER_EMAIL": "colleague@example.org",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def git(*args: str, cwd: Path, data: bytes | None = None) -> bytes:
    """`git ARGS` in `cwd`, its output; DemoError naming the command when it fails."""
    done = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=git_env(_IDENTITY),
        input=data,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip()[-300:]
        raise DemoError(f"git {' '.join(args)} exited {done.returncode}: {why}")
    return done.stdout


def git_text(*args: str, cwd: Path) -> str:
    return git(*args, cwd=cwd).decode().strip()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Repository:
    """The demo's remote (`bare`, what `repo add --url` names), a clone where a colleague
    commits (`work`), and the commit the tasks are approved on (`base`)."""

    bare: Path
    work: Path
    base: str

    def head(self) -> str:
        """The remote's head as the supervisor reads it (`git ls-remote`)."""
        line = git_text("ls-remote", str(self.bare), "HEAD", cwd=self.work)
        return line.split()[0] if line else ""

    def push_commit(self, name: str, text: str, message: str) -> str:
        """Commit `text` as `name` in the clone and push it to the remote; the new head."""
        path = self.work / name
        path.write_text(text, encoding="utf-8")
        git("add", name, cwd=self.work)
        git("commit", "--quiet", "-m", message, cwd=self.work)
        git("push", "--quiet", "origin", "HEAD:main", cwd=self.work)
        return git_text("rev-parse", "HEAD", cwd=self.work)


def make_repository(folder: Path) -> Repository:
    """`folder`/calc.git, a bare repository whose `main` holds FILES in one commit."""
    seed, bare, work = folder / "seed", folder / "calc.git", folder / "work"
    seed.mkdir(parents=True)
    git("init", "--quiet", "--initial-branch=main", ".", cwd=seed)
    for name, text in FILES.items():
        (seed / name).parent.mkdir(parents=True, exist_ok=True)
        (seed / name).write_text(text, encoding="utf-8")
    git("add", "--all", cwd=seed)
    git("commit", "--quiet", "-m", "calc: add() and its test", cwd=seed)
    git("clone", "--quiet", "--bare", str(seed), str(bare), cwd=folder)
    git("clone", "--quiet", str(bare), str(work), cwd=folder)
    return Repository(bare=bare, work=work, base=git_text("rev-parse", "HEAD", cwd=work))


def tests_at(repository: Path, sha: str) -> tuple[int, str]:
    """Run TEST_COMMAND (with this interpreter) on a checkout of `sha` from `repository` (a
    clone or a bare mirror): its exit code and pytest's last line. The checkout is a clone
    sharing `repository`'s objects, so any commit in it can be checked out, refs or not; git
    writes the files (no tar extraction, whose `filter=` needs Python 3.11.4)."""
    with tempfile.TemporaryDirectory(prefix="tether-demo-tests-") as scratch:
        work = Path(scratch) / "tree"
        git("clone", "-q", "--shared", "--no-checkout", str(repository), "tree", cwd=Path(scratch))
        git("checkout", "--quiet", "--detach", sha, cwd=work)
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
            cwd=work,
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    lines = done.stdout.strip().splitlines()
    return done.returncode, lines[-1] if lines else "(no output)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CandidateFacts:
    """What git itself says about a candidate in the supervisor's mirror."""

    ref_sha: str  # what the attempt's ref refs/tether/<task>/<step>/<fence> names
    descends: bool  # the base is an ancestor of the candidate
    changed: tuple[str, ...]  # paths that differ between the base and the candidate
    calc: str  # src/calc.py at the candidate


def inspect_candidate(mirror: Path, ref: str, base: str, candidate: str) -> CandidateFacts:
    if not mirror.is_dir():
        raise DemoError(f"the supervisor has no mirror at {mirror}")
    descends = subprocess.run(
        ["git", "merge-base", "--is-ancestor", base, candidate],
        cwd=mirror,
        env=git_env(_IDENTITY),
        capture_output=True,
        check=False,
    )
    return CandidateFacts(
        ref_sha=git_text("rev-parse", "--verify", "--quiet", ref, cwd=mirror),
        descends=descends.returncode == 0,
        changed=tuple(git_text("diff", "--name-only", base, candidate, cwd=mirror).split()),
        calc=git("show", f"{candidate}:src/calc.py", cwd=mirror).decode(),
    )
