"""`tether-supervisor chaos explore`: run N seeded schedules against the real ledger.

Schedules are split into fixed chunks and spread over `--jobs` processes; results are taken in
schedule order, so the output and the trace digest are the same whatever the number of jobs.
The run stops at the first schedule (in schedule order) that violates an invariant, prints its
seed, its ordered events with their fences and SHAs, and the one command that replays exactly
that schedule. Exit 0: no violation; 1: a violation; 2: bad usage, or no PostgreSQL server.

The ledger is a scratch SQLite file per process, or with `--db postgresql://...` a scratch
database per process on that server, created for the run and dropped after it (`pgscratch`;
the database the URL names is only connected to). The rules are the same; PostgreSQL's
fences and identities are not rolled back with a transaction, so its traces and digests are
its own.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import multiprocessing
import os
import shlex
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from tether.cli import USAGE_EXIT, Parser
from tether.sim.harness import Scratch, open_workspace, scratch_root
from tether.sim.plants import PLANTS
from tether.sim.schedule import run_schedule
from tether.sim.seeds import fresh_seed, parse_seed, schedule_seed
from tether.supervisor.ledger.backends import is_postgres
from tether.supervisor.ledger.errors import StorageError

PROG = "tether-supervisor chaos"
CHUNK = 50
DEFAULT_SCHEDULES = 10_000
MAX_SCHEDULES = 10_000_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Found:
    index: int
    seed: int
    violations: list[str]
    trace: list[str]
    snapshot: list[str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Chunk:
    digests: list[str]
    found: Found | None
    traces: list[list[str]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    root: Path
    run_seed: int
    start: int
    stop: int
    plant: str | None
    keep_traces: bool
    db: str | None = None  # a PostgreSQL server's URL; None: SQLite files under `root`
    prefix: str = ""  # the run's database name prefix on that server


@dataclasses.dataclass(frozen=True, kw_only=True)
class Exploration:
    seed: int
    count: int
    digest: str
    found: Found | None
    wall_s: float


_workspaces: dict[tuple[Path, int], Scratch] = {}  # (run root, process id) -> its ledger


def run_chunk(job: Job) -> Chunk:
    """Run schedules `start..stop` of a run; stop early at the first violation."""
    key = (job.root, os.getpid())
    workspace = _workspaces.get(key)
    if workspace is None:
        workspace = _workspaces[key] = open_workspace(job.root, job.db, job.prefix)
    digests: list[str] = []
    traces: list[list[str]] = []
    for index in range(job.start, job.stop):
        seed = schedule_seed(job.run_seed, index)
        result = run_schedule(seed, workspace, job.plant)
        digests.append(result.digest)
        if job.keep_traces:
            traces.append(result.trace)
        if result.violations:
            found = Found(
                index=index,
                seed=seed,
                violations=result.violations,
                trace=result.trace,
                snapshot=result.snapshot,
            )
            return Chunk(digests=digests, found=found, traces=traces)
    return Chunk(digests=digests, found=None, traces=traces)


def explore(
    *,
    schedules: int,
    seed: int,
    plant: str | None = None,
    jobs: int = 1,
    first: int = 0,
    trace_out: TextIO | None = None,
    db: str | None = None,
) -> Exploration:
    """Run `schedules` schedules of run `seed` from schedule `first` on (one share of a run
    split over several processes or machines); on PostgreSQL when `db` is a server's URL."""
    started = time.perf_counter()
    run_digest = hashlib.sha256()
    count = 0
    found: Found | None = None
    with scratch_root() as root, _databases(db) as prefix:
        chunks = [
            Job(
                root=root,
                run_seed=seed,
                start=start,
                stop=min(start + CHUNK, first + schedules),
                plant=plant,
                keep_traces=trace_out is not None,
                db=db,
                prefix=prefix,
            )
            for start in range(first, first + schedules, CHUNK)
        ]
        with _results(chunks, jobs) as results:
            for chunk in results:
                for offset, digest in enumerate(chunk.digests):
                    run_digest.update(digest.encode())
                    if trace_out is not None:
                        index = first + count + offset
                        print(
                            f"-- schedule {index} seed {schedule_seed(seed, index)}", file=trace_out
                        )
                        print("\n".join(chunk.traces[offset]), file=trace_out)
                count += len(chunk.digests)
                if chunk.found is not None:
                    found = chunk.found
                    break
        workspace = _workspaces.pop((root, os.getpid()), None)  # this process ran schedules
        if workspace is not None:
            workspace.close()
    return Exploration(
        seed=seed,
        count=count,
        digest=run_digest.hexdigest(),
        found=found,
        wall_s=time.perf_counter() - started,
    )


@contextlib.contextmanager
def _databases(db: str | None) -> Iterator[str]:
    """The run's database name prefix on server `db` (dropped after), or "" for SQLite."""
    if db is None:
        yield ""
        return
    from tether.sim.pgscratch import scratch_server

    with scratch_server(db) as prefix:
        yield prefix


@contextlib.contextmanager
def _results(chunks: list[Job], jobs: int) -> Iterator[Iterable[Chunk]]:
    """Chunk results in chunk order, from this process or from a pool of `jobs`."""
    if jobs <= 1 or len(chunks) <= 1:
        yield (run_chunk(job) for job in chunks)
        return
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with context.Pool(min(jobs, len(chunks))) as pool:  # leaving it terminates the workers
        yield pool.imap(run_chunk, chunks)


def replay_command(seed: int, plant: str | None, db: str | None = None) -> str:
    """The command that replays one schedule; a server's URL without its password."""
    command = f"tether-supervisor chaos explore --schedules 1 --seed {seed}"
    if plant:
        command += f" --plant {plant}"
    if db:
        command += f" --db {shlex.quote(_redact(db))}"
    return command


