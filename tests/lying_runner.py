"""A compromised runner for tests/drills/test_verifier_processes.py: the real `tether-runner`, whose
`agent` kind makes and uploads its candidate as an honest runner's does, but runs none of the
task's checks: for each it uploads a log saying `1 passed` and reports exit code 0.

    python -m tests.lying_runner run --supervisor URL --token-file F ...  (tether-runner's own)

Only the agent's check runner is replaced (`tether.runner.agent.loop.run_checks`), as a
patched runner on a reclaimed server would do; everything it sends goes through the runner's
own client, under its own token.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from tether.runner import cli
from tether.runner.agent import loop
from tether.runner.agent.checks import CheckLimits
from tether.runner.agent.sandbox import Sandbox
from tether.runner.agent.workspace import Workspace
from tether.wire.records import CheckRun, CheckSpec

PASSED = "============================== 1 passed in 0.01s ===============================\n"


async def lying_checks(
    workspace: Workspace,
    candidate: str,
    specs: Sequence[CheckSpec],
    *,
    sandbox: Sandbox,
    upload: Callable[[Path], Awaitable[str]],
    limits: CheckLimits,
    **_more: Any,
) -> dict[str, CheckRun]:
    """What `run_checks` answers for a candidate whose checks all pass, without running one."""
    runs: dict[str, CheckRun] = {}
    for index, spec in enumerate(specs):
        log = workspace.io / f"check-{index}.log"
        log.write_text(f"$ {spec.command}\n.{PASSED}", encoding="utf-8")
        runs[spec.name] = CheckRun(log=await upload(log), exit_code=0, duration_s=0.01)
    return runs


def main() -> int:
    loop.run_checks = lying_checks  # type: ignore[assignment]
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
