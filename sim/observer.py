"""The explorer's own record of what it saw, and the checks it makes after every event.

The ledger checks itself with `invariants.find_violations`; the observer checks it from
outside, from the replies it gave, so it knows which fence is current and what verification
must decide without asking the ledger.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from tether.sim.actors import plan_hash
from tether.sim.receivers import Receivers
from tether.supervisor.ledger.errors import (
    IdempotencyConflict,
    LedgerError,
    PayloadDrift,
    StaleFence,
)
from tether.supervisor.ledger.fencing import UNCOUNTED_RELEASES
from tether.supervisor.ledger.identity import Created, StepSpec, TaskSpec, step_id_for
from tether.supervisor.ledger.outbox import Outgoing
from tether.supervisor.ledger.reaper import ALIVE_GRACE_S, ALIVE_PER_S
from tether.supervisor.ledger.states import TERMINAL, TaskState
from tether.supervisor.ledger.steps import tokens_spent
from tether.supervisor.ledger.tx import LedgerConfig
from tether.supervisor.ledger.verification import Evidence, Finding
from tether.wire import Outcome, ReleaseReason, content_hash
from tether.wire.records import Checkpoint, Event, Lease, Renewal, Report

TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)
EFFECT_KINDS = LedgerConfig().effect_kinds  # plan steps the supervisor delivers itself


@dataclasses.dataclass
class ShadowLease:
    task_id: str
    runner: str
    token: str | None  # the runner token the attempt was granted to
    fence: int
    deadline: float
    accept_deadline: float | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Expectation:
    """How a task must end; a FAILED one with the code of one of `codes` as its reason."""

    state: TaskState
    why: str
    codes: frozenset[str] = frozenset()

    @property
    def stale(self) -> bool:
        return Finding.STALE_BASE.value in self.codes


def same_task(a: TaskSpec, b: TaskSpec) -> bool:
    return plan_hash(a) == plan_hash(b) and a.declared() == b.declared()


class Observer:
    """A shadow of every live lease, the first terminal state each task reached, the task each
    idempotency key named, every applied effect, and the repository heads and approved bases."""

    def __init__(self, config: LedgerConfig) -> None:
        self.config = config
        self.violations: list[str] = []
        self.leases: dict[str, ShadowLease] = {}
        self.top_fence = 0
        self.alive: int | None = None  # the ledger's stamp 'alive' (reaper), once it starts
        self.attempts: dict[str, int] = {}
        self.applied: dict[str, Report] = {}
        self.specs: dict[str, TaskSpec] = {}  # task id -> what was asked for
        self.keys: dict[tuple[str, str], str] = {}  # (tenant, key) -> task id
        self.states: dict[str, str] = {}  # last observed
        self.first_terminal: dict[str, str] = {}
        self.expected_end: dict[str, Expectation] = {}
        self.heads: dict[tuple[str, str], str] = {}
        self.approved: dict[str, str | None] = {}
        self.cancelled: set[str] = set()
        self.budgets: dict[str, int | None] = {}  # tenant -> token budget
        self.spent: dict[str, int] = {}  # tenant -> tokens of applied results
        self.burned: dict[str, int] = {}  # step -> attempts counted toward max_attempts
        self.evidence: dict[str, Evidence] = {}  # step -> the evidence its commit came with
        self.checkpoints: dict[str, Checkpoint] = {}  # step -> its last accepted checkpoint
        self.charged: dict[str, int] = {}  # tenant -> tokens_used as last read
        # effects (docs/design.md, Effects): the ones recorded delivered (by an answer or an
        # operator's yes), each unkeyed one's gate openings and sends that may have reached
        # its receiver, the ones an operator said did not happen, and the pending verdict of
        # a task whose runner steps are all committed and whose effects are not
        self.delivered: set[str] = set()
        self.openings: dict[str, int] = {}
        self.sends: dict[str, int] = {}
        self.said_no: set[str] = set()
        self.misled: set[str] = set()  # an operator's word on it was not the receiver's
        self.pushing: dict[str, str] = {}  # task -> the candidate its git.push began to push
        self.pending: dict[str, Expectation] = {}

    def violation(self, text: str) -> None:
        if text not in self.violations:
            self.violations.append(text)

    def done(self, step_id: str) -> bool:
        """Committed: a runner's result applied, or an effect recorded delivered."""
        return step_id in self.applied or step_id in self.delivered

    def step_of(self, step_id: str) -> StepSpec | None:
        spec = self.specs.get(step_id.rsplit(".", 1)[0])
        position = int(step_id.rsplit(".", 1)[1])
        return spec.steps[position] if spec is not None and position < len(spec.steps) else None

    def _steps(self, task_id: str, spec: TaskSpec, effects: bool) -> list[str]:
        """The task's runner steps (`effects` False) or effect steps (True), in order."""
        return [
            step_id_for(task_id, i)
            for i, s in enumerate(spec.steps)
            if (s.kind in EFFECT_KINDS) is effects
        ]

    # -- operator answers ---------------------------------------------------------------------

    def created(self, spec: TaskSpec, value: Created | None, error: LedgerError | None) -> None:
        key = (spec.tenant, spec.idempotency_key)
        known = self.keys.get(key)
        if isinstance(error, IdempotencyConflict):
            if known is None or same_task(self.specs[known], spec):
                self.violation(f"create {key} refused as a conflict, yet no other plan holds it")
            return
        if error is not None or value is None:
            self.violation(f"create {key} failed unexpectedly: {error}")
            return
        if known is None:
            if not value.created:
                self.violation(f"create {key}: a new key answered an existing task {value.task_id}")
            self.keys[key] = value.task_id
            self.specs[value.task_id] = spec
            return
        if value.created or value.task_id != known:
            self.violation(
                f"key-uniqueness: key {key} names {known}; a duplicate create made"
                f" {value.task_id}, a second logical execution"
            )
            self.specs.setdefault(value.task_id, spec)
        elif not same_task(self.specs[known], spec):
            self.violation(f"create {key} with another plan answered the existing task {known}")

    def approved_task(
        self, task_id: str, approved_plan: str, base_sha: str | None, observed_head: str | None
    ) -> None:
        spec = self.specs.get(task_id)
        if spec is not None and approved_plan != plan_hash(spec):
            self.violation(f"approval of {task_id} accepted plan {approved_plan[:8]}, not its own")
        if task_id in self.approved and self.approved[task_id] == base_sha:
            return  # a repeated approval: answered as done, nothing read or changed
        if spec is not None and spec.repository and base_sha != observed_head:
            self.violation(
                f"stale-approval: {task_id} approved at base {base_sha}; the head read was"
                f" {observed_head}"
            )
        self.approved[task_id] = base_sha
        if spec is not None and spec.repository and observed_head:
            self.head_moved(spec.tenant, spec.repository, observed_head)

    def head_moved(self, tenant: str, repository: str, sha: str) -> None:
        """The ledger recorded `sha` as the head (a webhook, or a head an adapter read): every
        approved task of the repository that has not ended and is bound to another base fails
        `stale_base` in the same rule, and its leases end."""
        self.heads[(tenant, repository)] = sha
        for task_id, spec in self.specs.items():
            if (spec.tenant, spec.repository) != (tenant, repository):
                continue
            if task_id not in self.approved or task_id in self.first_terminal:
                continue
            base = self.approved[task_id]
            if base == sha or self.expected_end.get(task_id) is not None:
                continue
            if self.pushing.get(task_id) == sha:
                # The task's own push, read back (a webhook, another report's head read): the
                # ledger may take it as its own and not a moved base (`tasks.pushed_sha`), or
                # fail the task stale_base; either is an end the observer accepts.
                continue
            self.expected_end[task_id] = Expectation(
                state=TaskState.FAILED,
                why=f"stale base {base}, head {sha}",
                codes=frozenset({Finding.STALE_BASE.value}),
            )
            for step_id in [s for s, lease in self.leases.items() if lease.task_id == task_id]:
                del self.leases[step_id]

    def cancelled_task(self, task_id: str) -> None:
        if task_id in self.first_terminal:
            self.violation(
                f"cancel of {task_id} accepted after it ended {self.first_terminal[task_id]}"
            )
        self.cancelled.add(task_id)
        for step_id in [s for s, lease in self.leases.items() if lease.task_id == task_id]:
            del self.leases[step_id]

    # -- runner answers -----------------------------------------------------------------------

    def granted(self, lease: Lease, runner: str, token: str | None, now: float) -> None:
        step = lease.step_id
        live = self.leases.get(step)
        if live is not None:
            self.violation(
                f"one-live-lease: {step} granted fence {lease.fence} while fence {live.fence}"
                " is live"
            )
        if lease.fence <= self.top_fence:
            self.violation(f"fences-increase: fence {lease.fence} after fence {self.top_fence}")
        if self.burned.get(step, 0) >= self.config.max_attempts:
            self.violation(
                f"retry-bound: {step} granted after {self.burned[step]} counted attempts"
                f" (max_attempts {self.config.max_attempts})"
            )
        self.top_fence = max(self.top_fence, lease.fence)
        if lease.attempt != self.attempts.get(step, 0) + 1:
            self.violation(f"attempts: {step} granted attempt {lease.attempt} out of order")
        self.attempts[step] = lease.attempt
        if step in self.applied:
            self.violation(f"lease on committed step {step} (fence {lease.fence})")
        position = int(step.rsplit(".", 1)[1])
        for earlier in range(position):
            if not self.done(step_id_for(lease.task_id, earlier)):
                self.violation(f"order: {step} leased before step {earlier} committed")
                break
        if (planned := self.step_of(step)) is not None and planned.kind in EFFECT_KINDS:
            self.violation(f"effect-step-leased: {step} ({planned.kind}) granted to {runner}")
        if lease.task_id in self.first_terminal:
            self.violation(f"lease {step} on ended task ({self.first_terminal[lease.task_id]})")
        expected = self.expected_end.get(lease.task_id)
        if expected is not None and expected.stale:
            self.violation(f"stale-grant: {step} granted after the head moved ({expected.why})")
        self._check_resume(lease)
        spec = self.specs.get(lease.task_id)
        if spec is not None and spec.repository:
            self._check_start(lease, spec)
        budget = self.budgets.get(spec.tenant) if spec else None
        if spec is not None and budget is not None and self.spent.get(spec.tenant, 0) >= budget:
            self.violation(
                f"budget: {step} leased to tenant {spec.tenant}, which spent"
                f" {self.spent.get(spec.tenant, 0)} of its {budget} tokens"
            )
        self.leases[step] = ShadowLease(
            task_id=lease.task_id,
            runner=runner,
            token=token,
            fence=lease.fence,
            deadline=now + self.config.lease_ttl_s,
            accept_deadline=now + self.config.accept_window_s,
        )

    def eager_granted(
        self, runner: str, reported: Sequence[tuple[str, int]], want: int, leases: list[Lease]
    ) -> None:
        """An eager grant (docs/design.md, Runner API) follows its request's results: none
        unless one of them is committed under its fence, and at most `want` less one for each
        that is not. Run before `granted` sees its leases (which checks each like a claim's)."""
        accepted = sum(
            1
            for step, fence in reported
            if step in self.applied and self.applied[step].fence == fence
        )
        if leases and accepted == 0:
            self.violation(
                f"eager-grant: {runner} granted {len(leases)} leases after results none of which"
                " is committed"
            )
        allowed = want - (len(reported) - accepted)
        if len(leases) > max(allowed, 0):
            self.violation(
                f"eager-grant: {runner} granted {len(leases)} leases; want {want} with"
                f" {len(reported) - accepted} results not accepted allows {max(allowed, 0)}"
            )
        if len({lease.step_id for lease in leases}) != len(leases):
            self.violation(f"eager-grant: {runner} granted one step twice in one answer")

    def _check_resume(self, lease: Lease) -> None:
        """A replayed attempt resumes from its step's last accepted checkpoint, one written
        under a fence that was current then; a first attempt, or a step never checkpointed,
        from nothing."""
        step, resume = lease.step_id, lease.resume
        held = self.checkpoints.get(step)
        if resume is None:
            if held is not None:
                self.violation(
                    f"resume: {step} attempt {lease.attempt} granted without its checkpoint"
                    f" (turn {held.turn}, fence {held.fence})"
                )
            return
        if not resume.transcript.startswith(f"t:{step}:"):
            self.violation(f"resume: {step} resumes from {resume.transcript}, another step's")
        elif held is None or (resume.fence, resume.turn, resume.transcript) != (
            held.fence,
            held.turn,
            held.transcript,
        ):
            last = "none" if held is None else f"turn {held.turn} fence {held.fence}"
            self.violation(
                f"resume: {step} resumes from turn {resume.turn} fence {resume.fence}; its last"
                f" checkpoint accepted under a current fence is {last}"
            )

    def _check_start(self, lease: Lease, spec: TaskSpec) -> None:
        """The worktree starts at the approved base, or the latest earlier candidate."""
        position = int(lease.step_id.rsplit(".", 1)[1])
        start = self.approved.get(lease.task_id)
        for earlier in range(position):
            rep = self.applied.get(step_id_for(lease.task_id, earlier))
            if rep is not None and rep.candidate_sha:
                start = rep.candidate_sha
        bound = lease.repository
        if (
            bound is None
            or bound.start_sha != start
            or bound.base_sha != self.approved.get(lease.task_id)
        ):
            shown = "none" if bound is None else f"base {bound.base_sha} start {bound.start_sha}"
            self.violation(f"lease-repository: {lease.step_id} carries {shown}; expected {start}")

    def checkpointed(
        self, step_id: str, cp: Checkpoint, error: LedgerError | None, now: float
    ) -> None:
        """A checkpoint is accepted only under the step's current fence of a lease that has
        not lapsed, and never goes back a turn; one that is current is not refused stale."""
        live = self.leases.get(step_id)
        current = live is not None and live.fence == cp.fence and not _lapsed(live, now)
        if error is None:
            if not current:
                state = "none" if live is None else f"{live.fence}"
                if live is not None and live.fence == cp.fence:
                    state += " (lapsed)"
                self.violation(
                    f"stale-checkpoint: {step_id} checkpoint under fence {cp.fence} accepted;"
                    f" the current fence is {state}"
                )
            held = self.checkpoints.get(step_id)
            if held is not None and cp.turn < held.turn:
                self.violation(
                    f"checkpoint-turn: {step_id} went back from turn {held.turn} to {cp.turn}"
                )
            self.checkpoints[step_id] = cp
        elif isinstance(error, StaleFence) and current:
            self.violation(f"{step_id}: a current checkpoint (fence {cp.fence}) refused as stale")

    def charged_now(self, rows: Iterable[tuple[str, int]]) -> None:
        """Charged tokens never decrease, and cover at least every committed result's usage."""
        for tenant, used in rows:
            before = self.charged.get(tenant, 0)
            if used < before:
                self.violation(f"tokens-charged: tenant {tenant}'s count fell {before} -> {used}")
            if used < self.spent.get(tenant, 0):
                self.violation(
                    f"tokens-charged: tenant {tenant} charged {used}, below its committed"
                    f" results' {self.spent[tenant]}"
                )
            self.charged[tenant] = used

    def renewed(self, step_id: str, fence: int, renewal: Renewal, now: float) -> None:
        task_id = step_id.rsplit(".", 1)[0]
        if renewal.cancelled:
            if task_id not in self.cancelled:
                self.violation(f"renew of {step_id} says cancelled; {task_id} was not cancelled")
            return
        live = self.leases.get(step_id)
        if live is None or live.fence != fence:
            current = "none" if live is None else live.fence
            self.violation(
                f"stale-renew: {step_id} renewed under fence {fence}; the current fence is"
                f" {current}"
            )
            return
        if _lapsed(live, now):
            self.violation(f"lapsed-lease: {step_id} renewed under fence {fence} after it ended")
        live.deadline = now + self.config.lease_ttl_s
        live.accept_deadline = None

    def released(self, step_id: str, fence: int, reason: ReleaseReason, retryable: bool) -> None:
        task_id = step_id.rsplit(".", 1)[0]
        live = self.leases.pop(step_id, None)
        if task_id in self.cancelled and live is None:
            return
        if retryable and reason not in UNCOUNTED_RELEASES:
            self.burned[step_id] = self.burned.get(step_id, 0) + 1
        if live is None or live.fence != fence:
            current = "none" if live is None else live.fence
            self.violation(
                f"stale-release: {step_id} released under fence {fence} (current {current})"
            )

    def reported(
        self,
        rep: Report,
        runner: str,
        token: str | None,
        outcome: Outcome | None,
        error: LedgerError | None,
        now: float,
        evidence: Evidence | None = None,
    ) -> None:
        step = rep.step_id
        task_id = step.rsplit(".", 1)[0]
        spec = self.specs.get(task_id)
        intent = _intent_hash(spec, step)
        drifted = intent is not None and rep.payload_hash != intent
        if isinstance(error, PayloadDrift) and not drifted:
            self.violation(f"{step}: a faithful report was refused as payload drift")
        if outcome is Outcome.REPLAYED and step not in self.applied:
            self.violation(f"{step}: answered replayed, but no effect was ever applied")
        if outcome is not Outcome.APPLIED:
            return
        if drifted:
            self.violation(f"payload-drift: {step} committed a payload other than its intent")
        if step in self.applied:
            self.violation(
                f"one-effect-per-step: {step} applied twice (fences"
                f" {self.applied[step].fence} and {rep.fence})"
            )
        live = self.leases.pop(step, None)
        if live is None or live.fence != rep.fence:
            current = "none (lease ended)" if live is None else f"{live.fence} ({live.runner})"
            self.violation(
                f"no-stale-commit: {step} committed under fence {rep.fence} from {runner}; the"
                f" current fence was {current}"
            )
        elif live.token != token:
            self.violation(
                f"lease-holder: {step} committed under fence {rep.fence} from {runner} with"
                f" {token}; the attempt was granted to {live.runner} with {live.token}"
            )
        elif _lapsed(live, now):  # over on the supervisor's clock, reaped or not
            self.violation(
                f"lapsed-lease: {step} committed under fence {rep.fence} after its lease ended"
            )
        self.applied[step] = rep
        if evidence is not None:
            self.evidence[step] = evidence
        if spec is not None:
            self.spent[spec.tenant] = self.spent.get(spec.tenant, 0) + tokens_spent(rep.usage)
        if spec is not None and spec.repository and evidence is not None:
            self.head_moved(spec.tenant, spec.repository, evidence.head_sha)
        if spec is not None:
            self._maybe_complete(task_id, spec)

    def _maybe_complete(self, task_id: str, spec: TaskSpec) -> None:
        """Once every runner step is committed, what verification must decide: at once when
        every effect step is delivered too, or when it fails (the first effect never becomes
        due: `lifecycle.make_due` verifies first); else once the effects are delivered."""
        if task_id in self.expected_end or task_id in self.first_terminal:
            return
        if not all(s in self.applied for s in self._steps(task_id, spec, effects=False)):
            return
        verdict = self.pending.get(task_id) or self._verdict(task_id, spec)
        effects_done = all(s in self.delivered for s in self._steps(task_id, spec, effects=True))
        if effects_done or verdict.state is not TaskState.SUCCEEDED:
            self.expected_end[task_id] = verdict
            self.pending.pop(task_id, None)
        else:
            self.pending[task_id] = verdict

    # -- effects ------------------------------------------------------------------------------

    def effect_delivered(self, step_id: str) -> None:
        """The ledger accepted a delivery (an answer, or an operator's yes) for `step_id`."""
        if step_id in self.delivered:
            self.violation(f"one-delivery: effect {step_id} recorded delivered twice")
        self.delivered.add(step_id)
        task_id = step_id.rsplit(".", 1)[0]
        spec = self.specs.get(task_id)
        if spec is not None:
            self._maybe_complete(task_id, spec)

    def push_begun(self, out: Outgoing) -> None:
        """A `git.push` attempt was recorded as about to be sent."""
        self.pushing[out.task_id] = str(out.request.get("candidate"))

    def gate_opened(self, step_id: str, digest: str, request_digest: str) -> None:
        if digest != request_digest:
            self.violation(
                f"gate-digest: {step_id}'s gate opened for {digest[:8]}; its request's digest"
                f" is {request_digest[:8]}"
            )
        self.openings[step_id] = self.openings.get(step_id, 0) + 1

    def resolved(self, step_id: str, happened: bool, *, truth: bool) -> None:
        """An operator's word on an uncertain effect was accepted; `truth`: whether its
        receiver had applied it. A wrong word is the operator's, not the ledger's: the
        receiver checks leave that effect out."""
        if happened != truth:
            self.misled.add(step_id)
        if happened:
            self.effect_delivered(step_id)
        else:
            self.said_no.add(step_id)

    def effect_sent(self, out: Outgoing, *, reached: bool) -> None:
        """A dispatcher sent `out` (`reached`: it may have arrived). An unkeyed effect is
        sent at most once per gate opening an operator made."""
        if out.keyed or not reached:
            return
        sends = self.sends[out.effect_id] = self.sends.get(out.effect_id, 0) + 1
        openings = self.openings.get(out.effect_id, 0)
        if sends > openings:
            self.violation(
                f"unkeyed-needs-word: unkeyed effect {out.effect_id} sent {sends} times after"
                f" {openings} gate openings"
            )

    def effects_now(self, receivers: Receivers) -> None:
        """A keyed receiver applies each effect key at most once, and an effect arrives under
        one key; every keyed effect of a SUCCEEDED task was applied exactly once."""
        for key, count in receivers.applications.items():
            if count > 1:
                self.violation(f"keyed-applied-once: key {key[:8]} applied {count} times")
        for effect_id, keys in receivers.keys.items():
            if len(keys) > 1:
                self.violation(
                    f"keyed-applied-once: effect {effect_id} arrived under {len(keys)} keys"
                )
        for task_id, state in self.first_terminal.items():
            spec = self.specs.get(task_id)
            if state != TaskState.SUCCEEDED or spec is None:
                continue
            for step_id in self._steps(task_id, spec, effects=True):
                planned = self.step_of(step_id)
                assert planned is not None
                keyed = _keyed(planned)
                if not keyed or step_id in self.misled:
                    continue
                applied = receivers.applied(planned.kind, keyed, step_id)
                if applied != 1:
                    self.violation(
                        f"keyed-exactly-once: {task_id} SUCCEEDED; its keyed effect {step_id}"
                        f" ({planned.kind}) was applied {applied} times"
                    )

    def withdrawn(self, step_id: str, receivers: Receivers) -> None:
        """A withdrawn effect never reached its receiver, unless an operator said it had not."""
        planned = self.step_of(step_id)
        if planned is None or step_id in self.misled:
            return
        applied = receivers.applied(planned.kind, _keyed(planned), step_id)
        if applied:
            self.violation(f"withdrawn-unsent: effect {step_id} withdrawn; applied {applied} times")

    def _verdict(self, task_id: str, spec: TaskSpec) -> Expectation:
        """What verification must decide once every step is committed (docs/design.md,
        Verification)."""
        if not spec.repository:
            return Expectation(state=TaskState.SUCCEEDED, why="all steps committed")
        base = self.approved.get(task_id)
        steps = self._steps(task_id, spec, effects=False)
        reports = [self.applied[s] for s in steps]
        final = [s for s, r in zip(steps, reports, strict=True) if r.candidate_sha]
        if not final:
            return _failed("no candidate sha", {Finding.NO_CANDIDATE})
        candidate = self.applied[final[-1]].candidate_sha
        why: list[str] = []
        codes: set[Finding] = set()
        used = {final[-1]}
        for check in spec.expected_checks:
            runs = [
                (s, r.checks[check])
                for s, r in zip(steps, reports, strict=True)
                if r.candidate_sha == candidate and check in r.checks
            ]
            if not runs:
                why.append(f"no run of {check} at candidate {candidate}")
                codes.add(Finding.MISSING_CHECK)
                continue
            used.add(runs[-1][0])
            if runs[-1][1].exit_code != 0:
                why.append(f"{check} failed at candidate {candidate}")
                codes.add(Finding.CHECK_FAILED)
        for step in sorted(used):
            evidence = self.evidence.get(step)
            for problem in evidence.problems if evidence is not None else ():
                why.append(f"{step}'s evidence: {problem.reason}")
                codes.add(problem.code)
        if codes:
            return _failed("; ".join(why), codes)
        return Expectation(state=TaskState.SUCCEEDED, why=f"verified at {candidate} on {base}")

    # -- the supervisor's own doings ----------------------------------------------------------

    def expired(self, count: int, now: float) -> None:
        ended = sorted(step for step, lease in self.leases.items() if _lapsed(lease, now))
        if count != len(ended):
            self.violation(f"reaper ended {count} leases; the shadow says {len(ended)} {ended}")
        self.alive = int(now * ALIVE_PER_S)
        for step in ended:
            del self.leases[step]
            self.burned[step] = self.burned.get(step, 0) + 1  # an expiry always counts

    def restarted(self, now: float) -> None:
        """The supervisor (re)started at `now`: open leases move later by the time since the
        last stamp of 'alive' less the grace (`reaper.refresh_after_restart`)."""
        unattended = None if self.alive is None else now - self.alive / ALIVE_PER_S - ALIVE_GRACE_S
        for lease in self.leases.values():
            if unattended is None:
                lease.deadline = now + self.config.lease_ttl_s
                if lease.accept_deadline is not None:
                    lease.accept_deadline = now + self.config.accept_window_s
            elif unattended > 0:
                lease.deadline += unattended
                if lease.accept_deadline is not None:
                    lease.accept_deadline += unattended
        self.alive = int(now * ALIVE_PER_S)

    def saw_states(self, rows: Iterable[tuple[str, str, str | None]]) -> list[str]:
        """Terminal monotonicity and verification, from the task states (and reasons) after
        one rule. Return the changes, for the trace."""
        changes: list[str] = []
        for task_id, state, reason in rows:
            before = self.states.get(task_id)
            if before != state:
                changes.append(f"{task_id} {before or 'new'}->{state}")
                self.states[task_id] = state
            first = self.first_terminal.get(task_id)
            if first is not None:
                if state != first:
                    self.violation(f"terminal-monotonicity: {task_id} ended {first}, now {state}")
                continue
            if state not in TERMINAL_NAMES:
                continue
            self.first_terminal[task_id] = state
            expected = self.expected_end.get(task_id)
            if state == TaskState.SUCCEEDED and expected is None:
                self.violation(
                    f"unverified-success: {task_id} SUCCEEDED before every step committed"
                )
            elif expected is not None and state != expected.state:
                self.violation(
                    f"verification: {task_id} ended {state}; the evidence says"
                    f" {expected.state} ({expected.why})"
                )
            elif expected is not None and expected.codes:
                code = (reason or "").split(":", 1)[0]
                if code not in expected.codes:
                    self.violation(
                        f"failure-reason: {task_id} failed {reason!r}; the evidence names"
                        f" {', '.join(sorted(expected.codes))} ({expected.why})"
                    )
        return changes


