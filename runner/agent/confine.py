"""Limits on every command an agent step runs (the `run` tool, checks, setup): each runs under
the reaper (`runner/agent/reaper.py`) with its rlimits, and in a cgroup of its own where this
host offers one (`runner/agent/cgroups.py`).

What bounds what:

- processes: RLIMIT_NPROC, which counts every process of the command's user (so it is a
  ceiling shared with the runner's other commands) and which the kernel does not enforce for
  root, not even inside bubblewrap's user namespace (root there is root outside); and the
  cgroup's `pids.max`, which holds for root too. A root runner on a host with no usable
  cgroup has no bound on processes but the wall-clock timeout (said once, at the first
  command); on a host with cgroups, a root runner refuses a command whose own cgroup cannot
  be made (`CommandUnbounded`) rather than run it unbounded.
- memory: RLIMIT_AS (address space, per process: a runtime that reserves a large address
  space up front may need more than it uses), and the cgroup's memory limit for the whole
  command, where there is one.
- file size: RLIMIT_FSIZE (each file; the worktree as a whole is `worktree_max_mb`, checked
  by the caller after each command).
- CPU: RLIMIT_CPU, per process: SIGXCPU at the limit, SIGKILL a second later.
- what outlives the command: nothing. The reaper is a child subreaper, so whatever the command
  starts (`setsid` and double-forked daemons included) is reparented to it and killed when the
  command exits or the runner ends it; the cgroup, where there is one, is then emptied and
  removed; under bubblewrap the PID namespace dies with the command besides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import anyio
import structlog

from tether.runner.agent import cgroups as cg
from tether.runner.agent.errors import CommandUnbounded, WorktreeTooLarge

log = structlog.get_logger(__name__)

REAPER = Path(__file__).with_name("reaper.py")
MB = 1024 * 1024


@dataclasses.dataclass(frozen=True, kw_only=True)
class CommandLimits:
    """The runner's `command_max_*` and `worktree_max_mb` settings."""

    max_processes: int = 256
    max_memory_mb: int = 2048
    max_file_mb: int = 1024
    max_cpu_s: int = 600
    worktree_max_mb: int = 4096

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """The command's rlimits by `resource` name, as (soft, hard)."""
        return {
            "RLIMIT_NPROC": (self.max_processes, self.max_processes),
            "RLIMIT_AS": (self.max_memory_mb * MB, self.max_memory_mb * MB),
            "RLIMIT_FSIZE": (self.max_file_mb * MB, self.max_file_mb * MB),
            "RLIMIT_CPU": (self.max_cpu_s, self.max_cpu_s + 1),
        }

    def as_dict(self) -> dict[str, int]:
        """The limits as a tool result names them."""
        return {
            "max_processes": self.max_processes,
            "max_memory_mb": self.max_memory_mb,
            "max_file_mb": self.max_file_mb,
            "max_cpu_s": self.max_cpu_s,
        }


@dataclasses.dataclass(frozen=True)
class Confined:
    """One command under way: the argv to start, and its cgroup if it has one."""

    argv: list[str]
    cgroup: cg.CommandCgroup | None

    def limit_hit(self, returncode: int | None) -> str | None:
        """Which limit ended or hampered the command, when that can be told: `processes` or
        `memory` from its cgroup's counters, `cpu` or `file_size` from the signal it died of
        (an rlimit a process merely ran into shows as an error in its own output). bubblewrap
        and shells report a signal as exit code 128 + its number."""
        if self.cgroup is not None:
            hit = self.cgroup.limit_hit()
            if hit is not None:
                return hit
        for number, limit in ((signal.SIGXCPU, "cpu"), (signal.SIGXFSZ, "file_size")):
            if returncode in (-number, 128 + number):
                return limit
        return None


_finding = threading.Lock()


def host_cgroups() -> cg.Cgroups | None:
    """This runner's cgroups, found once per process (cgroup v2 moves the runner itself).
    Commands of concurrent steps ask from threads of their own at once: the lock keeps them
    to one `Cgroups`, whose names never clash (two made each their `cmd-<pid>-1`)."""
    with _finding:
        return _find_host_cgroups()


