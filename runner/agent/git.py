"""Running `git` for the workspace: in a subprocess that never blocks the event loop, never
prompts for a password, and never names a credential in an error message.

Git inherits the runner's environment (an operator may give it an SSH agent or a credential
store for read access), less the `GIT_*` variables that would point it at another repository
or askpass program; `GIT_TERMINAL_PROMPT=0` and SSH's `BatchMode` make a missing credential a
failure instead of a prompt.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

import anyio

# Inherited GIT_* variables that choose how to reach a remote, kept; every other one
# (GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE, GIT_ASKPASS, ...) is dropped.
_KEPT_GIT_VARS = frozenset({"GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSL_CAINFO", "GIT_PROXY_COMMAND"})
_NO_PROMPT = {"GIT_TERMINAL_PROMPT": "0", "GCM_INTERACTIVE": "never"}
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")

DEFAULT_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class GitOutput:
    returncode: int
    stdout: bytes
    stderr: bytes


class GitError(Exception):
    """A git command exited non-zero (or timed out)."""

    def __init__(self, args: tuple[str, ...], returncode: int, stderr: str) -> None:
        self.returncode = returncode
        self.stderr = stderr
        command = " ".join(redact(a) for a in args)
        super().__init__(f"git {command} exited {returncode}: {stderr.strip()[-500:]}")


def redact(text: str) -> str:
    """Drop the user and password from every URL in `text`."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment git runs in (see the module docstring)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("GIT_") or key in _KEPT_GIT_VARS
    }
    env.pop("SSH_ASKPASS", None)
    env.update(_NO_PROMPT)
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

    A command past `timeout_s` is killed and reported as exit code -1."""
    command = ("git", "-c", "core.hooksPath=/dev/null", *args)
    with anyio.move_on_after(timeout_s):
        done = await anyio.run_process(
            command,
            input=stdin,
            cwd=cwd,
            env=git_env(env),
            check=False,
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
        if check and done.returncode != 0:
            raise GitError(args, done.returncode, done.stderr.decode(errors="replace"))
        return GitOutput(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)
    raise GitError(args, -1, f"timed out after {timeout_s:g} s")
