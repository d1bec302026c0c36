"""The process every agent command runs under (`runner/agent/confine.py`): it joins the
command's cgroups, becomes a child subreaper, starts the command with its rlimits set, and when
the command ends, or on SIGTERM from the runner, kills every process the command left behind,
`setsid` daemons included (they are reparented here, not to init), before it exits with the
command's status: its exit code, or the same signal re-raised.

Run by path as `python -I -S reaper.py [--parent PID] [--rlimit NAME=SOFT:HARD]...
[--cgroup PROCS_FILE]... -- ARGV...`, so it imports only the standard library, and little of
it (no json, re or typing: it starts once per command). `--parent` is the runner's pid: when
it is gone by the time the death signal is armed, nothing runs. Its own failures exit 126 with
one line.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CANNOT_START = 126
NOT_FOUND = 127
# Signals Python ignores at start, restored for the command as subprocess does.
_RESTORED = ("SIGPIPE", "SIGXFZ", "SIGXFSZ")


USAGE = "usage: reaper.py [--parent PID] [--rlimit NAME=SOFT:HARD]... [--cgroup FILE]... -- ARGV"


def parse(argv: list[str]) -> tuple[int | None, dict[str, tuple[int, int]], list[str], list[str]]:
    """The parent pid, the rlimits by name, the cgroup.procs files and the command."""
    parent: int | None = None
    rlimits: dict[str, tuple[int, int]] = {}
    cgroups: list[str] = []
    at = 1
    while at < len(argv) and argv[at] != "--":
        option, value = argv[at], argv[at + 1]
        if option == "--parent":
            parent = int(value)
        elif option == "--rlimit":
            name, _, limits = value.partition("=")
            soft, _, hard = limits.partition(":")
            rlimits[name] = (int(soft), int(hard))
        elif option == "--cgroup":
            cgroups.append(value)
        else:
            raise ValueError(option)
        at += 2
    command = argv[at + 1 :]
    if not command:
        raise ValueError("no command")
    return parent, rlimits, cgroups, command


def main(argv: list[str]) -> int:
    try:
        parent, rlimits, cgroups, command = parse(argv)
    except (IndexError, ValueError):
        print(f"tether reaper: {USAGE}", file=sys.stderr)
        return CANNOT_START
    try:
        for procs in cgroups:
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))
        libc = ctypes.CDLL(None, use_errno=True)
        for option, value in ((PR_SET_CHILD_SUBREAPER, 1), (PR_SET_PDEATHSIG, signal.SIGTERM)):
            if libc.prctl(option, value, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), f"prctl({option})")
    except OSError as exc:
        print(f"tether reaper: cannot confine the command: {exc}", file=sys.stderr)
        return CANNOT_START
    if parent is not None and os.getppid() != parent:
        return CANNOT_START  # the runner died before the death signal was armed
    # SIGTERM waits until its handler knows the child, so there is never a child it misses.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    child = os.fork()
    if child == 0:
        _exec(command, rlimits)
    signal.signal(signal.SIGTERM, lambda *_: _kill(child))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    status = _wait_for(child)
    end_tree()
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        return 128 + number
    return os.waitstatus_to_exitcode(status)


def _exec(command: list[str], rlimits: dict[str, tuple[int, int]]) -> None:
    """In the forked child: the command's rlimits and default signals, then exec it."""
    try:
        for name in _RESTORED:
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        for name, (soft, hard) in rlimits.items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        os.execvp(command[0], command)  # noqa: S606 (the command as the plan allows it)
    except OSError as exc:
        print(f"tether: cannot run {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        os._exit(NOT_FOUND if isinstance(exc, FileNotFoundError) else CANNOT_START)
    os._exit(CANNOT_START)  # pragma: no cover (execvp returns only by raising)


def _kill(pid: int) -> bool:
    """SIGKILL `pid`; whether it was there to get it."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _wait_for(child: int) -> int:
    """Reap children until `child` itself exits; its wait status."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # pragma: no cover (the child is ours until reaped)
            return 0
        if pid == child:
            return status


def children() -> list[int]:
    """This process's children, from /proc (each task's `children` list when the kernel has
    it, else every process's parent)."""
    me = os.getpid()
    listing = f"/proc/{me}/task/{me}/children"
    if os.path.exists(listing):
        with open(listing) as handle:
            return [int(pid) for pid in handle.read().split()]
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found.append(int(name))
    return found


def end_tree() -> None:
    """Kill every descendant: kill the children and reap them; their own children are
    reparented here (the subreaper), so go again until none is left."""
    while True:
        for pid in children():
            _kill(pid)
        reaped = False
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
            reaped = True
        if not reaped:
            time.sleep(0.005)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
