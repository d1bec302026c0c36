"""Several supervisors writing one PostgreSQL ledger: what the advisory lock that serializes
their batches costs (supervisor/ledger/postgres.py).

Queues `TASKS` one-step tasks (and ANALYZEs), then runs S supervisor processes (each a
store on the same database, as `tether-supervisor serve` opens it) for `SECONDS`, each with
`WORKERS` workers looping claim (capacity 1, no wait) -> result, as runners without HTTP
would. Prints, per S, committed steps/s and write batches/s summed over the processes, and
rules per batch.

    python -m bench.pgwriters --pg-url postgresql://... [--supervisors 1,3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from collections.abc import Sequence

import anyio

from tether.supervisor.ledger import LedgerConfig, Report, StepSpec, TaskSpec
from tether.supervisor.ledger.pg_schema import connect
from tether.supervisor.ledger.store import open_ledger

TASKS = 20_000
SECONDS = 5.0
WORKERS = 32


async def queue_tasks(url: str, n: int) -> None:
    async with open_ledger(url, config=LedgerConfig()) as ledger:

        async def create(start: int) -> None:
            for i in range(start, n, 64):
                spec = TaskSpec(
                    tenant="acme",
                    idempotency_key=f"w{i}",
                    steps=(StepSpec(name="s", kind="chat", payload={"i": i}),),
                )
                created = await ledger.create_task(spec)
                await ledger.approve("acme", created.task_id, spec.plan_hash, None)

        async with anyio.create_task_group() as tg:
            for start in range(64):
                tg.start_soon(create, start)
    # Statistics now, not at autovacuum's next turn: planned on an empty table's, the claim
    # query sorts the whole queue (38 ms a claim at 10,000 queued, against 0.1 ms).
    with connect(url) as db:
        db.execute("ANALYZE")


async def supervise(url: str, start_at: float) -> tuple[int, int, int]:
    """Steps committed, batches and rules written in the window by one store."""
    async with open_ledger(url, config=LedgerConfig()) as ledger:
        await anyio.sleep(max(0.0, start_at - time.time()))
        before = (ledger.counters.batches, ledger.counters.batched_rules)
        deadline = time.monotonic() + SECONDS
        steps = 0

        async def worker(n: int) -> None:
            nonlocal steps
            while time.monotonic() < deadline:
                leases = await ledger.claim(f"r{n}", "default", 1, 0)
                for lease in leases:
                    rep = Report(
                        step_id=lease.step_id,
                        fence=lease.fence,
                        payload_hash=lease.payload_hash,
                        output="ok",
                    )
                    await ledger.report(rep)
                    steps += 1

        async with anyio.create_task_group() as tg:
            for n in range(WORKERS):
                tg.start_soon(worker, n)
        counters = ledger.counters
        return steps, counters.batches - before[0], counters.batched_rules - before[1]


def _process(url: str, start_at: float, out: multiprocessing.Queue[tuple[int, int, int]]) -> None:
    out.put(anyio.run(supervise, url, start_at))


def run(url: str, supervisors: int) -> tuple[float, float, float]:
    context = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[tuple[int, int, int]] = context.Queue()
    start_at = time.time() + 3.0  # every process open before the window starts
    procs = [
        context.Process(target=_process, args=(url, start_at, out)) for _ in range(supervisors)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join()
    steps, batches, rules = (sum(r[i] for r in results) for i in range(3))
    return steps / SECONDS, batches / SECONDS, rules / max(1, batches)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", required=True, help="a scratch database (written to)")
    parser.add_argument("--supervisors", default="1,3", help="comma-separated counts")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.supervisors.split(",")]
    for count in counts:
        anyio.run(queue_tasks, args.pg_url, TASKS // len(counts))
        steps, batches, per = run(args.pg_url, count)
        print(
            f"{count} supervisor(s): {steps:6.0f} steps/s, {batches:6.0f} batches/s,"
            f" {per:5.1f} rules per batch"
        )


if __name__ == "__main__":
    main()
