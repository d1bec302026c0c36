"""One schedule: a seeded fault plan, a few dozen random events, then quiescence.

Everything a schedule does comes from `Random(seed)`: the plan (how many tasks, runners and
events, which faults are on and how often, which adversarial histories may be played, how the
clients misbehave) and every choice after it. So a seed is a complete, exact replay.
"""

from __future__ import annotations

import dataclasses
import hashlib
from random import Random

from tether.sim import dispatch
from tether.sim.actors import OPERATOR, RunnerActor, make_orders
from tether.sim.harness import Harness, Scratch
from tether.sim.hazards import HAZARDS, pause
from tether.sim.observer import TERMINAL_NAMES
from tether.sim.plants import Plant, planted
from tether.sim.snapshot import ledger_snapshot
from tether.sim.world import Habits, World
from tether.supervisor.ledger.tx import LedgerConfig

# A dispatcher's hold lasts 20 s here (60 s by default), so holds lapse within a schedule.
CONFIG = LedgerConfig(lease_ttl_s=30.0, accept_window_s=10.0, max_attempts=5, effect_hold_s=20.0)
QUIESCENCE_TTLS = 4.0
# chance per event that an armed hazard tries to play (it plays only if its situation exists)
HAZARD_EAGERNESS = {
    "cancel-vs-commit": 0.5,
    "fenced-renew": 0.03,
    "consumer-replay": 0.05,
    "crash-around-key": 0.03,
    "base-moves": 0.05,
    "late-push": 0.1,
    "stale-checkpoint": 0.05,
    "crash-before-send": 0.15,
    "crash-after-send": 0.15,
    "crash-mid-batch": 0.5,
    "cancel-vs-delivery": 0.15,
    "lease-takeover": 0.03,
}

