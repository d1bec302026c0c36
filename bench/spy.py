"""py-spy, when it is installed (`pip install py-spy`; not a dependency of tether): sample the
thread that holds a running process's GIL (`--gil`), without stopping or restarting it, for a
few seconds. `bench.cpu.profile` uses it when it can, and cProfile (`bench.profiled`) otherwise.

Only the GIL's holder, because py-spy samples wall time: a thread waiting (in epoll, on a lock,
in an fsync) would read as busy. The GIL's holder is running Python (or C that keeps the GIL,
such as msgspec); SQLite's statements run without it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from bench.procs import VENV_BIN

RATE_HZ = 250


def find() -> str | None:
    """The py-spy program on PATH or beside this Python, if any."""
    beside = VENV_BIN / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def start(program: str, pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """Sample `pid` for `seconds` into `out` (raw collapsed stacks); wait with `finish`."""
    return subprocess.Popen(
        [
            program,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, round(seconds))),
            "--rate",
            str(RATE_HZ),
            "--nonblocking",
            "--gil",
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def finish(
    proc: subprocess.Popen[bytes], out: Path, timeout_s: float
) -> list[tuple[list[str], int]]:
    """Wait for py-spy; its samples as (frames from the root to the leaf, count)."""
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=5)
        raise RuntimeError("py-spy did not finish") from None
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed: {err.decode(errors='replace').strip()[-500:]}")
    samples = []
    for line in out.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            samples.append((stack.split(";"), int(count)))
    return samples
