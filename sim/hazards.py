"""The adversarial histories of the second seed article, as moves a schedule can make.

Each hazard looks for the situation it needs in the current world and, when it finds it, plays
the history there and returns True; otherwise it changes nothing and returns False. Random
schedules pick them from their fault plan; `scenarios` sets each one up on purpose.
"""

from __future__ import annotations

from collections.abc import Callable

from tether.sim import dispatch
from tether.sim.actors import (
    INTRUDER,
    OPERATOR,
    RUNNER_TOKENS,
    TURN_TOKENS,
    HeldPhase,
    Kind,
    Message,
    RunnerActor,
)
from tether.sim.dispatch import DispatcherActor, InHand
from tether.sim.observer import TERMINAL_NAMES
from tether.sim.world import World
from tether.supervisor.ledger.errors import NotFound
from tether.supervisor.ledger.identity import step_id_for
from tether.wire.records import Checkpoint, Lease, Report


def completes_task(world: World, step_id: str) -> bool:
    """Would committing `step_id` commit the last uncommitted step of a live task?"""
    obs = world.observer
    task_id, position = step_id.rsplit(".", 1)
    spec = obs.specs.get(task_id)
    if spec is None or obs.states.get(task_id) in TERMINAL_NAMES or step_id in obs.applied:
        return False
    others = (step_id_for(task_id, i) for i in range(len(spec.steps)) if i != int(position))
    return all(obs.done(other) for other in others)


def completing_reports(world: World) -> list[Message]:
    """Reports that would complete a task: queued ones, else one a working runner sends now."""
    queued = [
        m
        for m in world.queue
        if m.kind is Kind.REPORT
        and m.report is not None
        and completes_task(world, m.report.step_id)
    ]
    if queued:
        return queued
    working = [
        (runner, step_id)
        for runner in world.runners
        for step_id, held in sorted(runner.held.items())
        if held.phase is not HeldPhase.NEW and completes_task(world, step_id)
    ]
    if not working:
        return []
    runner, step_id = world.rng.choice(working)
    return [world.act(runner, step_id, finish=True)]


def cancel_between_verification_and_commit(world: World, *, variant: str | None = None) -> bool:
    """The report that completes a task and a cancel of it reach the supervisor in one batch.

    In either order, or the supervisor dies before that batch commits. Verification and commit
    are one transaction in this ledger, so the batch is the narrowest gap there is; exactly one
    terminal decision must come out of it, and the loser is a rejected attempt. `variant`:
    "cancel-first", "report-first" or "crash"; chosen at random when None.
    """
    reports = completing_reports(world)
    if not reports:
        return False
    report = world.rng.choice(reports)
    assert report.report is not None
    task_id = report.report.step_id.rsplit(".", 1)[0]
    tenant = world.observer.specs[task_id].tenant
    cancel = world.send(OPERATOR, 0, Kind.CANCEL, tenant=tenant, task_id=task_id)
    variant = variant or world.rng.choice(("cancel-first", "report-first", "crash"))
    world.log(f"hazard: cancel {task_id} between verification and commit ({variant})")
    if variant == "crash":
        world.crash_during([report, cancel])
        # Both clients retry after the restart; the race is run again, in the batch's order.
        report = world.send(report.sender, report.incarnation, Kind.REPORT, report=report.report)
        cancel = world.send(OPERATOR, 0, Kind.CANCEL, tenant=tenant, task_id=task_id)
        variant = "report-first"
    batch = [cancel, report] if variant == "cancel-first" else [report, cancel]
    world.deliver(batch)
    return True


def renew_after_fenced_out(world: World, *, sleeper: RunnerActor | None = None) -> bool:
    """A runner pauses past its TTL, is fenced out and its step claimed by another; it wakes
    and reports, renews and checkpoints with its old fence: all refused, none a state."""
    holders = [r for r in world.runners if r.held]
    if sleeper is None:
        if not holders:
            return False
        sleeper = world.rng.choice(holders)
    if not sleeper.held:
        return False
    step_id = world.rng.choice(sorted(sleeper.held))
    old = sleeper.held[step_id].lease
    world.log(f"hazard: {sleeper.id} pauses holding {step_id} fence {old.fence}")
    pause(world, sleeper, world.h.config.lease_ttl_s + 1 + world.rng.randrange(10))
    others = [r for r in world.runners if r is not sleeper]
    if others:
        world.deliver([world.claim(world.rng.choice(others), 2)])
    if step_id in sleeper.held and sleeper.held[step_id].phase is not HeldPhase.NEW:
        world.deliver([world.act(sleeper, step_id, finish=True)])  # its work finished meanwhile
    renew = world.send(
        sleeper.id, sleeper.incarnation, Kind.RENEW, step_id=step_id, fence=old.fence
    )
    world.deliver([renew])
    # and checkpoints the turn it completed while paused
    cp = late_checkpoint(old, 1)
    world.deliver([world.send_checkpoint(sleeper.id, sleeper.incarnation, step_id, cp)])
    return True


