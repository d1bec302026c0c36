"""Lease -> first model call of a repository-bound `agent` step, the runner's mirror of the
repository already fetched (issue 17: at most 0.5 s with a warm mirror of 10,000 files).

One `tether-runner` (concurrency 1, its cache directory under the work folder) serves a pool of
`1 + runs` approved agent tasks of one repository of `files` small files (bench.agent_workspace's
origin, read by path). The first lease fetches the mirror (the cold figure); every later one
finds it warm. The model is `bench.stamped_model`, in this process, answering at once without a
tool call, so each step makes exactly one model call. A step's figure is the model's arrival
time of its request minus the attempt's `granted_at` in the ledger (both `time.time()` on this
machine): it includes the claim's answer on the wire and the sandbox probe on the first step
only. The worktree of `files` files is checked out beside that first call (its first tool call
would wait for it), so the figure no longer holds it; the step's end still waits for it, as
the candidate's commit needs the tree. Each task then fails verification (`no_candidate`:
nothing was changed), which is not what is measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import seed
from bench.agent_workspace import make_origin
from bench.procs import children
from bench.stack import Stack
from bench.stamped_model import StampedModel
from tether.supervisor.ledger import StepSpec, TaskSpec

TARGET_S = 0.5
POOL = "agent-lease"  # the runner's cache in the work folder (on the ledger's disk)
TMPFS_POOL = "agent-lease-tmpfs"  # the same with the cache on tmpfs (`TMPFS`), when there is one
TMPFS = Path("/dev/shm")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentLease:
    files: int
    cold_s: float  # the first lease: the mirror fetched, the sandbox probed
    warm_s: tuple[float, ...]  # every later lease, in order
    p50_s: float
    max_s: float
    cache_dir: str  # where the runner's mirror and worktrees were (which filesystem matters)


def _spec(base: str, repository: str) -> Callable[[str, str], TaskSpec]:
    def make(key: str, pool: str) -> TaskSpec:
        payload = {
            "messages": [{"role": "user", "content": f"lease {key}"}],
            "allowed_commands": [],
            "max_turns": 2,
        }
        return TaskSpec(
            tenant=seed.TENANT,
            idempotency_key=key,
            steps=(StepSpec(name="agent", kind="agent", payload=payload),),
            pool=pool,
            repository=repository,
            base_sha=base,
            allowed_paths=("src/",),
        )

    return make


def run(
    stack: Stack,
    *,
    files: int,
    runs: int,
    pool: str = POOL,
    cache_root: Path | None = None,
    timeout_s: float = 300.0,
) -> AgentLease:
    """Measure on `stack`'s running supervisor, the runner's cache under `cache_root` (the work
    folder when None); `pool`'s token must exist before the supervisor started."""
    origin = stack.workdir / f"{pool}-origin"
    base = make_origin(origin, files)
    seed.add_repository(stack.db, pool, str(origin))
    count = 1 + runs
    seed.create_tasks(stack.db, pool, count, approve=True, make=_spec(base, pool), base_sha=base)
    model = StampedModel()
    model.start()
    cache = Path(tempfile.mkdtemp(prefix=f"{pool}-cache-", dir=cache_root or stack.workdir))
    aimed = Stack(
        kids=stack.kids,
        workdir=stack.workdir,
        db=stack.db,
        supervisor_url=stack.supervisor_url,
        model_url=model.url,
    )
    env = {"CACHE_DIRECTORY": str(cache), "TETHER_COMMANDS_WITHOUT_SANDBOX": "1"}
    [runner] = aimed.start_runners(pool, pool, 1, 1, env=env)
    try:
        deadline = time.monotonic() + timeout_s
        keys = [f"{pool}-{i}" for i in range(count)]
        while time.monotonic() < deadline:
            if all(model.first_request_of(f"lease {k}") is not None for k in keys):
                break
            if len(seed.ended(stack.db, pool)) == count:
                break  # every task ended: a step that made no model call is named below
            if runner.poll() is not None:
                raise RuntimeError(f"the agent runner exited {runner.returncode}")
            time.sleep(0.1)
        grants = seed.first_grants(stack.db, pool)
    finally:
        stack.kids.stop(runner, grace_s=10)
        model.stop()
        seed.cancel_pool(stack.db, pool)
        shutil.rmtree(cache, ignore_errors=True)
    spans = []
    for key in keys:
        asked = model.first_request_of(f"lease {key}")
        if asked is None or key not in grants:
            why = seed.ended(stack.db, pool).get(key, f"not ended within {timeout_s:.0f} s")
            raise RuntimeError(f"step {key} made no model call ({why})")
        spans.append(asked - grants[key])
    cold, warm = spans[0], tuple(spans[1:])
    return AgentLease(
        files=files,
        cold_s=cold,
        warm_s=warm,
        p50_s=statistics.median(warm),
        max_s=max(warm),
        cache_dir=str(cache),
    )


def _main() -> None:
    """`python -m bench.agent_lease`: this measurement alone, on a fresh supervisor."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5, help="warm leases measured")
    parser.add_argument("--dir", type=Path, default=None, help="where the work folder goes")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where the runner's cache goes (default: in the work folder)",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tether-bench-lease-", dir=args.dir))
    try:
        db = workdir / "ledger.db"
        seed.create_tasks(db, "warm", 1, approve=False)
        with children(workdir) as kids:
            stack = Stack(kids=kids, workdir=workdir, db=db)
            stack.token(POOL)
            stack.start_supervisor()
            found = run(stack, files=args.files, runs=args.runs, cache_root=args.cache_dir)
            print(json.dumps(dataclasses.asdict(found), indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    _main()
