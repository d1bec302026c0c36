"""The supervisor's dispatcher as the explorer plays it: what supervisor/effects/dispatcher.py
does, one step per schedule event, through the ledger's own outbox rules.

A dispatcher takes effects (`outbox_delivery.take`); for each it holds, its next step is one of:
`begin_attempt` (the durable "about to send"), the send to the effect's receiver, or
`record_attempt` with the answer. An answer that ends the effect (delivered, refused, or an
unkeyed one that may have sent) drops it from the dispatcher's hand; any other is tried again
by a later step, or given up (`give_up`) once the delivery deadline has passed. A refusal by
the ledger drops the effect quietly, as the real dispatcher does. The supervisor may die
between any two steps (`World.restart` forgets every dispatcher's hand); a graceful shutdown
hands each held effect back (`outbox_delivery.release`) first.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

from tether.sim.receivers import describe_answer
from tether.supervisor.ledger import outbox_delivery
from tether.supervisor.ledger.outbox import Answer, Delivered, Outgoing, Unanswered, Undeliverable

if TYPE_CHECKING:
    from tether.sim.world import World

CAPACITY = 3  # effects one dispatcher holds at once (the real one: 8)
DRAIN_MOVES = 60  # a bound on one quiescent drain's steps


@dataclasses.dataclass
class InHand:
    """One effect a dispatcher holds: the attempt it began (None: none in flight) and the
    receiver's answer to it, once sent and not yet recorded."""

    out: Outgoing
    attempt: int | None = None
    answer: Answer | None = None


@dataclasses.dataclass
class DispatcherActor:
    name: str
    incarnation: int = 0
    hand: dict[str, InHand] = dataclasses.field(default_factory=dict)

    @property
    def holder(self) -> str:
        """The holder id: a new one for each process (the real one draws it at random)."""
        return f"{self.name}.{self.incarnation}"

    def crash(self) -> None:
        self.incarnation += 1
        self.hand.clear()


def outgoing(taken: list[Outgoing]) -> str:
    return ", ".join(f"{o.effect_id} {o.kind}{'' if o.keyed else ' unkeyed'}" for o in taken)


def take(world: World, d: DispatcherActor, limit: int) -> None:
    value, _ = world.call(
        f"{d.holder} take x{limit}",
        lambda tx: outbox_delivery.take(tx, d.holder, limit),
        describe=lambda v: outgoing(v) or "nothing",
    )
    for out in value or ():
        d.hand.setdefault(out.effect_id, InHand(out))  # one of its own: its hold renewed


def step(world: World, d: DispatcherActor, hand: InHand) -> None:
    """The next step of one held effect: begin, send or record."""
    if hand.answer is not None:
        record(world, d, hand)
    elif hand.attempt is not None:
        send(world, d, hand)
    else:
        begin(world, d, hand)


def begin(world: World, d: DispatcherActor, hand: InHand) -> None:
    out = hand.out
    if world.h.now >= out.deadline_at:
        give_up(world, d, hand, "no attempt before the deadline")
        return
    value, error = world.call(
        f"{d.holder} begin {out.effect_id} digest {out.digest[:8]}",
        lambda tx: outbox_delivery.begin_attempt(tx, out.effect_id, d.holder, out.digest),
        describe=lambda v: f"attempt {v}",
    )
    if error is not None:
        del d.hand[out.effect_id]
        return
    hand.attempt = value
    if out.kind == "git.push":
        world.observer.push_begun(out)


def send(world: World, d: DispatcherActor, hand: InHand) -> None:
    out = hand.out
    fault = world.delivery_fault(out)
    answer = world.receivers.receive(out, fault)
    hand.answer = answer
    world.sent(f"{d.holder} sends {out.effect_id} attempt {hand.attempt}", out, fault, answer)


def record(world: World, d: DispatcherActor, hand: InHand) -> None:
    out, answer, attempt = hand.out, hand.answer, hand.attempt
    assert answer is not None
    assert attempt is not None

    def seen(_: object) -> None:
        if isinstance(answer, Delivered):
            world.observer.effect_delivered(out.effect_id)

    label = f"{d.holder} record {out.effect_id} attempt {attempt} {describe_answer(answer)}"
    _, error = world.call(
        label,
        lambda tx: outbox_delivery.record_attempt(tx, out.effect_id, attempt, d.holder, answer),
        seen=seen,
    )
    ends = isinstance(answer, Delivered | Undeliverable) or (
        isinstance(answer, Unanswered) and not out.keyed and answer.sent
    )
    if error is not None or ends:
        del d.hand[out.effect_id]
        if error is None and world.duplicate_answer():
            # The same answer reaches the dispatcher twice: the second record is refused.
            _, again = world.call(
                f"{label} (duplicate answer)",
                lambda tx: outbox_delivery.record_attempt(
                    tx, out.effect_id, attempt, d.holder, answer
                ),
            )
            if again is None:
                world.flag(f"duplicate-answer: {out.effect_id} attempt {attempt} recorded twice")
        return
    hand.attempt = hand.answer = None  # unanswered: tried again by a later step


def give_up(world: World, d: DispatcherActor, hand: InHand, why: str) -> None:
    out = hand.out
    world.call(
        f"{d.holder} give up {out.effect_id}: {why}",
        lambda tx: outbox_delivery.give_up(tx, out.effect_id, d.holder, why),
    )
    del d.hand[out.effect_id]


def next_move(world: World, d: DispatcherActor) -> None:
    """The dispatcher's next step: on an effect it holds, or a take for more."""
    rng = world.rng
    held = sorted(d.hand)
    if held and (len(held) >= CAPACITY or rng.random() < 0.75):
        step(world, d, d.hand[rng.choice(held)])
    elif world.outbox_ready():  # (the real one waits for a wake-up, or polls)
        take(world, d, rng.randint(1, CAPACITY - len(held)))


def shutdown(world: World) -> None:
    """A graceful restart: each dispatcher hands back what it holds, then the supervisor
    restarts."""
    for d in world.dispatchers:
        for effect_id in sorted(d.hand):
            world.call(
                f"{d.holder} release {effect_id} (shutdown)",
                functools.partial(outbox_delivery.release, effect_id=effect_id, holder=d.holder),
            )
        d.hand.clear()
    world.restart()


def drain(world: World) -> None:
    """Quiescence: each dispatcher takes what is ready and steps every held effect until
    nothing is left to take (within a bound of steps)."""
    for d in world.dispatchers:
        for _ in range(DRAIN_MOVES):
            if world.violations:
                return
            if not d.hand:
                if not world.outbox_ready():
                    break
                take(world, d, CAPACITY)
                if not d.hand:
                    break
                continue
            step(world, d, d.hand[sorted(d.hand)[0]])
