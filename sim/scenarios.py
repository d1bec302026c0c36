"""The adversarial histories as named, hand-set scenarios on the explorer's own world.

Each scenario builds the situation its hazard needs on purpose (a repository task with an
expected check, two runners), plays the hazard, then drives the world to quiescence; every
check of the explorer runs throughout, exactly as in a random schedule. Tests assert on the
world afterwards: its trace, the observer's record and the ledger file.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from random import Random

from tether.sim import dispatch, hazards
from tether.sim.actors import Order, RunnerActor, effect_step
from tether.sim.harness import Harness, Workspace, scratch_root
from tether.sim.plants import planted
from tether.sim.repos import BASE, FORGERIES
from tether.sim.schedule import CONFIG, QUIESCENCE_TTLS, quiesce
from tether.sim.world import Habits, World
from tether.supervisor.ledger.identity import StepSpec, TaskSpec
from tether.supervisor.ledger.verification import Finding


def order(steps: int = 2) -> Order:
    spec = TaskSpec(
        tenant="acme",
        idempotency_key="scenario",
        steps=tuple(
            StepSpec(
                name=f"s{j}",
                kind="chat",
                payload={
                    "n": j,
                    "repo": True,
                    "last": j == steps - 1,
                    "checks": ["lint"] if j == steps - 1 else [],
                },
            )
            for j in range(steps)
        ),
        repository="repo0",
        base_sha=BASE,
        allowed_paths=("src/",),
        expected_checks=("lint",),
    )
    other = dataclasses.replace(spec, steps=(StepSpec(name="s0", kind="chat", payload={}),))
    return Order(spec=spec, conflicting=other)


def effect_order(index: int, *kinds: str, repository: bool = False) -> Order:
    """A task whose first step is a chat step s0, followed by effect steps of `kinds`
    ("deploy" keyed http, "notify" unkeyed http, "push" git.push)."""
    rng = Random(index)
    base = order(1) if repository else None
    s0 = StepSpec(
        name="s0",
        kind="chat",
        payload={
            "n": 0,
            "repo": repository,
            "last": True,
            "checks": ["lint"] if repository else [],
        },
    )
    effects = tuple(effect_step(rng, index, kind, after_s0=True) for kind in kinds)
    spec = TaskSpec(
        tenant="acme",
        idempotency_key=f"effects{index}",
        steps=(s0, *effects),
        repository="repo0" if repository else None,
        base_sha=BASE if repository else None,
        allowed_paths=("src/",) if repository else (),
        expected_checks=("lint",) if repository else (),
    )
    conflicting = base.conflicting if base else dataclasses.replace(spec, owner="someone-else")
    return Order(spec=spec, conflicting=conflicting)


@contextlib.contextmanager
def scenario_world(
    seed: int = 0, *, steps: int = 2, plant: str | None = None, orders: list[Order] | None = None
) -> Iterator[World]:
    with scratch_root() as root, Workspace(root) as workspace, planted(plant) as active:
        harness = Harness(workspace, config=CONFIG, plant=active)
        try:
            yield World(
                harness,
                Random(seed),
                orders=orders or [order(steps)],
                runners=2,
                habits=Habits(release=0),
            )
        finally:
            harness.close()


def submit(world: World) -> str:
    """Create and approve the scenario's task; return its id."""
    world.deliver([world.create(0)])
    task_id = world.operator.orders[0].task_id
    assert task_id is not None
    world.deliver([world.approve(0)])  # type: ignore[list-item]
    return task_id


def work(world: World, runner: RunnerActor) -> str:
    """`runner` claims the next step and acknowledges it; return the step id."""
    world.deliver([world.claim(runner)])
    [step_id] = runner.held
    world.deliver([world.act(runner, step_id, finish=False)])
    return step_id


def finish(world: World, runner: RunnerActor, step_id: str) -> None:
    world.deliver([world.act(runner, step_id, finish=True)])


def cancel_vs_commit(variant: str) -> Callable[[World], None]:
    def play(world: World) -> None:
        submit(world)
        a = world.runners[0]
        finish(world, a, work(world, a))  # step 0 commits
        step_id = work(world, a)  # the last step is in flight
        world.act(a, step_id, finish=True)  # its report is on the wire
        assert hazards.cancel_between_verification_and_commit(world, variant=variant)

    return play