def _keyed(step: StepSpec) -> bool:
    """Whether an effect step is keyed: unless it says `"keyed": false`."""
    return not (isinstance(step.payload, dict) and step.payload.get("keyed") is False)


def _failed(why: str, codes: Iterable[Finding]) -> Expectation:
    return Expectation(state=TaskState.FAILED, why=why, codes=frozenset(c.value for c in codes))


def _lapsed(lease: ShadowLease, now: float) -> bool:
    """Past its deadline, or never acknowledged within the acceptance window (the ledger's
    rule, `steps.lapsed`, restated from the shadow's own bookkeeping)."""
    accept = lease.accept_deadline
    return lease.deadline <= now or (accept is not None and accept <= now)


def _intent_hash(spec: TaskSpec | None, step_id: str) -> str | None:
    if spec is None:
        return None
    position = int(step_id.rsplit(".", 1)[1])
    return content_hash(spec.steps[position].payload) if position < len(spec.steps) else None


@dataclasses.dataclass
class Consumer:
    """A status consumer of one task's journal: applies events in sequence order and ignores
    any sequence number at or below the last one applied (docs/design.md, Event journal)."""

    task_id: str
    last_seq: int = 0
    state: str | None = None

    def apply(self, events: Sequence[Event]) -> list[str]:
        """Apply a delivery; return what went wrong, if anything."""
        problems: list[str] = []
        for event in events:
            if event.seq <= self.last_seq:
                continue
            self.last_seq = event.seq
            if self.state in TERMINAL_NAMES and event.state != self.state:
                problems.append(
                    f"consumer: {self.task_id} view moved from {self.state} to {event.state}"
                    f" at seq {event.seq}"
                )
            self.state = event.state
        return problems
