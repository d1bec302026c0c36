"""One attempt at one step: run the kind while the keeper holds the lease, then report,
release, or drop.

The attempt runs inside one cancel scope: the keeper cancels it the moment the lease is lost
(nothing is reported then: the step is not ours), and shutdown cancels it, releasing the lease
(`shutdown`, retryable) outside that scope. A renew saying the tenant's token budget is spent
cancels it too, and the lease is released uncounted (`operator`), so the task waits for the
budget instead of failing. Every release carries the tokens the attempt's model calls spent,
which count toward the budget though nothing commits.

When shutdown cancels: a step of a kind that checkpoints its turns (`agent`, or any step that
has had a checkpoint accepted) is cancelled at once, because its last completed turn is
recorded at the supervisor and the next attempt resumes from it: going on would only spend
tokens on a turn that is lost anyway. Every other kind (`chat`, a deployment's own) keeps
`shutdown_grace_s` to finish, since cancelling it loses all its work. Checkpoints already on
their way are finished first, each within `CHECKPOINT_TIMEOUT_S` of its turn's end
(`tether.runner.agent.checkpoints`; its record request itself at most `CHECKPOINT_FINISH_S`,
`tether.runner.services`), so the release that follows never cuts one in half.

When the cloud reclaims the server (`preempt`, runner/preemption/), the step is asked to stop
at its next save point (`WindDown`): an agent step checkpoints the turn it is in as soon as its
model call or tool call in flight returns, so an answer that arrives in the notice's window is
kept. A step of any other kind is let finish. Whatever still works at the runner's deadline
for the notice is cancelled; the lease is then released `preempted` (retryable, not counted).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import anyio
import structlog
from tenacity import stop_never

from tether.clocks import MonotonicClock
from tether.runner import tracing
from tether.runner.credentials import SecretMissing, SecretSource
from tether.runner.errors import (
    BudgetExhausted,
    LeaseLost,
    LostBecause,
    OperatorProblem,
    Preempted,
    StepFailure,
    StepRejected,
    StepUnsupported,
    SupervisorError,
    SupervisorRefused,
    TokenRejected,
    TransientFailure,
)
from tether.runner.keeper import LeaseKeeper, RenewalBatcher
from tether.runner.kinds.base import StepContext, StepOutput, WindDown
from tether.runner.kinds.registry import KindRegistry
from tether.runner.lease import Lease
from tether.runner.model_client import Completion, ModelClient
from tether.runner.results import ResultSender
from tether.runner.services import SupervisorServices, while_unreachable
from tether.runner.supervisor_client import ResultReport, SupervisorClient
from tether.wire import ReleaseReason, content_hash

T = TypeVar("T")

# How long a shutdown release may take before the runner exits without it (the lease then
# expires on the supervisor after its TTL).
SHUTDOWN_RELEASE_S = 5.0
# Kinds whose steps checkpoint each completed turn, and so stop at once on shutdown.
CHECKPOINTING_KINDS = frozenset({"agent"})


class Phase(enum.StrEnum):
    STARTING = "starting"
    WORKING = "working"
    REPORTING = "reporting"
    RELEASING = "releasing"
    DONE = "done"


class StepHost(Protocol):
    """What a step needs from the runner around it."""

    def operator_problem(self, problem: OperatorProblem) -> None: ...
    def token_rejected(self, detail: str) -> None: ...
    def rate_limited(self, seconds: float) -> None: ...
    def step_succeeded(self) -> None: ...


class StepRun:
    """One leased attempt; every log line carries `task_id, step_id, attempt, fence`."""

    def __init__(
        self,
        *,
        lease: Lease,
        supervisor: SupervisorClient,
        model: ModelClient,
        model_key: SecretSource,
        kinds: KindRegistry,
        clock: MonotonicClock,
        host: StepHost,
        default_model: str,
        model_timeout_s: float,
        results: ResultSender | None = None,
        renewals: RenewalBatcher | None = None,
    ) -> None:
        self.lease = lease
        self._supervisor = supervisor
        self._results = results or ResultSender(supervisor)
        self._model = model
        self._model_key = model_key
        self._kinds = kinds
        self._clock = clock
        self._host = host
        self._default_model = default_model
        self._model_timeout_s = model_timeout_s
        self.log = structlog.get_logger("runner.step").bind(**lease.log_context())
        self.services = SupervisorServices(supervisor, lease, clock=clock)
        self.phase = Phase.STARTING
        self._scope = anyio.CancelScope()
        self._aborted = False
        self._out_of_budget = False
        self.wind_down = WindDown()
        self._preempted: Preempted | None = None
        self._preempt_by = 0.0  # when, on the runner's clock, preempted work is cancelled
        self._attempt_tasks: anyio.abc.TaskGroup | None = None  # while the attempt runs
        self._key_in_use: str | None = None
        # Token counts of every model answer this attempt got, sent with a release.
        self.spent: dict[str, int] = {}
        self.keeper = LeaseKeeper(
            lease=lease,
            client=supervisor,
            clock=clock,
            log=self.log,
            on_lost=self._on_lost,
            on_token_rejected=host.token_rejected,
            on_budget_exhausted=self._on_budget_exhausted,
            renewals=renewals,
        )
        self.outcome: str | None = None

    def _on_lost(self, lost: LeaseLost) -> None:
        """Cancel the work, unless a result is on its way: then only expiry cancels.

        The result's own reply is the truth (`applied`/`replayed` are success, a 409 means
        the step is not ours), so a renew refusal meanwhile changes nothing.
        """
        if self.phase is Phase.REPORTING and lost.because is not LostBecause.EXPIRED:
            return
        self._scope.cancel()

    def _on_budget_exhausted(self) -> None:
        """Stop working and let the lease go uncounted; a result already on its way is let
        finish (the tokens are spent either way)."""
        if self.phase is Phase.WORKING and not self._out_of_budget:
            self._out_of_budget = True
            self._scope.cancel()

    @property
    def stops_at_once(self) -> bool:
        """Whether shutdown cancels this step without a grace period (see the module's
        docstring): its kind checkpoints, or it has a checkpoint accepted, and it is still
        working (a result on its way is let finish within the grace)."""
        checkpoints = self.lease.kind in CHECKPOINTING_KINDS or self.services.checkpoints > 0
        return checkpoints and self.phase in (Phase.STARTING, Phase.WORKING)

    def abort(self) -> None:
        """Shutdown's grace is over: stop the work; the lease is released after."""
        if self.phase is not Phase.DONE:
            self._aborted = True
            self._scope.cancel()

    def preempt(self, until: float, why: str) -> None:
        """The cloud reclaims the server (see the module's docstring): stop at the next save
        point, and no later than `until` on the runner's clock; then release `preempted`. A
        result or a release already on its way is let finish."""
        if self._preempted is not None or self.phase not in (Phase.STARTING, Phase.WORKING):
            return
        self._preempted = Preempted(why)
        self._preempt_by = until
        self.wind_down.request(self._preempted)
        if self._attempt_tasks is not None:
            self._attempt_tasks.start_soon(self._cut_at_preemption_deadline)

    async def _cut_at_preemption_deadline(self) -> None:
        await self._clock.sleep(self._preempt_by - self._clock.now())
        if self.phase in (Phase.STARTING, Phase.WORKING):
            self._scope.cancel()

    async def run(self) -> None:
        """Run the attempt. Everything it runs logs with the step's ids (structlog's context
        variables, bound in this task only), so a step kind's own lines, `checkpoint` and
        `resuming` among them, carry `task_id, step_id, attempt, fence` without binding them."""
        with (
            structlog.contextvars.bound_contextvars(**self.lease.log_context()),
            tracing.step(self.lease) as span,
        ):
            await self._run()
            span.set(outcome=self.outcome, **self.spent)

    async def _run(self) -> None:
        self.log.info("step leased", kind=self.lease.kind, name=self.lease.name)
        with self._scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.keeper.run)
                self._attempt_tasks = tg
                try:
                    if self._preempted is not None:  # asked before the attempt began
                        tg.start_soon(self._cut_at_preemption_deadline)
                    await self._attempt()
                finally:
                    self._attempt_tasks = None
                tg.cancel_scope.cancel()
        if self.phase is Phase.DONE:
            return
        if self.keeper.lost is not None:
            self.outcome = f"dropped: {self.keeper.lost.because}"
            self.log.warning(
                "step dropped; nothing reported", because=str(self.keeper.lost.because)
            )
        elif self._out_of_budget:
            await self._release(BudgetExhausted())
        elif self._preempted is not None:
            await self._release(self._preempted)
        elif self._aborted:
            await self._release_for_shutdown()
        self.phase = Phase.DONE

    async def _attempt(self) -> None:
        self.phase = Phase.WORKING
        try:
            self.wind_down.check()  # a lease that came after the notice: no work begins
            output = await self._work()
        except LeaseLost as lost:  # a checkpoint heard that the step is not ours
            self._dropped(lost, "checkpoint refused; the step is no longer ours")
            return
        except TokenRejected as exc:
            self._token_rejected(exc)
            return
        except SupervisorError as exc:  # the supervisor stayed unreachable, or refused a call
            await self._release(TransientFailure(f"supervisor: {exc.detail}"))
            return
        except OperatorProblem as problem:
            self._host.operator_problem(problem)
            await self._release(problem)
            return
        except StepFailure as failure:
            if isinstance(failure, TransientFailure) and failure.retry_after_s:
                self._host.rate_limited(failure.retry_after_s)
            await self._release(failure)
            return
        except Exception as exc:  # a bug in a step kind must not take the runner down
            self.log.exception("step kind crashed")
            await self._release(TransientFailure(f"runner error: {type(exc).__name__}: {exc}"))
            return
        await self._report(output)

    async def _work(self) -> StepOutput:
        computed = content_hash(self.lease.payload)
        if computed != self.lease.payload_hash:
            self.log.error(
                "payload does not match its hash; releasing",
                payload_hash=self.lease.payload_hash,
                computed=computed,
            )
            # Maybe this runner hashes differently (an older tether): another runner deserves
            # a try, and max_attempts bounds it.
            raise StepUnsupported("payload hash mismatch: the runner computed another hash")
        kind = self._kinds.get(self.lease.kind)
        context = StepContext(
            step_id=self.lease.step_id,
            task_id=self.lease.task_id,
            name=self.lease.name,
            attempt=self.lease.attempt,
            payload=self.lease.payload,
            outputs=self.lease.outputs,
            default_model=self._default_model,
            chat=self._chat,
            fence=self.lease.fence,
            repository=self.lease.repository,
            resume=self.lease.resume,
            services=self.services,
            wind_down=self.wind_down,
        )
        return await kind(context)

    async def _chat(self, body: dict[str, Any]) -> Completion:
        try:
            key = await self._model_key.get()
        except SecretMissing as exc:
            raise OperatorProblem(
                f"model key missing: {exc}",
                action=f"put the model API key in {self._model_key.describe()}",
            ) from None
        self._key_in_use = key
        deadline = self._clock.now() + self._model_timeout_s
        try:
            completion = await self._model.chat(
                body, key=key, deadline=deadline, on_retry=self._model_retrying
            )
        except OperatorProblem as problem:
            self._model_key.invalidate()  # the operator may fix the file; read it again
            if problem.about_key:
                problem.action = (
                    f"put a valid API key in {self._model_key.describe()}; the runner re-reads it"
                )
            raise
        for name, count in completion.usage.items():
            self.spent[name] = self.spent.get(name, 0) + count
        return completion

    def _model_retrying(self, tries: int, why: str, wait_s: float) -> None:
        """A provider outage must show: the first retry of a step's model call is a warning,
        and so is each doubling of its tries (1, 2, 4, 8, ...), not every one of them."""
        if tries & (tries - 1) == 0:
            self.log.warning(
                "model call failed; retrying with backoff",
                error=why,
                tries=tries,
                retry_in_s=round(wait_s, 2),
            )

    def _token_rejected(self, exc: TokenRejected) -> None:
        """The runner's token was refused: the runner stops claiming; this step is dropped."""
        self._host.token_rejected(exc.detail)
        self.outcome = "dropped: token_rejected"
        self.phase = Phase.DONE

    def _detail(self, failure: StepFailure) -> str:
        """The release's detail: the key hidden, cut to 500 characters, and any NUL (a model's
        or a tool's text may hold one; the supervisor refuses it) shown as U+FFFD."""
        detail = failure.detail
        if self._key_in_use:
            detail = detail.replace(self._key_in_use, "***")
        return detail[:500].replace("\x00", "\ufffd")

    async def _until_answered(self, call: Callable[[], Awaitable[T]]) -> T:
        """Retry `call`, with backoff, while the supervisor gives no reply; expiry bounds it."""
        max_wait_s = min(5.0, self.keeper.renew_every_s)
        return await while_unreachable(
            call, clock=self._clock, stop=stop_never, max_wait_s=max_wait_s
        )

    async def _release(self, failure: StepFailure) -> None:
        self.phase = Phase.RELEASING
        detail = self._detail(failure)
        log = self.log.info if isinstance(failure, Preempted) else self.log.warning
        log(
            "releasing the step",
            reason=str(failure.reason),
            retryable=failure.retryable,
            detail=detail,
        )
        reason = failure.reason
        try:
            try:
                await self._send_release(reason, failure.retryable, detail)
            except SupervisorRefused as exc:
                if reason is not ReleaseReason.PREEMPTED or exc.status != 422:
                    raise
                # A supervisor older than `preempted` refuses the reason; `shutdown` means
                # the same to it: requeued at once, not counted.
                reason = ReleaseReason.SHUTDOWN
                await self._send_release(reason, failure.retryable, detail)
        except LeaseLost as lost:
            self.log.info(
                "release refused; the step was no longer ours",
                because=str(lost.because),
                error=lost.detail,
            )
        except TokenRejected as exc:
            self._host.token_rejected(exc.detail)
        except SupervisorRefused as exc:
            self.log.error("release refused as malformed", error=exc.detail)  # noqa: TRY400
        self.outcome = f"released: {reason}"
        self.phase = Phase.DONE

    async def _send_release(self, reason: ReleaseReason, retryable: bool, detail: str) -> None:
        await self._until_answered(
            lambda: self._supervisor.release(
                self.lease.step_id,
                self.lease.fence,
                reason,
                retryable=retryable,
                detail=detail,
                usage=self.spent,
            )
        )

    async def _report(self, output: StepOutput) -> None:
        """Send the result. Its usage is the attempt's own: the kind's `usage` (the agent's
        excludes the turns an earlier attempt paid for), else what this attempt's model calls
        spent, so a kind that reports none is charged all the same."""
        self.phase = Phase.REPORTING
        usage = output.usage or dict(self.spent)
        report = ResultReport(
            fence=self.lease.fence,
            payload_hash=content_hash(self.lease.payload),
            output=output.output,
            usage=usage,
            candidate_sha=output.candidate_sha,
            artifacts=output.artifacts,
            bundle=output.bundle,
            checks=output.checks,
        )
        try:
            outcome = await self._until_answered(
                lambda: self._results.report(self.lease.step_id, report)
            )
        except LeaseLost as lost:
            self._dropped(lost, "result refused; the step is no longer ours")
            return
        except TokenRejected as exc:
            self._token_rejected(exc)
            return
        except SupervisorRefused as exc:
            # The supervisor will never take this output (too large, malformed): the step
            # would fail the same way on every runner.
            await self._release(StepRejected(f"result refused: {exc.detail}"))
            return
        self.outcome = str(outcome)
        self.phase = Phase.DONE
        self.log.info("step reported", outcome=str(outcome), usage=usage)
        self._host.step_succeeded()

    def _dropped(self, lost: LeaseLost, message: str) -> None:
        """The supervisor said the step is no longer ours: nothing more is sent about it."""
        self.outcome = f"dropped: {lost.because}"
        log = self.log.error if lost.because is LostBecause.PAYLOAD_DRIFT else self.log.warning
        log(message, because=str(lost.because), error=lost.detail)
        self.phase = Phase.DONE

    async def _release_for_shutdown(self) -> None:
        self.phase = Phase.RELEASING
        self.log.info("shutting down: releasing the step")
        with anyio.move_on_after(SHUTDOWN_RELEASE_S) as scope:
            try:
                await self._until_answered(
                    lambda: self._supervisor.release(
                        self.lease.step_id,
                        self.lease.fence,
                        ReleaseReason.SHUTDOWN,
                        retryable=True,
                        detail="runner shutting down",
                        usage=self.spent,
                    )
                )
            except (LeaseLost, TokenRejected, SupervisorRefused) as exc:
                self.log.info("shutdown release refused", error=str(exc))
        if scope.cancelled_caught:
            self.log.warning("shutdown release got no answer; the lease will expire")
        self.outcome = "released: shutdown"
