"""Run the peer scripts (`bench/peers/*.py`) with the peers' own venv, in the same run.

The peers' venv (`bench/.peers-venv`, from `bench/requirements-peers.txt`, built by
`make bench`) is separate from the project's, so neither Huey, DBOS nor procrastinate (nor
SQLAlchemy) is ever importable by tether. Each SQLite peer writes its database in the
benchmark's work directory, on the same filesystem as tether's ledger; each PostgreSQL peer
creates a database of its own on the server tether's PostgreSQL section uses, and drops it.
Each script prints one JSON document.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.procs import ROOT, Children, read_json_line

PEERS_PYTHON = ROOT / "bench" / ".peers-venv" / "bin" / "python"
SCRIPTS = ROOT / "bench" / "peers"


def available() -> bool:
    return PEERS_PYTHON.exists()


def run_all(kids: Children, workdir: Path, *, seconds: float) -> dict[str, dict[str, Any]]:
    """Huey end to end; DBOS with its default SQLite engine; DBOS with a WAL engine."""
    conc = "1,16,64"
    plans: list[tuple[str, list[str], dict[str, str]]] = [
        (
            "huey",
            [
                str(SCRIPTS / "huey_bench.py"),
                "--seconds",
                str(seconds),
                "--concurrency",
                conc,
                "--workers",
                "4",
            ],
            {"HUEY_BENCH_DB": str(workdir / "huey.db")},
        ),
        (
            "dbos",
            [
                str(SCRIPTS / "dbos_bench.py"),
                "--db",
                str(workdir / "dbos.sqlite"),
                "--seconds",
                str(seconds),
                "--concurrency",
                conc,
            ],
            {},
        ),
        (
            "dbos_wal",
            [
                str(SCRIPTS / "dbos_bench.py"),
                "--db",
                str(workdir / "dbos-wal.sqlite"),
                "--seconds",
                str(seconds),
                "--concurrency",
                conc,
                "--wal",
            ],
            {},
        ),
    ]
    return _run(kids, plans, seconds)


def run_pg(kids: Children, server_url: str, *, seconds: float) -> dict[str, dict[str, Any]]:
    """procrastinate (about 200 jobs per second of `seconds` at each concurrency: its figure
    is N jobs enqueue -> done) and DBOS with a PostgreSQL system database, on `server_url`."""
    conc = "1,16,64"
    jobs = str(max(50, int(200 * seconds)))
    plans: list[tuple[str, list[str], dict[str, str]]] = [
        (
            "procrastinate",
            [
                str(SCRIPTS / "procrastinate_bench.py"),
                "--pg-url",
                server_url,
                "--jobs",
                jobs,
                "--concurrency",
                conc,
            ],
            {},
        ),
        (
            "dbos_pg",
            [
                str(SCRIPTS / "dbos_bench.py"),
                "--pg-url",
                server_url,
                "--seconds",
                str(seconds),
                "--concurrency",
                conc,
            ],
            {},
        ),
    ]
    return _run(kids, plans, seconds)


def _run(
    kids: Children, plans: list[tuple[str, list[str], dict[str, str]]], seconds: float
) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name, argv, env in plans:
        proc = kids.start(f"peer-{name}", [str(PEERS_PYTHON), *argv], env=env, stdout_pipe=True)
        results[name] = json.loads(read_json_line(proc, timeout_s=20 * seconds + 120))
    return results