def fenced_renew(world: World) -> None:
    submit(world)
    a = world.runners[0]
    work(world, a)
    assert hazards.renew_after_fenced_out(world, sleeper=a)


def consumer_replay(world: World) -> None:
    task_id = submit(world)
    a = world.runners[0]
    for _ in range(2):
        finish(world, a, work(world, a))
    world.poll(task_id)
    assert hazards.consumer_replay_after_success(world, task_id=task_id)


def crash_around_key(when: str) -> Callable[[World], None]:
    def play(world: World) -> None:
        assert hazards.crash_around_key_insert(world, index=0, when=when)
        world.deliver([world.create(0)])  # and once more, for good measure

    return play


def base_moves(when: str) -> Callable[[World], None]:
    """Step 0 commits on the approved base; then the operator pushes. `when`: "webhook" (the
    push's webhook arrives before step 1 is claimed), "no-webhook" (it is lost: step 1 runs and
    its evidence shows the move) or "during-step" (the push lands while step 1 runs)."""

    def play(world: World) -> None:
        submit(world)
        a = world.runners[0]
        finish(world, a, work(world, a))
        if when == "during-step":
            step_id = work(world, a)
            world.drop(world.move_head(0))  # type: ignore[arg-type]
            finish(world, a, step_id)
            return
        assert hazards.base_moves_between_steps(world, webhook=when == "webhook")
        world.deliver([world.claim(a)])
        for step_id in sorted(a.held):
            world.deliver([world.act(a, step_id, finish=False)])
            finish(world, a, step_id)

    return play


def late_push(taken: bool) -> Callable[[World], None]:
    """Runner a pauses holding step 0 and is fenced out; b commits the step; a wakes and
    pushes its candidate late, under its own fence or (`taken`) naming b's."""

    def play(world: World) -> None:
        submit(world)
        a, b = world.runners
        work(world, a)
        hazards.pause(world, a, world.h.config.lease_ttl_s + 1)
        finish(world, b, work(world, b))
        assert hazards.fenced_out_attempt_pushes_late(world, taken=taken)

    return play


def stale_checkpoint(world: World) -> None:
    """Runner a checkpoints two turns of step 0 and pauses past its TTL: its next checkpoint
    (lapsed) is refused; b resumes from turn 2; a's checkpoint while b holds the step (fenced
    out) is refused too; b checkpoints turn 3 and commits."""
    submit(world)
    a, b = world.runners
    step_id = work(world, a)
    lease = a.held[step_id].lease
    for _ in range(2):
        world.deliver([world.checkpoint(a, a.held[step_id])])
    hazards.pause(world, a, world.h.config.lease_ttl_s + 1)
    world.deliver([world.checkpoint(a, a.held[step_id])])
    work(world, b)
    world.deliver(
        [world.send_checkpoint(a.id, a.incarnation, step_id, hazards.late_checkpoint(lease, 4))]
    )
    world.deliver([world.checkpoint(b, b.held[step_id])])
    if step_id in b.held:  # (a planted bug may have taken it from b)
        finish(world, b, step_id)


def lease_takeover(world: World) -> None:
    """Runner a (one token) works step 0; an intruder with the pool's other token renews,
    checkpoints, reports and releases it under a's fence; then a reports it."""
    submit(world)
    a = world.runners[0]
    work(world, a)
    assert hazards.lease_takeover(world, holder=a)


def forged(code: Finding) -> Callable[[World], None]:
    """Step 0 is honest; every result after it is forged the way the adapters call `code`."""

    def play(world: World) -> None:
        submit(world)
        a = world.runners[0]
        finish(world, a, work(world, a))
        world.forgery = code
        finish(world, a, work(world, a))

    return play


# -- effects ----------------------------------------------------------------------------------


def submit_all(world: World) -> list[str]:
    """Create and approve every order of the world; return the task ids."""
    ids = []
    for index in range(len(world.operator.orders)):
        world.deliver([world.create(index)])
        task_id = world.operator.orders[index].task_id
        assert task_id is not None
        world.deliver([world.approve(index)])  # type: ignore[list-item]
        ids.append(task_id)
    return ids


def first_steps(world: World) -> None:
    """Runner a commits every task's first step (its chat step s0)."""
    a = world.runners[0]
    for _ in world.operator.orders:
        finish(world, a, work(world, a))


def open_gates(world: World) -> None:
    for row in world.effects_in("gated"):
        world.deliver([world.open_gate(row)])


