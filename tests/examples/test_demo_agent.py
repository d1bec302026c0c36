"""`make demo-agent` end to end: real processes on 127.0.0.1 and a real git repository; the runner
SIGKILLed after its write's checkpoint, the other resuming without asking the model again for the
turns done, the candidate verified, the review record, and a moved head failing `stale_base`;
then nothing left behind. Plus the demo's own pieces that decide what it runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from examples.demo_agent import WITHOUT_SANDBOX, sandbox_environment, scenario
from examples.demo_evidence import ADDED, EXPECTATIONS, TWELVE
from examples.standin_model import read_scenario

CALL = re.compile(
    r"  #(\d) turn_index (\d)  (\w+)\s+messages (\d+)\s+digest (\w+)  (\S+)(  held 3600 s)?"
)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_agent_prints_a_checked_account_and_exits_zero() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.demo_agent"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr + _kept_logs(done.stderr)
    announced = re.search(r"^sandbox      (bwrap works here|NONE: .*=true\))", out, re.M)
    assert announced is not None
    used = "bwrap" if announced.group(1).startswith("bwrap") else "none"
    assert re.search(rf"'s log: its commands and checks ran in sandbox={used}$", out, re.M)
    base = re.search(r"^base         (\w{12}): python -m pytest -q exits 1 \(1 failed", out, re.M)
    assert base is not None

    # Killed after the checkpoint of turn 2 (read, write), while its third call was held.
    checkpoint = re.search(r"checkpoint   turn 2 \(read, write\) under fence (\d+): .* bundle", out)
    killed = re.search(r"SIGKILL (\S+) \(pid \d+\) while the stand-in holds", out)
    assert checkpoint is not None
    assert killed is not None
    assert out.index(checkpoint.group(0)) < out.index(killed.group(0))

    # The stand-in's call log: the resumed attempt asked turns 2 and 3 only, its first call the
    # very question the killed attempt was waiting on.
    calls = [m.groups() for m in CALL.finditer(out)]
    assert [(c[1], c[2]) for c in calls] == [
        ("0", "read"),
        ("1", "write"),
        ("2", "test"),
        ("2", "test"),
        ("3", "done"),
    ]
    killer, survivor = calls[0][5], calls[4][5]
    assert {c[5] for c in calls[:3]} == {killed.group(1)} == {killer}
    assert calls[3][5] == survivor != killer
    assert calls[2][6] is not None  # held, never answered
    assert calls[3][6] is None  # answered at once
    assert calls[2][4] == calls[3][4]  # the same digest: the same conversation asked again
    assert re.search(
        rf"resume proof: {survivor} resumed from turn 2 of fence {checkpoint.group(1)}", out
    )

    # The candidate, verified, and its check log read back.
    assert f"descends from the base {base.group(1)}: yes" in out
    assert 'changed: src/calc.py (allowed_paths ["src/"])' in out
    assert re.search(r"check tests: exit code 0 in [\d.]+ s, log [0-9a-f]{64}", out)
    assert "the tests again, run by the demo on the mirror's copy: exit code 0" in out
    log_lines = out.split("$ tether-supervisor artifact get", 1)[1].splitlines()[1:5]
    assert any(line.startswith("  | ") and "1 passed" in line for line in log_lines)

    # The review record: the twelve fields and issue 12's three, each with its kind.
    review = out.split("== the review record", 1)[1].split("== second run", 1)[0]
    shown = dict(re.findall(r"^  (\w+)\s+(expectation|observation)  ", review, re.M))
    assert list(shown) == [*TWELVE, *ADDED]
    assert {k for k, v in shown.items() if v == "expectation"} == EXPECTATIONS
    assert re.search(r"observed_terminal_state\s+observation  SUCCEEDED", review)
    assert re.search(r"reviewer_decision\s+observation  accept", review)
    assert re.search(r"unresolved_questions\s+observation  \[\]", review)
    assert "verdict: acceptable True" in review

    # The second run: the head moved mid-step; the task failed stale_base, naming both.
    moved = re.search(r"git push: calc\.git main is now (\w{12}), while the step waits", out)
    assert moved is not None
    failed = re.search(
        r"state FAILED  reason stale_base: approved (\w+), repository calc is at (\w+)", out
    )
    assert failed is not None
    assert failed.group(1).startswith(base.group(1))
    assert failed.group(2).startswith(moved.group(1))
    assert "approving another task on the old base now: 409 stale_base" in out
    assert "tether-supervisor check: ok" in out
    assert "demo-agent ok:" in out

    ledger = re.search(r"ledger (\S+/ledger\.db)", out)
    assert ledger is not None
    folder = Path(ledger.group(1)).parent
    assert not folder.exists()  # the temporary folder is removed after a success
    leftovers = [
        p.info["pid"]
        for p in psutil.process_iter(["pid", "cmdline"])
        if any(str(folder) in part for part in (p.info["cmdline"] or []))
    ]
    assert leftovers == []


def _kept_logs(stderr: str) -> str:
    """The tails of the process logs a failed demo kept (its one line names the folder)."""
    kept = re.search(r"\(logs kept in (\S+)\)", stderr)
    if kept is None:
        return ""
    logs = sorted(Path(kept.group(1)).glob("*.log"))
    return "".join(
        f"\n--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        for log in logs
    )


def test_the_script_is_one_the_stand_in_takes_with_one_held_turn() -> None:
    script = read_scenario(scenario("test", 3600.0))
    assert [(t.name, t.assistant_turns) for t in script.turns] == [
        ("read", 0),
        ("write", 1),
        ("test", 2),
        ("done", 3),
    ]
    assert [(t.hold_s, t.holds) for t in script.turns] == [
        (0.0, None),
        (0.0, None),
        (3600.0, 1),
        (0.0, None),
    ]
    write = script.turns[1].tool_calls[0]
    assert write.name == "write_file"
    assert isinstance(write.arguments, dict)
    assert write.arguments["path"].startswith("src/")  # inside the task's allowed_paths


def test_without_bwrap_the_demo_says_so_and_lets_its_runners_run_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap here
    assert sandbox_environment(tmp_path) == {WITHOUT_SANDBOX: "true"}
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "sandbox      NONE: bwrap is not installed; the demo's runners run commands without"
        f" a sandbox ({WITHOUT_SANDBOX}=true)"
    ]
