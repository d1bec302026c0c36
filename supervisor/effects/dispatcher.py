"""The dispatcher: the supervisor's one task that delivers effect steps from the outbox
(docs/design.md, Effects). `running_ledger` starts it beside the reaper.

It takes effects (`take_effects`), and for each, in its own task, repeats an attempt until an
answer ends it: `begin_attempt` (the durable "about to send") -> the kind's deliverer ->
`record_attempt`. `Delivered` and `Undeliverable` end the effect, and so does an unkeyed
attempt that may have sent (the ledger makes it `uncertain`). Any other `Unanswered` is tried
again after an exponential backoff with full jitter, at least as long as the receiver's
`Retry-After`, until the next attempt would start after the effect's delivery deadline: then
`give_up`. At shutdown an effect in hand is handed back (`release_effect`). A refusal by the
ledger (`EffectNotHeld`: the task was cancelled, or another dispatcher took the effect over)
ends that effect quietly with one log line. Log lines name the effect id, kind, attempt and
status, never a credential, a header value, a request or a receiver's body.

The numbers, and why (the hold, `effect_hold_s`, is 60 s by default; only `begin_attempt`
refreshes it, so an attempt plus the wait before the next must stay well inside it, or
`take_effects` would count the effect as abandoned):

    CONCURRENCY = 8          effects in delivery at once; each is mostly waiting on a receiver
    RETRY_BASE_S = 0.5       first backoff bound; doubles per attempt (0.5, 1, 2, 4, ... s)
    RETRY_CAP_S = 30.0       largest backoff, and largest Retry-After honoured; also at most a
                             quarter of the hold (15 s at the default hold). A Retry-After
                             beyond that is honoured only up to it: one extra request, instead
                             of a hold that lapses in the middle of the wait
    an attempt's bound       half the hold (30 s at the default), after which it counts as
                             Unanswered(sent=True); http's own timeouts (10 s connect, 20 s
                             read) classify a slow receiver first
    POLL_S = 1.0             the longest sleep between looks at the outbox when nothing woke
                             it: a hold that lapsed (a dispatcher that died) is noticed within
                             the hold plus a second
    RELEASE_BOUND_S = 5.0    how long shutdown waits to hand back each effect in hand
    RECORD_TRIES = 5         writes of one answer when the ledger fails to take it (locked or
    RECORD_BACKOFF_S = 0.25  busy file), 0.25 s doubling between them: 3.75 s in all, well
                             inside the hold. The answer is kept meanwhile and nothing is sent
                             again; after the last the hold lapses and the ledger's rules
                             decide (a keyed effect is sent again under its key, an unkeyed
                             one becomes uncertain -- and the late answer still settles it)

Measured (30 keyed effects one after another, synchronous=FULL, the local receiver in process,
a 2-core machine): from the report that makes the effect due to its task SUCCEEDED -- take,
begin, send, record: three durable writes -- median 46 ms, p90 75 ms.
"""

from __future__ import annotations

import secrets as random_ids
import time
from typing import Final, Protocol

import anyio
import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_result, wait_random_exponential

from tether.clocks import WallClock
from tether.supervisor import tracing
from tether.supervisor.effects.credentials import Credentials
from tether.supervisor.effects.registry import Deliverer, EffectKinds, RetryLater
from tether.supervisor.ledger.errors import EffectNotHeld, LedgerError, StorageError
from tether.supervisor.ledger.errors import Refused as LedgerRefusal
from tether.supervisor.ledger.outbox import (
    Answer,
    Delivered,
    Outgoing,
    Unanswered,
    Undeliverable,
)

log = structlog.get_logger("tether.effects")

CONCURRENCY: Final = 8
RETRY_BASE_S: Final = 0.5
RETRY_CAP_S: Final = 30.0
POLL_S: Final = 1.0
RELEASE_BOUND_S: Final = 5.0
RECORD_TRIES: Final = 5
RECORD_BACKOFF_S: Final = 0.25