def crash_around_send(when: str) -> Callable[[World], None]:
    """s0 commits, its effect becomes due (and its gate is opened), the dispatcher takes it;
    the supervisor dies before the send, or after it before the answer is recorded."""

    def play(world: World) -> None:
        submit_all(world)
        first_steps(world)
        open_gates(world)
        assert hazards.crash_around_send(world, when=when)

    return play


def crash_mid_batch(world: World) -> None:
    """Two tasks' deploys are due at once; the dispatcher holds both: the first is
    recorded, the second sent, when the supervisor dies."""
    submit_all(world)
    first_steps(world)
    assert hazards.crash_mid_batch(world)


def cancel_vs_delivery(sent: bool) -> Callable[[World], None]:
    def play(world: World) -> None:
        submit_all(world)
        first_steps(world)
        assert hazards.cancel_vs_delivery(world, sent=sent)

    return play


def push_answer_lost(world: World) -> None:
    """A repository task's push moves the branch; its answer is lost, and the retry finds
    the branch at the candidate already (`replayed`)."""
    submit_all(world)
    first_steps(world)
    world.habits = dataclasses.replace(world.habits, lost=1.0)
    d = world.dispatchers[0]
    dispatch.take(world, d, dispatch.CAPACITY)
    [hand] = d.hand.values()
    for _ in range(3):  # begin, send (lost), record (unanswered, held for a retry)
        dispatch.step(world, d, hand)
    world.habits = dataclasses.replace(world.habits, lost=0.0)


SCENARIOS: dict[str, Callable[[World], None]] = {
    "cancel-vs-commit/cancel-first": cancel_vs_commit("cancel-first"),
    "cancel-vs-commit/report-first": cancel_vs_commit("report-first"),
    "cancel-vs-commit/crash": cancel_vs_commit("crash"),
    "fenced-renew": fenced_renew,
    "consumer-replay": consumer_replay,
    "crash-around-key/before": crash_around_key("before"),
    "crash-around-key/after": crash_around_key("after"),
    "base-moves/webhook": base_moves("webhook"),
    "base-moves/no-webhook": base_moves("no-webhook"),
    "base-moves/during-step": base_moves("during-step"),
    "late-push/own-ref": late_push(taken=False),
    "late-push/taken": late_push(taken=True),
    "stale-checkpoint": stale_checkpoint,
    "lease-takeover": lease_takeover,
    **{f"forged/{code}": forged(code) for code in FORGERIES},
    "effects/crash-before-send/keyed": crash_around_send("before"),
    "effects/crash-after-send/keyed": crash_around_send("after"),
    "effects/crash-before-send/unkeyed": crash_around_send("before"),
    "effects/crash-after-send/unkeyed": crash_around_send("after"),
    "effects/crash-mid-batch": crash_mid_batch,
    "effects/cancel-before-send": cancel_vs_delivery(sent=False),
    "effects/cancel-after-send": cancel_vs_delivery(sent=True),
    "effects/push-answer-lost": push_answer_lost,
}

# The orders of the effect scenarios (every other scenario plays `order()`).
EFFECT_ORDERS: dict[str, Callable[[], list[Order]]] = {
    "effects/crash-before-send/keyed": lambda: [effect_order(0, "deploy")],
    "effects/crash-after-send/keyed": lambda: [effect_order(0, "deploy")],
    "effects/crash-before-send/unkeyed": lambda: [effect_order(0, "notify")],
    "effects/crash-after-send/unkeyed": lambda: [effect_order(0, "notify")],
    "effects/crash-mid-batch": lambda: [effect_order(0, "deploy"), effect_order(1, "deploy")],
    "effects/cancel-before-send": lambda: [effect_order(0, "deploy")],
    "effects/cancel-after-send": lambda: [effect_order(0, "deploy")],
    "effects/push-answer-lost": lambda: [effect_order(0, "push", repository=True)],
}


@contextlib.contextmanager
def played(name: str, *, seed: int = 0, plant: str | None = None) -> Iterator[World]:
    """The world after scenario `name` and quiescence; the ledger file is still open."""
    orders = EFFECT_ORDERS[name]() if name in EFFECT_ORDERS else None
    with scenario_world(seed, plant=plant, orders=orders) as world:
        SCENARIOS[name](world)
        if not world.violations:
            quiesce(world, QUIESCENCE_TTLS)
        yield world
