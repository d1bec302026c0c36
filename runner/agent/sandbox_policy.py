"""Whether an agent step may run commands on this runner: without a working bubblewrap, a
command runs as the runner's own user and can read the runner token and the model key, so a
step that would run commands (its `allowed_commands`, or the checks its lease carries) is
refused unless the operator set `commands_without_sandbox` (docs/design.md, The agent kind).

A refused step is released `operator`, uncounted and retryable, so its task waits with the
reason in its attempts instead of failing, and claiming pauses as for any operator problem.
"""

from __future__ import annotations

import structlog

from tether.runner.agent.sandbox import NoSandbox, Sandbox
from tether.runner.errors import OperatorProblem

log = structlog.get_logger(__name__)

# A release's detail is kept to 500 characters with its reason: the probe's reason is cut to
# this many, so that the ways out always fit.
WHY_MAX = 100
WAYS_OUT = (
    "install bubblewrap so that it works here (under systemd: the drop-in"
    " systemd/tether-runner-bwrap.conf), or set commands_without_sandbox = true, accepting"
    " that model-written code can then read the runner's credentials"
)


def refusal(why: str) -> str:
    """The detail a refused step is released with: why, and the two ways out."""
    if len(why) > WHY_MAX:
        why = why[: WHY_MAX - 1] + "…"
    return (
        f"no working sandbox on this runner ({why}): this step's commands (allowed_commands,"
        " checks) would run as the runner's own user and could read its token and model key."
        f" Either {WAYS_OUT}"
    )


class CommandPolicy:
    """The runner's `commands_without_sandbox` setting, applied to each agent step once the
    sandbox is known. One per agent kind (so per runner process): it says what it decided
    once, and a short line per refused step after that."""

    def __init__(self, *, commands_without_sandbox: bool = False) -> None:
        self.commands_without_sandbox = commands_without_sandbox
        self._said = False

    def admit(self, sandbox: Sandbox, *, step_id: str, runs_commands: bool) -> None:
        """Return when the step may run under `sandbox`; else raise `OperatorProblem`."""
        if sandbox.isolated:
            return
        why = sandbox.why if isinstance(sandbox, NoSandbox) else f"sandbox {sandbox.name!r}"
        if self.commands_without_sandbox:
            if not self._said:
                self._said = True
                log.warning(
                    "commands_without_sandbox is set: agent commands and checks run without a"
                    " sandbox, as the runner's own user; model-written code can read the"
                    " runner's credentials (runner token, model key) and reach the network",
                    sandbox=sandbox.name,
                    why=why,
                )
            return
        if not runs_commands:
            return
        detail = refusal(why)
        if not self._said:
            self._said = True
            log.error(f"agent steps that run commands are refused: {detail}")
        log.warning("agent step refused: no sandbox for its commands", step_id=step_id)
        raise OperatorProblem(detail, action=WAYS_OUT)
