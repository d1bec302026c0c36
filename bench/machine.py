"""What the figures were measured on: cores, memory, CPU model, the ledger's filesystem."""

from __future__ import annotations

import contextlib
import os
import platform
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil


def describe(ledger_dir: Path) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fs = "unknown"
    try:
        out = (
            subprocess.run(
                ["df", "-T", str(ledger_dir)],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
            .stdout.splitlines()[-1]
            .split()
        )
        fs = f"{out[1]} on {out[0]} (mounted at {out[-1]})"
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return {
        "loadavg_at_start": os.getloadavg(),
        "busy_processes_at_start": busy_processes(),
        "nproc": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu_model": cpu,
        "ledger_filesystem": fs,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "kernel": platform.release(),
    }


def busy_processes(threshold_pct: float = 10.0) -> list[str]:
    """Other processes using CPU as the run starts: the figures share the machine with them."""
    procs = list(psutil.process_iter(["pid", "name", "cmdline"]))
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.cpu_percent(None)
    time.sleep(1.0)
    busy = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            pct = proc.cpu_percent(None)
            if pct >= threshold_pct and proc.pid != os.getpid():
                cmd = " ".join(proc.info["cmdline"] or [proc.info["name"] or "?"])[:80]
                busy.append(f"{pct:.0f}% {cmd}")
    return busy
