"""`chaos explore` as operators and CI run it: usage, determinism, planted bugs caught and
replayed exactly, and the CI-sized run of 10,000 schedules with zero violations."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tether.sim.explore import explore, main
from tether.sim.plants import PLANTS

ROOT = Path(__file__).resolve().parents[2]
CLI_SCRIPT = Path(sys.executable).parent / "tether-supervisor"
CI_SCHEDULES = 10_000
CI_SHARES = 4  # the CI run in shares of 2,500 (`--first`), none left out
# The ledger invariant (`tether-supervisor check`'s name for it) each planted bug breaks, or
# the invariants: the first schedule to catch it may show either.
PLANT_CAUGHT_BY: dict[str, str | tuple[str, ...]] = {
    "stale-fence": "no-stale-commit",
    "double-effect": "effect-key-is-identity",
    "terminal-overwrite": "terminal-is-final",
    "key-reuse": "idempotency-key-unique",
    "unverified-success": "success-is-verified",  # stale bases fail at commit, not here
    # the observer's: the ledger's file cannot show a time (a lapsed lease's checkpoint, too)
    "lapsed-lease": ("lapsed-lease", "stale-checkpoint"),
    "evidence-ignored": "success-is-verified",  # a forged candidate or log passes
    "stale-checkpoint": "stale-checkpoint",  # the observer's: it knows which fence is current
    # a second attempt under one opening; or the ledger's: a maybe-sent effect withdrawn
    "double-send": ("unkeyed-sent-once-per-opening", "withdrawn-effect-sent-nothing"),
    "ungated": "unkeyed-needs-word",  # the observer's: only it knows no operator opened it
    "lease-takeover": "lease-holder",  # the observer's: it knows which token claimed
}
CI_SEED = 20_260_601


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether.sim", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_replay(command: str) -> subprocess.CompletedProcess[str]:
    """Run a printed replay command as printed, through the installed `tether-supervisor`
    when it is there, else through `python -m supervisor.chaos`."""
    words = shlex.split(command)
    assert words[:2] == ["tether-supervisor", "chaos"], command
    argv = (
        [str(CLI_SCRIPT), *words[1:]]
        if CLI_SCRIPT.exists()
        else [sys.executable, "-m", "tether.sim", *words[2:]]
    )
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def digest(output: str) -> str:
    found = re.search(r"^trace digest: ([0-9a-f]{64})$", output, re.MULTILINE)
    assert found, output
    return found.group(1)


def violation_lines(output: str) -> list[str]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("VIOLATION in schedule"))
    end = next(i for i, line in enumerate(lines) if line.startswith("events ("))
    return [line.strip() for line in lines[start + 1 : end]]


def report_body(output: str) -> list[str]:
    """A violation report from its events to its replay command."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("events ("))
    end = next(i for i, line in enumerate(lines) if line.startswith("replay: "))
    return lines[start : end + 1]


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["explore", "--schedules", "0"], "--schedules"),
        (["explore", "--schedules", "many"], "--schedules"),
        (["explore", "--seed", "banana"], "--seed"),
        (["explore", "--seed", "-3"], "--seed"),
        (["explore", "--plant", "gremlin"], "--plant"),
        (["explore", "--jobs", "0"], "--jobs"),
        (["explore", "--first", "-1"], "--first"),
        (["explore", "--first", "two"], "--first"),
        (["explore", "--replay", "5", "--first", "2"], "--first"),
        (["explore", "--bogus"], "unrecognized"),
        (["explore", "--replay", "5", "--seed", "5"], "--replay"),
        ([], "required"),
        (["implode"], "invalid choice"),
    ],
)
def test_bad_usage_exits_2_with_one_line(
    args: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    # The program's name, or its subcommand's when the subcommand's arguments are wrong.
    assert err.startswith(
        ("tether-supervisor chaos: error:", "tether-supervisor chaos explore: error:")
    )
    assert complaint in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explore", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--schedules", "--seed", "--plant", "--jobs", *PLANTS):
        assert flag in out


def test_same_seed_same_digest_any_jobs_other_seed_other_digest() -> None:
    one = run("explore", "--schedules", "60", "--seed", "5", "--jobs", "1")
    again = run("explore", "--schedules", "60", "--seed", "5", "--jobs", "2")
    other = run("explore", "--schedules", "60", "--seed", "6", "--jobs", "1")
    for proc in (one, again, other):
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert re.search(r"^explored 60 schedules \(seed [56]\) in [0-9.]+s", proc.stdout, re.M)
    assert digest(one.stdout) == digest(again.stdout)
    assert digest(one.stdout) != digest(other.stdout)


