"""The built-in `verify` kind (docs/design.md, Verification): re-run a task's checks at a
candidate another runner made, so that the supervisor does not hold that runner's word alone.

The supervisor leases a verify step only to runners of the task's verifier pool, never to a
token that worked on the task. Its payload names the candidate and the digest of its bundle,
and its lease's `repository` the checks and the start point (the candidate, from that
bundle). The step checks the candidate out in a fresh workspace, runs the setup commands the
making step ran (the repository's, then its payload's: `runner/agent/setup.py`), runs each
check with the agent's own check runner (`runner/agent/checks.py`: a clean checkout per
check, the sandbox, the process-group and log rules), uploads its own logs and reports the
runs; the supervisor compares them with the making runner's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from tether.runner.agent.checks import run_checks
from tether.runner.agent.setup import run_setup
from tether.runner.errors import StepRejected
from tether.runner.kinds.base import StepContext, StepOutput
from tether.wire.payloads import VerifyPayload, read_payload

if TYPE_CHECKING:
    from tether.runner.agent.loop import AgentKind

log = structlog.get_logger(__name__)


class VerifyKind:
    """The `verify` kind as a `StepKind`, sharing the agent kind's repository cache, sandbox,
    command policy and check limits (a verifier runs commands only under the same rules)."""

    def __init__(self, agent: AgentKind) -> None:
        self._agent = agent

    async def __call__(self, ctx: StepContext) -> StepOutput:
        try:
            payload = read_payload(ctx.payload, VerifyPayload)
        except ValueError as exc:
            raise StepRejected(f"verify payload: {exc}") from None
        repo = ctx.repository
        if repo is None or repo.start_sha != payload.candidate_sha:
            raise StepRejected(
                "verify step: its lease must start at the candidate its payload names"
            )
        services = ctx.services
        if services is None:
            raise StepRejected("verify step: the candidate comes from the supervisor's store")
        sandbox = await self._agent.sandbox()
        runs_commands = bool(repo.checks or repo.setup or payload.setup)
        self._agent.policy.admit(sandbox, step_id=ctx.step_id, runs_commands=runs_commands)

        async def fetch_start(into: Path) -> None:
            await services.download(payload.bundle, into)

        setup = repo.setup + payload.setup
        limits = self._agent.check_limits
        async with self._agent.cache.attempt(
            url=repo.url,
            base_sha=repo.base_sha,
            start_sha=payload.candidate_sha,
            label=f"{ctx.step_id}-{ctx.attempt}",
            start_bundle=fetch_start,
        ) as workspace:
            setup_run = None
            if setup:  # the toolchain the making runner's checks saw (`SetupFailed` fails it)
                setup_run = await run_setup(
                    workspace,
                    setup,
                    sandbox=sandbox,
                    confiner=self._agent.confiner,
                    upload=services.upload,
                    limits=limits,
                )
            runs = await run_checks(
                workspace,
                payload.candidate_sha,
                repo.checks,
                sandbox=sandbox,
                upload=services.upload,
                limits=limits,
                confiner=self._agent.confiner,
            )
        cleanup = workspace.cleanup
        output: dict[str, Any] = {
            "candidate_sha": payload.candidate_sha,
            "checks": {name: run.exit_code for name, run in runs.items()},
            "sandbox": sandbox.name,
            "cleanup": None if cleanup is None else cleanup.as_dict(),
        }
        if setup_run is not None:
            output["setup"] = setup_run.as_dict()
        log.info(
            "verify step done",
            step_id=ctx.step_id,
            candidate_sha=payload.candidate_sha,
            failed=sorted(name for name, run in runs.items() if run.exit_code != 0),
        )
        return StepOutput(output=output, candidate_sha=payload.candidate_sha, checks=runs)
