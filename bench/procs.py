"""Child processes for the benchmarks: start them, wait for them, measure them, always kill them.

Every child is started through `Children`, a context manager that kills whatever is still alive
on exit (SIGTERM, then SIGKILL after a grace period), so no measurement can leave a supervisor,
runner or load process behind, whatever fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tool(name: str) -> str:
    """A console script of the project's venv (`tether-supervisor`, `tether-runner`)."""
    found = VENV_BIN / name
    return str(found) if found.exists() else name


class Children:
    """Every subprocess a measurement starts; all of them are ended on exit."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        stdout_pipe: bool = False,
    ) -> subprocess.Popen[bytes]:
        log = (self.logdir / f"{name}.log").open("ab")
        self._logs.append(log)
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_pipe else log,
            stderr=log,
            env=full_env,
            cwd=ROOT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after `grace_s`; this process only (never a name match)."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(5)

    def stop_all(self, procs: Sequence[subprocess.Popen[bytes]], grace_s: float = 5.0) -> None:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(5)

    def close(self) -> None:
        self.stop_all(self.procs, grace_s=3.0)
        for log in self._logs:
            log.close()


@contextlib.contextmanager
def children(logdir: Path) -> Iterator[Children]:
    kids = Children(logdir)
    try:
        yield kids
    finally:
        kids.close()


def rss_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / (1024 * 1024)


def tree_rss_mb(pid: int) -> float:
    """RSS of a process and its children (uvicorn/runner are single processes, but be sure)."""
    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += child.memory_info().rss
    return float(total) / (1024 * 1024)


class CpuMeter:
    """CPU% of one core used by a process between `start()` and `stop()` (user + system)."""

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)
        self._t0 = 0.0
        self._c0 = 0.0

    def _cpu(self) -> float:
        t = self._proc.cpu_times()
        return float(t.user + t.system)

    def start(self) -> None:
        self._t0, self._c0 = time.monotonic(), self._cpu()

    def stop(self) -> float:
        wall = time.monotonic() - self._t0
        return 100.0 * (self._cpu() - self._c0) / wall if wall > 0 else 0.0


class MachineBusy:
    """Share of all the machine's cores that were busy between `start()` and `stop()`, in %,
    whoever ran (tether, the stand-in, load processes): user, nice, system and interrupts.
    Idle and I/O wait are not busy; nor is steal (a VM's time taken by its host, which no
    process here used). Guest time is already inside user and nice (Linux), so not added."""

    def __init__(self) -> None:
        self._t0: tuple[float, float] = (0.0, 0.0)

    @staticmethod
    def _read() -> tuple[float, float]:
        t = psutil.cpu_times()
        extra = {f: float(getattr(t, f, 0.0)) for f in ("iowait", "steal", "guest", "guest_nice")}
        total = float(sum(t)) - extra["guest"] - extra["guest_nice"]
        return total, float(t.idle) + extra["iowait"] + extra["steal"]

    def start(self) -> None:
        self._t0 = self._read()

    def stop(self) -> float:
        total, idle = self._read()
        spent = total - self._t0[0]
        return 100.0 * (1.0 - (idle - self._t0[1]) / spent) if spent > 0 else 0.0


def read_json_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    """Wait for a child that prints one JSON document on stdout, bounded in time."""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=5)
        raise RuntimeError(f"{proc.args!r} did not finish within {timeout_s:.0f}s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{proc.args!r} exited {proc.returncode}")
    lines = [ln for ln in out.decode().splitlines() if ln.strip().startswith("{")]
    if not lines:
        raise RuntimeError(f"{proc.args!r} printed no JSON")
    return lines[-1]


class JsonLines:
    """Read a child's stdout JSON lines one at a time, each wait bounded in time."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self._out = proc.stdout
        self._buffer = b""

    def next(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{self.proc.args!r} said nothing within {timeout_s:.0f}s")
            ready, _, _ = select.select([self._out], [], [], left)
            if ready:
                chunk = os.read(self._out.fileno(), 65536)
                if not chunk:
                    raise RuntimeError(f"{self.proc.args!r} exited ({self.proc.poll()})")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        doc: dict[str, Any] = json.loads(line)
        return doc
