"""The simulated parties: an operator, runners and the messages they put on the network.

A message is one request as it travels to the supervisor; the network may lose, duplicate or
reorder it, and lose its answer. A request that carries many rules (results with `want`,
batched renewals: docs/design.md, Runner API) is one message whose `parts` reach the
supervisor's writer together, in one group-commit batch. Clients only learn what answers
reach them: a runner that never hears its claim answer holds nothing, one that never hears its
report answer reports again. A crashed runner forgets everything; answers meant for the
process that died are lost.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from random import Random
from typing import Any

from tether.sim.repos import ALLOWED, BASE
from tether.supervisor.ledger import checkpoints, effects, fencing, identity, operator, outbox_gates
from tether.supervisor.ledger.identity import Created, StepSpec, TaskSpec
from tether.supervisor.ledger.tx import Tx
from tether.supervisor.ledger.verification import Evidence
from tether.wire import ReleaseReason
from tether.wire.records import Checkpoint, Checkpointed, Lease, Renewal, Report

OPERATOR = "operator"
POOL = "default"
# What the explorer's runners announce when they claim: every step of its scenarios is chat.
KINDS = ("chat",)
TENANTS = ("acme", "globex")
REPOSITORIES = ("repo0", "repo1")  # each tenant added both at setup (`repo add`)
CHECKS = ("lint", "test")
TURN_TOKENS = 10  # what one turn of a simulated agent spends
# The pool's runner tokens: runner i claims with the i-th (round robin), and every report of
# an attempt goes with the token that claimed it. The intruder holds another of them and
# claims nothing (hazard `lease-takeover`).
RUNNER_TOKENS = ("token-a", "token-b")
INTRUDER = "intruder"


_plan_hashes: dict[int, tuple[TaskSpec, str]] = {}


def plan_hash(spec: TaskSpec) -> str:
    """`spec.plan_hash`, computed once per spec: the explorer asks for it on every label and
    answer, and hashing a plan costs more than most rules."""
    held = _plan_hashes.get(id(spec))
    if held is None or held[0] is not spec:
        if len(_plan_hashes) > 256:
            _plan_hashes.clear()
        held = _plan_hashes[id(spec)] = (spec, spec.plan_hash)
    return held[1]


class Kind(enum.StrEnum):
    CREATE = "create"
    APPROVE = "approve"
    CANCEL = "cancel"
    HEAD = "head"
    BUDGET = "budget"
    CLAIM = "claim"
    GRANT = "grant"  # the eager grant after a request's results (a part of RESULTS)
    RENEW = "renew"
    RENEWALS = "renewals"  # many leases renewed in one request (parts: RENEW)
    RELEASE = "release"
    REPORT = "report"
    RESULTS = "results"  # results asking for the next leases (parts: REPORT..., GRANT)
    CHECKPOINT = "checkpoint"
    GATE = "gate"  # the operator opens an unkeyed effect's gate for the digest shown
    RESOLVE = "resolve"  # the operator says whether an uncertain effect happened


@dataclasses.dataclass(frozen=True, kw_only=True)
class Message:
    id: int
    sender: str
    incarnation: int
    kind: Kind
    token: str | None = None  # the runner token a runner's request goes with
    order: int = -1
    spec: TaskSpec | None = None
    tenant: str = ""
    task_id: str = ""
    plan_hash: str = ""
    base_sha: str | None = None
    repository: str = ""
    sha: str = ""
    capacity: int = 1
    tokens: int | None = None
    step_id: str = ""
    fence: int = 0
    reason: ReleaseReason = ReleaseReason.TRANSIENT
    retryable: bool = True
    report: Report | None = None
    # What the supervisor's adapters read just before the rule: the repository's head for an
    # approval, the evidence for a report of a repository-bound step.
    observed_head: str | None = None
    evidence: Evidence | None = None
    checkpoint: Checkpoint | None = None
    step_name: str = ""  # an effect step's name, for the operator's gate and resolve
    digest: str = ""
    happened: bool = False
    # RESULTS: the reports and how many leases they ask for next; RENEWALS and GRANT: the
    # (step id, fence) of the leases renewed, or of the results reported
    reports: tuple[Report, ...] = ()
    want: int = 0
    leases: tuple[tuple[str, int], ...] = ()

    def parts(self) -> list[Message]:
        """The rules this request puts in the writer's queue, in the store's order: each
        result's report then the eager grant (`want` >= 1); each lease's renew."""
        if self.kind is Kind.RESULTS:
            reports = [
                dataclasses.replace(self, kind=Kind.REPORT, report=r, reports=(), want=0)
                for r in self.reports
            ]
            if self.want < 1:
                return reports
            reported = tuple((r.step_id, r.fence) for r in self.reports)
            grant = dataclasses.replace(self, kind=Kind.GRANT, reports=(), leases=reported)
            return [*reports, grant]
        if self.kind is Kind.RENEWALS:
            return [
                dataclasses.replace(self, kind=Kind.RENEW, step_id=s, fence=f, leases=())
                for s, f in self.leases
            ]
        return [self]

    def rule(self) -> Callable[[Tx], Any]:
        k = Kind
        if self.kind is k.CREATE:
            assert self.spec is not None
            spec = self.spec
            return lambda tx: identity.create_task(tx, spec)
        if self.kind is k.APPROVE:
            return lambda tx: operator.approve(
                tx, self.tenant, self.task_id, self.plan_hash, self.base_sha, self.observed_head
            )
        if self.kind is k.CANCEL:
            return lambda tx: operator.cancel(tx, self.tenant, self.task_id, "chaos cancel")
        if self.kind is k.HEAD:
            return lambda tx: operator.set_repository_head(
                tx, self.tenant, self.repository, self.sha
            )
        if self.kind is k.BUDGET:
            return lambda tx: operator.set_budget(tx, self.tenant, self.tokens)
        if self.kind is k.CLAIM:
            return lambda tx: fencing.claim(
                tx, self.sender, POOL, self.capacity, token_id=self.token, kinds=KINDS
            )
        if self.kind is k.GRANT:
            reported, want = list(self.leases), self.want
            return lambda tx: fencing.claim_after_results(
                tx, reported, self.sender, POOL, want, token_id=self.token, kinds=KINDS
            )
        if self.kind is k.RENEW:
            return lambda tx: fencing.renew(tx, self.step_id, self.fence, POOL, token_id=self.token)
        if self.kind is k.RELEASE:
            return lambda tx: fencing.release(
                tx,
                self.step_id,
                self.fence,
                self.reason,
                self.retryable,
                "chaos",
                POOL,
                token_id=self.token,
            )
        if self.kind is k.CHECKPOINT:
            assert self.checkpoint is not None
            cp = self.checkpoint
            return lambda tx: checkpoints.checkpoint(
                tx, self.step_id, cp, POOL, token_id=self.token
            )
        if self.kind is k.GATE:
            return lambda tx: outbox_gates.open_gate(
                tx, self.tenant, self.task_id, self.step_name, self.digest, OPERATOR
            )
        if self.kind is k.RESOLVE:
            return lambda tx: outbox_gates.resolve(
                tx, self.tenant, self.task_id, self.step_name, self.happened, OPERATOR
            )
        assert self.report is not None
        rep, evidence = self.report, self.evidence
        return lambda tx: effects.report(tx, rep, POOL, evidence, token_id=self.token)

    @property
    def subject(self) -> tuple[str, str]:
        """What a client waits on while this message is in flight: one claim per runner, one
        request per lease, order or task."""
        if self.kind is Kind.CLAIM:
            return (self.sender, "claim")
        if self.report is not None:
            return (self.sender, self.report.step_id)
        if self.kind is Kind.CREATE and self.spec is not None:
            return (self.sender, f"key {self.spec.idempotency_key}")
        return (self.sender, self.step_id or self.task_id or self.repository)

    @property
    def subjects(self) -> tuple[tuple[str, str], ...]:
        """`subject` of each part: a request of many leases holds each of them."""
        if self.kind in (Kind.RESULTS, Kind.RENEWALS):
            return tuple(p.subject for p in self.parts() if p.kind is not Kind.GRANT)
        return (self.subject,)

    def label(self) -> str:
        k, who = Kind, f"m{self.id} {self.sender}"
        if self.kind is k.CREATE:
            assert self.spec is not None
            return (
                f"{who} create {self.spec.tenant}/{self.spec.idempotency_key}"
                f" plan {plan_hash(self.spec)[:8]}"
            )
        if self.kind is k.APPROVE:
            return (
                f"{who} approve {self.task_id} plan {self.plan_hash[:8]} base {self.base_sha}"
                f" head {self.observed_head}"
            )
        if self.kind is k.CANCEL:
            return f"{who} cancel {self.task_id}"
        if self.kind is k.HEAD:
            return f"{who} head {self.tenant}/{self.repository} = {self.sha}"
        if self.kind is k.BUDGET:
            return f"{who} budget {self.tenant} = {self.tokens} tokens"
        if self.kind is k.CLAIM:
            return f"{who} claim x{self.capacity}"
        if self.kind is k.GRANT:
            reported = ", ".join(f"{s} f{f}" for s, f in self.leases)
            return f"{who} eager grant x{self.want} after [{reported}]"
        if self.kind in (k.RESULTS, k.RENEWALS):
            return f"{who} {self.kind} [" + "; ".join(p.label() for p in self.parts()) + "]"
        if self.kind is k.RENEW:
            return f"{who} renew {self.step_id} fence {self.fence}"
        if self.kind is k.RELEASE:
            kind = "retryable" if self.retryable else "final"
            return f"{who} release {self.step_id} fence {self.fence} {self.reason} {kind}"
        if self.kind is k.GATE:
            return f"{who} gate {self.step_id} ({self.step_name}) open for {self.digest[:8]}"
        if self.kind is k.RESOLVE:
            return f"{who} resolve {self.step_id} ({self.step_name}) happened {self.happened}"
        if self.kind is k.CHECKPOINT:
            assert self.checkpoint is not None
            cp = self.checkpoint
            return (
                f"{who} checkpoint {self.step_id} fence {cp.fence} turn {cp.turn}"
                f" sha {cp.sha or '-'} tokens {cp.usage.get('total_tokens', 0)}"
            )
        assert self.report is not None
        rep = self.report
        checks = ",".join(f"{n}={c.exit_code}" for n, c in sorted(rep.checks.items())) or "-"
        found = ""
        if self.evidence is not None:
            codes = ",".join(p.code.value for p in self.evidence.problems)
            found = f" head {self.evidence.head_sha}" + (f" problems {codes}" if codes else "")
        return (
            f"{who} report {rep.step_id} fence {rep.fence} payload {rep.payload_hash[:8]}"
            f" candidate {rep.candidate_sha or '-'} bundle {rep.bundle or '-'} checks"
            f" {checks}{found}"
        )


def describe(kind: Kind, value: Any) -> str:
    """An answer, for the trace."""
    if isinstance(value, Created):
        return f"{value.task_id} {'new' if value.created else 'existing'}"
    if kind in (Kind.CLAIM, Kind.GRANT):
        leases: list[Lease] = value
        return (
            ", ".join(
                f"{x.step_id} a{x.attempt} f{x.fence}"
                + (f" resume t{x.resume.turn} f{x.resume.fence}" if x.resume else "")
                for x in leases
            )
            or "nothing"
        )
    if isinstance(value, Renewal):
        return "cancelled" if value.cancelled else "renewed"
    if isinstance(value, Checkpointed):
        return f"checkpointed after turn {value.turn}"
    return "ok" if value is None else str(value)


# -- the operator ---------------------------------------------------------------------------


@dataclasses.dataclass
class Order:
    """One logical execution the operator wants: its spec, and a conflicting spec that reuses
    its idempotency key with another plan."""

    spec: TaskSpec
    conflicting: TaskSpec
    task_id: str | None = None
    sent: bool = False


def make_orders(rng: Random, count: int) -> list[Order]:
    orders = []
    for i in range(count):
        tenant = TENANTS[0] if rng.random() < 0.8 else TENANTS[1]
        repository = f"repo{rng.randrange(2)}" if rng.random() < 0.6 else None
        checks = tuple(c for c in CHECKS if rng.random() < 0.5) if repository else ()
        n = rng.randint(1, 3)
        steps = tuple(
            StepSpec(
                name=f"s{j}",
                kind="chat",
                payload={
                    "order": i,
                    "n": j,
                    "repo": bool(repository),
                    "last": j == n - 1,
                    "checks": list(checks) if j == n - 1 else [],
                },
            )
            for j in range(n)
        )
        steps = with_effects(rng, i, steps, bool(repository))
        spec = TaskSpec(
            tenant=tenant,
            idempotency_key=f"k{i}",
            steps=steps,
            repository=repository,
            base_sha=BASE if repository else None,
            allowed_paths=(ALLOWED,) if repository else (),
            expected_checks=checks,
        )
        # The same key for another task: another plan, or (every other order) the same plan
        # declaring another owner, which is just as much another task (`same_task`).
        other = (
            dataclasses.replace(
                spec,
                steps=(StepSpec(name="s0", kind="chat", payload={"order": i, "other": True}),),
            )
            if i % 2 == 0
            else dataclasses.replace(spec, owner="someone-else")
        )
        orders.append(Order(spec=spec, conflicting=other))
    return orders


EFFECTFUL = 0.7  # the share of orders whose plans have effect steps


def with_effects(
    rng: Random, order: int, steps: tuple[StepSpec, ...], repository: bool
) -> tuple[StepSpec, ...]:
    """`steps` with effect steps added, for some orders: a keyed `http` deploy, an unkeyed
    `http` notification, and for a repository task a `git.push` of its candidate. On a
    repository task they follow every runner step (verification runs before the first is
    due, and the push moves the head its later steps would be checked against); elsewhere
    anywhere, its body naming the first step's output when it follows that step."""
    if rng.random() >= EFFECTFUL:
        return steps
    # Where each effect goes: after every runner step on a repository task, else anywhere.
    kinds = [kind for kind, chance in (("deploy", 0.7), ("notify", 0.4)) if rng.random() < chance]
    if repository and rng.random() < 0.6:
        kinds.append("push")
    placed = list(steps)
    for kind in kinds:
        # (Half of them first: due at approval, so the faults meet them.)
        at = len(placed) if repository else rng.choice([0, rng.randint(0, len(placed))])
        first = next(i for i, s in enumerate(placed) if s.name == "s0")
        placed.insert(at, effect_step(rng, order, kind, after_s0=at > first))
    return tuple(placed)


