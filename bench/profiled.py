"""`python -m bench.profiled ARGS...`: `tether-supervisor ARGS...` under cProfile, every thread.

With `BENCH_PROFILE=path` set, each thread (the event loop's, the ledger's writer, anyio's
workers) gets its own profiler, timed by its own CPU clock (`time.thread_time`), so a function's
own time is CPU it spent, not time it waited (a poll, a lock, an fsync). Each SIGUSR1 writes
the figures so far, every thread's merged, to `path.1`, `path.2`, ...: the difference of two
(`delta`) is the window between the signals, without start-up and shutdown. Without the
variable, this is `tether-supervisor` itself. Only the benchmark starts the supervisor this way
(`bench.cpu.profile`); the supervisor has no switch of its own.
"""

from __future__ import annotations

import cProfile
import marshal
import os
import pstats
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from tether.supervisor.cli import main as supervisor_main

ENV = "BENCH_PROFILE"


class ThreadProfiles:
    """One `cProfile.Profile` per thread, started before the thread's `run` and kept to the end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._profiles: list[cProfile.Profile] = []

    def new(self) -> cProfile.Profile:
        profile = cProfile.Profile(time.thread_time)
        with self._lock:
            self._profiles.append(profile)
        return profile

    def install(self) -> None:
        """Profile every thread started from now on. `Thread.run` is overridden by anyio's
        worker threads, so the hook is the bootstrap every thread goes through."""
        bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]
        profiles = self

        def profiled_bootstrap(thread: threading.Thread) -> None:
            profile = profiles.new()
            profile.enable()
            try:
                bootstrap(thread)
            finally:
                profile.disable()

        setattr(threading.Thread, "_bootstrap_inner", profiled_bootstrap)  # noqa: B010

    def dump(self, path: Path) -> None:
        """Merge every thread's figures so far into one pstats file (threads still running
        are read as they stand)."""
        with self._lock:
            profiles = list(self._profiles)
        with tempfile.TemporaryDirectory() as scratch:
            files = []
            for n, profile in enumerate(profiles):
                profile.snapshot_stats()
                stats: dict[Any, Any] = profile.stats
                if not stats:
                    continue
                part = Path(scratch) / f"{n}.prof"
                part.write_bytes(marshal.dumps(stats))
                files.append(str(part))
            if files:
                pstats.Stats(*files).dump_stats(str(path))


Stats = dict[tuple[str, int, str], tuple[Any, ...]]


def delta(before: Path, after: Path) -> Stats:
    """What each function did between two snapshots: calls, own and cumulative time (pstats'
    tuple, callers left out)."""
    old: Stats = pstats.Stats(str(before)).stats  # type: ignore[attr-defined]
    new: Stats = pstats.Stats(str(after)).stats  # type: ignore[attr-defined]
    out: Stats = {}
    for key, (cc, nc, tt, ct, _callers) in new.items():
        was = old.get(key, (0, 0, 0.0, 0.0, {}))
        if nc - was[1] > 0 or tt - was[2] > 0:
            out[key] = (cc - was[0], nc - was[1], tt - was[2], ct - was[3], {})
    return out


def main(argv: list[str]) -> int:
    out = os.environ.get(ENV)
    if not out:
        return supervisor_main(argv)
    profiles = ThreadProfiles()
    main_thread = profiles.new()
    marks = 0

    def mark(_signum: int, _frame: FrameType | None) -> None:
        """Runs on the main thread, whose profiler is paused meanwhile: the dump is not in
        the figures."""
        nonlocal marks
        main_thread.disable()
        marks += 1
        part, taken = Path(f"{out}.{marks}.part"), Path(f"{out}.{marks}")
        profiles.dump(part)
        part.rename(taken)  # whole, or not there
        main_thread.enable()

    signal.signal(signal.SIGUSR1, mark)
    profiles.install()
    main_thread.enable()
    try:
        return supervisor_main(argv)
    finally:
        main_thread.disable()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
