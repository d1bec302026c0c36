"""`make demo-effects` end to end: real processes on 127.0.0.1, a local bare git repository and
the local receiver; the supervisor SIGKILLed after the push moved the branch and again after
the receiver applied the deploy, each before the answer was recorded; the receiver's own count
of deploys is 1 and the branch is at the verified candidate; then nothing left behind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_demo_effects_prints_one_deploy_and_the_branch_at_the_candidate() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.demo_effects"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr

    candidate = re.search(r"step fix     committed; candidate (\w{12}) verified", out)
    assert candidate is not None, out
    sha = candidate.group(1)
    kills = re.findall(r"  SIGKILL      (supervisor(?:-\d)?) \(pid \d+\) (.*)", out)
    assert [who for who, _ in kills] == ["supervisor", "supervisor-2"]
    assert kills[0][1].startswith("after the push moved main ")
    assert kills[1][1].startswith("after the receiver applied the deploy")
    assert "restarted    supervisor-3" in out

    ledger = out.split("== the ledger's account ==", 1)[1]
    assert re.search(r"task \w+  state SUCCEEDED", ledger)
    for step in ("push", "deploy"):
        block = ledger.split(f"  step {step} ", 1)[1]
        lines = block.splitlines()
        assert "delivered" in lines[0]
        assert lines[1] == "      attempt 1  no answer recorded: the supervisor was SIGKILLed"
        assert lines[2].startswith("      attempt 2  delivered")
        assert lines[3] == "      recorded: replayed True on attempt 2"
    assert f"branch main already at {sha}" in ledger

    assert re.search(
        rf"^deploys applied: 1  \(requests 2, .*replayed 1\) of commit {sha}$", out, re.MULTILINE
    )
    assert re.search(rf"^calc\.git main: {sha} = the verified candidate", out, re.MULTILINE)
    assert "tether-supervisor check: ok" in out
    assert out.rstrip().splitlines()[-1].startswith("demo-effects ok:")

    folder = re.search(r"ledger (\S+)/ledger\.db", out)
    assert folder is not None
    assert not Path(folder.group(1)).exists()  # the temporary folder is removed after a success
    leftovers = [
        p.info["pid"]
        for p in psutil.process_iter(["pid", "cmdline"])
        if any(folder.group(1) in part for part in (p.info["cmdline"] or []))
    ]
    assert leftovers == []
