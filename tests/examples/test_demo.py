"""`make demo` end to end: real processes on 127.0.0.1, a runner SIGKILLed mid-step, the replay,
and the ledger's account printed; then nothing left behind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow


def test_demo_prints_the_account_and_exits_zero() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.demo"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    account = out.split("== the ledger's account ==", 1)[1].splitlines()

    assert re.match(r"task \w+  state SUCCEEDED", account[1])
    steps = [line for line in account if re.match(r"  step \d ", line)]
    assert len(steps) == 4
    assert all(" committed " in line and "effects 1 " in line for line in steps)
    assert "effects in the ledger: 4 for 4 steps (exactly one each)" in out

    killed = [line for line in account if "<- SIGKILLed mid-step" in line]
    replayed = [line for line in account if "<- replayed" in line]
    assert len(killed) == 1
    assert len(replayed) == 1
    kill = re.search(r"fence (\d+)\s+(\S+)\s+expired", killed[0])
    replay = re.search(r"fence (\d+)\s+(\S+)\s+committed", replayed[0])
    assert kill is not None
    assert replay is not None
    assert int(replay.group(1)) > int(kill.group(1))  # a new, higher fence
    assert replay.group(2) != kill.group(2)  # the other runner
    assert re.search(rf"SIGKILL {kill.group(2)} \(pid \d+\)", out)
    assert "tether-supervisor check: ok" in out

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