def pause(world: World, sleeper: RunnerActor, seconds: float) -> None:
    """`sleeper` stops (a GC pause, SIGSTOP) for `seconds` while every other runner keeps
    renewing, all its leases in one request (their renewals fall due on the same tick); the
    supervisor's reaper runs on its own clock meanwhile."""
    world.log(f"runner {sleeper.id} pauses for {seconds:g}s")
    half = seconds / 2
    for _ in range(2):
        world.advance(half)
        renews = [renew_all(world, r) for r in world.runners if r is not sleeper and r.held]
        if renews:
            world.deliver(renews)
    world.reap()


def renew_all(world: World, runner: RunnerActor) -> Message:
    """One request renewing every lease `runner` holds: a single renew for one lease."""
    leases = tuple((s, h.lease.fence) for s, h in sorted(runner.held.items()))
    if len(leases) == 1:
        [(step_id, fence)] = leases
        return world.send(runner.id, runner.incarnation, Kind.RENEW, step_id=step_id, fence=fence)
    return world.send(runner.id, runner.incarnation, Kind.RENEWALS, leases=leases)


def consumer_replay_after_success(world: World, *, task_id: str | None = None) -> bool:
    """A status consumer that saw a task end gets its older events again, shuffled and
    duplicated; its view must not move."""
    states = world.observer.states
    if task_id is None:
        ended = sorted(t for t, s in states.items() if s == "SUCCEEDED") or sorted(
            t for t, s in states.items() if s in TERMINAL_NAMES
        )
        if not ended:
            return False
        task_id = world.rng.choice(ended)
    world.log(f"hazard: consumer of {task_id} gets old events after {states.get(task_id)}")
    world.poll(task_id)
    world.replay_old(task_id, after=0)
    return True


def crash_around_key_insert(
    world: World, *, index: int | None = None, when: str | None = None
) -> bool:
    """The supervisor dies just before a create's commit (the insert is rolled back) or just
    after it (the reply is lost); the client retries, and there is still one task for the key.

    `when`: "before" or "after" the commit that inserts the key; random when None.
    """
    orders = world.operator.orders
    if index is None:
        fresh = [i for i, o in enumerate(orders) if not o.sent]
        index = world.rng.choice(fresh if fresh else range(len(orders)))
    when = when or world.rng.choice(("before", "after"))
    key = orders[index].spec.idempotency_key
    world.log(f"hazard: supervisor crash just {when} the insert of key {key}")
    msg = world.create(index)
    if when == "before":
        world.crash_during([msg])
    else:
        world.deliver([msg], lose_answers=True)
        world.restart()
    world.deliver([world.create(index)])  # the client retries with the same key
    return True


def base_moves_between_steps(world: World, *, webhook: bool | None = None) -> bool:
    """The operator pushes to the repository of an approved task that has committed a step
    and has more to run. The webhook reaches the supervisor (`webhook`), or is lost, and then
    only the evidence of the next report shows the move: either way no later step may
    commit on the old base, and the task fails `stale_base`."""
    obs = world.observer
    moving = []
    for index, order in enumerate(world.operator.orders):
        task_id, spec = order.task_id, order.spec
        if task_id is None or not spec.repository or task_id not in obs.approved:
            continue
        if obs.states.get(task_id) in TERMINAL_NAMES or task_id in obs.expected_end:
            continue
        done = sum(step_id_for(task_id, i) in obs.applied for i in range(len(spec.steps)))
        if 0 < done < len(spec.steps):
            moving.append(index)
    if not moving:
        return False
    index = world.rng.choice(moving)
    if webhook is None:
        webhook = world.rng.random() < 0.5
    world.log(
        f"hazard: base of {world.operator.orders[index].task_id} moves between steps"
        + ("" if webhook else "; its webhook is lost")
    )
    msg = world.move_head(index)
    if msg is not None and webhook:
        world.deliver([msg])
    elif msg is not None:
        world.drop(msg)
    return True


