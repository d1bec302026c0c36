"""What a serving supervisor loads (issue 25): a real `serve`, run with `python -X importtime`,
answers the API and the status page; every module it imported is read from that trace, and
none may be the schedule explorer (`tether.sim`), a test or a benchmark. The explorer and its
plants are for the `chaos` command and the tests only.

The check is shown to catch what it looks for: the same serve started through
`tests/serve_planted.py` (a test module that wraps the CLI) is flagged."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.supervisor.ledger.test_ledger_one_writer import admin, wait_up
from tests.supervisor.test_cli_serve import clean_env, free_port, stop
from tether.supervisor.api.openapi import PATH as OPENAPI

pytestmark = pytest.mark.slow

CHECKOUT = Path(__file__).resolve().parents[2]
NOT_IN_PRODUCTION = ("tether.sim", "tests", "bench", "hypothesis")
IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(?P<module>\S+)\s*$")


def imported_by_serve(tmp_path: Path, *entry: str) -> set[str]:
    """The modules a `serve` started as `python -X importtime ENTRY serve ...` imported while
    it came up and answered an operator's reads."""
    db = tmp_path / "ledger.db"
    made = admin(
        "token", "create", "--init", "--db", str(db), "--tenant", "t", "--role", "operator"
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    port = free_port()
    trace = tmp_path / "importtime.log"
    with trace.open("wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-X",
                "importtime",
                *entry,
                "serve",
                "--db",
                str(db),
                "--port",
                str(port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=CHECKOUT,
            env=clean_env(PYTHONPATH=str(CHECKOUT)),
        )
    try:
        wait_up(proc, port, trace)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False) as http:
            auth = {"Authorization": f"Bearer {token}"}
            assert http.get("/v1/tasks", headers=auth).status_code == 200
            assert http.get(OPENAPI).status_code == 200
            assert http.get("/ui/login").status_code == 200
    finally:
        stop(proc)
    matched = (IMPORT_LINE.match(line) for line in trace.read_text().splitlines())
    return {m["module"] for m in matched if m is not None}


def not_for_production(modules: set[str]) -> list[str]:
    return sorted(
        m for m in modules if any(m == p or m.startswith(f"{p}.") for p in NOT_IN_PRODUCTION)
    )


def test_serving_loads_no_explorer_test_or_bench_module(tmp_path: Path) -> None:
    modules = imported_by_serve(tmp_path, "-m", "tether.supervisor.cli")
    assert "tether.supervisor.api.app" in modules  # the trace is read
    assert not_for_production(modules) == []


def test_the_check_flags_a_serve_that_loads_a_test_module(tmp_path: Path) -> None:
    modules = imported_by_serve(tmp_path, "-m", "tests.serve_planted", "no-folder-sync")
    assert "tests" in not_for_production(modules)  # `-m` runs the module itself as __main__
