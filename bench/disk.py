"""The disk's bound: single-row SQLite commits per second, WAL, `synchronous=FULL`.

Measured in the very directory the benchmark's ledger files live in, with one connection and
one thread: each commit is one row and one fsync of the WAL. Everything tether does per step is
judged against this figure (and against half of it, the "naive ceiling" of two durable writes
per step).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path


def commits_per_s(directory: Path, seconds: float) -> float:
    path = directory / "disk-bound.db"
    db = sqlite3.connect(str(path), isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = FULL")
        db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        for _ in range(20):  # warm the file and the WAL
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t (v) VALUES ('warm')")
            db.execute("COMMIT")
        n = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t (v) VALUES (?)", (f"row {n}",))
            db.execute("COMMIT")
            n += 1
            now = time.perf_counter()
            if now >= deadline:
                return n / (now - start)
    finally:
        db.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        print(f"{commits_per_s(Path(d), 3.0):.0f} commits/s")