def fenced_out_attempt_pushes_late(world: World, *, taken: bool | None = None) -> bool:
    """A runner fenced out of a step that then committed under another fence wakes and
    reports its candidate: its bundle makes only its own ref, never moves the committed one,
    and the report is refused. Or (`taken`) it names the committed fence with another commit:
    the mirror refuses the ref, and the ledger answers it as a replay (from the committing
    token) or `not_found` (from another)."""
    obs = world.observer
    ghosts = [
        (runner, lease)
        for runner, lease in world.grants
        if lease.repository is not None
        and (done := obs.applied.get(lease.step_id)) is not None
        and done.fence != lease.fence
    ]
    if not ghosts:
        return False
    runner, lease = world.rng.choice(ghosts)
    committed = obs.applied[lease.step_id].fence
    if taken is None:
        taken = world.rng.random() < 0.5
    fence = committed if taken else lease.fence
    work = world.repos.work(
        lease.step_id,
        fence,
        lease.repository,
        lease.payload.get("checks", []),
        sha=f"c{lease.fence}late",
    )
    rep = Report(
        step_id=lease.step_id,
        fence=fence,
        payload_hash=lease.payload_hash,
        output={"step": lease.step_id, "fence": lease.fence},
        usage={"total_tokens": 1},
        candidate_sha=work.candidate,
        bundle=work.bundle,
        checks=work.checks,
    )
    world.log(
        f"hazard: late push of {lease.step_id} by fenced-out {runner} (fence {lease.fence}),"
        f" committed under fence {committed}" + (", naming that fence" if taken else "")
    )
    world.deliver([world.send(runner, -1, Kind.REPORT, report=rep)])
    return True


def late_checkpoint(lease: Lease, turns: int) -> Checkpoint:
    """The checkpoint the attempt under `lease` makes after `turns` more turns, sent when its
    lease may be long over."""
    turn = (lease.resume.turn if lease.resume else 0) + turns
    return Checkpoint(
        fence=lease.fence,
        turn=turn,
        transcript=f"t:{lease.step_id}:{lease.fence}:{turn}",
        usage={"total_tokens": TURN_TOKENS * turns},
    )


def checkpoint_after_fenced_out(world: World) -> bool:
    """A runner that lost a lease (lapsed, fenced out, its task ended) wakes and checkpoints
    under its old fence: refused as stale, and never the point a later attempt resumes from.
    (It is no longer the process that holds anything: its answer goes nowhere.)"""
    ghosts = [
        (runner, lease)
        for runner, lease in world.grants
        if (live := world.observer.leases.get(lease.step_id)) is None or live.fence != lease.fence
    ]
    if not ghosts:
        return False
    runner, lease = world.rng.choice(ghosts)
    cp = late_checkpoint(lease, world.rng.randint(1, 3))
    world.log(
        f"hazard: checkpoint of {lease.step_id} by {runner} under fence {lease.fence},"
        " its lease over"
    )
    world.deliver([world.send_checkpoint(runner, -1, lease.step_id, cp)])
    return True


def lease_takeover(world: World, *, holder: RunnerActor | None = None) -> bool:
    """Another runner token of the pool, knowing the fence of a live lease it never claimed,
    renews, checkpoints, reports and releases it: each is refused `not_found` and changes
    nothing (docs/design.md, Fencing and leases), and the holder's own report then goes
    through as if the intruder had never spoken."""
    obs = world.observer
    working = [
        (runner, step_id)
        for runner in ([holder] if holder is not None else world.runners)
        for step_id, held in sorted(runner.held.items())
        if held.phase is not HeldPhase.NEW
        and (live := obs.leases.get(step_id)) is not None
        and live.fence == held.lease.fence
    ]
    if not working:
        return False
    runner, step_id = world.rng.choice(working)
    lease = runner.held[step_id].lease
    token = next(t for t in RUNNER_TOKENS if t != runner.token)
    world.log(f"hazard: lease-takeover of {step_id} fence {lease.fence} by {INTRUDER} ({token})")
    forged = Report(
        step_id=step_id,
        fence=lease.fence,
        payload_hash=lease.payload_hash,
        output={"step": step_id, "taken by": INTRUDER},
        usage={"total_tokens": 1},
    )
    fields = {"step_id": step_id, "fence": lease.fence, "token": token}
    moves = [
        world.send(INTRUDER, 0, Kind.RENEW, **fields),
        world.send(INTRUDER, 0, Kind.CHECKPOINT, checkpoint=late_checkpoint(lease, 1), **fields),
        world.send(INTRUDER, 0, Kind.REPORT, report=forged, token=token),
        world.send(INTRUDER, 0, Kind.RELEASE, **fields),
    ]
    for move in moves:
        [error] = world.deliver([move])
        if not isinstance(error, NotFound):
            world.flag(
                f"lease-holder: {INTRUDER}'s {move.kind} of {step_id} under fence {lease.fence}"
                f" was answered {type(error).__name__ if error else 'ok'}, not not_found"
            )
    [error] = world.deliver([world.act(runner, step_id, finish=True)])
    if isinstance(error, NotFound):
        world.flag(f"lease-holder: {runner.id}'s own report of {step_id} refused not_found")
    return True


# -- effects ----------------------------------------------------------------------------------


