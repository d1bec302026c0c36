"""Huey, durably: `SqliteHuey(fsync=True)` (WAL, synchronous=FULL) and a thread consumer.

End to end, enqueue to result: C client threads each enqueue a no-op task and block on its
result, again and again, for a fixed time; the consumer (`huey_consumer`-style, thread workers,
in its own process like tether's runners) runs the tasks. Both pollers are tuned for speed (the
consumer polls the queue every 1 ms when idle, a client polls for its result every 5 ms), so
Huey is measured at its best, not at its defaults. Also measured: draining a pre-enqueued
backlog (consumer throughput alone, no enqueue in the timed part), like tether's figure.

    python huey_bench.py --dir D --seconds S --concurrency 1,16,64 --workers 16
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

from huey import SqliteHuey

huey = SqliteHuey("bench", filename=os.environ.get("HUEY_BENCH_DB", "huey-bench.db"), fsync=True)


@huey.task()
def noop(i: int) -> int:
    return i


def consumer(workers: int) -> None:
    c = huey.create_consumer(
        workers=workers,
        worker_type="thread",
        periodic=False,
        initial_delay=0.001,
        backoff=1.0,
        max_delay=0.001,
        check_worker_health=False,
    )
    c.run()  # until SIGINT (graceful) or SIGTERM


def start_consumer(db: str, workers: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HUEY_BENCH_DB": db}
    return subprocess.Popen(
        [sys.executable, __file__, "--consumer", "--workers", str(workers)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def end_to_end(clients: int, seconds: float) -> float:
    done = [0] * clients
    deadline = time.monotonic() + seconds

    def client(n: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            r = noop(n * 1_000_000 + i)
            if r.get(blocking=True, timeout=30, backoff=1.0, max_delay=0.005) is not None:
                done[n] += 1
            i += 1

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return sum(done) / (time.monotonic() - start)


def drain(db: str, workers: int, tasks: int) -> float:
    huey.storage.flush_queue()
    for i in range(tasks):
        huey.enqueue(noop.s(i))
    proc = start_consumer(db, workers)
    try:
        start = time.monotonic()
        while huey.pending_count() > 0 and time.monotonic() - start < 60:
            time.sleep(0.005)
        return tasks / (time.monotonic() - start)
    finally:
        stop(proc)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--consumer", action="store_true")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--drain", type=int, default=2000)
    args = p.parse_args()
    if args.consumer:
        consumer(args.workers)
        return
    db = os.environ.get("HUEY_BENCH_DB", "huey-bench.db")
    by_c: dict[str, float] = {}
    proc = start_consumer(db, args.workers)
    try:
        time.sleep(0.5)
        end_to_end(4, 0.5)  # warm up
        for c in (int(x) for x in args.concurrency.split(",")):
            by_c[str(c)] = end_to_end(c, args.seconds)
    finally:
        stop(proc)
    huey.storage.flush_results()
    drained = drain(db, args.workers, args.drain) if args.drain else 0.0
    import huey as huey_pkg

    print(
        json.dumps(
            {
                "peer": "huey",
                "version": huey_pkg.__version__,
                "config": f"SqliteHuey(fsync=True) WAL, thread consumer x{args.workers}",
                "by_concurrency": by_c,
                "steps_per_s": max(by_c.values()),
                "drain_steps_per_s": drained,
            }
        )
    )


if __name__ == "__main__":
    main()