def effect_step(rng: Random, order: int, kind: str, *, after_s0: bool) -> StepSpec:
    """A keyed `deploy`, an unkeyed `notify` (both `http`, their body naming the first
    step's output when they follow it) or a `push` of the task's candidate."""
    if kind == "push":
        return StepSpec(name="push", kind="git.push", payload={"branch": "main"})
    body: dict[str, Any] = {"order": order}
    if after_s0:
        body["after"] = "{{ steps.s0.output.fence }}"
    payload: dict[str, Any] = {
        "method": "POST",
        "url": f"http://receiver.test/{kind}",
        "body": body,
    }
    if kind == "notify":
        payload["keyed"] = False
    else:
        payload["deadline_s"] = rng.choice([60, 300])
    return StepSpec(name=kind, kind="http", payload=payload)


@dataclasses.dataclass
class Operator:
    orders: list[Order]

    def answer(self, msg: Message, value: Any, error: BaseException | None) -> None:
        if msg.kind is Kind.CREATE and error is None and isinstance(value, Created):
            order = self.orders[msg.order]
            if msg.spec is order.spec:
                order.task_id = value.task_id


# -- runners --------------------------------------------------------------------------------


class HeldPhase(enum.StrEnum):
    """Where a simulated runner is with a lease it holds."""

    NEW = "new"  # granted; not yet acknowledged by a renew
    WORKING = "working"
    REPORTING = "reporting"  # the result is ready; report until an answer arrives


