"""The runner daemon: the claim loop, the step slots, pauses, and a graceful shutdown.

Claims long-poll the supervisor for as many leases as there are free slots (`concurrency`);
each lease runs as a `StepRun` in one task group (docs/design.md, The runner). A request
carrying results also asks for the next leases (eager dispatch) for the slots it frees and any
free slot no claim is asking for, and starts what it gets at once, as a claim's leases.
With `preemption` set, a watch polls the cloud's notice; on one the runner stops claiming for
good and hands every step on (`Runner.preempt`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import anyio
import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_never,
    wait_random_exponential,
)

from tether.broadcast import Broadcast
from tether.clocks import LoopClock, MonotonicClock
from tether.runner.credentials import SecretMissing, SecretSource
from tether.runner.errors import (
    NotASupervisor,
    OperatorProblem,
    SupervisorRefused,
    SupervisorUnreachable,
    TokenRejected,
)
from tether.runner.keeper import RenewalBatcher
from tether.runner.kinds.registry import KindRegistry
from tether.runner.lease import Lease
from tether.runner.log_shipping import LogBuffer, LogShipper
from tether.runner.model_client import ModelClient
from tether.runner.preemption import Notice, NoticeSource, PreemptionWatch, where
from tether.runner.results import ResultSender
from tether.runner.settings import RunnerSettings
from tether.runner.state import RunnerPhase, RunnerState
from tether.runner.step import StepRun
from tether.runner.supervisor_client import SupervisorClient
from tether.sdnotify import Notifier
from tether.wire.records import MAX_CAPACITY, WantLeases

log = structlog.get_logger("runner")

RECENT_STEPS = 256
# The longest wait between two tries of a call to a supervisor that cannot be reached
# (random exponential backoff).
BACKOFF_MAX_S = 30.0
# The exit code when `supervisor_url` is not a supervisor's: a configuration error, as in
# `tether.runner.cli`.
NOT_A_SUPERVISOR_EXIT = 2
# Kept, of the time a preemption notice leaves, for the steps' last checkpoints and releases:
# work still going this long before the provider's deadline is cancelled.
PREEMPTION_RESERVE_S = 10.0


class Runner:
    """The daemon. Build it inside the event loop (it holds anyio primitives), then `run()`.

    Its state is one `RunnerState` (runner/state.py), replaced by each transition; the rest
    are its collaborators and the steps in flight."""

    def __init__(
        self,
        *,
        settings: RunnerSettings,
        supervisor: SupervisorClient,
        model: ModelClient,
        model_key: SecretSource,
        token: SecretSource | None = None,
        kinds: KindRegistry | None = None,
        clock: MonotonicClock | None = None,
        notifier: Notifier | None = None,
        backoff_max_s: float = BACKOFF_MAX_S,
        log_buffer: LogBuffer | None = None,
        preemption: NoticeSource | None = None,
    ) -> None:
        self._settings = settings
        self._supervisor = supervisor
        self._results = ResultSender(
            supervisor, wanting=self._eager_want, on_leases=self._start_eager
        )
        self._model = model
        self._model_key = model_key
        self._token = token
        self._kinds = kinds or KindRegistry.default(
            commands_without_sandbox=settings.commands_without_sandbox,
            command_limits=settings.command_limits,
            sandbox_read_only=settings.sandbox_read_only_paths,
        )
        self._clock = clock or LoopClock()
        self._renewals = RenewalBatcher(supervisor, clock=self._clock)
        # The step lines `log_buffer` collects (the logging setup's processor) go to the
        # supervisor; without one, nothing is shipped.
        self.log_shipper = (
            None if log_buffer is None else LogShipper(log_buffer, supervisor, clock=self._clock)
        )
        self._notifier = notifier or Notifier({})
        self._backoff_max_s = backoff_max_s
        self._claim_scope = anyio.CancelScope()
        self._claim_call = anyio.CancelScope()  # the claim on its way, cancelled on a notice
        self._root_scope: anyio.CancelScope | None = None
        self._in_flight: dict[tuple[str, int], StepRun] = {}
        self._steps: anyio.abc.TaskGroup | None = None
        self.eager_leases = 0  # leases that came with results, not claims
        self._changed = Broadcast()
        self._state = RunnerState(next_pause_s=settings.pause_initial_s)
        self._watch: PreemptionWatch | None = None
        if preemption is not None:
            self._watch = PreemptionWatch(
                preemption,
                poll_s=settings.preemption_poll_s,
                clock=self._clock,
                on_notice=self.preempt,
                where=where(settings.preemption, settings.preemption_url),
            )
        # The last steps started, finished or not: for tests and a debugger. Bounded, because a
        # runner lives for months and each step holds its lease (payload, earlier outputs).
        self.recent_steps: collections.deque[StepRun] = collections.deque(maxlen=RECENT_STEPS)

    # ---- the life of the daemon -------------------------------------------------------------

    async def run(self) -> int:
        """Serve until shut down; return the process's exit code."""
        s = self._settings
        log.info(
            "runner starting",
            runner_id=s.runner_id,
            supervisor_url=s.supervisor_url,
            failover=len(s.supervisor_urls) > 1,
            model_url=s.model_url,
            model_api=s.model_api,
            model=s.model,
            concurrency=s.concurrency,
            kinds=self._kinds.names(),
        )
        async with anyio.create_task_group() as root:
            self._root_scope = root.cancel_scope
            root.start_soon(self._watchdog_loop)
            if self.log_shipper is not None:
                root.start_soon(self.log_shipper.run)
            if self._watch is not None:
                root.start_soon(self._watch.run)
            async with anyio.create_task_group() as steps:
                self._steps = steps
                with self._claim_scope:
                    await self._claim_loop(steps)
                await self._drain()
            if self.log_shipper is not None:
                await self.log_shipper.flush()  # the steps' last lines
            root.cancel_scope.cancel()
        log.info("runner stopped", exit_code=self._state.exit_code)
        return self._state.exit_code

    @property
    def state(self) -> RunnerState:
        return self._state

    @property
    def stopping(self) -> bool:
        return self._state.stopping

    def request_shutdown(self) -> None:
        """Stop claiming; in-flight steps get `shutdown_grace_s`, then are released; a step
        that checkpoints its turns is released at once (`tether.runner.step`, `stops_at_once`).

        A claim reply cut off mid-flight is not lost: its leases go back to the queue through
        the supervisor's accept window.
        """
        if self._state.stopping:
            return
        self._state = self._state.stop()
        log.info(
            "shutting down: claiming stopped",
            in_flight=len(self._in_flight),
            grace_s=self._settings.shutdown_grace_s,
        )
        self._notifier.stopping()
        self._update_status()
        self._claim_scope.cancel()

    def preempt(self, notice: Notice, heard_at: float) -> None:
        """The cloud reclaims this server (`heard_at`: when its answer came, on the runner's
        clock). Within this call: claiming stops for good (a claim on its way is cancelled),
        and each step in flight is asked to stop at its next save point, an agent step
        checkpointing the turn it is in as soon as its model call or tool call returns; a
        step of another kind may finish. Whatever still works `PREEMPTION_RESERVE_S` before
        the provider's deadline (`shutdown_grace_s` after the notice when the provider names
        none) is cancelled. Every lease not reported is released `preempted`: requeued at
        once and not counted. The runner then serves nothing more until it is stopped.
        """
        if self._state.phase is not RunnerPhase.SERVING:
            return
        if notice.left_s is None:
            cancel_at = heard_at + self._settings.shutdown_grace_s
        else:
            cancel_at = heard_at + max(0.0, notice.left_s - PREEMPTION_RESERVE_S)
        self._state = self._state.preempt(notice, cancel_at)
        log.warning(
            "preemption notice: claiming stopped; steps checkpoint and are released",
            provider=notice.provider,
            action=notice.action,
            deadline=notice.deadline,
            left_s=None if notice.left_s is None else round(notice.left_s, 1),
            in_flight=len(self._in_flight),
        )
        self._claim_call.cancel()
        why = f"{notice.provider} reclaims the server ({notice.action})"
        for step in list(self._in_flight.values()):
            step.preempt(cancel_at, why)
        self._update_status()
        self._notify_changed()

    def force_stop(self, exit_code: int) -> None:
        """Exit at once, releasing nothing: the leases expire on the supervisor."""
        log.warning("second signal: exiting now; unreleased leases will expire")
        self._state = self._state.force_stop(exit_code)
        self._claim_scope.cancel()
        if self._root_scope is not None:
            self._root_scope.cancel()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def _drain(self) -> None:
        for step in list(self._in_flight.values()):
            if step.stops_at_once:
                step.abort()
        if self._in_flight:
            log.info("waiting for in-flight steps", in_flight=len(self._in_flight))
            async with anyio.create_task_group() as tg:

                async def grace_timer() -> None:
                    await self._clock.sleep(self._settings.shutdown_grace_s)
                    tg.cancel_scope.cancel()

                tg.start_soon(grace_timer)
                await self.wait_until(lambda: not self._in_flight)
                tg.cancel_scope.cancel()
        for step in list(self._in_flight.values()):
            step.abort()

    async def _watchdog_loop(self) -> None:
        interval = self._notifier.watchdog_interval_s
        if interval is None:
            return
        while True:
            self._notifier.watchdog()
            await self._clock.sleep(interval)

    # ---- claiming ---------------------------------------------------------------------------

    def _notify_changed(self) -> None:
        self._changed.fire()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Wait until `condition()` holds, checked whenever a step starts or ends."""
        await self._changed.wait_for(condition)

    async def _claim_loop(self, steps: anyio.abc.TaskGroup) -> None:
        concurrency = self._settings.concurrency
        while True:
            await self.wait_until(lambda: len(self._in_flight) < concurrency)
            if self._state.preemption is not None:
                await anyio.sleep_forever()  # until shutdown cancels the claiming
            # A preemption notice cancels whatever this round waits for (a pause, the
            # supervisor's first answer, a claim), so nothing more is claimed after it.
            with anyio.CancelScope() as self._claim_call:
                if not await self._claim_round(steps, concurrency):
                    return

    async def _claim_round(self, steps: anyio.abc.TaskGroup, concurrency: int) -> bool:
        """Claim for the free slots once and start what comes; False when the runner must
        stop (`supervisor_url` is not a supervisor's)."""
        # After the slot: the step that freed it may just have paused claiming.
        await self._wait_unpaused()
        if self._state.token_stale:
            await self._reload_token()
        if self._state.pool is None:
            try:
                await self._introduce()
            except NotASupervisor as exc:
                log.error(f"cannot start: {exc.detail}")  # noqa: TRY400 (no traceback)
                self._state = self._state.cannot_start(NOT_A_SUPERVISOR_EXIT)
                return False
            except TokenRejected as exc:
                self._answered_once()
                self.token_rejected(exc.detail)
                return True
            except Exception:  # a bug here must pause claiming, not end the steps in flight
                log.exception("asking the supervisor failed unexpectedly; again after a pause")
                await self._clock.sleep(self._backoff_max_s)
                return True
        # Quick replies at start and after a pause: READY=1, and `claiming resumed`.
        wait_s = 0.0 if self._state.resuming else self._settings.claim_wait_s
        free = concurrency - len(self._in_flight)
        try:
            self._state = self._state.claiming(free)
            leases = await self._claim(free, wait_s)
        except TokenRejected as exc:
            self.token_rejected(exc.detail)
            return True
        except SupervisorRefused as exc:
            log.error("claim refused by the supervisor", error=exc.detail)  # noqa: TRY400
            await self._clock.sleep(self._backoff_max_s)
            return True
        except Exception:  # a bug here must pause claiming, not end the steps in flight
            log.exception("claim failed unexpectedly; claiming again after a pause")
            await self._clock.sleep(self._backoff_max_s)
            return True
        finally:
            self._state = self._state.claiming(0)
        if self._state.resuming:
            self._state = self._state.claim_answered()
            log.info("claiming resumed", after=self._state.pause.why, pool=self._state.pool)
        for lease in leases:
            self._start(steps, lease)
        return True

    def _retrying(self) -> AsyncRetrying:
        """Retries of a call to the supervisor while it cannot be reached, with backoff.

        One line when the link goes down and one when it comes back, none per retry.
        """
        return AsyncRetrying(
            retry=retry_if_exception_type(SupervisorUnreachable),
            wait=wait_random_exponential(multiplier=0.5, max=self._backoff_max_s),
            stop=stop_never,
            sleep=self._clock.sleep,
            before_sleep=self._link_down,
            reraise=True,
        )

    async def _introduce(self) -> None:
        """Ask the supervisor whose token this is (`GET /v1/runner`); once it replies, the
        runner is ready (`READY=1`) and its pool known.

        Raises `NotASupervisor` and `TokenRejected` as `whoami` does. Readiness means a
        supervisor: a refusal of the token in the contract's error shape is one too, reported
        on STATUS and paused as later rather than by a start-up failure loop; any other reply
        (an HTML page, the model server, a URL ending in /v1) is one error line naming the URL,
        exit 2 and no `READY=1`. With several supervisor URLs, one that answers is enough;
        every one that replies is checked (`SupervisorClient.whoami`).
        """
        async for attempt in self._retrying():
            with attempt:
                identity = await self._supervisor.whoami()
        self._link_up()
        self._state = self._state.introduced(identity.pool)
        log.info(
            "supervisor answered; claiming",
            pool=identity.pool,
            kinds=self._kinds.names(),
            runner_id=self._settings.runner_id,
            token_id=identity.token_id,
        )

    async def _claim(self, capacity: int, wait_s: float) -> list[Lease]:
        async for attempt in self._retrying():
            with attempt:
                leases = await self._supervisor.claim(
                    self._settings.runner_id, capacity, wait_s, self._kinds.names()
                )
        self._link_up()
        return leases

    def _eager_want(self, results: int) -> WantLeases | None:
        """What a request carrying `results` results asks for beside them: the slots they free
        and the free slots no claim is asking for; None while the runner claims nothing
        (stopping, paused, its token or pool not yet known)."""
        if not self._state.takes_leases(self._clock.now()):
            return None
        free = self._settings.concurrency - len(self._in_flight) - self._state.claim_asks + results
        if free < 1:
            return None
        return WantLeases(
            runner_id=self._settings.runner_id,
            leases=min(free, MAX_CAPACITY),
            kinds=tuple(self._kinds.names()),
        )

    def _start_eager(self, leases: list[Lease]) -> None:
        """Start the leases a result's answer carried, exactly as a claim's."""
        if self._steps is None:  # not running: the leases lapse through the accept window
            return
        self.eager_leases += len(leases)
        for lease in leases:
            self._start(self._steps, lease)

    def _answered_once(self) -> None:
        if not self._state.answered:
            self._state = self._state.supervisor_answered()
            self._notifier.ready()

    def _link_down(self, retry_state: RetryCallState) -> None:
        if self._state.down_since is not None:
            return
        outcome = retry_state.outcome
        error = str(outcome.exception()) if outcome is not None else ""
        log.warning("supervisor unreachable; retrying with backoff", error=error)
        self._state = self._state.link_down(self._clock.now())
        self._update_status()

    def _link_up(self) -> None:
        self._answered_once()
        down_since = self._state.down_since
        if down_since is not None:
            log.info("supervisor reachable again", down_s=round(self._clock.now() - down_since, 3))
        self._state = self._state.link_up()
        self._update_status()

    def _start(self, steps: anyio.abc.TaskGroup, lease: Lease) -> None:
        step = StepRun(
            lease=lease,
            supervisor=self._supervisor,
            model=self._model,
            model_key=self._model_key,
            kinds=self._kinds,
            clock=self._clock,
            host=self,
            default_model=self._settings.model,
            model_timeout_s=self._settings.model_timeout_s,
            results=self._results,
            renewals=self._renewals,
        )
        preemption = self._state.preemption
        if preemption is not None:  # it came after the notice: released without work
            step.preempt(preemption.cancel_at, "the server is being reclaimed")
        key = (lease.step_id, lease.fence)
        self._in_flight[key] = step
        self.recent_steps.append(step)
        self._update_status()
        self._notify_changed()
        steps.start_soon(self._run_step, key, step)

    async def _run_step(self, key: tuple[str, int], step: StepRun) -> None:
        try:
            await step.run()
        except Exception:  # a bug must cost one step (its lease expires), not the daemon
            step.log.exception("step crashed; its lease will expire")
        finally:
            self._in_flight.pop(key, None)
            self._notify_changed()
            self._update_status()

    # ---- pauses: what the steps tell the runner ----------------------------------------------

    @property
    def paused(self) -> bool:
        return self._state.paused(self._clock.now())

    async def _wait_unpaused(self) -> None:
        if not self.paused:
            return
        while (left := self._state.pause.until - self._clock.now()) > 0:
            await self._clock.sleep(left)
        # The first claim after a pause does not wait; `claiming resumed` is logged once the
        # supervisor accepts it, not when a token it still refuses is about to pause again.
        self._state = self._state.pause_waited_out()
        self._update_status()

    def _pause(self, seconds: float, why: str, action: str | None) -> bool:
        """Pause claiming; False (and silence) when already paused.

        An operator problem or a rejected runner token doubles the pause from
        `pause_initial_s` up to `pause_max_s`, and a reported step resets it; a provider's
        `Retry-After` pauses for that long, without growing. A rejected token is read again
        from its file when the pause ends.
        """
        if self.paused:
            return False
        self._state = self._state.paused_until(self._clock.now() + seconds, why)
        message = f"claiming paused for {seconds:g}s: {why}"
        if action:
            message += f". Operator action: {action}"
        log.warning(message, pause_s=seconds, operator_action=action)
        self._update_status()
        return True

    def operator_problem(self, problem: OperatorProblem) -> None:
        if self._pause(self._state.next_pause_s, problem.detail, problem.action):
            self._state = self._state.pause_grown(self._settings.pause_max_s)

    def token_rejected(self, detail: str) -> None:
        where = self._token.describe() if self._token is not None else "the runner's token file"
        self._state = self._state.token_refused()
        if self._token is not None:
            self._token.invalidate()
        action = (
            "create a runner token (tether-supervisor token create --role runner ...) and"
            f" write it to {where}; the runner re-reads it"
        )
        why = f"supervisor rejected the runner token ({detail})"
        if self._pause(self._state.next_pause_s, why, action):
            self._state = self._state.pause_grown(self._settings.pause_max_s)

    def rate_limited(self, seconds: float) -> None:
        self._pause(seconds, "the model provider asked to wait (Retry-After)", None)

    def step_succeeded(self) -> None:
        self._state = self._state.pause_reset(self._settings.pause_initial_s)

    async def _reload_token(self) -> None:
        if self._token is None:
            return
        try:
            token = await self._token.get()
        except SecretMissing as exc:
            log.warning("runner token could not be read again; keeping the old one", error=str(exc))
            return
        if token:
            self._supervisor.set_token(token)
        self._state = self._state.token_read_again(replaced=bool(token))

    def _update_status(self) -> None:
        state = self._state.describe(self._clock.now())
        self._notifier.status(f"{len(self._in_flight)} steps in flight; {state}")
