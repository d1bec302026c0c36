"""Stand-ins for the effects tests: an `Outgoing` builder, a scripted deliverer and an in-memory
`EffectsPort` that keeps the dispatcher's side of the outbox rules (docs/design.md, Effects)."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable
from typing import Any, Final

import anyio
import httpx

from tether.supervisor.effects.credentials import Credentials
from tether.supervisor.effects.http import HttpDeliverer
from tether.supervisor.ledger.destinations import Address, Destinations
from tether.supervisor.ledger.errors import EffectNotHeld, GateMismatch
from tether.supervisor.ledger.outbox import Answer, Delivered, Outgoing, Unanswered, Undeliverable
from tether.wire import content_hash

# Every name answers 127.0.0.1, which these tests' deliverers may reach: a request an
# in-process transport fails to intercept could reach nothing but this machine.
LOOPBACK: Final = ipaddress.IPv4Address("127.0.0.1")
LOOPBACK_ALLOWED: Final = Destinations.from_settings("*, 127.0.0.1", {})


async def loopback_resolver(name: str, port: int) -> list[Address]:
    return [LOOPBACK]


def http_deliverer(client: httpx.AsyncClient, **extra: Any) -> HttpDeliverer:
    """An `http` deliverer through `client` (an in-process transport), every name resolved
    to 127.0.0.1 and that address allowed."""
    return HttpDeliverer(client, destinations=LOOPBACK_ALLOWED, resolver=loopback_resolver, **extra)


def outgoing(
    request: dict[str, Any] | None = None,
    *,
    kind: str = "http",
    effect_id: str = "e1",
    keyed: bool = True,
    deadline_at: float = 2_000_000_000.0,
) -> Outgoing:
    request = request if request is not None else {"method": "POST", "url": "http://r/x"}
    return Outgoing(
        effect_id=effect_id,
        task_id="t1",
        tenant="acme",
        kind=kind,
        effect_key=f"key-{effect_id}",
        keyed=keyed,
        request=request,
        digest=content_hash(request),
        deadline_at=deadline_at,
    )


@dataclasses.dataclass
class Scripted:
    """A deliverer answering from a script (the last answer repeats); it records each call."""

    answers: list[Answer | Exception]
    kind: str = "http"
    calls: list[str] = dataclasses.field(default_factory=list)
    hang: anyio.Event | None = None  # when set: every call waits on it (a send in flight)

    async def deliver(self, out: Outgoing, secrets: Credentials) -> Answer:
        self.calls.append(out.effect_id)
        if self.hang is not None:
            await self.hang.wait()
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


@dataclasses.dataclass
class Row:
    out: Outgoing
    state: str = "due"  # due | sending | delivered | failed | uncertain
    holder: str | None = None
    held_until: float = 0.0
    attempts: list[Answer | None] = dataclasses.field(default_factory=list)
    reason: str | None = None
    ended: bool = False  # the task was cancelled


@dataclasses.dataclass
class FakeOutbox:
    """The dispatcher's ledger methods over rows in memory (only keyed effects' rules)."""

    clock: Callable[[], float]
    hold_s: float = 60.0
    rows: dict[str, Row] = dataclasses.field(default_factory=dict)
    log: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    woken: anyio.Event = dataclasses.field(default_factory=anyio.Event)

    def add(self, out: Outgoing) -> None:
        self.rows[out.effect_id] = Row(out=out)
        self.woken.set()

    def _held(self, effect_id: str, holder: str) -> Row:
        row = self.rows[effect_id]
        if row.state != "sending" or row.holder != holder or row.ended:
            raise EffectNotHeld(f"{holder} does not hold {effect_id}")
        return row

    async def take_effects(self, holder: str, limit: int) -> list[Outgoing]:
        now = self.clock()
        taken: list[Outgoing] = []
        for row in self.rows.values():
            if len(taken) >= limit or row.ended:
                continue
            lapsed = row.state == "sending" and row.held_until < now
            if row.state == "due" or lapsed:
                row.state, row.holder, row.held_until = "sending", holder, now + self.hold_s
                taken.append(row.out)
                self.log.append(("take", row.out.effect_id))
        return taken

    async def begin_attempt(self, effect_id: str, holder: str, digest: str) -> int:
        row = self._held(effect_id, holder)
        if digest != row.out.digest:
            raise GateMismatch("digest differs")
        row.attempts.append(None)
        row.held_until = self.clock() + self.hold_s
        self.log.append(("begin", effect_id))
        return len(row.attempts)

    async def record_attempt(
        self, effect_id: str, attempt: int, holder: str, answer: Answer
    ) -> None:
        row = self._held(effect_id, holder)
        assert type(answer) in (Delivered, Undeliverable, Unanswered), answer
        row.attempts[attempt - 1] = answer
        if isinstance(answer, Delivered):
            row.state = "delivered"
        elif isinstance(answer, Undeliverable):
            row.state, row.reason = "failed", answer.code
        self.log.append(("record", effect_id))

    async def give_up(self, effect_id: str, holder: str, reason: str) -> None:
        row = self._held(effect_id, holder)
        row.state, row.reason = "failed", reason
        self.log.append(("give_up", effect_id))

    async def release_effect(self, effect_id: str, holder: str) -> None:
        row = self._held(effect_id, holder)
        row.state, row.holder = "due", None
        self.log.append(("release", effect_id))

    async def wait_for_effects(self, timeout_s: float) -> None:
        with anyio.move_on_after(timeout_s):
            await self.woken.wait()
        self.woken = anyio.Event()


class SlackDeliverer:
    """A plugin's deliverer, as an entry point names it (`slack = tests.effects_fakes:...`)."""

    kind = "slack"

    async def deliver(self, out: Outgoing, secrets: Credentials) -> Answer:
        return Delivered(status=200, detail="posted")


class ClashingDeliverer(SlackDeliverer):
    kind = "http"
