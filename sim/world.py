"""One simulated world: the ledger harness, the actors, the network and the observer.

Every primitive here is one event of a schedule: it changes the world, appends one line to the
trace (with the fences, SHAs and answers involved) and, when the ledger was touched, runs every
check: the observer's, then `find_violations` over the whole file. The schedule decides which
primitive comes next; the hazards compose them into the adversarial histories.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from random import Random
from typing import Any

from tether.sim.actors import (
    OPERATOR,
    REPOSITORIES,
    RUNNER_TOKENS,
    TENANTS,
    TURN_TOKENS,
    Held,
    HeldPhase,
    Kind,
    Message,
    Operator,
    Order,
    RunnerActor,
    describe,
    plan_hash,
)
from tether.sim.dispatch import DispatcherActor
from tether.sim.harness import START, Harness
from tether.sim.observer import Consumer, Observer
from tether.sim.receivers import Fault, Receivers, describe_answer
from tether.sim.repos import BASE, FORGERIES, Repos, candidate_ref
from tether.supervisor.ledger import reaper, repositories, views
from tether.supervisor.ledger.batch import RuleCrashed
from tether.supervisor.ledger.errors import LedgerError, Refused
from tether.supervisor.ledger.invariants import find_violations
from tether.supervisor.ledger.outbox import Answer, Outgoing
from tether.supervisor.ledger.tx import Row, Tx
from tether.supervisor.ledger.verification import Evidence, Finding
from tether.wire import Outcome, ReleaseReason, content_hash
from tether.wire.records import Checkpoint, Lease, Report


@dataclasses.dataclass(frozen=True, kw_only=True)
class Habits:
    """How the simulated clients misbehave, as probabilities per action."""

    drift: float = 0.0  # a runner reports a payload other than its lease's
    sloppy: float = 0.0  # a runner's result lacks the candidate SHA
    forge: float = 0.0  # a runner's result is forged in one way the adapters name (`FORGERIES`)
    release: float = 0.05  # a runner hands a lease back instead of finishing it
    stale_approval: float = 0.0  # the operator approves an out-of-date base
    wrong_plan: float = 0.0  # the operator approves with another plan hash
    # effects: how the network and the receivers treat a send, and the operator's slips
    unreachable: float = 0.0  # the request never arrives (connection refused)
    busy: float = 0.0  # the receiver answers 503 before applying
    lost: float = 0.0  # the receiver applies it; its answer is lost
    refuse: float = 0.0  # an http receiver refuses it for good
    duplicate_answer: float = 0.0  # an answer reaches the dispatcher twice
    wrong_digest: float = 0.0  # the operator opens a gate for another request's digest
    guess: float = 0.0  # the operator says whether an uncertain effect happened at random


QUICK_STEPS = 0.3
CHANGED_WORKTREE = 0.7  # a turn's checkpoint carries a bundle of the worktree's changes
FINISHED_TOGETHER = 0.5  # another working lease's step finishes as a results request is sent
DUPLICATE_CHECKPOINT = 0.1  # a runner sends a checkpoint twice (a retry after a timeout)


def _observed(rule: Callable[[Tx], Any]) -> Callable[[Tx], Any]:
    """Run `rule`, then read every task's state inside the same savepoint."""

    def run(tx: Tx) -> tuple[Any, list[tuple[str, str, str | None]]]:
        value = rule(tx)
        rows = tx.db.execute("SELECT id, state, reason FROM tasks ORDER BY created_order")
        return value, rows.fetchall()

    return run