@dataclasses.dataclass
class Held:
    """A lease a runner holds, with its agent's progress: the turns completed (counting those
    of the checkpoint it resumed from) and the tokens this attempt spent."""

    lease: Lease
    phase: HeldPhase = HeldPhase.NEW
    report: Report | None = None
    turn: int = 0
    spent: int = 0

    def __post_init__(self) -> None:
        if self.lease.resume is not None:
            self.turn = self.lease.resume.turn

    @property
    def step_tokens(self) -> int:
        """What the completed turns of the step spent, in every attempt."""
        resumed = self.lease.resume
        return self.spent + (resumed.usage.get("total_tokens", 0) if resumed else 0)


@dataclasses.dataclass
class RunnerActor:
    """A runner process as the explorer plays it: the token it claims and reports with, the
    leases it holds, and which incarnation of it is alive (answers to an earlier, crashed one
    are dropped)."""

    id: str
    token: str
    incarnation: int = 0
    held: dict[str, Held] = dataclasses.field(default_factory=dict)

    def crash(self) -> None:
        self.incarnation += 1
        self.held.clear()

    def answer(self, msg: Message, value: Any, error: BaseException | None) -> None:
        if msg.incarnation != self.incarnation:
            return  # the process that asked is gone
        if msg.kind in (Kind.CLAIM, Kind.GRANT):
            if error is None:
                for lease in value:
                    self.held[lease.step_id] = Held(lease=lease)
            return
        step_id = msg.report.step_id if msg.report is not None else msg.step_id
        held = self.held.get(step_id)
        if held is None or held.lease.fence != (msg.report.fence if msg.report else msg.fence):
            return
        if msg.kind is Kind.RENEW and error is None and not value.cancelled:
            if held.phase is HeldPhase.NEW:
                held.phase = HeldPhase.WORKING
            return
        if msg.kind is Kind.CHECKPOINT and error is None:
            return  # checkpointed: work goes on
        # Any other answer ends this runner's part: committed, replayed, refused or cancelled.
        del self.held[step_id]
