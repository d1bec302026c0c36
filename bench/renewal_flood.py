"""A renewal flood from one lease (issue 23, finding 4), with and without the renewal memory
(`supervisor/ledger/renewal_memory.py`), in one run.

One supervisor app on a SQLite ledger file (synchronous=FULL, as served), reached in process
through `httpx.ASGITransport`. For `--seconds` each: no flood; then one lease renewed about
`--rate` times a second with the memory switched off (every renewal written); then the same with
the memory on. Meanwhile an operator reads the task view one request after another. Printed:
renewals sent, ledger write batches, and the operator's read p50/p99.

    python -m bench.renewal_flood [--seconds 5] [--rate 100]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

from tether.supervisor import admin
from tether.supervisor.api import create_app
from tether.supervisor.ledger.renewal_memory import RenewalMemory
from tether.supervisor.settings import SupervisorSettings


class NoMemory(RenewalMemory):
    """The memory switched off, for the bench's 'before': every renewal is written."""

    def answer(self, *_args: Any, **_kwargs: Any) -> None:
        return None


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _phase(
    client: httpx.AsyncClient,
    ledger: Any,
    task_id: str,
    renew: tuple[str, dict[str, Any]] | None,
    headers: dict[str, dict[str, str]],
    seconds: float,
    rate: float,
) -> dict[str, float]:
    reads: list[float] = []
    sent = 0
    batches = ledger.counters.batches
    end = time.monotonic() + seconds

    async def flood() -> None:
        nonlocal sent
        assert renew is not None
        url, body = renew
        async with anyio.create_task_group() as tg:
            while time.monotonic() < end:
                tg.start_soon(lambda: client.post(url, headers=headers["runner"], json=body))
                sent += 1
                await anyio.sleep(1.0 / rate)

    async def read() -> None:
        while time.monotonic() < end:
            started = time.perf_counter()
            answer = await client.get(f"/v1/tasks/{task_id}", headers=headers["operator"])
            reads.append((time.perf_counter() - started) * 1000)
            assert answer.status_code == 200, answer.text
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        if renew is not None:
            tg.start_soon(flood)
        tg.start_soon(read)
    return {
        "renewals": sent,
        "batches": ledger.counters.batches - batches,
        "p50_ms": statistics.median(reads),
        "p99_ms": _percentile(reads, 0.99),
    }


async def run(seconds: float, rate: float) -> None:
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "ledger.db"
        secrets = {
            name: admin.create_token(db, scope, name, init=True).secret
            for name, scope in [("operator", "acme"), ("runner", "default")]
        }
        headers = {k: {"Authorization": f"Bearer {v}"} for k, v in secrets.items()}
        app = create_app(SupervisorSettings(db=db), reaper=False)
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://bench") as client,
        ):
            message = {"role": "user", "content": "hi"}
            step = {"name": "s", "kind": "chat", "payload": {"messages": [message]}}
            body = {"idempotency_key": "k", "plan": {"steps": [step]}}
            created = await client.post("/v1/tasks", headers=headers["operator"], json=body)
            task = created.json()
            approval = {"plan_hash": task["plan_hash"], "base_sha": None}
            url = f"/v1/tasks/{task['id']}/approve"
            await client.post(url, headers=headers["operator"], json=approval)
            claim = {"runner_id": "flood", "capacity": 1, "wait_s": 0}
            claimed = await client.post("/v1/leases/claim", headers=headers["runner"], json=claim)
            [lease] = claimed.json()["leases"]
            renew = (f"/v1/leases/{lease['step_id']}/renew", {"fence": lease["fence"]})
            ledger = app.state.ledger
            real = ledger.renewals
            rows = []
            for name, flood, memory in [
                ("no flood", None, real),
                ("flood, memory off (before)", renew, NoMemory(real.window_s)),
                ("flood, memory on (after)", renew, real),
            ]:
                ledger.renewals = memory
                found = await _phase(client, ledger, task["id"], flood, headers, seconds, rate)
                rows.append((name, found))
    print(
        f"renewal flood: one lease, ~{rate:g}/s, {seconds:g} s each, operator reads the task view"
    )
    print("| phase | renewals sent | write batches | read p50 ms | read p99 ms |")
    print("|---|---|---|---|---|")
    for name, f in rows:
        print(
            f"| {name} | {f['renewals']:.0f} | {f['batches']:.0f} | {f['p50_ms']:.2f}"
            f" | {f['p99_ms']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=100.0)
    args = parser.parse_args()
    anyio.run(run, args.seconds, args.rate)


if __name__ == "__main__":
    main()
