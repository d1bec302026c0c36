"""The system under test, as real processes on 127.0.0.1: `tether-supervisor serve` on a ledger
file (synchronous=FULL) or, with `url`, a PostgreSQL database (one supervisor, or several on
the same database: `start_supervisors`), the stand-in model, and `tether-runner run` processes.

Runners log at `warning` by default in the benchmarks: at info they write a line per step to
a pipe, which is the runner's choice of verbosity, not tether's cost. (`--runner-log-level`
of `python -m bench` changes it.)
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench import seed
from bench.ledgers import BenchLedger, ledger_for
from bench.procs import Children, JsonLines, free_port, tool

READY_TIMEOUT_S = 30.0


@dataclasses.dataclass(kw_only=True)
class Stack:
    kids: Children
    workdir: Path
    db: Path
    url: str = ""  # a PostgreSQL ledger the supervisors serve instead of `db`, when given
    supervisor: subprocess.Popen[bytes] | None = None
    supervisor_url: str = ""
    # Supervisors beyond the first on the same ledger (`start_supervisors`), and their URLs.
    others: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)
    other_urls: list[str] = dataclasses.field(default_factory=list)
    model: subprocess.Popen[bytes] | None = None
    model_url: str = ""
    runner_log_level: str = "warning"
    supervisor_log_level: str = "warning"
    lease_ttl_s: float = 30.0
    # Added to the supervisors' environment (`bench.ab`: another tree's code on PYTHONPATH).
    supervisor_env: dict[str, str] = dataclasses.field(default_factory=dict)
    # Added to the runners' environment, under `start_runners`' own `env`.
    runner_env: dict[str, str] = dataclasses.field(default_factory=dict)
    # Started instead of `tether-supervisor` (`bench.features`: `python -m bench.variants`).
    supervisor_program: list[str] | None = None

    @property
    def ledger(self) -> BenchLedger:
        """The ledger the supervisors serve, for seeding and reading figures."""
        return ledger_for(self.url or self.db)

    @property
    def supervisors(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in (self.supervisor, *self.others) if p is not None]

    @property
    def supervisor_urls(self) -> list[str]:
        return [self.supervisor_url, *self.other_urls] if self.supervisor_url else []

    def start_supervisor(self, profile: Path | None = None) -> None:
        """`tether-supervisor serve` on the ledger; with `profile`, under cProfile
        (`bench.profiled`: each SIGUSR1 writes its figures to `profile.1`, `profile.2`, ...)."""
        self.supervisor, self.supervisor_url = self._serve("supervisor", profile)

    def start_supervisors(self, count: int) -> None:
        """`count` supervisors on the one ledger (a PostgreSQL database, for more than one)."""
        self.start_supervisor()
        for n in range(1, count):
            proc, url = self._serve(f"supervisor-{n}", None)
            self.others.append(proc)
            self.other_urls.append(url)

    def _serve(self, name: str, profile: Path | None) -> tuple[subprocess.Popen[bytes], str]:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        program = self.supervisor_program or [tool("tether-supervisor")]
        env = {
            "TETHER_SYNCHRONOUS": "FULL",
            "TETHER_LOG_LEVEL": self.supervisor_log_level,
            "TETHER_LEASE_TTL_S": str(self.lease_ttl_s),
            **self.supervisor_env,
        }
        if profile is not None:
            program = [sys.executable, "-m", "bench.profiled"]
            env["BENCH_PROFILE"] = str(profile)
        db = self.url or str(self.db)
        proc = self.kids.start(
            name,
            [*program, "serve", "--db", db, "--port", str(port), "--host", "127.0.0.1"],
            env=env,
        )
        wait_ready(f"{url}/readyz", proc)
        return proc, url

    def stop_supervisor(self) -> None:
        """Stop every supervisor (the first and any others)."""
        self.kids.stop_all(self.supervisors, grace_s=15)
        self.supervisor, self.others, self.other_urls = None, [], []

    def start_model(self, latency_s: float = 0.0, scenario: Path | None = None) -> None:
        """The stand-in model, holding each answer `latency_s`, scripted by a `scenario` file
        (see `examples.standin_model.Scenario`) when given."""
        port = free_port()
        self.model_url = f"http://127.0.0.1:{port}/v1"
        script = [] if scenario is None else ["--scenario", str(scenario)]
        self.model = self.kids.start(
            f"model-{port}",
            [
                sys.executable,
                "-m",
                "examples.standin_model",
                "--port",
                str(port),
                "--latency",
                str(latency_s),
                *script,
            ],
        )
        wait_ready(f"http://127.0.0.1:{port}/_admin/knobs", self.model)

    def set_model_latency(self, latency_s: float, spread: float = 0.0) -> None:
        """How long the stand-in holds each answer (`spread`: see `examples.standin_model`)."""
        base = self.model_url.removesuffix("/v1")
        knobs = {"latency_s": latency_s, "latency_spread": spread}
        answer = httpx.post(f"{base}/_admin/knobs", json=knobs, timeout=5)
        answer.raise_for_status()

    def token(self, pool: str, role: str = "runner") -> Path:
        dest = self.workdir / f"token-{role}-{pool}"
        if not dest.exists():
            self.ledger.create_token(pool, role, dest)
        return dest

    def approve_at(
        self,
        name: str,
        tasks: list[tuple[str, str]],
        *,
        rate: float,
        seconds: float,
        concurrency: int,
    ) -> dict[str, Any]:
        """Approve `tasks` (`[task_id, plan_hash]` pairs) at `rate` per second, open loop, from
        one operator load process; return its summary once it is done feeding."""
        listing = self.workdir / f"{name}-tasks.json"
        listing.write_text(json.dumps(tasks))
        feeder = self.kids.start(
            name,
            [
                sys.executable,
                "-m",
                "bench.load",
                "approve",
                "--url",
                self.supervisor_url,
                "--token-file",
                str(self.token(seed.TENANT, role="operator")),
                "--tasks",
                str(listing),
                "--rate",
                str(rate),
                "--seconds",
                str(seconds),
                "--concurrency",
                str(concurrency),
            ],
            stdout_pipe=True,
        )
        try:
            lines = JsonLines(feeder)
            lines.next(30)  # ready
            return lines.next(seconds + 60)
        finally:
            self.kids.stop(feeder)

    def start_runners(
        self,
        name: str,
        pool: str,
        concurrency: int,
        processes: int,
        env: dict[str, str] | None = None,
        program: str | None = None,
    ) -> list[subprocess.Popen[bytes]]:
        """`processes` runners sharing `concurrency` between them (as evenly as possible),
        with `env` added to their environment. The pool's token must exist (`token(pool)`)
        before the supervisor starts. With several supervisors each runner gets all of them,
        its list rotated by one per runner, so runners spread over the supervisors (a runner
        uses the first that answers). `program` is another `tether-runner` to start (the
        installed one of `runner_rss`)."""
        token = self.workdir / f"token-runner-{pool}"
        base, extra = divmod(concurrency, processes)
        shares = [base + (i < extra) for i in range(processes)]
        urls = self.supervisor_urls
        procs = []
        for i, share in enumerate(s for s in shares if s > 0):
            runner_id = f"{name}-{i}"
            turn = i % len(urls)
            supervisors = ",".join(urls[turn:] + urls[:turn])
            procs.append(
                self.kids.start(
                    runner_id,
                    [
                        program or tool("tether-runner"),
                        "run",
                        "--supervisor",
                        supervisors,
                        "--token-file",
                        str(token),
                        "--model-url",
                        self.model_url,
                        "--model",
                        "standin",
                        "--concurrency",
                        str(share),
                        "--runner-id",
                        runner_id,
                        "--log-level",
                        self.runner_log_level,
                        "--log-format",
                        "json",
                    ],
                    env={**self.runner_env, **(env or {})},
                ),
            )
        return procs


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited {proc.returncode} before it was ready")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready within {READY_TIMEOUT_S:.0f}s")


def wait_succeeded(db: Path, pool: str, count: int, timeout_s: float) -> int:
    """Poll the ledger file (read-only) until `count` tasks of `pool` succeeded, or time out."""
    deadline = time.monotonic() + timeout_s
    done = 0
    while time.monotonic() < deadline:
        done = seed.succeeded(db, pool)
        if done >= count:
            break
        time.sleep(0.1)
    return done