class EffectsPort(Protocol):
    """The ledger methods the dispatcher calls (`LedgerStore` has them; the effects tests'
    `FakeOutbox` keeps them in memory)."""

    async def take_effects(self, holder: str, limit: int) -> list[Outgoing]: ...
    async def begin_attempt(self, effect_id: str, holder: str, digest: str) -> int: ...
    async def record_attempt(
        self, effect_id: str, attempt: int, holder: str, answer: Answer
    ) -> None: ...
    async def give_up(self, effect_id: str, holder: str, reason: str) -> None: ...
    async def release_effect(self, effect_id: str, holder: str) -> None: ...
    async def wait_for_effects(self, timeout_s: float) -> None: ...


class Dispatcher:
    """Delivers effects for one holder id (random per process unless given)."""

    def __init__(
        self,
        ledger: EffectsPort,
        kinds: EffectKinds,
        secrets: Credentials,
        *,
        hold_s: float,
        clock: WallClock = time.time,
        holder: str | None = None,
        concurrency: int = CONCURRENCY,
        retry_base_s: float = RETRY_BASE_S,
        retry_cap_s: float = RETRY_CAP_S,
        poll_s: float = POLL_S,
        record_backoff_s: float = RECORD_BACKOFF_S,
    ) -> None:
        self.ledger = ledger
        self.kinds = kinds
        self.secrets = secrets
        self.clock = clock
        self.holder = holder or f"dispatcher-{random_ids.token_hex(8)}"
        self.concurrency = concurrency
        self.retry_base_s = retry_base_s
        self.retry_cap_s = min(retry_cap_s, hold_s / 4)
        self.attempt_bound_s = hold_s / 2
        self.poll_s = poll_s
        self.record_backoff_s = record_backoff_s
        self.in_flight: set[str] = set()
        self._freed = anyio.Event()

    async def run(self) -> None:
        """Deliver effects until cancelled. A storage error is logged and retried at the next
        turn (as the reaper does); any other error ends the dispatcher, and with it the
        supervisor."""
        failing = False
        async with anyio.create_task_group() as tg:
            while True:
                free = self.concurrency - len(self.in_flight)
                if free <= 0:
                    await self._freed.wait()
                    self._freed = anyio.Event()
                    continue
                try:
                    taken = await self.ledger.take_effects(self.holder, free)
                except StorageError as exc:
                    if not failing:
                        log.error(  # noqa: TRY400 - the detail says it all
                            "the dispatcher cannot write to the ledger; trying again",
                            error=exc.detail,
                        )
                    failing = True
                    await anyio.sleep(self.poll_s)
                    continue
                if failing:
                    log.info("the dispatcher writes to the ledger again")
                    failing = False
                for out in taken:
                    if out.effect_id not in self.in_flight:  # else: our own, its hold renewed
                        self.in_flight.add(out.effect_id)
                        tg.start_soon(self._run_one, out)
                if len(taken) < free:
                    await self.ledger.wait_for_effects(self.poll_s)

    async def _run_one(self, out: Outgoing) -> None:
        settled = False
        try:
            await self._deliver(out)
            settled = True
        except EffectNotHeld as exc:
            settled = True
            log.info(
                "effect no longer held; left to the ledger",
                effect_id=out.effect_id,
                kind=out.kind,
                error=exc.code,
            )
        except LedgerError as exc:  # a storage error too: the hold lapses, the rules decide
            settled = True
            log.error(  # noqa: TRY400 - the code says it all
                "the ledger refused an effect's record",
                effect_id=out.effect_id,
                kind=out.kind,
                error=exc.code,
            )
        finally:
            if not settled:  # cancelled (shutdown) with the effect in hand: hand it back
                with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_BOUND_S):
                    try:
                        await self.ledger.release_effect(out.effect_id, self.holder)
                        log.info("effect released", effect_id=out.effect_id, kind=out.kind)
                    except LedgerError:
                        pass  # not ours any more, or the file is failing: the hold lapses
            self.in_flight.discard(out.effect_id)
            self._freed.set()

    async def _deliver(self, out: Outgoing) -> None:
        deliverer = self.kinds.get(out.kind)
        if deliverer is None:  # its plugin was uninstalled since the step became due
            why = f"no deliverer for effect kind {out.kind!r} in this supervisor"
            await self.ledger.give_up(out.effect_id, self.holder, why)
            log.error("no deliverer for this effect kind", effect_id=out.effect_id, kind=out.kind)
            return
        if self.clock() >= out.deadline_at:
            await self._give_up(out, "no attempt before the deadline")
            return
        backoff = wait_random_exponential(multiplier=self.retry_base_s, max=self.retry_cap_s)

        def wait(state: RetryCallState) -> float:
            answer = state.outcome.result() if state.outcome is not None else None
            pause = backoff(state)
            if isinstance(answer, RetryLater):
                pause = max(pause, min(answer.retry_after_s, self.retry_cap_s))
            return pause

        def again(answer: Answer) -> bool:
            return isinstance(answer, Unanswered) and (out.keyed or not answer.sent)

        def past_deadline(state: RetryCallState) -> bool:
            return self.clock() + state.upcoming_sleep >= out.deadline_at

        retrying = AsyncRetrying(
            retry=retry_if_result(again),
            wait=wait,
            stop=past_deadline,
            sleep=anyio.sleep,
            retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
        )
        last: Answer | None = await retrying(self._attempt, out, deliverer)
        if isinstance(last, Unanswered) and again(last):
            await self._give_up(out, f"still unanswered; last: {last.detail}")

    async def _attempt(self, out: Outgoing, deliverer: Deliverer) -> Answer:
        with tracing.effect_attempt(out) as span:
            attempt = await self.ledger.begin_attempt(out.effect_id, self.holder, out.digest)
            answer: Answer = Unanswered(
                detail=f"no answer within {self.attempt_bound_s:g} s", sent=True
            )
            with anyio.move_on_after(self.attempt_bound_s):
                try:
                    answer = await deliverer.deliver(out, self.secrets)
                except Exception as exc:  # a deliverer's bug: nobody can say whether it sent
                    detail = f"the deliverer failed: {type(exc).__name__}"
                    answer = Unanswered(detail=detail, sent=True)
            await self._record(out, attempt, _plain(answer))
            tracing.effect_answered(span, attempt, answer)
        log.info(
            "effect attempt",
            effect_id=out.effect_id,
            kind=out.kind,
            attempt=attempt,
            outcome=type(answer).__name__.lower(),
            status=answer.status,
            **_facts(answer),
        )
        return answer

    async def _record(self, out: Outgoing, attempt: int, answer: Answer) -> None:
        """Record the answer, writing it again (`RECORD_TRIES`, backing off) while the ledger
        fails to take it; a refusal by the ledger's rules is final at once."""
        for tried in range(1, RECORD_TRIES + 1):
            try:
                await self.ledger.record_attempt(out.effect_id, attempt, self.holder, answer)
            except LedgerRefusal:
                raise
            except LedgerError as exc:
                if tried == RECORD_TRIES:
                    raise
                log.warning(
                    "the ledger did not take an effect's answer; writing it again",
                    effect_id=out.effect_id,
                    kind=out.kind,
                    attempt=attempt,
                    error=exc.code,
                )
                await anyio.sleep(self.record_backoff_s * 2 ** (tried - 1))
            else:
                return

    async def _give_up(self, out: Outgoing, why: str) -> None:
        """The ledger names the failure `delivery_deadline`; `why` is its detail."""
        await self.ledger.give_up(out.effect_id, self.holder, why)
        log.warning("effect delivery deadline passed", effect_id=out.effect_id, kind=out.kind)


def _plain(answer: Answer) -> Answer:
    """The answer as the ledger records it: a `RetryLater` is an `Unanswered`."""
    if isinstance(answer, RetryLater):
        return Unanswered(detail=answer.detail, sent=answer.sent, status=answer.status)
    return answer


def _facts(answer: Answer) -> dict[str, object]:
    if isinstance(answer, Delivered):
        return {"replayed": answer.replayed}
    if isinstance(answer, Undeliverable):
        return {"code": answer.code}
    return {"sent": answer.sent}
