"""What the ledger's rules cost the writer thread per step on SQLite, and by named statement
(issue 28): no HTTP, no event loop, one thread.

A ledger file with queued one-step tasks (`seed`), then batches in the runner's shape, as the
supervisor's writer gets them at concurrency 64: the results of a claim's leases (16 by
default) and the claim their request's `want` queues after them (`claim_after_results`), one
transaction and one fsync each (`Transactions.run`, synchronous=FULL). The figure is the
thread's CPU time per committed step, the fsync's waiting excluded; then, in a second pass,
each named statement's share (`Tx.one`, `all`, `run`, `count`, `many` timed on the thread's
CPU clock; the timing adds about half a microsecond to each).

`python -m bench.rulecost [--steps N] [--batch B]`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import seed
from tether.supervisor.ledger import Lease, LedgerConfig, Report, Tx
from tether.supervisor.ledger.batch import Transactions
from tether.supervisor.ledger.effects import report
from tether.supervisor.ledger.fencing import claim, claim_after_results
from tether.supervisor.ledger.schema import connect

POOL = "rulecost"
RUNNER = "rulecost-runner"
TOKEN = "rulecost-token"
WARM_BATCHES = 10


def _report(tx: Tx, lease: Lease) -> Any:
    done = Report(
        step_id=lease.step_id,
        fence=lease.fence,
        payload_hash=lease.payload_hash,
        output={"text": "ok"},
        usage={"total_tokens": 1},
    )
    return report(tx, done, POOL, None, token_id=TOKEN)


def _claim_after(tx: Tx, leases: list[Lease]) -> list[Lease]:
    reported = [(lease.step_id, lease.fence) for lease in leases]
    return claim_after_results(tx, reported, RUNNER, POOL, len(leases), token_id=TOKEN)


def _batch(transactions: Transactions, leases: list[Lease]) -> list[Lease]:
    """The results of `leases` and the eager claim after them, in one batch; its new leases."""
    rules: list[Any] = [functools.partial(_report, lease=lease) for lease in leases]
    rules.append(functools.partial(_claim_after, leases=leases))
    outcomes = transactions.run(rules).outcomes
    for outcome in outcomes:
        if outcome.error is not None:
            raise outcome.error
    granted: list[Lease] = outcomes[-1].value
    return granted


def drive(transactions: Transactions, leases: list[Lease], steps: int) -> tuple[int, float]:
    """Batches until `steps` are committed (or the queue is empty): steps done, thread CPU s."""
    done, cpu0 = 0, time.thread_time()
    while done < steps and leases:
        committed = len(leases)
        leases = _batch(transactions, leases)
        done += committed
    return done, time.thread_time() - cpu0


@contextlib.contextmanager
def timed_statements() -> Iterator[tuple[collections.Counter[str], collections.Counter[str]]]:
    """Thread CPU nanoseconds and calls by statement name while entered."""
    spent: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    originals = {m: getattr(Tx, m) for m in ("one", "all", "run", "count", "many")}
    for method, original in originals.items():

        def timed(
            tx: Tx, name: str, /, *rows: Any, _original: Any = original, **params: Any
        ) -> Any:
            start = time.thread_time_ns()
            try:
                return _original(tx, name, *rows, **params)
            finally:
                spent[name] += time.thread_time_ns() - start
                calls[name] += 1

        setattr(Tx, method, timed)
    try:
        yield spent, calls
    finally:
        for method, original in originals.items():
            setattr(Tx, method, original)


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=3000, help="steps per pass")
    parser.add_argument("--batch", type=int, default=16, help="results per batch")
    parser.add_argument("--dir", type=Path, default=None, help="where the ledger file goes")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tether-bench-rulecost-", dir=args.dir))
    try:
        db = workdir / "ledger.db"
        seed.create_tasks(db, POOL, 2 * args.steps + (WARM_BATCHES + 2) * args.batch, approve=True)
        conn = connect(db, synchronous="FULL")
        transactions = Transactions(db=conn, config=LedgerConfig(), clock=time.time)
        leases: list[Lease] = transactions.one(
            lambda tx: claim(tx, RUNNER, POOL, args.batch, token_id=TOKEN)
        )
        for _ in range(WARM_BATCHES):
            leases = _batch(transactions, leases)
        done, cpu_s = drive(transactions, leases, args.steps)
        print(
            f"ledger rules on one thread, batches of {args.batch} results + their eager claim:"
            f" {1e3 * cpu_s / done:.3f} ms CPU per committed step ({done} steps)"
        )
        leases = transactions.one(lambda tx: claim(tx, RUNNER, POOL, args.batch, token_id=TOKEN))
        with timed_statements() as (spent, calls):
            done, cpu_s = drive(transactions, leases, args.steps)
        total = sum(spent.values())
        print(
            f"second pass, statements timed: {1e3 * cpu_s / done:.3f} ms per step, of which"
            f" {total / done / 1e3:.1f} us in {sum(calls.values()) / done:.1f} named statements"
            " (the rest: the rules' Python, savepoints, BEGIN and COMMIT)"
        )
        for name, ns in spent.most_common():
            print(
                f"  {ns / done / 1e3:6.1f} us/step  {calls[name] / done:5.2f}/step"
                f"  {ns / calls[name] / 1e3:6.1f} us each  {name}"
            )
        conn.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    _main()
