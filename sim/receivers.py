"""The receivers an effect reaches, modelled: what each one applied, and the answer it gives.

An `http` effect goes to a keyed receiver (it applies each `Idempotency-Key` once and answers
a repeat with its first answer) or, for a step declared `"keyed": false`, to an unkeyed one
(it applies every request it gets). A `git.push` goes to the task's repository (`Repos`): it
moves the branch only from the value it expects to the candidate, as `--force-with-lease`
does, answers `replayed` when the branch is at the candidate already, and `branch_moved` when
it is anywhere else (supervisor/effects/git_push.py). The network's part is a `Fault`: the
request never arrives, the receiver is busy, or its answer is lost after it applied.
"""

from __future__ import annotations

import dataclasses
import enum

from tether.sim.repos import Repos
from tether.supervisor.ledger.outbox import Answer, Delivered, Outgoing, Unanswered, Undeliverable


class Fault(enum.StrEnum):
    NONE = "answered"
    UNREACHABLE = "unreachable"  # connection refused: nothing arrived
    BUSY = "busy"  # 503 before applying: a retry may follow
    LOST = "lost"  # applied, and the answer never came back
    REFUSE = "refuse"  # an http receiver refuses it for good (422), applying nothing


def repository_of(url: str) -> str:
    """The explorer's repositories live at /srv/git/<name>.git (`World._add_repositories`)."""
    return url.rsplit("/", 1)[-1].removesuffix(".git")


@dataclasses.dataclass
class Receivers:
    repos: Repos
    # keyed receiver: key -> its first answer, how often each key was applied, and the keys
    # each effect (step id) arrived under
    answers: dict[str, Answer] = dataclasses.field(default_factory=dict)
    applications: dict[str, int] = dataclasses.field(default_factory=dict)
    keys: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    unkeyed: dict[str, int] = dataclasses.field(default_factory=dict)  # effect -> applied
    pushes: dict[str, int] = dataclasses.field(default_factory=dict)  # effect -> branch moves
    # effect -> pushes again after someone else moved the branch back to the expected value
    # in between (compare-and-swap cannot tell that from "never pushed": see `_push`)
    repushed: dict[str, int] = dataclasses.field(default_factory=dict)

    def applied(self, out_kind: str, keyed: bool, effect_id: str) -> int:
        """How many times the receiver applied this effect (a keyed one: per key it came
        under, so a second key for one effect counts twice)."""
        if out_kind == "git.push":
            return self.pushes.get(effect_id, 0)
        if keyed:
            return sum(self.applications.get(k, 0) for k in self.keys.get(effect_id, ()))
        return self.unkeyed.get(effect_id, 0)

    def receive(self, out: Outgoing, fault: Fault) -> Answer:
        """The request `out` meets `fault` on its way; return what the dispatcher hears."""
        if fault is Fault.UNREACHABLE:
            return Unanswered(detail="connection refused", sent=False)
        if fault is Fault.BUSY:
            return Unanswered(detail="503 busy", sent=True, status=503)
        if out.kind == "git.push":
            answer = self._push(out)
        elif fault is Fault.REFUSE:
            return Undeliverable(
                status=422, detail="422 the receiver refused it", code="receiver_refused"
            )
        elif out.keyed:
            answer = self._keyed(out)
        else:
            count = self.unkeyed[out.effect_id] = self.unkeyed.get(out.effect_id, 0) + 1
            answer = Delivered(status=200, detail=f"200 applied (request {count})")
        if fault is Fault.LOST:
            return Unanswered(detail="no answer", sent=True)
        return answer

    def _keyed(self, out: Outgoing) -> Answer:
        key = out.effect_key
        self.keys.setdefault(out.effect_id, set()).add(key)
        first = self.answers.get(key)
        if first is not None:
            return first  # a repeated key: the first answer, nothing applied
        self.applications[key] = self.applications.get(key, 0) + 1
        answer = self.answers[key] = Delivered(status=200, detail=f"200 applied {key[:8]}")
        return answer

    def _push(self, out: Outgoing) -> Answer:
        request = out.request
        name = repository_of(str(request["url"]))
        head = self.repos.head(out.tenant, name)
        candidate, expected = request["candidate"], request["expected"]
        if head == candidate:
            return Delivered(status=None, detail=f"{name} at {candidate} already", replayed=True)
        if head != expected:
            return Undeliverable(
                status=None, detail=f"{name} is at {head}, not {expected}", code="branch_moved"
            )
        self.repos.push(out.tenant, name, candidate)
        if self.pushes.get(out.effect_id):
            # Pushed before, and the branch was moved back to `expected` since (an operator's
            # revert): the lease cannot see it, so the retry moves it again. Kept apart, so
            # `applied` counts the supervisor's own repeats only.
            self.repushed[out.effect_id] = self.repushed.get(out.effect_id, 0) + 1
            return Delivered(status=None, detail=f"{name} {expected} -> {candidate} again")
        self.pushes[out.effect_id] = 1
        return Delivered(status=None, detail=f"{name} {expected} -> {candidate}")


def describe_answer(answer: Answer) -> str:
    if isinstance(answer, Delivered):
        return f"delivered{' (replayed)' if answer.replayed else ''} {answer.detail}"
    if isinstance(answer, Undeliverable):
        return f"refused {answer.code}"
    return f"unanswered ({'maybe sent' if answer.sent else 'not sent'}) {answer.detail}"
