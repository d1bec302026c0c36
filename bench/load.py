"""Load processes: `python -m bench.load MODE ...`, each bounded in time, 127.0.0.1 only.

Each mode (a `mode_*` function) prints `{"ready": true}` once its load is in place, then one
JSON result.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio

from bench.httpraw import RawConnection

CLAIM = "/v1/leases/claim"


def emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def claim_leases(conn: RawConnection, runner_id: str, count: int) -> list[dict[str, Any]]:
    """Claim `count` leases and acknowledge each at once (else the reaper takes them back)."""
    leases: list[dict[str, Any]] = []
    while len(leases) < count:
        status, body = await conn.post(
            CLAIM, {"runner_id": runner_id, "capacity": min(256, count - len(leases)), "wait_s": 0}
        )
        if status != 200:
            raise SystemExit(f"claim answered {status}: only {len(leases)} of {count} leases")
        for lease in body["leases"]:
            await renew(conn, lease)
        leases += body["leases"]
    return leases


async def renew(conn: RawConnection, lease: dict[str, Any]) -> int:
    status, _ = await conn.post(f"/v1/leases/{lease['step_id']}/renew", {"fence": lease["fence"]})
    return status


async def run_workers(n: int, worker: Callable[[int], Coroutine[Any, Any, None]]) -> None:
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(worker, i)


async def _step_rounds(
    a: argparse.Namespace, token: str, one_round: Callable[[RawConnection, int], Awaitable[int]]
) -> dict[str, Any]:
    """C workers repeat `one_round` (answers the steps it committed, or -1 once the pool is
    drained) until the time is up."""
    done = 0
    deadline = time.monotonic() + a.seconds

    async def worker(i: int) -> None:
        nonlocal done
        conn = RawConnection.for_url(a.url, token)
        try:
            while time.monotonic() < deadline:
                committed = await one_round(conn, i)
                if committed < 0:
                    return
                done += committed
        finally:
            await conn.aclose()

    emit({"ready": True})
    start = time.monotonic()
    await run_workers(a.concurrency, worker)
    seconds = time.monotonic() - start
    return {"steps": done, "seconds": seconds, "steps_per_s": done / seconds}


def _result(lease: dict[str, Any]) -> dict[str, Any]:
    return {
        "fence": lease["fence"],
        "payload_hash": lease["payload_hash"],
        "output": {"text": "ok"},
        "usage": {"total_tokens": 1},
    }


async def _one_step(conn: RawConnection, i: int) -> int:
    status, body = await conn.post(CLAIM, {"runner_id": f"load-{i}", "capacity": 1, "wait_s": 0})
    if status == 204:
        return -1
    lease = body["leases"][0]
    await renew(conn, lease)
    status, _ = await conn.post(f"/v1/steps/{lease['step_id']}/result", _result(lease))
    return int(status == 200)


SHARED_CLAIM = 16


async def _shared_steps(conn: RawConnection, i: int) -> int:
    status, body = await conn.post(
        CLAIM, {"runner_id": f"load-{i}", "capacity": SHARED_CLAIM, "wait_s": 0}
    )
    if status == 204:
        return -1
    results = [{"step_id": lease["step_id"], **_result(lease)} for lease in body["leases"]]
    status, answer = await conn.post("/v1/steps/results", {"results": results})
    return sum("outcome" in r for r in answer["results"]) if status == 200 else 0


async def mode_steps(a: argparse.Namespace, token: str) -> dict[str, Any]:
    """C workers loop claim -> renew -> result until the pool is drained: the supervisor's own
    capacity, with no runner and no model in the way. The one renewal per step is kept so the
    figure compares across runs."""
    return await _step_rounds(a, token, _one_step)


async def mode_steps_shared(a: argparse.Namespace, token: str) -> dict[str, Any]:
    """The runner's protocol without a runner: each worker claims up to 16 leases at once and
    reports all of them in one `POST /v1/steps/results`."""
    return await _step_rounds(a, token, _shared_steps)


async def mode_renew_max(a: argparse.Namespace, token: str) -> dict[str, Any]:
    """Claim L leases, acknowledge them, then K workers renew them round robin as fast as the
    supervisor replies, for T seconds: sustained renewals/s."""
    setup = RawConnection.for_url(a.url, token)
    leases = await claim_leases(setup, "renew-max", a.leases)
    await setup.aclose()
    ok = errors = 0
    latencies: list[float] = []
    emit({"ready": True})
    start = time.monotonic()
    deadline = start + a.seconds

    async def worker(i: int) -> None:
        nonlocal ok, errors
        conn = RawConnection.for_url(a.url, token)
        k = i
        try:
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                status = await renew(conn, leases[k % len(leases)])
                latencies.append(time.monotonic() - t0)
                ok += status == 200
                errors += status != 200
                k += a.concurrency
        finally:
            await conn.aclose()

    await run_workers(a.concurrency, worker)
    seconds = time.monotonic() - start
    return {
        "renews": ok,
        "errors": errors,
        "seconds": seconds,
        "renews_per_s": ok / seconds,
        "p50_ms": 1000 * pct(latencies, 0.5),
        "p99_ms": 1000 * pct(latencies, 0.99),
    }


async def mode_renew_paced(a: argparse.Namespace, token: str) -> dict[str, Any]:
    """Claim L leases and renew each one every P seconds for T seconds.

    1,000 leases every second is 1,000 renewals/s, five times the cadence a real runner uses by
    default. `late` counts renewals sent over P/2 after they were due (the load fell behind);
    `max_gap_s` is the longest time any lease went between two accepted renewals.
    """
    setup = RawConnection.for_url(a.url, token)
    leases = await claim_leases(setup, "renew-paced", a.leases)
    await setup.aclose()
    ok = errors = late = 0
    latencies: list[float] = []
    emit({"ready": True})
    start = time.monotonic()
    deadline = start + a.seconds
    last_ok = dict.fromkeys(range(len(leases)), start)
    max_gap = 0.0

    async def worker(i: int) -> None:
        nonlocal ok, errors, late, max_gap
        mine = leases[i :: a.concurrency]
        conn = RawConnection.for_url(a.url, token)
        try:
            rnd = 0
            while True:
                for j, lease in enumerate(mine):
                    due = start + rnd * a.period + (i + j * a.concurrency) * a.period / len(leases)
                    if due >= deadline:
                        return
                    now = time.monotonic()
                    if due > now:
                        await anyio.sleep(due - now)
                    elif now - due > a.period / 2:
                        late += 1
                    t0 = time.monotonic()
                    status = await renew(conn, lease)
                    t1 = time.monotonic()
                    latencies.append(t1 - t0)
                    ok += status == 200
                    errors += status != 200
                    k = i + j * a.concurrency
                    if status == 200:
                        max_gap = max(max_gap, t1 - last_ok[k])
                        last_ok[k] = t1
                rnd += 1
        finally:
            await conn.aclose()

    await run_workers(a.concurrency, worker)
    seconds = time.monotonic() - start
    return {
        "renews": ok,
        "errors": errors,
        "late": late,
        "seconds": seconds,
        "renews_per_s": ok / seconds,
        "p50_ms": 1000 * pct(latencies, 0.5),
        "p99_ms": 1000 * pct(latencies, 0.99),
        "max_gap_s": max_gap,
    }


async def mode_idle(a: argparse.Namespace, token: str) -> dict[str, Any]:
    """Hold N claim long-polls open (`wait_s` W) on a pool with no work for T seconds,
    re-issuing each as it returns: N runners idle in long-poll, from one process."""
    answered = leased = opened = 0
    deadline = time.monotonic() + a.seconds
    all_open = anyio.Event()

    async def poller(i: int) -> None:
        nonlocal answered, leased, opened
        conn = RawConnection.for_url(a.url, token)
        try:
            with anyio.move_on_after(a.seconds):
                first = True
                while time.monotonic() < deadline:
                    wait = min(a.wait, max(0.0, deadline - time.monotonic()))
                    if first:
                        opened += 1
                        first = False
                        if opened == a.pollers:
                            all_open.set()
                    status, _ = await conn.post(
                        CLAIM, {"runner_id": f"idle-{i}", "capacity": 1, "wait_s": wait}
                    )
                    answered += 1
                    leased += status == 200
        finally:
            with anyio.CancelScope(shield=True):
                await conn.aclose()

    async def announce() -> None:
        await all_open.wait()
        emit({"ready": True, "opened": opened})

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        for i in range(a.pollers):
            tg.start_soon(poller, i)
    return {"pollers": a.pollers, "opened": opened, "answered": answered, "leased": leased}


async def mode_approve(a: argparse.Namespace, token: str) -> dict[str, Any]:
    """Approve the tasks listed in a JSON file at R per second (open loop), as an operator
    feeding work at a fixed rate."""
    tasks = json.loads(await anyio.Path(a.tasks).read_text())
    approved = errors = late = 0
    latencies: list[float] = []
    emit({"ready": True})
    start = time.monotonic()
    deadline = start + a.seconds
    next_index = 0

    async def worker(i: int) -> None:
        nonlocal approved, errors, late, next_index
        conn = RawConnection.for_url(a.url, token)
        try:
            while next_index < len(tasks):
                k = next_index
                next_index += 1
                due = start + k / a.rate
                if due >= deadline:
                    return
                now = time.monotonic()
                if due > now:
                    await anyio.sleep(due - now)
                elif now - due > 0.1:
                    late += 1
                task_id, plan_hash = tasks[k]
                t0 = time.monotonic()
                status, _ = await conn.post(
                    f"/v1/tasks/{task_id}/approve", {"plan_hash": plan_hash}
                )
                latencies.append(time.monotonic() - t0)
                approved += status == 200
                errors += status != 200
        finally:
            await conn.aclose()

    await run_workers(a.concurrency, worker)
    seconds = time.monotonic() - start
    return {
        "approved": approved,
        "errors": errors,
        "late": late,
        "seconds": seconds,
        "approves_per_s": approved / seconds,
        "p99_ms": 1000 * pct(latencies, 0.99),
    }


MODES = {
    "steps": mode_steps,
    "steps-shared": mode_steps_shared,
    "renew-max": mode_renew_max,
    "renew-paced": mode_renew_paced,
    "idle": mode_idle,
    "approve": mode_approve,
}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.load")
    p.add_argument("mode", choices=sorted(MODES))
    p.add_argument("--url", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--leases", type=int, default=1000)
    p.add_argument("--period", type=float, default=1.0)
    p.add_argument("--pollers", type=int, default=1000)
    p.add_argument("--wait", type=float, default=25.0)
    p.add_argument("--tasks", help="JSON file of [task_id, plan_hash] pairs (approve)")
    p.add_argument("--rate", type=float, default=100.0)
    a = p.parse_args()
    if not a.url.startswith("http://127.0.0.1:"):
        raise SystemExit("load processes only talk to http://127.0.0.1")
    if a.seconds > 300:
        raise SystemExit("--seconds is capped at 300")
    token = Path(a.token_file).read_text(encoding="utf-8").strip()
    emit(anyio.run(MODES[a.mode], a, token))


if __name__ == "__main__":
    main()