@functools.cache
def _find_host_cgroups() -> cg.Cgroups | None:
    try:
        found, why = cg.find_cgroups()
    except OSError as exc:
        found, why = None, f"cannot read the cgroup mounts: {exc.strerror or exc}"
    if found is None:
        log.warning(
            "commands run without a cgroup: each process is bounded by its rlimits only;"
            " as root nothing bounds how many processes a command starts but its timeout",
            why=why,
        )
    else:
        log.info("commands run in cgroups", cgroups=why)
    return found


class Confiner:
    """Puts commands under `limits`, in cgroups where the host offers them."""

    def __init__(
        self,
        limits: CommandLimits | None = None,
        *,
        cgroups: Callable[[], cg.Cgroups | None] = host_cgroups,
    ) -> None:
        """`cgroups`: where command cgroups are made (None: nowhere, rlimits only)."""
        self.limits = limits or CommandLimits()
        self._cgroups = cgroups

    @contextlib.asynccontextmanager
    async def confine(self, argv: Sequence[str]) -> AsyncIterator[Confined]:
        """`argv` as the reaper runs it; on the way out the command's cgroup is emptied and
        removed (the caller ends the reaper itself)."""
        group = None
        found = await anyio.to_thread.run_sync(self._cgroups)
        if found is not None:
            try:
                group = found.create(
                    max_processes=self.limits.max_processes,
                    max_memory_bytes=self.limits.max_memory_mb * MB,
                )
            except OSError as exc:
                self._without_cgroup(exc)
        options = ["--parent", str(os.getpid())]
        for name, (soft, hard) in self.limits.rlimits().items():
            options += ["--rlimit", f"{name}={soft}:{hard}"]
        for procs in group.procs if group is not None else ():
            options += ["--cgroup", str(procs)]
        wrapped = [sys.executable, "-I", "-S", str(REAPER), *options, "--", *argv]
        try:
            yield Confined(argv=wrapped, cgroup=group)
        finally:
            if group is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(group.end)

    def _without_cgroup(self, exc: OSError) -> None:
        """A command's cgroup could not be made where the host offers cgroups: it runs on its
        rlimits where they bound its processes, else it is refused (`CommandUnbounded`)."""
        why = exc.strerror or str(exc)
        if rlimits_bound_processes():
            log.warning("no cgroup for this command: its rlimits bound it", why=why)
            return
        log.error("command refused: no cgroup for it, and as root nothing else bounds it", why=why)
        raise CommandUnbounded(
            f"command_unbounded: the runner could not make this command's cgroup ({why}), and"
            " as root nothing else bounds how many processes it starts; it was not run"
        )


def rlimits_bound_processes() -> bool:
    """Whether RLIMIT_NPROC holds for the runner's commands: not for root (see the module)."""
    return os.geteuid() != 0


def folder_bytes(folders: Sequence[Path]) -> int:
    """Bytes of the files under `folders`, symlinks counted as links, never followed."""
    size = 0
    for root in folders:
        for folder, _dirs, names in os.walk(root):
            for name in names:
                with contextlib.suppress(OSError):
                    size += os.lstat(os.path.join(folder, name)).st_size
    return size


async def check_workspace_size(
    folders: Sequence[Path], limits: CommandLimits, *, after: str
) -> None:
    """Raise `WorktreeTooLarge` when `folders` (the worktree and the command's HOME) hold
    more than `limits.worktree_max_mb`; `after` names the command, for the detail."""
    size = await anyio.to_thread.run_sync(folder_bytes, folders)
    if size > limits.worktree_max_mb * MB:
        raise WorktreeTooLarge(
            f"worktree_too_large: after {after} the worktree and HOME hold {size // MB} MB;"
            f" the runner's worktree_max_mb is {limits.worktree_max_mb}"
        )
