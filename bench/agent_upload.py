"""A check's artifact upload of 10 MB to a real supervisor over HTTP on 127.0.0.1 (issue 17;
no target: the figure is printed).

The upload goes the way a check's log does (`tether.runner.agent.checks` -> the step's services):
`SupervisorServices.upload(path)` hashes the file in a thread, then streams it in 64 KiB chunks
with `PUT /v1/artifacts/{digest}` to `tether-supervisor serve`, which hashes it again and
stores it. Each round uploads a file of fresh random bytes (a digest the store has not seen);
the wall time of the whole call is the figure, and MB/s is 10 MB over it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from bench import seed
from bench.procs import children
from bench.stack import Stack
from tether.clocks import LoopClock
from tether.runner.services import SupervisorServices
from tether.runner.supervisor_client import SupervisorClient

POOL = "agent-upload"
MB = 1_000_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Upload:
    size_mb: float
    rounds: int
    median_s: float
    max_s: float
    mb_per_s: float  # size over the median


async def _upload_all(url: str, token: str, files: list[Path]) -> list[float]:
    """Claim the pool's one queued step and upload `files` for its lease, renewed before each
    (an upload names the lease it is for, and the lease must be live and this token's)."""
    clock = LoopClock()
    client = SupervisorClient(base_url=url, token=token, clock=clock, timeout_s=60.0)
    spans = []
    try:
        leases = await client.claim("bench-upload", 1, wait_s=10.0)
        if not leases:
            raise RuntimeError(f"no step of pool {POOL} to upload for")
        [lease] = leases
        services = SupervisorServices(client, lease, clock=clock)
        for path in files:
            await client.renew(lease.step_id, lease.fence)
            started = time.perf_counter()
            await services.upload(path)
            spans.append(time.perf_counter() - started)
    finally:
        await client.aclose()
    return spans


def run(stack: Stack, *, size_mb: float = 10.0, rounds: int = 5) -> Upload:
    """Measure against `stack`'s running supervisor; `POOL`'s token must exist before it
    started (`stack.token(POOL)`)."""
    token = stack.token(POOL).read_text().strip()
    folder = Path(tempfile.mkdtemp(prefix="upload-", dir=stack.workdir))
    try:
        files = []
        for index in range(rounds):
            path = folder / f"check-{index}.log"
            path.write_bytes(os.urandom(int(size_mb * MB)))
            files.append(path)
        seed.create_tasks(stack.db, POOL, 1, approve=True)
        spans = anyio.run(_upload_all, stack.supervisor_url, token, files)
    finally:
        seed.cancel_pool(stack.db, POOL)
        shutil.rmtree(folder, ignore_errors=True)
    median = statistics.median(spans)
    return Upload(
        size_mb=size_mb, rounds=rounds, median_s=median, max_s=max(spans), mb_per_s=size_mb / median
    )


def _main() -> None:
    """`python -m bench.agent_upload`: this measurement alone, on a fresh supervisor."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mb", type=float, default=10.0, help="size of each upload, MB")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tether-bench-upload-"))
    try:
        db = workdir / "ledger.db"
        seed.create_tasks(db, "warm", 1, approve=False)
        with children(workdir) as kids:
            stack = Stack(kids=kids, workdir=workdir, db=db)
            stack.token(POOL)
            stack.start_supervisor()
            found = run(stack, size_mb=args.mb, rounds=args.rounds)
            print(json.dumps(dataclasses.asdict(found), indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    _main()
