"""How an allowed command is isolated: under bubblewrap when it works on this host, otherwise
with no isolation beyond what `runner/agent/command.py` always does. Whether a step may run
commands at all without bubblewrap is `runner/agent/sandbox_policy.py`'s decision.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import anyio
import structlog

log = structlog.get_logger(__name__)

_RO_DIRS = ("/usr", "/etc")
_MAYBE_LINKED = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_HIDDEN = ("/etc/tether",)  # the runner's own configuration and credentials
PROBE_TIMEOUT_S = 10.0


class Sandbox(Protocol):
    """Turns a command's argv into the argv that runs it isolated."""

    @property
    def name(self) -> str: ...

    @property
    def isolated(self) -> bool:
        """Whether a command is kept from the runner's files and network (bubblewrap), so
        whether code the model wrote may run here (`runner/agent/sandbox_policy.py`)."""
        ...

    def wrap(
        self, argv: Sequence[str], *, tree: Path, home: Path, network: bool = False
    ) -> list[str]:
        """`network`: the command may reach the network (setup only; never the model's)."""
        ...


@dataclasses.dataclass(frozen=True)
class NoSandbox:
    """No isolation beyond the process group, the environment and the working directory.

    Used when there is no `bwrap`, or bwrap cannot create namespaces here (e.g. inside a
    container that forbids them). The command runs as the runner's own user, so it can read
    whatever that user can read and reach whatever the runner can reach. What still holds: its
    own process group, killed whole on timeout or cancellation; a fixed minimal environment
    with no secret; the worktree as its working directory. `why` says why bubblewrap is not
    used, for the operator.
    """

    why: str = "no sandbox is in use"
    name: str = "none"

    @property
    def isolated(self) -> bool:
        return False

    def wrap(
        self, argv: Sequence[str], *, tree: Path, home: Path, network: bool = False
    ) -> list[str]:
        return list(argv)


def private_tmp(home: Path) -> Path:
    """The folder a command under bubblewrap sees as /tmp: beside its HOME, on disk, so what
    it writes there counts toward `worktree_max_mb` (the size check measures it with the
    worktree and HOME) and toward no process's memory; its parent is not the command's to
    write, so it cannot be swapped for a link elsewhere."""
    return home.with_name(f"{home.name}.tmp")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bubblewrap:
    """bubblewrap with the worktree and HOME the only writable paths and no network.

    The command sees read-only /usr, /bin, /lib*, /sbin and /etc (with /etc/tether hidden), a
    private /tmp (`private_tmp`, on disk), /proc and /dev, and the caller's further read-only
    paths (a toolchain outside /usr, e.g. a virtualenv). `--unshare-all` gives it its own
    network namespace with only a loopback, and its own PID namespace, so everything it
    started dies with it. The mirror is not mounted, so `git` run inside does not find the
    repository (the worktree's `.git` file points into the mirror), and that `.git` is
    read-only.
    """

    bwrap: str
    read_only: tuple[Path, ...] = ()
    name: str = "bwrap"

    @property
    def isolated(self) -> bool:
        return True

    def wrap(
        self, argv: Sequence[str], *, tree: Path, home: Path, network: bool = False
    ) -> list[str]:
        args = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-all"]
        if network:
            args.append("--share-net")
        for folder in _RO_DIRS:
            args += ["--ro-bind", folder, folder]
        for folder in _MAYBE_LINKED:
            path = Path(folder)
            if path.is_symlink():
                args += ["--symlink", str(path.readlink()), folder]
            elif path.is_dir():
                args += ["--ro-bind", folder, folder]
        for folder in _HIDDEN:
            if Path(folder).is_dir():
                args += ["--tmpfs", folder]
        # /tmp on disk, beside HOME: a tmpfs would be memory no rlimit counts and no size
        # check sees, and a command's HOME is its own to replace with a symlink.
        tmp = private_tmp(home)
        tmp.mkdir(exist_ok=True)
        args += ["--proc", "/proc", "--dev", "/dev", "--bind", str(tmp), "/tmp"]  # noqa: S108
        for path in self.read_only:
            args += ["--ro-bind-try", str(path), str(path)]
        args += ["--bind", str(tree), str(tree), "--bind", str(home), str(home)]
        # The tree's `.git` read-only: a command cannot swap in a repository of its own (the
        # runner's git never reads it either: `tether.git.TreeGit`).
        args += ["--ro-bind-try", str(tree / ".git"), str(tree / ".git")]
        args += ["--chdir", str(tree), "--", *argv]
        return args


async def detect_sandbox(read_only: Sequence[Path] = ()) -> Sandbox:
    """Bubblewrap when `bwrap` is on PATH and a probe (`true` under the same options)
    succeeds, else `NoSandbox`."""
    found = shutil.which("bwrap")
    if found is None:
        why = "bwrap is not installed"
        log.info("sandbox", sandbox="none", why=why)
        return NoSandbox(why=why)
    candidate = Bubblewrap(bwrap=found, read_only=tuple(read_only))
    with tempfile.TemporaryDirectory(prefix="tether-probe-") as scratch:
        tree = Path(scratch)
        argv = candidate.wrap(["true"], tree=tree, home=tree)
        with anyio.move_on_after(PROBE_TIMEOUT_S):
            done = await anyio.run_process(
                argv, check=False, stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"}
            )
            if done.returncode == 0:
                log.info("sandbox", sandbox="bwrap")
                return candidate
            said = done.stderr.decode(errors="replace").strip()[-300:]
            why = f"bwrap probe failed: {said}"
            log.warning("sandbox", sandbox="none", why=why)
            return NoSandbox(why=why)
    why = "bwrap probe timed out"
    log.warning("sandbox", sandbox="none", why=why)
    return NoSandbox(why=why)
