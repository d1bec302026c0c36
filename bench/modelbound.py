"""The machine's bound for any runner written like ours: model calls alone, no tether.

What the model calls of a step cost on these cores, which no amount of work on the ledger can
beat; tether's steps/s is reported as a ratio to it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import anyio

from bench.procs import JsonLines
from bench.stack import Stack
from bench.steps import processes_for
from tether.clocks import LoopClock
from tether.runner.cli import event_loop_options
from tether.runner.http import pooled_transport
from tether.runner.model_client import ModelClient

BODY = {"model": "standin", "messages": [{"role": "user", "content": "one no-op step"}]}


async def _calls(url: str, concurrency: int, seconds: float) -> tuple[int, float]:
    clock = LoopClock()
    model = ModelClient(base_url=url, clock=clock, transport=pooled_transport(concurrency))
    calls = 0
    start = time.monotonic()
    deadline = start + seconds

    async def worker() -> None:
        nonlocal calls
        while time.monotonic() < deadline:
            await model.chat(BODY, key=None, deadline=clock.now() + 30)
            calls += 1

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
    finally:
        await model.aclose()
    return calls, time.monotonic() - start


def run(stack: Stack, *, concurrency: int, seconds: float) -> float:
    """Model calls/s of as many processes as runners for `concurrency`, the stack's model.

    Each process (`python -m bench.modelbound --url URL --concurrency C --seconds S`) runs C
    workers that call the stand-in through the runner's own `ModelClient` (httpx, the runner's
    pooled transport, uvloop when installed), with no supervisor, lease or ledger, and prints
    one JSON line `{"calls", "seconds"}`; their rates are added.
    """
    n = processes_for(concurrency)
    argv = [
        sys.executable,
        "-m",
        "bench.modelbound",
        "--url",
        stack.model_url,
        "--concurrency",
        str(-(-concurrency // n)),
        "--seconds",
        str(seconds),
    ]
    procs = [stack.kids.start(f"modelbound-{i}", argv, stdout_pipe=True) for i in range(n)]
    try:
        found = [JsonLines(proc).next(seconds + 30) for proc in procs]
    finally:
        stack.kids.stop_all(procs)
    return float(sum(f["calls"] / f["seconds"] for f in found if f["seconds"] > 0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.modelbound")
    p.add_argument("--url", required=True, help="the stand-in model's base URL (…/v1)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seconds", type=float, default=5.0)
    a = p.parse_args(argv)
    calls, seconds = anyio.run(
        _calls, a.url, a.concurrency, a.seconds, backend_options=event_loop_options()
    )
    sys.stdout.write(json.dumps({"calls": calls, "seconds": seconds}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