def holding(world: World, count: int = 1) -> tuple[DispatcherActor, list[InHand]] | None:
    """A dispatcher holding at least `count` effects (one: no hazard played on it yet): one
    already does, or one takes them now when the outbox has enough ready. None (nothing
    changed) otherwise. The effects it returns are marked played."""

    def fresh(d: DispatcherActor) -> list[InHand]:
        # (a batch: any effects held will do; one effect: one no hazard played on yet)
        return [d.hand[e] for e in sorted(d.hand) if count > 1 or e not in world.hazarded]

    held = [d for d in world.dispatchers if len(fresh(d)) >= count]
    if held:
        d = world.rng.choice(held)
    else:
        d = world.rng.choice(world.dispatchers)
        room = dispatch.CAPACITY - len(d.hand)
        if room < 1 or not world.outbox_ready(count - len(fresh(d))):
            return None
        dispatch.take(world, d, room)
        if len(fresh(d)) < count:
            return None
    hands = fresh(d)
    world.hazarded.update(h.out.effect_id for h in hands)
    return d, hands


def to_phase(world: World, d: DispatcherActor, hand: InHand, phase: str) -> bool:
    """Step `hand` until it is "begun" (an attempt recorded, nothing sent) or "sent" (the
    receiver had it, its answer not recorded); False if the effect left the hand first."""
    effect_id = hand.out.effect_id
    for _ in range(6):
        if d.hand.get(effect_id) is not hand:
            return False
        if phase == "begun" and hand.attempt is not None and hand.answer is None:
            return True
        if phase == "sent" and hand.answer is not None:
            return True
        if phase == "begun" and hand.answer is not None:
            dispatch.record(world, d, hand)  # an earlier attempt's answer first
        else:
            dispatch.step(world, d, hand)
    return False


def crash_around_send(world: World, *, when: str) -> bool:
    """The supervisor dies with an effect's attempt begun and nothing sent (`when`
    "before"), or sent and the answer not recorded ("after"). After the restart the effect's
    hold lapses: a keyed one is sent again under its key, an unkeyed one that may have been
    sent becomes uncertain and waits for an operator."""
    found = holding(world)
    if found is None:
        return False
    d, hands = found
    hand = world.rng.choice(hands)
    world.log(f"hazard: crash-{when}-send of {hand.out.effect_id} ({hand.out.kind})")
    to_phase(world, d, hand, "begun" if when == "before" else "sent")
    world.restart()
    return True


def crash_mid_batch(world: World) -> bool:
    """A dispatcher holds several effects: the first is recorded, the second sent and not
    recorded, the rest untouched, when the supervisor dies."""
    found = holding(world, 2)
    if found is None:
        return False
    d, hands = found
    world.log(f"hazard: crash-mid-batch with {', '.join(h.out.effect_id for h in hands)} held")
    first, second = hands[0], hands[1]
    if to_phase(world, d, first, "sent") and first.out.effect_id in d.hand:
        dispatch.record(world, d, first)
    to_phase(world, d, second, "sent")
    world.restart()
    return True


def cancel_vs_delivery(world: World, *, sent: bool | None = None) -> bool:
    """The operator cancels a task while its effect is being delivered: after the attempt
    began and before the send (`sent` False), or after the send and before its answer is
    recorded. Either way the effect is not withdrawn (it may have been sent): the dispatcher
    goes on, and the task stays CANCELLED with the effect delivered, or uncertain."""
    found = holding(world)
    if found is None:
        return False
    d, hands = found
    hand = world.rng.choice(hands)
    if sent is None:
        sent = world.rng.random() < 0.5
    task_id = hand.out.task_id
    world.log(
        f"hazard: cancel-vs-delivery of {hand.out.effect_id},"
        f" {'after the send' if sent else 'before the send'}"
    )
    if not to_phase(world, d, hand, "sent" if sent else "begun"):
        return True
    world.deliver([world.send(OPERATOR, 0, Kind.CANCEL, tenant=hand.out.tenant, task_id=task_id)])
    for _ in range(4):
        if d.hand.get(hand.out.effect_id) is not hand:
            break
        dispatch.step(world, d, hand)
    return True


HAZARDS: dict[str, Callable[[World], bool]] = {
    "cancel-vs-commit": cancel_between_verification_and_commit,
    "fenced-renew": renew_after_fenced_out,
    "consumer-replay": consumer_replay_after_success,
    "crash-around-key": crash_around_key_insert,
    "base-moves": base_moves_between_steps,
    "late-push": fenced_out_attempt_pushes_late,
    "stale-checkpoint": checkpoint_after_fenced_out,
    "lease-takeover": lease_takeover,
    "crash-before-send": lambda world: crash_around_send(world, when="before"),
    "crash-after-send": lambda world: crash_around_send(world, when="after"),
    "crash-mid-batch": crash_mid_batch,
    "cancel-vs-delivery": cancel_vs_delivery,
}