# chance that a runner's report asks for the next leases (eager dispatch), and that its renew
# carries its other leases too (batched renewals)
EAGER = 0.4
TOGETHER = 0.5
# event -> weight when on; faults are switched on per schedule by the plan
NORMAL = {
    "operator": 5.0,
    "create": 0.5,
    "cancel": 0.5,
    "head": 0.7,
    "budget": 0.3,
    "runner": 10.0,
    "deliver": 14.0,
    "batch": 3.0,
    "tick": 2.5,
    "reap": 1.0,
    "poll": 1.0,
    "dispatch": 6.0,
    "gate": 0.8,
    "resolve": 0.6,
}
FAULTS = {
    "duplicate": 1.5,
    "lose": 0.8,
    "crash-runner": 0.5,
    "restart": 0.4,
    "crash-in-batch": 0.4,
    "pause": 0.4,
    "replay-old": 0.6,
    "shutdown": 0.3,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultPlan:
    events: int
    tasks: int
    runners: int
    dispatchers: int
    weights: dict[str, float]
    lose_answer: float
    hazards: tuple[str, ...]
    habits: Habits
    max_attempts: int

    @classmethod
    def draw(cls, rng: Random) -> FaultPlan:
        weights = dict(NORMAL)
        for fault, weight in FAULTS.items():
            if rng.random() < 0.55:
                weights[fault] = weight * rng.uniform(0.5, 2.0)
        hazards = tuple(h for h in HAZARDS if rng.random() < 0.4)
        if rng.random() < 0.1:  # some plans arm none: the plain faults alone
            hazards = ()
        habits = Habits(
            drift=0.08 if rng.random() < 0.25 else 0.0,
            sloppy=0.1 if rng.random() < 0.4 else 0.0,
            forge=0.4 if rng.random() < 0.5 else 0.0,
            release=0.06 if rng.random() < 0.5 else 0.0,
            stale_approval=0.25 if rng.random() < 0.3 else 0.0,
            wrong_plan=0.2 if rng.random() < 0.2 else 0.0,
            unreachable=0.15 if rng.random() < 0.4 else 0.0,
            busy=0.15 if rng.random() < 0.3 else 0.0,
            lost=0.25 if rng.random() < 0.5 else 0.0,
            refuse=0.05 if rng.random() < 0.2 else 0.0,
            duplicate_answer=0.3 if rng.random() < 0.3 else 0.0,
            wrong_digest=0.2 if rng.random() < 0.2 else 0.0,
            guess=0.3 if rng.random() < 0.15 else 0.0,
        )
        return cls(
            events=rng.randint(50, 120),
            tasks=rng.randint(1, 3),
            runners=rng.randint(1, 3),
            dispatchers=rng.choice([1, 1, 2]),
            weights=weights,
            lose_answer=rng.uniform(0.05, 0.3) if rng.random() < 0.5 else 0.0,
            hazards=hazards,
            habits=habits,
            max_attempts=rng.choice([2, 3, 5]),
        )

    def describe(self) -> str:
        faults = sorted(f for f in FAULTS if f in self.weights)
        values = dataclasses.asdict(self.habits)
        habits = [f"{name} {value:g}" for name, value in values.items() if value]
        return (
            f"plan: {self.tasks} tasks, {self.runners} runners, {self.dispatchers} dispatchers,"
            f" {self.events} events,"
            f" max_attempts {self.max_attempts};"
            f" faults: {', '.join(faults) or 'none'}; lost answers {self.lose_answer:.2f};"
            f" hazards: {', '.join(self.hazards) or 'none'}; habits: {', '.join(habits) or 'none'}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduleResult:
    seed: int
    trace: list[str]
    violations: list[str]
    snapshot: list[str] = dataclasses.field(default_factory=list)  # the ledger at a violation

    @property
    def digest(self) -> str:
        return hashlib.sha256("\n".join(self.trace).encode()).hexdigest()


def run_schedule(seed: int, workspace: Scratch, plant: str | None = None) -> ScheduleResult:
    """Play the schedule of `seed`, with the bug called `plant` planted while it runs."""
    with planted(plant) as active:
        return _run_schedule(seed, workspace, active)


def _run_schedule(seed: int, workspace: Scratch, plant: Plant | None) -> ScheduleResult:
    rng = Random(seed)
    plan = FaultPlan.draw(rng)
    harness = Harness(
        workspace, config=dataclasses.replace(CONFIG, max_attempts=plan.max_attempts), plant=plant
    )
    world = World(
        harness,
        rng,
        orders=make_orders(rng, plan.tasks),
        runners=plan.runners,
        habits=plan.habits,
        dispatchers=plan.dispatchers,
    )
    try:
        world.log(plan.describe())
        _play(world, plan)
    except Exception as exc:  # reported like a violation, so the seed replays it
        error = f"explorer error: {type(exc).__name__}: {exc}"
        world.observer.violation(error)
        world.log(error)
    try:
        snapshot = ledger_snapshot(harness) if world.violations else []
    finally:
        harness.close()
    return ScheduleResult(
        seed=seed, trace=world.trace, violations=list(world.violations), snapshot=snapshot
    )


def _play(world: World, plan: FaultPlan) -> None:
    rng = world.rng
    names = list(plan.weights)
    weights = [plan.weights[n] for n in names]
    for _ in range(plan.events):
        step(world, plan, rng.choices(names, weights)[0])
        for hazard in plan.hazards:
            # An armed hazard plays soon after its situation arises.
            if not world.violations and rng.random() < HAZARD_EAGERNESS[hazard]:
                HAZARDS[hazard](world)
        if world.violations:
            return
    quiesce(world, QUIESCENCE_TTLS)


def _operator_moves(world: World) -> list[tuple[str, int]]:
    moves = []
    for index, order in enumerate(world.operator.orders):
        if order.task_id is None:
            if not world.busy(OPERATOR, f"key {order.spec.idempotency_key}"):
                moves.append(("create", index))
        elif world.observer.states.get(order.task_id) == "PLANNED" and not world.busy(
            OPERATOR, order.task_id
        ):
            moves.append(("approve", index))
    return moves


def _holder(world: World, rng: Random) -> RunnerActor | None:
    """A runner holding a lease, if any does."""
    holders = [r for r in world.runners if r.held]
    return rng.choice(holders) if holders else None


def step(world: World, plan: FaultPlan, event: str) -> None:  # noqa: PLR0915
    """Play one event of the schedule; one that finds nothing to do does nothing."""
    rng = world.rng
    orders = world.operator.orders
    index = rng.randrange(len(orders))
    queue = world.queue
    lose = plan.lose_answer > 0 and rng.random() < plan.lose_answer
    if event == "operator":  # the operator's next move on an order that needs one
        moves = _operator_moves(world)
        if moves:
            move, index = rng.choice(moves)
            if move == "create":
                world.create(index)  # a first try, or a retry after a lost answer
            else:
                world.approve(index)
    elif event == "create":  # a duplicate create, with the same or (rarely) another plan
        conflicting = orders[index].task_id is not None and rng.random() < 0.3
        world.create(index, conflicting=conflicting)
    elif event == "cancel":
        world.cancel(index)
    elif event == "head":
        world.move_head(index, revert=rng.random() < 0.3)
    elif event == "budget":  # a tenant's token budget: tasks over it wait, they do not fail
        world.set_budget(orders[index].spec.tenant, rng.choice([None, 0, 10, 20, 40]))
    elif event == "runner":  # a runner's next move: work on a lease it holds, or claim
        runner = rng.choice(world.runners)
        idle = [s for s in sorted(runner.held) if not world.busy(runner.id, s)]
        if idle and (rng.random() < 0.75 or world.busy(runner.id, "claim")):
            # a report may ask for the next leases, a renew carry the runner's other leases
            want = rng.randint(1, 2) if rng.random() < EAGER else 0
            world.act(runner, rng.choice(idle), want=want, together=rng.random() < TOGETHER)
        elif not world.busy(runner.id, "claim"):
            world.claim(runner, rng.randint(1, 2))
    elif event == "deliver":
        if queue:
            world.deliver([rng.choice(queue)], lose_answers=lose)
    elif event == "batch":
        if queue:
            world.deliver(rng.sample(queue, min(len(queue), rng.randint(2, 4))), lose_answers=lose)
    elif event == "duplicate":
        if queue:
            world.deliver([rng.choice(queue)], keep=True, lose_answers=lose)
    elif event == "lose":
        if queue:
            world.drop(rng.choice(queue))
    elif event == "crash-runner":
        world.crash_runner(rng.choice(world.runners))
    elif event == "restart":
        world.restart()
    elif event == "crash-in-batch":
        world.crash_during(rng.sample(queue, min(len(queue), rng.randint(1, 3))))
    elif event == "tick":
        world.advance(rng.randint(1, 6))
        if rng.random() < 0.8:
            world.reap()
    elif event == "pause":
        runner = _holder(world, rng) or rng.choice(world.runners)
        pause(world, runner, world.h.config.lease_ttl_s + rng.randint(1, 15))
    elif event == "reap":
        world.reap()
    elif event == "dispatch":  # a dispatcher's next step: take, begin, send or record
        dispatch.next_move(world, rng.choice(world.dispatchers))
    elif event == "gate":  # the operator opens a gated effect's gate
        gated = world.effects_in("gated")
        if gated:
            world.open_gate(rng.choice(gated))
    elif event == "resolve":  # the operator says whether an uncertain effect happened
        uncertain = world.effects_in("uncertain")
        if uncertain:
            world.resolve(rng.choice(uncertain))
    elif event == "shutdown":
        dispatch.shutdown(world)
    elif event in ("poll", "replay-old"):
        tasks = sorted(world.observer.states)
        if tasks:
            task_id = rng.choice(tasks)
            if event == "poll":
                world.poll(task_id)
            else:
                world.replay_old(task_id)
    else:
        raise ValueError(f"unknown schedule event {event!r}")


def quiesce(world: World, ttls: float) -> None:
    """Faults stop: the network delivers in order, clients behave, the clock runs in renew
    intervals. Every task must end within `ttls` lease TTLs of virtual time."""
    world.honest = True
    world.log("faults stop; drive to quiescence")
    config = world.h.config
    deadline = world.h.now + ttls * config.lease_ttl_s
    orders = world.operator.orders
    while not world.violations:
        world.flush()  # what is still in flight lands first
        for tenant, budget in sorted(world.observer.budgets.items()):
            if budget is not None:
                world.set_budget(tenant, None)  # the operator lifts every budget
        for i, order in enumerate(orders):
            if order.sent and order.task_id is None:
                world.create(i)
        world.flush()
        for i, order in enumerate(orders):
            if order.task_id and world.observer.states.get(order.task_id) == "PLANNED":
                world.approve(i)
        world.flush()
        for runner in world.runners:
            world.claim(runner, 2)
        world.flush()
        for _ in range(2):  # acknowledge new leases, then finish and report
            for runner in world.runners:
                want = 1 if world.rng.random() < EAGER else 0
                for step_id in sorted(runner.held):
                    if not world.busy(runner.id, step_id):  # not in a results request
                        world.act(runner, step_id, finish=True, want=want)
            world.flush()
        dispatch.drain(world)  # deliver what is due and open
        for row in world.effects_in("gated"):
            world.open_gate(row)
        for row in world.effects_in("uncertain"):
            world.resolve(row)
        world.flush()
        dispatch.drain(world)
        if not world.queue and all(
            state in TERMINAL_NAMES for state in world.observer.states.values()
        ):
            break
        if world.h.now >= deadline:
            stuck = sorted(
                f"{t} {s}" for t, s in world.observer.states.items() if s not in TERMINAL_NAMES
            )
            world.observer.violation(
                f"liveness: after {ttls:g} TTLs without faults, not ended: {', '.join(stuck)}"
            )
            world.log(f"VIOLATION {world.violations[-1]}")
            return
        world.advance(config.renew_every_s)
        world.reap()
    if world.violations:
        return
    for task_id in sorted(world.observer.states):
        world.poll(task_id)
        consumer = world.consumers[task_id]
        if consumer.state != world.observer.states[task_id]:
            world.observer.violation(
                f"consumer: {task_id} view {consumer.state}, ledger"
                f" {world.observer.states[task_id]}"
            )
            world.log(f"VIOLATION {world.violations[-1]}")