def test_shares_of_a_run_together_run_its_schedules() -> None:
    """`--first`: two shares of a run trace exactly the schedules, in order, of the whole."""

    def schedules(proc: subprocess.CompletedProcess[str]) -> list[str]:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return [line for line in proc.stdout.splitlines() if line.startswith("-- schedule")]

    whole = run("explore", "--schedules", "6", "--seed", "5", "--trace", "--jobs", "1")
    head = run("explore", "--schedules", "4", "--seed", "5", "--trace", "--jobs", "1")
    tail = run("explore", "--schedules", "2", "--seed", "5", "--first", "4", "--trace")
    assert len(schedules(whole)) == 6
    assert schedules(head) + schedules(tail) == schedules(whole)
    assert "explored 2 schedules (seed 5, from schedule 4)" in tail.stdout


def test_digest_covers_every_schedule() -> None:
    shorter = explore(schedules=20, seed=5).digest
    longer = explore(schedules=21, seed=5).digest
    assert shorter != longer
    assert explore(schedules=20, seed=5).digest == shorter


def test_one_schedule_with_trace_prints_its_events() -> None:
    proc = run("explore", "--schedules", "1", "--seed", "12345", "--trace", "--jobs", "1")
    assert proc.returncode == 0, proc.stderr
    assert "-- schedule 0 seed 12345" in proc.stdout
    assert "plan:" in proc.stdout
    assert "faults stop; drive to quiescence" in proc.stdout
    replay = run("explore", "--replay", "12345", "--jobs", "1")
    assert replay.returncode == 0, replay.stderr
    events = [line for line in proc.stdout.splitlines() if not line.startswith("explored")]
    assert [line for line in replay.stdout.splitlines() if not line.startswith("explored")] == (
        events
    )


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_planted_bug_is_caught_and_its_replay_reproduces_it(plant: str) -> None:
    proc = run("explore", "--schedules", str(CI_SCHEDULES), "--seed", "1", "--plant", plant)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    count = int(re.search(r"^explored (\d+) schedules", out, re.M).group(1))  # type: ignore[union-attr]
    assert count <= CI_SCHEDULES
    header = re.search(r"^VIOLATION in schedule (\d+) .*schedule seed (\d+)", out, re.M)
    assert header, out
    assert count == int(header.group(1)) + 1  # stopped at the first violating schedule
    violations = violation_lines(out)
    assert violations, out
    # caught by the invariant the plant breaks, not by the harness crashing on it
    assert not any(line.startswith("explorer error") for line in violations), out
    caught = PLANT_CAUGHT_BY[plant]
    names = tuple(f"{n}:" for n in ((caught,) if isinstance(caught, str) else caught))
    assert any(line.startswith(names) for line in violations), out
    [replay] = re.findall(r"^replay: (.+)$", out, re.M)
    assert replay == (
        f"tether-supervisor chaos explore --schedules 1 --seed {header.group(2)} --plant {plant}"
    )
    assert re.search(r"^    fence counter \d+$", out, re.M)  # the fences and SHAs at the end

    again = run_replay(replay)
    assert again.returncode == 1, again.stdout + again.stderr
    assert violation_lines(again.stdout) == violations
    assert report_body(again.stdout) == report_body(out)  # the same events, fences and SHAs


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "share",
    [pytest.param(n, marks=pytest.mark.xdist_group(f"explorer-{n}")) for n in range(CI_SHARES)],
)
def test_ci_explores_ten_thousand_schedules_without_a_violation(
    share: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """One of `CI_SHARES` shares of the 10,000-schedule run (`--first`): together they run
    every schedule of it, and `make test` runs the shares side by side on its workers."""
    seed = os.environ.get("TETHER_CHAOS_SEED", str(CI_SEED))
    size = CI_SCHEDULES // CI_SHARES
    # The cores this test has: every one when the suite runs one test at a time, else its
    # worker's share (the output and digest are the same whatever the number of jobs).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    jobs = str(max(1, (os.cpu_count() or 1) // workers))
    assert size * CI_SHARES == CI_SCHEDULES  # no schedule left out
    first = str(share * size)
    args = ("--schedules", str(size), "--first", first, "--seed", seed, "--jobs", jobs)
    proc = run("explore", *args, timeout=580)
    with capsys.disabled():
        print(f"\n{proc.stdout.strip()}\n{proc.stderr.strip()}".rstrip())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = f", from schedule {share * size}" if share else ""
    assert re.search(
        rf"^explored {size} schedules \(seed {seed}{shown}\) in [0-9.]+s: .*0 violating$",
        proc.stdout,
        re.M,
    ), proc.stdout
    digest(proc.stdout)
