"""Hypothesis drives the real ledger rules and a small pure-Python model of docs/design.md (The
invariant to Task state machine) side by
side, and after every step compares them: answers (or the refusal's code), task and step states,
current fences, attempts, effects per step and the fence counter; the ledger's own invariant
check must stay empty throughout.

Profiles: a small, fast one by default; `CI=true` selects the `ci` profile of 1,000 examples.
The same machine runs on PostgreSQL (`TestLedgerVersusModelOnPostgresql`, a scratch database
emptied between examples as the explorer's), with fewer examples: each step there costs a few
dozen round trips to the server.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tether.sim.harness import Harness, Scratch, Workspace, scratch_root
from tether.supervisor.ledger import effects, fencing, identity, operator, reaper, repositories
from tether.supervisor.ledger.errors import LedgerError
from tether.supervisor.ledger.identity import StepSpec, TaskSpec
from tether.supervisor.ledger.invariants import find_violations
from tether.supervisor.ledger.tx import LedgerConfig
from tether.supervisor.ledger.verification import Evidence
from tether.wire import Outcome, ReleaseReason, content_hash
from tether.wire.records import CheckRun, Report

settings.register_profile(
    "ledger-dev",
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ledger-ci",
    max_examples=1000,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# The CI profile's thousand examples take 60-110 s alone and more beside the rest of the suite
# on two loaded cores: past the suite's 120 s per-test bound, which is for hangs, not this.
pytestmark = pytest.mark.timeout(900)
settings.register_profile(
    "ledger-pg-dev",
    max_examples=15,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ledger-pg-ci",
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
ON_CI = os.environ.get("CI", "").lower() == "true"
PROFILE = "ledger-ci" if ON_CI else "ledger-dev"
PG_PROFILE = "ledger-pg-ci" if ON_CI else "ledger-pg-dev"

FEW = st.sampled_from([False, False, False, True])  # a fault now and then, not half the time
CONFIG = LedgerConfig(lease_ttl_s=30.0, accept_window_s=10.0, max_attempts=2)
TENANT = "acme"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}

_scratch = scratch_root()
_workspace = Workspace(_scratch.__enter__())
atexit.register(_scratch.__exit__, None, None, None)


def make_spec(key: str, variant: int, steps: int, repository: bool) -> TaskSpec:
    return TaskSpec(
        tenant=TENANT,
        idempotency_key=key,
        steps=tuple(
            StepSpec(name=f"s{j}", kind="chat", payload={"v": variant, "n": j})
            for j in range(steps)
        ),
        repository="repo" if repository else None,
        base_sha="sha0" if repository else None,
        expected_checks=("lint",) if repository else (),
    )


# -- the model --------------------------------------------------------------------------------


@dataclasses.dataclass
class MStep:
    id: str
    payload_hash: str
    state: str = "waiting"
    fence: int | None = None
    attempt: int = 0
    burned: int = 0
    deadline: float | None = None
    accept: float | None = None
    effects: int = 0
    candidate: str | None = None


@dataclasses.dataclass
class MTask:
    id: str
    spec: TaskSpec
    steps: list[MStep]
    state: str = "PLANNED"
    approved: bool = False
    base: str | None = None
    # (candidate, check) -> the exit code of its latest run there
    runs: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)


# Each runner claims with its own token of the pool (a lease is its token's alone).
TOKENS = {"r0": "tok-r0", "r1": "tok-r1"}


class Refusal(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class Model:
    """The invariant and the state machine in a few dozen lines: what the ledger must answer
    and become."""

    def __init__(self) -> None:
        self.now = 0.0
        self.fence = 0
        self.alive: int | None = None  # the reaper's stamp, microseconds (none before a start)
        self.tasks: dict[str, MTask] = {}
        self.keys: dict[str, str] = {}
        self.heads: dict[str, str] = {}  # recorded by the ledger
        self.real = "sha0"  # the repository's head: what the adapters read
        self.holders: dict[tuple[str, int], str] = {}  # (step, fence) -> the token granted it

    def step(self, step_id: str) -> tuple[MTask, MStep]:
        task = self.tasks[step_id.rsplit(".", 1)[0]]
        return task, task.steps[int(step_id.rsplit(".", 1)[1])]

    def create(self, spec: TaskSpec, new_id: str) -> tuple[str, bool]:
        known = self.keys.get(spec.idempotency_key)
        if known is not None:
            if self.tasks[known].spec != spec:
                raise Refusal("idempotency_conflict")
            return known, False
        steps = [MStep(f"{new_id}.{j}", content_hash(s.payload)) for j, s in enumerate(spec.steps)]
        self.tasks[new_id] = MTask(id=new_id, spec=spec, steps=steps)
        self.keys[spec.idempotency_key] = new_id
        return new_id, True

    def move(self, task: MTask, target: str) -> None:
        allowed = {
            "PLANNED": {"APPROVED", "CANCELLED"},
            "APPROVED": {"QUEUED", "CANCELLED"},
            "QUEUED": {"RUNNING", "FAILED", "CANCELLED"},
            "RUNNING": {"VERIFYING", "FAILED", "CANCELLED"},
            "VERIFYING": {"SUCCEEDED", "FAILED"},
        }
        if task.state in TERMINAL:
            raise Refusal("terminal")
        if target not in allowed[task.state]:
            raise Refusal("invalid_transition")
        task.state = target

    def approve(self, task: MTask, plan_hash: str, base: str | None) -> None:
        if plan_hash != task.spec.plan_hash:
            raise Refusal("plan_mismatch")
        if task.approved and task.base == base:
            return
        if task.spec.repository and base != self.real:
            raise Refusal("stale_base")
        self.move(task, "APPROVED")
        task.approved, task.base = True, base
        if task.spec.repository:
            self.observe(self.real)
        self.move(task, "QUEUED")
        task.steps[0].state = "queued"

    def observe(self, sha: str) -> None:
        """The head `sha` is recorded: approved tasks on another base fail at once."""
        self.heads["repo"] = sha
        for task in self.tasks.values():
            if not task.spec.repository or not task.approved or task.state in TERMINAL:
                continue
            if task.base == sha:
                continue
            for s in task.steps:
                if s.state not in ("committed", "failed"):
                    s.state = "failed" if s.state == "leased" else "cancelled"
                    s.fence = s.deadline = s.accept = None
            self.move(task, "FAILED")

    def cancel(self, task: MTask) -> None:
        self.move(task, "CANCELLED")
        for s in task.steps:
            if s.state not in ("committed", "failed"):
                s.state, s.deadline, s.accept = "cancelled", None, None

    def claim(self, token: str) -> list[str]:
        for task in self.tasks.values():  # creation order
            if task.state not in ("QUEUED", "RUNNING"):
                continue
            for s in task.steps:
                if s.state == "queued":
                    self.fence += 1
                    s.state, s.fence, s.attempt = "leased", self.fence, s.attempt + 1
                    self.holders[(s.id, self.fence)] = token
                    s.deadline, s.accept = self.now + CONFIG.lease_ttl_s, self.now + 10.0
                    if task.state == "QUEUED":
                        task.state = "RUNNING"
                    return [s.id]
        return []

    def held(self, step_id: str, fence: int, token: str) -> None:
        """A lease belongs to the token that claimed it: any other token, or a fence the step
        never had, is answered as an unknown step."""
        if self.holders.get((step_id, fence)) != token:
            raise Refusal("not_found")

    def current(self, step_id: str, fence: int) -> tuple[MTask, MStep]:
        task, s = self.step(step_id)
        if s.fence != fence:
            raise Refusal("stale_fence")
        lapsed = (s.deadline is not None and s.deadline <= self.now) or (
            s.accept is not None and s.accept <= self.now
        )
        if s.state == "leased" and lapsed:  # over on the supervisor's clock, reaped or not
            raise Refusal("stale_fence")
        return task, s

    def renew(self, step_id: str, fence: int, token: str) -> bool:
        self.held(step_id, fence, token)
        task, s = self.current(step_id, fence)
        if task.state == "CANCELLED":
            return True
        if s.state != "leased":
            raise Refusal("stale_fence")
        s.deadline, s.accept = self.now + CONFIG.lease_ttl_s, None
        return False

    def release(
        self, step_id: str, fence: int, token: str, reason: ReleaseReason, retryable: bool
    ) -> None:
        self.held(step_id, fence, token)
        task, s = self.current(step_id, fence)
        if task.state == "CANCELLED":
            return
        if s.state != "leased":
            raise Refusal("stale_fence")
        if not retryable:
            self.fail(task, s)
            return
        uncounted = (ReleaseReason.OPERATOR, ReleaseReason.SHUTDOWN, ReleaseReason.PREEMPTED)
        self.requeue(task, s, counted=reason not in uncounted)

    def requeue(self, task: MTask, s: MStep, *, counted: bool) -> None:
        s.burned += 1 if counted else 0
        if s.burned >= CONFIG.max_attempts:
            self.fail(task, s)
            return
        s.state, s.fence, s.deadline, s.accept = "queued", None, None, None

    def fail(self, task: MTask, s: MStep) -> None:
        s.state, s.fence, s.deadline, s.accept = "failed", None, None, None
        self.move(task, "FAILED")

    def report(self, rep: Report, token: str) -> Outcome:
        self.held(rep.step_id, rep.fence, token)
        task, s = self.step(rep.step_id)
        if rep.payload_hash != s.payload_hash:
            raise Refusal("payload_drift")
        if s.state == "committed":
            self.current(rep.step_id, rep.fence)  # only the committing fence hears `replayed`
            return Outcome.REPLAYED
        if task.state in TERMINAL:
            raise Refusal("terminal")
        self.current(rep.step_id, rep.fence)
        s.state, s.effects, s.candidate = "committed", s.effects + 1, rep.candidate_sha
        s.deadline = s.accept = None
        for name, run in rep.checks.items():
            task.runs[(rep.candidate_sha or "", name)] = run.exit_code
        if task.spec.repository:
            self.observe(self.real)  # the evidence's head
            if task.state in TERMINAL:
                return Outcome.APPLIED
        pending = [x for x in task.steps if x.state != "committed"]
        if pending:
            if pending[0].state == "waiting":
                pending[0].state = "queued"
            return Outcome.APPLIED
        self.move(task, "VERIFYING")
        self.move(task, "SUCCEEDED" if self.verified(task) else "FAILED")
        return Outcome.APPLIED

    def verified(self, task: MTask) -> bool:
        if not task.spec.repository:
            return True
        candidates = [s.candidate for s in task.steps if s.candidate]
        if not candidates:
            return False
        return all(task.runs.get((candidates[-1], c)) == 0 for c in task.spec.expected_checks)

    def expire(self) -> int:
        self.alive = int(self.now * reaper.ALIVE_PER_S)
        reaped = 0
        for task in self.tasks.values():
            for s in task.steps:
                late = s.deadline is not None and s.deadline <= self.now
                unacknowledged = s.accept is not None and s.accept <= self.now
                if s.state == "leased" and (late or unacknowledged):
                    reaped += 1
                    self.requeue(task, s, counted=True)
        return reaped

    def restart(self) -> None:
        """Open leases move later by the time no supervisor served (since the reaper's last
        stamp, less the grace); never stamped, each gets a fresh TTL."""
        if self.alive is None:
            gap = None
        else:
            gap = self.now - self.alive / reaper.ALIVE_PER_S - reaper.ALIVE_GRACE_S
        for task in self.tasks.values():
            for s in task.steps:
                if s.state != "leased":
                    continue
                if gap is None:
                    s.deadline = self.now + CONFIG.lease_ttl_s
                    s.accept = None if s.accept is None else self.now + 10.0
                elif gap > 0 and s.deadline is not None:
                    s.deadline += gap
                    s.accept = None if s.accept is None else s.accept + gap
        self.alive = int(self.now * reaper.ALIVE_PER_S)
        # never a fence again, even from a restored backup: at least the clock in microseconds
        self.fence = max(self.fence, int(self.now * reaper.FENCE_FLOOR_PER_S))


# -- the machine ------------------------------------------------------------------------------


class LedgerVersusModel(RuleBasedStateMachine):
    scratch: ClassVar[list[Scratch]] = [_workspace]  # where examples run: SQLite, or a subclass's

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(self.scratch[0], config=CONFIG)
        self.model = Model()
        self.model.now = self.h.now
        self.leases: list[tuple[str, int]] = []  # every (step, fence) ever granted

    def teardown(self) -> None:
        self.h.close()

    def ledger(self, rule: Any) -> tuple[Any, str | None]:
        [outcome] = self.h.run([rule])
        if outcome.error is None:
            return outcome.value, None
        assert isinstance(outcome.error, LedgerError), outcome.error
        return None, outcome.error.code.value

    def both(self, rule: Any, model_call: Any) -> tuple[Any, Any]:
        value, code = self.ledger(rule)
        try:
            expected, expected_code = model_call(), None
        except Refusal as refusal:
            expected, expected_code = None, refusal.code
        assert code == expected_code, (code, expected_code)
        return value, expected

    @initialize()
    def start(self) -> None:
        assert self.h.states() == []
        [added] = self.h.run([lambda tx: repositories.add_repository(tx, TENANT, "repo", "/r")])
        assert added.error is None

    @rule(
        key=st.sampled_from(["k0", "k1", "k2"]),
        variant=st.integers(0, 1),
        steps=st.integers(1, 2),
        repository=st.booleans(),
    )
    def create(self, key: str, variant: int, steps: int, repository: bool) -> None:
        spec = make_spec(key, variant, steps, repository)
        value, code = self.ledger(lambda tx: identity.create_task(tx, spec))
        new_id = value.task_id if value is not None else "?"
        try:
            expected, expected_code = self.model.create(spec, new_id), None
        except Refusal as refusal:
            expected, expected_code = None, refusal.code
        assert code == expected_code
        if expected is not None:
            assert (value.task_id, value.created) == expected

    @precondition(lambda self: self.model.tasks)
    @rule(data=st.data(), wrong_plan=FEW, base=st.sampled_from(["sha0", "sha1"]))
    def approve(self, data: st.DataObject, wrong_plan: bool, base: str) -> None:
        task = self.model.tasks[data.draw(st.sampled_from(sorted(self.model.tasks)))]
        plan_hash = "0" * 64 if wrong_plan else task.spec.plan_hash
        sha = base if task.spec.repository else None
        head = self.model.real if task.spec.repository else None
        self.both(
            lambda tx: operator.approve(tx, TENANT, task.id, plan_hash, sha, head),
            lambda: self.model.approve(task, plan_hash, sha),
        )

    @precondition(lambda self: self.model.tasks)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        task = self.model.tasks[data.draw(st.sampled_from(sorted(self.model.tasks)))]
        self.both(
            lambda tx: operator.cancel(tx, TENANT, task.id, "test"), lambda: self.model.cancel(task)
        )

    @rule(sha=st.sampled_from(["sha0", "sha1", "sha2"]))
    def move_head(self, sha: str) -> None:
        self.model.real = sha  # pushed, and the webhook arrives at once
        self.both(
            lambda tx: operator.set_repository_head(tx, TENANT, "repo", sha),
            lambda: self.model.observe(sha),
        )

    @rule(runner=st.sampled_from(["r0", "r1"]))
    def claim(self, runner: str) -> None:
        token = TOKENS[runner]
        leases, expected = self.both(
            lambda tx: fencing.claim(tx, runner, "default", 1, token_id=token),
            lambda: self.model.claim(token),
        )
        assert [x.step_id for x in leases] == expected
        self.leases += [(x.step_id, x.fence) for x in leases]

    def pick_lease(self, data: st.DataObject) -> tuple[str, int]:
        """Mostly a live lease (the runner holding it), sometimes any lease ever granted (a
        fenced-out worker)."""
        live = [
            (s.id, s.fence)
            for t in self.model.tasks.values()
            for s in t.steps
            if s.state == "leased" and s.fence is not None
        ]
        stale = data.draw(st.sampled_from([False, False, True])) or not live
        return data.draw(st.sampled_from(self.leases if stale else live))

    def caller(self, data: st.DataObject, step_id: str, fence: int) -> str:
        """Mostly the token the lease was granted to, sometimes the pool's other runner token
        (one that would take the lease over)."""
        holder = self.model.holders[(step_id, fence)]
        intruder = data.draw(st.sampled_from([False, False, False, True]))
        return next(t for t in TOKENS.values() if t != holder) if intruder else holder

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        step_id, fence = self.pick_lease(data)
        token = self.caller(data, step_id, fence)
        value, cancelled = self.both(
            lambda tx: fencing.renew(tx, step_id, fence, "default", token_id=token),
            lambda: self.model.renew(step_id, fence, token),
        )
        assert value is None or value.cancelled == cancelled

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), reason=st.sampled_from(list(ReleaseReason)), retryable=st.booleans())
    def release(self, data: st.DataObject, reason: ReleaseReason, retryable: bool) -> None:
        step_id, fence = self.pick_lease(data)
        token = self.caller(data, step_id, fence)
        self.both(
            lambda tx: fencing.release(
                tx, step_id, fence, reason, retryable, "t", "default", token_id=token
            ),
            lambda: self.model.release(step_id, fence, token, reason, retryable),
        )

    @precondition(lambda self: self.leases)
    @rule(
        data=st.data(),
        drift=FEW,
        evidence=st.sampled_from(["full", "full", "none", "partial", "failing"]),
    )
    def report(self, data: st.DataObject, drift: bool, evidence: str) -> None:
        step_id, fence = self.pick_lease(data)
        self.report_as(step_id, fence, drift, evidence, self.caller(data, step_id, fence))

    def report_as(
        self, step_id: str, fence: int, drift: bool, evidence: str, token: str | None = None
    ) -> None:
        """`evidence`: "full" (a candidate, lint passing), "failing" (lint exits 1),
        "partial" (a candidate, no check run) or "none" (no candidate). `token`: the lease
        holder's unless given."""
        token = token or self.model.holders[(step_id, fence)]
        task, s = self.model.step(step_id)
        candidate = None if evidence == "none" else f"c{fence}"
        exit_code = {"full": 0, "failing": 1}.get(evidence)
        checks = (
            {}
            if exit_code is None
            else {"lint": CheckRun(log=f"d{fence}", exit_code=exit_code, duration_s=1.0)}
        )
        rep = Report(
            step_id=step_id,
            fence=fence,
            payload_hash=content_hash({"drift": step_id}) if drift else s.payload_hash,
            output={"fence": fence},
            usage={"total_tokens": 1},
            candidate_sha=candidate,
            checks=checks,
        )
        seen = Evidence(head_sha=self.model.real) if task.spec.repository else None
        outcome, expected = self.both(
            lambda tx: effects.report(tx, rep, "default", seen, token_id=token),
            lambda: self.model.report(rep, token),
        )
        assert outcome == expected

    @rule(seconds=st.sampled_from([1.0, 5.0, 10.0, 29.0, 31.0]))
    def tick_and_reap(self, seconds: float) -> None:
        self.h.now += seconds
        self.model.now = self.h.now
        reaped, expected = self.both(reaper.expire, self.model.expire)
        assert reaped == expected

    @rule(seconds=st.sampled_from([5.0, 11.0, 31.0]))
    def tick(self, seconds: float) -> None:
        """Time passes and the reaper has not run yet: a lapsed lease must already be over
        (no renew, no result may bring it back), before anything requeues it."""
        self.h.now += seconds
        self.model.now = self.h.now

    @rule(runner=st.sampled_from(["r0", "r1"]), evidence=st.sampled_from(["full", "none"]))
    def claim_then_finish(self, runner: str, evidence: str) -> None:
        """A runner claims, works and reports under its fence, all at once."""
        before = len(self.leases)
        self.claim(runner)
        for step_id, fence in self.leases[before:]:
            self.report_as(step_id, fence, False, evidence)

    @rule(runner=st.sampled_from(["r0", "r1"]), seconds=st.sampled_from([11.0, 31.0]))
    def claim_then_lapse_then_report(self, runner: str, seconds: float) -> None:
        """A runner claims, is paused past its acceptance window or its lease before the
        reaper runs, then reports: the lapsed lease is over, and its result is refused."""
        before = len(self.leases)
        self.claim(runner)
        self.tick(seconds)
        for step_id, fence in self.leases[before:]:
            self.report_as(step_id, fence, False, "full")

    @rule(runner=st.sampled_from(["r0", "r1"]))
    def claim_then_vanish(self, runner: str) -> None:
        """A runner claims and vanishes: its lease runs out and the reaper takes it back."""
        self.claim(runner)
        self.tick_and_reap(CONFIG.lease_ttl_s + 1)

    @rule()
    def restart(self) -> None:
        self.h.restart()
        self.model.restart()

    @invariant()
    def ledger_matches_model(self) -> None:
        q = self.h.query
        assert dict(self.h.states()) == {t.id: t.state for t in self.model.tasks.values()}
        steps = {
            r["id"]: (r["state"], r["fence"], r["attempt"], r["burned"])
            for r in q("SELECT id, state, fence, attempt, burned FROM steps")
        }
        counts = {r[0]: r[1] for r in q("SELECT step_id, COUNT(*) FROM effects GROUP BY step_id")}
        for task in self.model.tasks.values():
            for s in task.steps:
                assert steps[s.id] == (s.state, s.fence, s.attempt, s.burned), s
                assert counts.get(s.id, 0) == s.effects <= 1
        assert self.h.fence_counter() == self.model.fence
        assert find_violations(self.h.reads) == []


LedgerVersusModel.TestCase.settings = settings.get_profile(PROFILE)
TestLedgerVersusModel = LedgerVersusModel.TestCase


class LedgerVersusModelOnPostgresql(LedgerVersusModel):
    scratch: ClassVar[list[Scratch]] = []  # set by `pg_scratch`


@pytest.fixture(scope="module")
def pg_scratch() -> Iterator[None]:
    """A scratch database for the PostgreSQL examples, beside a fresh one on the test server
    (which skips or fails these tests with one line when there is no server)."""
    from tests import pgdb
    from tether.sim.pgscratch import PgWorkspace, scratch_server

    with (
        pgdb.fresh_database() as server,
        scratch_server(server) as prefix,
        PgWorkspace(server, prefix) as workspace,
    ):
        LedgerVersusModelOnPostgresql.scratch[:] = [workspace]
        try:
            yield
        finally:
            LedgerVersusModelOnPostgresql.scratch.clear()


LedgerVersusModelOnPostgresql.TestCase.settings = settings.get_profile(PG_PROFILE)
TestLedgerVersusModelOnPostgresql = pytest.mark.usefixtures("pg_scratch")(
    LedgerVersusModelOnPostgresql.TestCase
)