class World:
    def __init__(
        self,
        harness: Harness,
        rng: Random,
        *,
        orders: list[Order],
        runners: int,
        habits: Habits,
        dispatchers: int = 1,
    ) -> None:
        self.h = harness
        self.rng = rng
        self.habits = habits
        self.operator = Operator(orders)
        self.runners = [
            RunnerActor(f"r{i}", token=RUNNER_TOKENS[i % len(RUNNER_TOKENS)])
            for i in range(runners)
        ]
        self.queue: list[Message] = []
        self.in_flight: set[tuple[str, str]] = set()
        self.observer = Observer(harness.config)
        self.consumers: dict[str, Consumer] = {}
        self.trace: list[str] = []
        self._messages = 0
        self._shas = 0
        self.honest = False  # set once faults stop: clients then behave
        # The repositories: a push moves a head at once; its webhook (a HEAD message) reaches
        # the supervisor later, or never. The adapters read the head, and import bundles into
        # the mirror's refs, as each report arrives (`_gathered`).
        self.repos = Repos()
        self.forgery: Finding | None = None  # a scenario's: every result forged this way
        self.grants: list[tuple[str, Lease]] = []  # every lease granted, with its runner
        self.dispatchers = [DispatcherActor(f"d{i}") for i in range(dispatchers)]
        self.receivers = Receivers(self.repos)
        self.hazarded: set[str] = set()  # effects a hazard played on (once each)
        self._add_repositories()

    def _add_repositories(self) -> None:
        """Every tenant adds every repository before the schedule starts (`repo add`)."""
        adds = [
            functools.partial(
                repositories.add_repository, tenant=tenant, name=name, url=f"/srv/git/{name}.git"
            )
            for tenant in TENANTS
            for name in REPOSITORIES
        ]
        for outcome in self.h.run(adds):
            if outcome.error is not None:
                raise outcome.error

    def head_of(self, tenant: str, repository: str) -> str:
        """The repository's head now, as `git ls-remote` would read it."""
        return self.repos.head(tenant, repository)

    def _misbehaves(self, probability: float) -> bool:
        return not self.honest and self.rng.random() < probability

    @property
    def violations(self) -> list[str]:
        return self.observer.violations

    def log(self, text: str) -> None:
        self.trace.append(f"{len(self.trace):03d} t+{self.h.now - START:g}s {text}")

    def check(self) -> None:
        before = len(self.violations)
        for found in find_violations(self.h.reads):
            self.observer.violation(found)
        charged = self.h.query("SELECT name, tokens_used FROM tenants ORDER BY name")
        self.observer.charged_now((row[0], row[1]) for row in charged)
        self.observer.effects_now(self.receivers)
        for row in self.h.query("SELECT step_id FROM outbox WHERE state = 'withdrawn'"):
            self.observer.withdrawn(row[0], self.receivers)
        for found in self.violations[before:]:
            self.log(f"VIOLATION {found}")

    def flag(self, violation: str) -> None:
        before = len(self.violations)
        self.observer.violation(violation)
        self._flag_new(before)

    def check_refs(self) -> None:
        """The ref a committed attempt's clean candidate was imported under still names that
        candidate, whatever was pushed since."""
        for step_id, rep in self.observer.applied.items():
            evidence = self.observer.evidence.get(step_id)
            if rep.candidate_sha is None or evidence is None or evidence.problems:
                continue
            ref = candidate_ref(step_id, rep.fence)
            held = self.repos.refs.get(ref)
            if held != rep.candidate_sha:
                self.observer.violation(
                    f"candidate-ref: {ref} names {held}; {step_id} committed {rep.candidate_sha}"
                )

    def _flag_new(self, before: int) -> None:
        for found in self.violations[before:]:
            self.log(f"VIOLATION {found}")

    # -- the network --------------------------------------------------------------------------

    def send(self, sender: str, incarnation: int, kind: Kind, **fields: Any) -> Message:
        """Put a request on the network; a runner's goes with its token unless `token` says."""
        self._messages += 1
        if "token" not in fields:
            fields["token"] = next((r.token for r in self.runners if r.id == sender), None)
        msg = Message(
            id=self._messages, sender=sender, incarnation=incarnation, kind=kind, **fields
        )
        self.queue.append(msg)
        self.in_flight.update(msg.subjects)
        return msg

    def _gathered(self, msg: Message) -> Message:
        """`msg` as the supervisor's rule gets it: a report of a repository-bound step with the
        evidence its adapters observe as it arrives (`Repos.gather`)."""
        rep = msg.report
        if msg.kind is not Kind.REPORT or rep is None:
            return msg
        tasks = self.h.query(
            "SELECT tenant, repository, approved_base_sha FROM tasks WHERE id = ?",
            (rep.step_id.rsplit(".", 1)[0],),
        )
        task = tasks[0] if tasks else None
        if task is None or task["repository"] is None:
            return msg
        evidence: Evidence = self.repos.gather(
            tenant=task["tenant"],
            repository=task["repository"],
            approved_base=task["approved_base_sha"],
            step_id=rep.step_id,
            fence=rep.fence,
            candidate=rep.candidate_sha,
            bundle=rep.bundle,
            checks=rep.checks,
        )
        return dataclasses.replace(msg, evidence=evidence)

    def busy(self, sender: str, subject: str) -> bool:
        """Is `sender` still waiting for an answer about `subject`?"""
        return (sender, subject) in self.in_flight

    def _gone(self, msg: Message) -> None:
        """`msg` left the network; its client stops waiting (an answer or a timeout)."""
        self.queue.remove(msg)
        for subject in msg.subjects:
            if not any(subject in m.subjects for m in self.queue):
                self.in_flight.discard(subject)

    def deliver(
        self, msgs: Sequence[Message], *, lose_answers: bool = False, keep: bool = False
    ) -> list[BaseException | None]:
        """Deliver `msgs` to the supervisor as one group-commit batch, in this order (each
        request's parts together, as its rules are queued); return each part's refusal."""
        if not keep:
            for msg in msgs:
                self._gone(msg)
        within = [f" (in {m.kind} m{m.id})" if len(m.parts()) > 1 else "" for m in msgs]
        within = [w for m, w in zip(msgs, within, strict=True) for _ in m.parts()]
        msgs = [self._gathered(p) for m in msgs for p in m.parts()]
        before, changes_before = len(self.violations), self.h.changes
        outcomes = self.h.run([_observed(m.rule()) for m in msgs])
        batch = f"batch of {len(msgs)}: " if len(msgs) > 1 else ""
        for msg, outcome, part in zip(msgs, outcomes, within, strict=True):
            value: Any = None
            if outcome.error is None:
                value, states = outcome.value
                self._observe(msg, value, None)
                changes = self.observer.saw_states(states)
                answer = describe(msg.kind, value)
            else:
                error = outcome.error
                self._observe(msg, None, error)
                changes = []
                answer = f"refused {error.code.value}" if isinstance(error, Refused) else "FAILED"
                if isinstance(error, RuleCrashed) or not isinstance(error, Refused):
                    self.observer.violation(f"rule crashed: {msg.label()}: {error}")
            lost = " (answer lost)" if lose_answers else ""
            dup = " (duplicate)" if keep else ""
            moved = f"; {', '.join(changes)}" if changes else ""
            self.log(f"deliver {batch}{msg.label()}{part}{dup} -> {answer}{lost}{moved}")
            if not lose_answers:
                self._answer(msg, value, outcome.error)
        self._flag_new(before)
        # Skip the scan when nothing an invariant reads can have changed: a batch that wrote
        # nothing, renewals (lease deadlines only; the observer checks their fences) and
        # refusals (rolled back, leaving a rejection row).
        wrote = self.h.changes != changes_before
        if wrote and any(
            m.kind is not Kind.RENEW and o.error is None
            for m, o in zip(msgs, outcomes, strict=True)
        ):
            self.check()
        if any(m.kind is Kind.REPORT for m in msgs):
            before = len(self.violations)
            self.check_refs()
            self._flag_new(before)
        return [o.error for o in outcomes]

    def _observe(self, msg: Message, value: Any, error: BaseException | None) -> None:
        obs, k = self.observer, Kind
        ledger_error = error if isinstance(error, LedgerError) else None
        if msg.kind is k.CREATE:
            assert msg.spec is not None
            obs.created(msg.spec, value, ledger_error)
        elif error is not None:
            if msg.kind is k.REPORT and isinstance(error, LedgerError):
                assert msg.report is not None
                obs.reported(
                    msg.report, msg.sender, msg.token, None, error, self.h.now, msg.evidence
                )
            elif msg.kind is k.CHECKPOINT and isinstance(error, LedgerError):
                assert msg.checkpoint is not None
                obs.checkpointed(msg.step_id, msg.checkpoint, error, self.h.now)
        elif msg.kind is k.APPROVE:
            obs.approved_task(msg.task_id, msg.plan_hash, msg.base_sha, msg.observed_head)
        elif msg.kind is k.CANCEL:
            obs.cancelled_task(msg.task_id)
        elif msg.kind is k.HEAD:
            obs.head_moved(msg.tenant, msg.repository, msg.sha)
        elif msg.kind is k.BUDGET:
            obs.budgets[msg.tenant] = msg.tokens
        elif msg.kind in (k.CLAIM, k.GRANT):
            if msg.kind is k.GRANT:
                obs.eager_granted(msg.sender, msg.leases, msg.want, value)
            for lease in value:
                self.grants.append((msg.sender, lease))
                obs.granted(lease, msg.sender, msg.token, self.h.now)
        elif msg.kind is k.CHECKPOINT:
            assert msg.checkpoint is not None
            obs.checkpointed(msg.step_id, msg.checkpoint, None, self.h.now)
        elif msg.kind is k.RENEW:
            obs.renewed(msg.step_id, msg.fence, value, self.h.now)
        elif msg.kind is k.RELEASE:
            obs.released(msg.step_id, msg.fence, msg.reason, msg.retryable)
        elif msg.kind is k.REPORT:
            assert msg.report is not None
            obs.reported(
                msg.report, msg.sender, msg.token, Outcome(value), None, self.h.now, msg.evidence
            )
        elif msg.kind is k.GATE:
            [row] = self.h.query("SELECT digest FROM outbox WHERE step_id = ?", (msg.step_id,))
            obs.gate_opened(msg.step_id, msg.digest, row[0])
        elif msg.kind is k.RESOLVE:
            [row] = self.h.query("SELECT kind, keyed FROM outbox WHERE step_id = ?", (msg.step_id,))
            truth = self.receivers.applied(row[0], bool(row[1]), msg.step_id) > 0
            obs.resolved(msg.step_id, msg.happened, truth=truth)

    def _answer(self, msg: Message, value: Any, error: BaseException | None) -> None:
        if msg.sender == OPERATOR:
            self.operator.answer(msg, value, error)
            return
        for runner in self.runners:
            if runner.id == msg.sender:
                runner.answer(msg, value, error)

    def drop(self, msg: Message) -> None:
        self._gone(msg)
        self.log(f"lose {msg.label()}")

    # -- the supervisor -----------------------------------------------------------------------

    def crash_during(self, msgs: Sequence[Message]) -> None:
        """The supervisor dies inside the batch carrying `msgs`, before its commit."""
        for msg in msgs:
            self._gone(msg)
        # the adapters ran before the batch
        msgs = [self._gathered(p) for m in msgs for p in m.parts()]
        for d in self.dispatchers:
            d.crash()
        refreshed = self.h.crash_before_commit([m.rule() for m in msgs])
        labels = "; ".join(m.label() for m in msgs)
        self.log(f"supervisor crash before commit of [{labels}]; restart refreshed {refreshed}")
        self.observer.restarted(self.h.now)
        self.check()

    def restart(self) -> None:
        for d in self.dispatchers:
            d.crash()
        refreshed = self.h.restart()
        self.log(f"supervisor crash and restart; refreshed {refreshed} leases")
        self.observer.restarted(self.h.now)
        self.check()

    def advance(self, seconds: float) -> None:
        self.h.now += seconds
        self.log(f"clock +{seconds:g}s")

    def reap(self) -> None:
        before, changes_before = len(self.violations), self.h.changes
        [outcome] = self.h.run([_observed(reaper.expire)])
        if outcome.error is not None:
            self.observer.violation(f"rule crashed: reaper: {outcome.error}")
            self._flag_new(before)
            return
        count, states = outcome.value
        self.observer.expired(count, self.h.now)
        changes = self.observer.saw_states(states)
        if count or changes:
            moved = f"; {', '.join(changes)}" if changes else ""
            self.log(f"reaper expired {count}{moved}")
        self._flag_new(before)
        if self.h.changes != changes_before:
            self.check()

    # -- the dispatcher ------------------------------------------------------------------------

    def call(
        self,
        label: str,
        rule: Callable[[Tx], Any],
        *,
        seen: Callable[[Any], None] | None = None,
        describe: Callable[[Any], str] | None = None,
    ) -> tuple[Any, LedgerError | None]:
        """One of the supervisor's own rules (the dispatcher's), as its own transaction;
        `seen` tells the observer of an accepted answer before the task states are read."""
        before, changes_before = len(self.violations), self.h.changes
        [outcome] = self.h.run([_observed(rule)])
        value: Any = None
        error = outcome.error
        moved = ""
        if error is None:
            value, states = outcome.value
            if seen is not None:
                seen(value)
            changes = self.observer.saw_states(states)
            moved = f"; {', '.join(changes)}" if changes else ""
            answer = describe(value) if describe is not None else "ok"
        else:
            answer = f"refused {error.code.value}" if isinstance(error, Refused) else "FAILED"
            if isinstance(error, RuleCrashed) or not isinstance(error, Refused):
                self.observer.violation(f"rule crashed: {label}: {error}")
        self.log(f"{label} -> {answer}{moved}")
        self._flag_new(before)
        if self.h.changes != changes_before:
            self.check()
        return value, error if isinstance(error, LedgerError) else None

    def outbox_ready(self, count: int = 1) -> bool:
        """Whether `outbox_delivery.take` would find at least `count` effects now: ready ones of
        live tasks, or held ones whose hold lapsed (read without a transaction)."""
        [row] = self.h.query(
            "SELECT COUNT(*) FROM outbox o JOIN tasks t ON t.id = o.task_id WHERE"
            " (o.state IN ('due', 'open') AND o.not_before <= ? AND t.state NOT IN"
            " ('SUCCEEDED', 'FAILED', 'CANCELLED')) OR (o.state = 'sending' AND o.held_until < ?)",
            (self.h.now, self.h.now),
        )
        return int(row[0]) >= count

    def delivery_fault(self, out: Outgoing) -> Fault:
        """What the network and the receiver make of one send (none, once faults stop)."""
        habits = self.habits
        for fault, chance in (
            (Fault.UNREACHABLE, habits.unreachable),
            (Fault.BUSY, habits.busy),
            (Fault.LOST, habits.lost),
            (Fault.REFUSE, habits.refuse),
        ):
            if self._misbehaves(chance):
                return fault
        return Fault.NONE

    def duplicate_answer(self) -> bool:
        return self._misbehaves(self.habits.duplicate_answer)

    def sent(self, label: str, out: Outgoing, fault: Fault, answer: Answer) -> None:
        """A dispatcher sent `out`; the receiver's model already applied what it got."""
        before = len(self.violations)
        self.observer.effect_sent(out, reached=fault is not Fault.UNREACHABLE)
        self.observer.effects_now(self.receivers)
        self.log(f"{label} to its receiver ({fault}) -> {describe_answer(answer)}")
        self._flag_new(before)

    # -- the operator -------------------------------------------------------------------------

    def create(self, index: int, *, conflicting: bool = False) -> Message:
        order = self.operator.orders[index]
        order.sent = True
        spec = order.conflicting if conflicting else order.spec
        return self.send(OPERATOR, 0, Kind.CREATE, order=index, spec=spec)

    def approve(self, index: int) -> Message | None:
        """Approve against the repository's head (sometimes a stale base); the supervisor's
        adapter reads the head as it takes the approval."""
        order = self.operator.orders[index]
        if order.task_id is None:
            return None
        spec = order.spec
        base = head = None
        if spec.repository:
            base = head = self.head_of(spec.tenant, spec.repository)
            if self._misbehaves(self.habits.stale_approval):
                base = BASE if base != BASE else f"old{self.rng.randrange(3)}"
        approved = plan_hash(spec)
        if self._misbehaves(self.habits.wrong_plan):
            approved = plan_hash(order.conflicting)
        return self.send(
            OPERATOR,
            0,
            Kind.APPROVE,
            tenant=spec.tenant,
            task_id=order.task_id,
            plan_hash=approved,
            base_sha=base,
            observed_head=head,
        )

    def cancel(self, index: int) -> Message | None:
        order = self.operator.orders[index]
        if order.task_id is None:
            return None
        return self.send(OPERATOR, 0, Kind.CANCEL, tenant=order.spec.tenant, task_id=order.task_id)

    def move_head(self, index: int, *, revert: bool = False) -> Message | None:
        spec = self.operator.orders[index].spec
        if not spec.repository:
            return None
        if revert:
            sha = self.observer.approved.get(self.operator.orders[index].task_id or "") or BASE
        else:
            self._shas += 1
            sha = f"sha{self._shas}"
        self.repos.push(spec.tenant, spec.repository, sha)  # the webhook is on its way
        return self.send(
            OPERATOR, 0, Kind.HEAD, tenant=spec.tenant, repository=spec.repository, sha=sha
        )

    def set_budget(self, tenant: str, tokens: int | None) -> Message:
        return self.send(OPERATOR, 0, Kind.BUDGET, tenant=tenant, tokens=tokens)

    def effects_in(self, state: str) -> list[Row]:
        """The effects in outbox `state` ("gated", "uncertain") as `task gate` shows them to
        the operator: step, name, kind and the rendered request's digest."""
        return self.h.query(
            "SELECT o.step_id, o.task_id, o.kind, o.keyed, o.digest, o.said_no, s.name,"
            " t.tenant FROM outbox o JOIN steps s ON s.id = o.step_id JOIN tasks t"
            " ON t.id = o.task_id WHERE o.state = ? ORDER BY o.created_at",
            (state,),
        )

    def open_gate(self, row: Row) -> Message:
        """Open a gated effect's gate for the digest shown (a slip: another digest)."""
        digest = row["digest"]
        if self._misbehaves(self.habits.wrong_digest):
            digest = content_hash({"another request": digest})
        return self.send(
            OPERATOR,
            0,
            Kind.GATE,
            tenant=row["tenant"],
            task_id=row["task_id"],
            step_id=row["step_id"],
            step_name=row["name"],
            digest=digest,
        )

    def resolve(self, row: Row) -> Message:
        """Say whether an uncertain effect happened, as its receiver's owner tells (a slip:
        at random). An honest `no` is said once; the second time the operator cancels."""
        happened = self.receivers.applied(row["kind"], bool(row["keyed"]), row["step_id"]) > 0
        if self._misbehaves(self.habits.guess):
            happened = self.rng.random() < 0.5
        elif not happened and row["said_no"]:
            return self.send(OPERATOR, 0, Kind.CANCEL, tenant=row["tenant"], task_id=row["task_id"])
        return self.send(
            OPERATOR,
            0,
            Kind.RESOLVE,
            tenant=row["tenant"],
            task_id=row["task_id"],
            step_id=row["step_id"],
            step_name=row["name"],
            happened=happened,
        )

    # -- runners ------------------------------------------------------------------------------

    def claim(self, runner: RunnerActor, capacity: int = 1) -> Message:
        return self.send(runner.id, runner.incarnation, Kind.CLAIM, capacity=capacity)

    def act(
        self,
        runner: RunnerActor,
        step_id: str,
        *,
        finish: bool | None = None,
        want: int = 0,
        together: bool = False,
    ) -> Message:
        """The runner's next move on one held lease: acknowledge, renew, finish, or report.
        With `want`, a report carries every other result the runner has ready and asks for
        `want` leases next; with `together`, a renew carries every other lease it is not
        reporting (docs/design.md, Runner API)."""
        held = runner.held[step_id]
        lease = held.lease
        if held.phase is HeldPhase.NEW and finish is None and self.rng.random() < QUICK_STEPS:
            held.phase = HeldPhase.WORKING  # a quick step: done before its first renew
        if held.phase is HeldPhase.WORKING:
            roll = self.rng.random()
            if finish is None and roll < self.habits.release and not self.honest:
                return self._release(runner, held)
            if finish or (finish is None and roll < 0.6):
                held.phase = HeldPhase.REPORTING
                held.report = self._result(lease.step_id, lease.fence, lease.payload, held)
            elif finish is None and roll < 0.85:
                return self.checkpoint(runner, held)
        if held.phase is HeldPhase.REPORTING:
            assert held.report is not None
            if want >= 1:
                return self.report_with_want(runner, held.report, want)
            return self.send(runner.id, runner.incarnation, Kind.REPORT, report=held.report)
        if together:
            return self.renew_together(runner, step_id)
        return self.send(
            runner.id, runner.incarnation, Kind.RENEW, step_id=step_id, fence=lease.fence
        )

    def _idle(self, runner: RunnerActor, step_id: str, reporting: bool) -> list[Held]:
        """The runner's other leases it is not waiting on, reporting ones or the others."""
        return [
            h
            for s, h in sorted(runner.held.items())
            if s != step_id
            and not self.busy(runner.id, s)
            and (h.phase is HeldPhase.REPORTING) == reporting
        ]

    def report_with_want(self, runner: RunnerActor, report: Report, want: int) -> Message:
        """One results request: `report` and every other ready result (sometimes a step that
        finished at the same moment too), then the eager grant of up to `want` leases in the
        same batch."""
        for held in self._idle(runner, report.step_id, False):
            if held.phase is HeldPhase.WORKING and self.rng.random() < FINISHED_TOGETHER:
                lease = held.lease
                held.phase = HeldPhase.REPORTING
                held.report = self._result(lease.step_id, lease.fence, lease.payload, held)
        ready = [h.report for h in self._idle(runner, report.step_id, True) if h.report]
        return self.send(
            runner.id, runner.incarnation, Kind.RESULTS, reports=(report, *ready), want=want
        )

    def renew_together(self, runner: RunnerActor, step_id: str) -> Message:
        """One renewals request: `step_id`'s lease and every other one not reporting."""
        held = [runner.held[step_id], *self._idle(runner, step_id, False)]
        leases = tuple((h.lease.step_id, h.lease.fence) for h in held)
        if len(leases) == 1:
            return self.send(
                runner.id, runner.incarnation, Kind.RENEW, step_id=step_id, fence=leases[0][1]
            )
        return self.send(runner.id, runner.incarnation, Kind.RENEWALS, leases=leases)

    def checkpoint(self, runner: RunnerActor, held: Held) -> Message:
        """Another turn completed: checkpoint it under the lease's fence (sometimes twice)."""
        held.turn += 1
        held.spent += TURN_TOKENS
        lease = held.lease
        changed = self.rng.random() < CHANGED_WORKTREE
        cp = Checkpoint(
            fence=lease.fence,
            turn=held.turn,
            transcript=f"t:{lease.step_id}:{lease.fence}:{held.turn}",
            bundle=f"w{lease.fence}.{held.turn}" if changed else None,
            sha=f"w{lease.fence}t{held.turn}" if changed else None,
            usage={"total_tokens": held.spent},
            step_usage={"total_tokens": held.step_tokens},
        )
        msg = self.send_checkpoint(runner.id, runner.incarnation, lease.step_id, cp)
        if self._misbehaves(DUPLICATE_CHECKPOINT):
            self.send_checkpoint(runner.id, runner.incarnation, lease.step_id, cp)
        return msg

    def send_checkpoint(
        self, sender: str, incarnation: int, step_id: str, cp: Checkpoint
    ) -> Message:
        return self.send(
            sender, incarnation, Kind.CHECKPOINT, step_id=step_id, fence=cp.fence, checkpoint=cp
        )

    def _release(self, runner: RunnerActor, held: Held) -> Message:
        reason = self.rng.choice(list(ReleaseReason))
        retryable = reason is not ReleaseReason.INVALID
        return self.send(
            runner.id,
            runner.incarnation,
            Kind.RELEASE,
            step_id=held.lease.step_id,
            fence=held.lease.fence,
            reason=reason,
            retryable=retryable,
        )

    def _result(self, step_id: str, fence: int, payload: Any, held: Held) -> Report:
        """The attempt's result: its running usage with the last turn's, and for a
        repository-bound step the work it did (sometimes none, sometimes forged)."""
        payload_hash = held.lease.payload_hash
        if self._misbehaves(self.habits.drift):
            payload_hash = content_hash({"drifted": payload})
        usage = {"total_tokens": held.spent + TURN_TOKENS}
        if not payload.get("repo") or self._misbehaves(self.habits.sloppy):
            return Report(
                step_id=step_id,
                fence=fence,
                payload_hash=payload_hash,
                output={"step": step_id, "fence": fence},
                usage=usage,
            )
        forgery = self.forgery
        if forgery is None and self._misbehaves(self.habits.forge):
            forgery = self.rng.choice(FORGERIES)
        work = self.repos.work(
            step_id, fence, held.lease.repository, payload.get("checks", []), forgery
        )
        return Report(
            step_id=step_id,
            fence=fence,
            payload_hash=payload_hash,
            output={"step": step_id, "fence": fence},
            usage=usage,
            candidate_sha=work.candidate,
            bundle=work.bundle,
            checks=work.checks,
        )

    def crash_runner(self, runner: RunnerActor) -> None:
        held = ", ".join(f"{s} f{h.lease.fence}" for s, h in sorted(runner.held.items()))
        runner.crash()
        self.log(f"runner {runner.id} crashes, forgetting [{held}]")

    # -- status consumers ---------------------------------------------------------------------

    def consumer(self, task_id: str) -> Consumer:
        return self.consumers.setdefault(task_id, Consumer(task_id))

    def poll(self, task_id: str) -> None:
        consumer = self.consumer(task_id)
        after, before = consumer.last_seq, len(self.violations)
        events = views.events_after(self.h.reads, task_id, after)
        for problem in consumer.apply(events):
            self.observer.violation(problem)
        self.log(
            f"consumer {task_id} polls after seq {after}: {len(events)} events,"
            f" view {consumer.state} at seq {consumer.last_seq}"
        )
        self._flag_new(before)

    def replay_old(self, task_id: str, after: int | None = None) -> None:
        """Redeliver events the consumer already applied, shuffled and duplicated."""
        consumer = self.consumer(task_id)
        start = self.rng.randrange(consumer.last_seq + 1) if after is None else after
        events = views.events_after(self.h.reads, task_id, start)
        events = [e for e in events if e.seq <= consumer.last_seq]
        events = events + self.rng.sample(events, len(events) // 2)
        self.rng.shuffle(events)
        before = len(self.violations)
        view = consumer.state
        for problem in consumer.apply(events):
            self.observer.violation(problem)
        if consumer.state != view:
            self.observer.violation(
                f"consumer: replaying old seqs moved {task_id}'s view from {view} to"
                f" {consumer.state}"
            )
        self.log(
            f"consumer {task_id} gets {len(events)} old events (seq > {start}) again;"
            f" view stays {consumer.state}"
        )
        self._flag_new(before)

    # -- the end of a schedule ----------------------------------------------------------------

    def flush(self) -> None:
        """Deliver everything in flight, in order, as one group-commit batch."""
        if self.queue:
            self.deliver(list(self.queue))