# -- the command line -------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}") from None
    if not 1 <= value <= MAX_SCHEDULES:
        raise argparse.ArgumentTypeError(f"expected 1..{MAX_SCHEDULES}, not {value}")
    return value


def _index(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a schedule index, not {text!r}") from None
    if not 0 <= value < MAX_SCHEDULES:
        raise argparse.ArgumentTypeError(f"expected 0..{MAX_SCHEDULES - 1}, not {value}")
    return value


def _seed(text: str) -> int:
    try:
        return parse_seed(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _redact(url: str) -> str:
    from tether.supervisor.ledger.pg_schema import redact  # psycopg: only with --db

    return redact(url)


def _server(text: str) -> str:
    if not is_postgres(text):
        raise argparse.ArgumentTypeError(
            f"expected a PostgreSQL URL (postgresql://...), not {text!r}; without --db the"
            " explorer runs on scratch SQLite files"
        )
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Schedule exploration against the real ledger.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="explore")
    ex = sub.add_parser(
        "explore",
        help="run seeded schedules with faults; exit 1 on any invariant violation",
        description=__doc__,
        epilog=f"planted bugs (--plant): {', '.join(sorted(PLANTS))}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ex.add_argument(
        "--schedules",
        type=_positive,
        default=None,
        metavar="N",
        help=f"how many schedules to run (default {DEFAULT_SCHEDULES})",
    )
    ex.add_argument(
        "--seed",
        type=_seed,
        default=None,
        metavar="S",
        help="run seed (default: a fresh one, printed); schedule 0 uses S itself, so"
        " --schedules 1 --seed S replays the schedule whose seed is S",
    )
    ex.add_argument(
        "--first",
        type=_index,
        default=0,
        metavar="I",
        help="start at schedule I of the run (default 0): runs I to I+N-1, so one run can be"
        " split into shares that together explore every schedule",
    )
    ex.add_argument(
        "--plant",
        choices=sorted(PLANTS),
        default=None,
        metavar="BUG",
        help="switch off one ledger check, to prove the explorer catches it",
    )
    ex.add_argument(
        "--jobs",
        type=_positive,
        default=os.cpu_count() or 1,
        metavar="J",
        help="worker processes (default: the CPU count); the output is the same",
    )
    ex.add_argument(
        "--replay",
        type=_seed,
        default=None,
        metavar="SEED",
        help="run the one schedule whose seed is SEED and print its events: the same as"
        " --schedules 1 --seed SEED --trace",
    )
    ex.add_argument(
        "--db",
        type=_server,
        default=None,
        metavar="URL",
        help="run on PostgreSQL: a scratch database per worker on the server URL names,"
        " dropped afterwards (default: scratch SQLite files)",
    )
    ex.add_argument(
        "--trace",
        action="store_true",
        help="print every schedule's ordered events, not only a violating one's",
    )
    return parser


def main(argv: list[str]) -> int:
    """`argv` is what follows `chaos` on the command line, e.g. `["explore", "--schedules",
    "100"]`."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or bad usage (one line written, USAGE_EXIT)
        return exc.code if isinstance(exc.code, int) else 0
    if args.replay is not None:
        if args.schedules is not None or args.seed is not None:
            print(
                f"{PROG}: error: --replay names one schedule; drop --schedules and --seed",
                file=sys.stderr,
            )
            return USAGE_EXIT
        if args.first:
            print(f"{PROG}: error: --replay names one schedule; drop --first", file=sys.stderr)
            return USAGE_EXIT
        args.schedules, args.seed, args.trace = 1, args.replay, True
    schedules: int = DEFAULT_SCHEDULES if args.schedules is None else args.schedules
    seed: int = fresh_seed() if args.seed is None else args.seed
    plant: str | None = args.plant
    db: str | None = args.db
    on = f", on {_redact(db)}" if db else ""
    share = f", from schedule {args.first}" if args.first else ""
    print(
        f"chaos explore: {schedules} schedules, seed {seed}, plant {plant or 'none'},"
        f" jobs {args.jobs}{share}{on}",
        flush=True,
    )
    try:
        result = explore(
            schedules=schedules,
            seed=seed,
            plant=plant,
            jobs=args.jobs,
            first=args.first,
            trace_out=sys.stdout if args.trace else None,
            db=db,
        )
    except StorageError as exc:  # the server: unreachable, or refusing a scratch database
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    if result.found is not None:
        _print_violation(result.found, seed, plant, db)
    rate = result.count / result.wall_s if result.wall_s > 0 else 0.0
    violations = 0 if result.found is None else 1
    print(
        f"explored {result.count} schedules (seed {seed}{share}) in {result.wall_s:.1f}s:"
        f" {rate:.0f} schedules/s, {violations} violating"
        + (" (stopped at the first)" if violations else "")
    )
    print(f"trace digest: {result.digest}")
    return 1 if result.found else 0


def _print_violation(found: Found, run_seed: int, plant: str | None, db: str | None) -> None:
    out = sys.stdout
    print(
        f"VIOLATION in schedule {found.index} of run seed {run_seed}: schedule seed"
        f" {found.seed}, plant {plant or 'none'}",
        file=out,
    )
    for violation in found.violations:
        print(f"  {violation}", file=out)
    print("events (fences as 'fence N' / 'fN', SHAs as 'base', 'head', 'candidate'):", file=out)
    for line in found.trace:
        print(f"  {line}", file=out)
    print("ledger after the violating event (attempts as aN:fFENCE:RUNNER:STATE):", file=out)
    for line in found.snapshot:
        print(f"    {line}", file=out)
    print(f"replay: {replay_command(found.seed, plant, db)}", file=out)
