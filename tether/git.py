"""Running `git` for either program: in a subprocess that never blocks the event loop, never
prompts for a password, and never names a credential in an error message.

`git` inherits the process's environment (an operator may give it an SSH agent or a credential
store), less the `GIT_*` variables that would point it at another repository or askpass
program. `GIT_TERMINAL_PROMPT=0` and SSH's `BatchMode` make a missing credential a failure
instead of a prompt, and `GIT_ALLOW_PROTOCOL` keeps out transports that run commands (`ext::`).

`TreeGit` is git on a work tree whose files someone else wrote (an agent step's worktree): it
reads nothing the tree can steer (docs/design.md, The borrowed side).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio

# Inherited GIT_* variables that choose how to reach a remote, kept; every other one
# (GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE, GIT_ASKPASS, ...) is dropped.
_KEPT_GIT_VARS = frozenset({"GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSL_CAINFO", "GIT_PROXY_COMMAND"})
_FIXED = {
    "GIT_TERMINAL_PROMPT": "0",
    "GCM_INTERACTIVE": "never",
    "GIT_ALLOW_PROTOCOL": "file:git:ssh:http:https",
}
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")

DEFAULT_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class GitOutput:
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


class GitError(Exception):
    """A git command exited non-zero or timed out; the message holds no credential."""

    def __init__(self, args: tuple[str, ...], returncode: int, stderr: str) -> None:
        self.returncode = returncode
        self.stderr = redact(stderr)
        # One line of git's own words, from their end (where git says what went wrong).
        self.reason = " ".join(self.stderr.split())[-300:] or f"exit code {returncode}"
        command = " ".join(redact(a) for a in args)
        super().__init__(f"git {command} exited {returncode}: {self.reason}")


def redact(text: str) -> str:
    """Mask the user and password of every URL in `text`."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment git runs in (see the module docstring), plus `extra`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("GIT_") or key in _KEPT_GIT_VARS
    }
    env.pop("SSH_ASKPASS", None)
    env.update(_FIXED)
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    if extra:
        env.update(extra)
    return env


async def git(
    *args: str,
    cwd: Path,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> GitOutput:
    """Run `git ARGS` in `cwd`; raise `GitError` on a non-zero exit when `check` is set.

    A command past `timeout_s` is killed and raised as exit code -1 whatever `check` says."""
    command = ("git", "-c", "core.hooksPath=/dev/null", *args)
    return await _run(command, args, cwd, stdin, git_env(env), check, timeout_s)


async def _run(
    command: Sequence[str],
    args: tuple[str, ...],
    cwd: Path,
    stdin: bytes | None,
    env: Mapping[str, str],
    check: bool,
    timeout_s: float,
) -> GitOutput:
    with anyio.move_on_after(timeout_s):
        done = await anyio.run_process(
            command,
            input=stdin,
            cwd=cwd,
            env=env,
            check=False,
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
        if check and done.returncode != 0:
            raise GitError(args, done.returncode, done.stderr.decode(errors="replace"))
        return GitOutput(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)
    raise GitError(args, -1, f"timed out after {timeout_s:g} s")


# Settings that would otherwise come from a config file or turn on a program git runs: no
# hook, no fsmonitor daemon or hook, no attributes or excludes file of the runner's user, no
# end-of-line conversion, no transport at all.
_TREE_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null",
    "core.autocrlf=false",
    "core.symlinks=true",
    "core.fileMode=true",
    "protocol.allow=never",
)
# The git dir's info/attributes, which outranks every .gitattributes in the tree: no filter
# (clean, smudge, LFS), no end-of-line conversion, no `$Id$` expansion, no re-encoding. A file
# is stored as the bytes on disk and checked out as the bytes of its blob.
NEUTRAL_ATTRIBUTES = "* -filter -text -eol -crlf -ident -working-tree-encoding\n"


def tree_git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a `TreeGit` command, plus `extra`: no system or global config
    or attributes (so no `include`, no filter or LFS set up for the runner's user), no
    replace refs, and nothing inherited but PATH."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_TERMINAL_PROMPT": "0",
    }
    if extra:
        env.update(extra)
    return env


def write_neutral_attributes(common_dir: Path) -> None:
    """Make `common_dir/info/attributes` `NEUTRAL_ATTRIBUTES` (for the git dirs of a
    repository's worktrees too: git reads it from the common dir)."""
    path = common_dir / "info" / "attributes"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != NEUTRAL_ATTRIBUTES:
        path.write_text(NEUTRAL_ATTRIBUTES)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TreeGit:
    """Git on `work_tree` with the repository at `git_dir`, which must lie outside anything a
    command can write, and whose common dir holds `NEUTRAL_ATTRIBUTES`.

    Both are passed on every command, so git never looks for a repository in the tree (a
    `.git` there, file or folder, is never read), and it reads no config but the git dir's
    own (`tree_git_env`, `_TREE_CONFIG`): code the model wrote can put what it likes in the
    tree, and nothing of it runs outside the sandbox when the runner snapshots, checks out or
    searches the tree."""

    git_dir: Path
    work_tree: Path

    def argv(self, *args: str) -> list[str]:
        """The command line of `git ARGS` on this tree (for a caller that streams it)."""
        config = [part for setting in _TREE_CONFIG for part in ("-c", setting)]
        tree = [f"--git-dir={self.git_dir}", f"--work-tree={self.work_tree}"]
        return ["git", *tree, *config, *args]

    async def __call__(
        self,
        *args: str,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> GitOutput:
        """Run `git ARGS` at the root of the tree, as `git` does (`env` adds to
        `tree_git_env`)."""
        command = self.argv(*args)
        return await _run(command, args, self.work_tree, stdin, tree_git_env(env), check, timeout_s)
