"""Running `git` for either program: in a subprocess that never blocks the event loop, never
prompts for a password, and never names a credential in an error message.

Git inherits the process's environment (an operator may give it an SSH agent or a credential
store), less the `GIT_*` variables that would point it at another repository or askpass
program. `GIT_TERMINAL_PROMPT=0` and SSH's `BatchMode` make a missing credential a failure
instead of a prompt, and `GIT_ALLOW_PROTOCOL` keeps out transports that run commands (`ext::`).
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
