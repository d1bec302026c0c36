"""The outbox of effect steps (docs/design.md, Effects): what the dispatcher is handed, what it
answers, and the states an outbox row moves through.

An effect step is never leased to a runner. When it becomes due, the transaction that makes it
due writes its rendered request here; the supervisor's dispatcher takes rows, records each
delivery attempt before it sends, and records the receiver's answer.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

from tether.supervisor.ledger import repositories
from tether.supervisor.ledger.decisions import Decision
from tether.supervisor.ledger.errors import (
    EffectNotGated,
    EffectNotHeld,
    GateMismatch,
    InvalidRequest,
    NotFound,
    TerminalState,
)
from tether.supervisor.ledger.fencing import fail_step, fail_task
from tether.supervisor.ledger.journal import append_event
from tether.supervisor.ledger.states import TERMINAL, TaskState
from tether.supervisor.ledger.steps import find_step
from tether.supervisor.ledger.transitions import transition
from tether.supervisor.ledger.tx import EFFECTS, Row, Statements, Tx, dumps, loads
from tether.supervisor.ledger.verification import Finding, candidate_sha, findings
from tether.wire import content_hash, effect_key, templates
from tether.wire.payloads import DEFAULT_DEADLINE_S, valid_branch
from tether.wire.templates import RenderError

__all__ = [
    "Answer",
    "Delivered",
    "EffectNotHeld",
    "GateMismatch",
    "OutboxState",
    "Outgoing",
    "Refused",
    "Unanswered",
]


class OutboxState(enum.StrEnum):
    DUE = "due"  # keyed, ready to be taken
    GATED = "gated"  # unkeyed, waiting for an operator to open the gate
    OPEN = "open"  # gate opened for one digest; ready to be taken
    SENDING = "sending"  # a dispatcher holds it; a delivery attempt may be in flight
    UNCERTAIN = "uncertain"  # a send may have reached the receiver; only an operator resolves it
    DELIVERED = "delivered"
    FAILED = "failed"
    WITHDRAWN = "withdrawn"  # its task ended before anything of it was sent


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outgoing:
    """One effect handed to a dispatcher by `take_effects`."""

    effect_id: str  # the step id
    task_id: str
    tenant: str
    kind: str
    effect_key: str
    keyed: bool
    request: dict[str, Any]  # as rendered at due time (credentials by name)
    digest: str
    deadline_at: float  # wall time; no attempt starts after it


@dataclasses.dataclass(frozen=True, kw_only=True)
class Delivered:
    """The receiver applied the effect (or answered that it already had: `replayed`)."""

    status: int | None
    detail: str
    replayed: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Refused:
    """The receiver refused it for good: the step fails with `code`."""

    status: int | None
    detail: str
    code: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Unanswered:
    """No usable answer; `sent` is whether the request may have reached the receiver."""

    detail: str
    sent: bool
    status: int | None = None


Answer = Delivered | Refused | Unanswered


# Rows an ending task settles at once (`end_with_task`): no dispatcher holds them.
UNHELD = (OutboxState.DUE, OutboxState.GATED, OutboxState.OPEN)


# -- making a step ready ----------------------------------------------------------------------


def start(tx: Tx, step_id: str) -> None:
    """Make a waiting step ready: an effect step becomes due (`make_due`); any other is queued
    for the runners of its task's pool."""
    step = find_step(tx, step_id, None)
    if step["kind"] in tx.config.effect_kinds:
        make_due(tx, step)
        return
    tx.run("queue_ready_step", (step_id,))
    tx.wake(step["pool"])


def make_due(tx: Tx, step: Row) -> None:
    """Write the effect step's outbox row with its rendered request, in the transaction that
    makes it due (`step`: a row of `find_step`).

    A repository-bound task's evidence must verify so far (`verification.findings` over the
    steps committed before it): otherwise the task fails with the first finding and the
    effect is never due. A request that cannot be rendered (a path missing from an earlier
    step's output, no candidate for a push) fails the step and the task; nothing is written.
    """
    task = tx.one("task_by_id", (step["task_id"],))
    assert task is not None
    if TaskState(task["state"]) is TaskState.QUEUED:
        transition(tx, task["id"], TaskState.RUNNING)
        step = find_step(tx, step["id"], None)
    if task["repository"]:
        found = findings(tx, task)
        if found:
            fail_task(tx, task, found[0].reason)
            return
    payload = loads(step["payload_json"])
    payload = payload if isinstance(payload, dict) else {}
    try:
        request = render_request(tx, step, task, payload)
    except (RenderError, ValueError) as exc:
        fail_step(tx, step, f"{render_code(exc)}: {exc}")
        return
    keyed = payload.get("keyed", True) is not False
    deadline_s = float(payload.get("deadline_s") or DEFAULT_DEADLINE_S)
    state = OutboxState.DUE if keyed else OutboxState.GATED
    digest = content_hash(request)
    tx.run(
        "insert_due_effect",
        (
            step["id"], step["task_id"], step["kind"],
            effect_key(step["id"], step["payload_hash"]), int(keyed), dumps(request), digest,
            state.value, deadline_s, tx.now + deadline_s if keyed else None, tx.now, tx.now,
        ),
    )  # fmt: skip
    tx.run("mark_effect_step_due", (step["id"],))
    append_event(
        tx, step["task_id"], "effect_due", TaskState.RUNNING,
        {"step_id": step["id"], "kind": step["kind"], "keyed": keyed, "digest": digest,
         "state": state.value},
    )  # fmt: skip
    tx.note(
        Decision.EFFECT_DUE, task_id=step["task_id"], step_id=step["id"], kind=step["kind"],
        keyed=keyed, state=state.value, tenant=step["tenant"], pool=step["pool"],
    )  # fmt: skip
    if keyed:
        tx.wake(EFFECTS)


class NoCandidate(ValueError):
    """A push is due, but no step of the task reported a candidate."""


def render_code(exc: Exception) -> str:
    return Finding.NO_CANDIDATE.value if isinstance(exc, NoCandidate) else "effect_render_failed"


def render_request(tx: Tx, step: Row, task: Row, payload: dict[str, Any]) -> dict[str, Any]:
    """The request the dispatcher sends for `step`, from its payload and what the ledger
    holds now. Credentials stay as placeholders (by name).

    `http`: the URL filled by position (`templates.render_url`), the header values as text
    with no control character (`templates.render_headers`), the body as JSON. `git.push`:
    the repository's URL, the branch as the plan wrote it (checked again), the approved base
    and the candidate. A kind a deployment registers is handed its
    payload (less `keyed` and `deadline_s`) filled by `templates.render(..., sealed=True)`:
    a string that is one placeholder becomes the output's JSON value, a placeholder inside
    a longer string its text as it is (not encoded: the deliverer knows where it puts it),
    credential placeholders by name, and no `{{`/`}}` an output built."""
    if step["kind"] == "git.push":
        remote = repositories.find_repository(tx, task["tenant"], task["repository"] or "")
        if remote is None:
            raise ValueError(f"task {task['id']} has no repository to push to")
        candidate = candidate_sha(tx, task["id"])
        if candidate is None:
            raise NoCandidate("no step of the task reported a candidate to push")
        check_push(payload.get("branch"))
        return {
            "url": remote.url, "branch": payload.get("branch"),
            "expected": task["approved_base_sha"], "candidate": candidate,
            "credential": payload.get("credential"),
        }  # fmt: skip
    outputs = {
        r["name"]: loads(r["output_json"])
        for r in tx.all("committed_outputs_before", (task["id"], step["position"]))
    }
    if step["kind"] == "http":
        return {
            "method": payload.get("method", "POST"),
            "url": templates.render_url(str(payload.get("url")), outputs, "payload.url"),
            "headers": templates.render_headers(payload.get("headers") or {}, outputs),
            "body": templates.render(payload.get("body"), outputs, "payload.body"),
        }
    # A registered kind's deliverer may fill credentials anywhere in its request: sealed.
    fields = {k: v for k, v in payload.items() if k not in ("keyed", "deadline_s")}
    rendered: dict[str, Any] = templates.render(fields, outputs, "payload", sealed=True)
    return rendered


def check_push(branch: Any) -> None:
    """`RenderError` unless a push's branch is one git accepts (as checked at create: it is
    the plan's text, never an output's, and must not reach git as an option or a refspec of
    another shape). The base and the candidate are the ledger's own; `Mirrors.push` refuses
    any that is not a commit id before git runs."""
    if not isinstance(branch, str) or not valid_branch(branch):
        raise RenderError(f"payload.branch: {branch!r} is not a branch name git accepts")


# -- the dispatcher's side --------------------------------------------------------------------


def _row(s: Statements, effect_id: str) -> Row:
    row = s.one("effect_row", (effect_id,))
    if row is None:
        raise NotFound(f"no effect {effect_id}")
    return row


def _ended(row: Row) -> bool:
    return TaskState(row["task_state"]) in TERMINAL


def _held(tx: Tx, effect_id: str, holder: str) -> Row:
    """The row, if `holder` holds it; `EffectNotHeld` otherwise."""
    row = _row(tx, effect_id)
    if row["state"] != OutboxState.SENDING or row["holder"] != holder:
        raise EffectNotHeld(
            f"effect {effect_id} is {row['state']}, not held by this dispatcher"
        ).about(task_id=row["task_id"], step_id=effect_id)
    return row


def _set(tx: Tx, effect_id: str, state: OutboxState) -> None:
    """Move the row to `state`, dropping its holder; an end state records when it ended.
    (`take` hands rows to a dispatcher, `open_gate` and `resolve` move them with the columns
    their gate changes.)"""
    if state is OutboxState.SENDING:
        raise ValueError("a row becomes `sending` only when a dispatcher takes it")
    if state in ENDS:
        tx.run("end_effect", (state.value, tx.now, effect_id))
    else:
        tx.run("move_effect", (state.value, effect_id))


ENDS = frozenset({OutboxState.DELIVERED, OutboxState.FAILED, OutboxState.WITHDRAWN})


def _attempts(s: Statements, row: Row, opening_only: bool) -> list[Row]:
    """The effect's attempts an operator's word has not settled (`settled_attempts`); with
    `opening_only`, those of its current gate opening."""
    if opening_only:
        return s.all(
            "unsettled_deliveries_of_opening",
            (row["step_id"], row["settled_attempts"], row["openings"]),
        )
    return s.all("unsettled_deliveries", (row["step_id"], row["settled_attempts"]))


def _maybe_sent(attempts: list[Row]) -> bool:
    """Whether any of these attempts may have reached the receiver: one answered `sent`, or
    one begun and never answered."""
    return any(a["sent"] is None or a["sent"] for a in attempts)


def _to_outgoing(row: Row) -> Outgoing:
    return Outgoing(
        effect_id=row["step_id"], task_id=row["task_id"], tenant=row["tenant"], kind=row["kind"],
        effect_key=row["effect_key"], keyed=bool(row["keyed"]),
        request=loads(row["request_json"]), digest=row["digest"],
        deadline_at=math.inf if row["deadline_at"] is None else float(row["deadline_at"]),
    )  # fmt: skip


def take(tx: Tx, holder: str, limit: int) -> list[Outgoing]:
    """Hand up to `limit` effects to `holder`, for `effect_hold_s`.

    First the `sending` rows whose hold lapsed (their dispatcher vanished): a keyed one is
    taken again and will be sent again under the same key; an unkeyed one that may have been
    sent becomes `uncertain` (never re-sent by itself), one with no attempt begun goes back to
    `open`; a row of a task that ended meanwhile is settled (`_settle_ended`). Then `due`
    (keyed) and `open` (unkeyed) rows of live tasks, oldest first.
    """
    tx.request = "take"
    taken: list[Row] = []
    hold = tx.now + tx.config.effect_hold_s
    for row in tx.all("lapsed_effects", (OutboxState.SENDING.value, tx.now)):
        if _ended(row):
            _settle_ended(tx, row, "its dispatcher vanished")
        elif row["keyed"]:
            if len(taken) < limit:
                taken.append(row)
        elif _maybe_sent(_attempts(tx, row, opening_only=True)):
            _uncertain(tx, row, "its dispatcher vanished after starting to send")
        else:
            _set(tx, row["step_id"], OutboxState.OPEN)
    room = max(0, limit - len(taken))
    if room:
        taken += tx.all(
            "ready_effects",
            (
                OutboxState.DUE.value, OutboxState.OPEN.value, tx.now,
                *(s.value for s in TERMINAL), room,
            ),
        )  # fmt: skip
    for row in taken:
        tx.run("hold_effect", (OutboxState.SENDING.value, holder, hold, row["step_id"]))
    return [_to_outgoing(row) for row in taken]


def _uncertain(tx: Tx, row: Row, why: str) -> None:
    _set(tx, row["step_id"], OutboxState.UNCERTAIN)
    append_event(
        tx, row["task_id"], "effect_uncertain", row["task_state"],
        {"step_id": row["step_id"], "why": why},
    )  # fmt: skip
    tx.note(
        Decision.EFFECT_UNCERTAIN, task_id=row["task_id"], step_id=row["step_id"],
        kind=row["kind"], why=why, tenant=row["tenant"],
    )  # fmt: skip


def _settle_ended(tx: Tx, row: Row, why: str) -> None:
    """A row whose task ended: withdrawn if nothing of it can have been sent, else
    `uncertain` for an operator, keyed or not: after the task ended nothing sends it again,
    so only an operator can say whether the receiver applied it (the task stays ended either
    way). An unkeyed effect counts the attempts of its current gate opening."""
    if _maybe_sent(_attempts(tx, row, opening_only=not row["keyed"])):
        _uncertain(tx, row, f"{why}; its task ended")
    else:
        _withdraw(tx, row, "nothing of it was sent before its task ended")


def _withdraw(tx: Tx, row: Row, why: str, **data: Any) -> None:
    """The effect will never be sent: its row `withdrawn`, its step cancelled."""
    _set(tx, row["step_id"], OutboxState.WITHDRAWN)
    tx.run("cancel_effect_step", (row["step_id"],))
    append_event(
        tx, row["task_id"], "effect_withdrawn", row["task_state"],
        {"step_id": row["step_id"], "why": why, **data},
    )  # fmt: skip


def end_with_task(tx: Tx, task_id: str) -> None:
    """The task has just ended (cancelled, or failed): settle its effects that no dispatcher
    is delivering (`_settle_ended`): `due`, `gated` and `open` rows, and `sending` rows with
    no attempt begun. A `sending` row with an attempt begun is left to its dispatcher, whose
    answer is recorded and whose next attempt is refused (docs/design.md, Effects). Called by
    `fencing.withdraw_effects` after the task's state moved."""
    for row in tx.all(
        "unheld_effects_of_task", (task_id, *(s.value for s in UNHELD), OutboxState.SENDING.value)
    ):
        _settle_ended(tx, row, "an attempt of it may have been sent")


def begin_attempt(tx: Tx, effect_id: str, holder: str, digest: str) -> int:
    """Record that attempt N is about to be sent (before anything leaves); return N.

    Refused, with nothing written, when `holder` does not hold the effect (`EffectNotHeld`;
    a held row whose task ended is settled at once, `_settle_ended`), when `digest` is not the
    rendered request's or, unkeyed, not the one its gate was opened for (`GateMismatch`), and
    when an unkeyed effect's gate opening was already used by an attempt that may have sent.
    """
    tx.request = "begin_attempt"
    row = _held(tx, effect_id, holder)
    about = {"task_id": row["task_id"], "step_id": effect_id}
    if _ended(row):
        tx.after_refusal.append(lambda t: _settle_ended(t, _row(t, effect_id), "cancelled"))
        raise EffectNotHeld(f"task {row['task_id']} is {row['task_state']}").about(**about)
    if digest != row["digest"]:
        raise GateMismatch(
            f"digest {digest} is not effect {effect_id}'s request digest {row['digest']}"
        ).about(**about)
    opening = 0
    if not row["keyed"]:
        opening = row["openings"]
        if digest != row["gate_digest"]:
            raise GateMismatch(
                f"the gate of effect {effect_id} was opened for {row['gate_digest']}"
            ).about(**about)
        if _maybe_sent(_attempts(tx, row, opening_only=True)):
            raise EffectNotHeld(
                f"effect {effect_id} is unkeyed and its gate opening was used"
            ).about(**about)
    if row["deadline_at"] is not None and tx.now > row["deadline_at"]:
        raise EffectNotHeld(f"effect {effect_id}'s delivery deadline has passed").about(**about)
    last = tx.one("last_delivery_attempt", (effect_id,))
    attempt = int((last["n"] if last else None) or 0) + 1
    tx.run("insert_delivery", (effect_id, attempt, opening, holder, tx.now))
    if row["kind"] == "git.push":
        # Before the push leaves: a head read that reports this candidate is the task's own
        # push (`operator.observe_head`), however soon the forge's webhook arrives.
        candidate = loads(row["request_json"]).get("candidate")
        tx.run("record_pushed_sha", (candidate, row["task_id"]))
    tx.run("extend_effect_hold", (tx.now + tx.config.effect_hold_s, effect_id))
    return attempt


def record_attempt(tx: Tx, effect_id: str, attempt: int, holder: str, answer: Answer) -> None:
    """Record the receiver's answer to attempt `attempt`, then move the effect on: delivered
    (step committed, task advances; a task cancelled meanwhile stays CANCELLED with its
    effect delivered), refused (step and task fail with the answer's code), or unanswered
    (keyed, or unkeyed and certainly not sent: still held, to be retried; unkeyed and maybe
    sent: `uncertain`).

    An answer that arrives after the effect became `uncertain` (its hold lapsed, or its task
    ended, while this holder was still sending) is taken as if in time when the attempt is
    this holder's and still unanswered: delivered or refused settles the effect; unanswered
    leaves it uncertain for an operator."""
    tx.request = "record_attempt"
    late = _row(tx, effect_id)
    row = late if _answers_uncertain(tx, late, attempt, holder) else _held(tx, effect_id, holder)
    delivery = tx.one("delivery_attempt", (effect_id, attempt))
    if delivery is None or delivery["answer"] is not None or delivery["holder"] != holder:
        raise EffectNotHeld(
            f"effect {effect_id} has no attempt {attempt} waiting for its answer"
        ).about(task_id=row["task_id"], step_id=effect_id)
    kind, sent = _answer_columns(answer)
    tx.run(
        "answer_delivery",
        (
            tx.now, kind, sent, answer.status, answer.detail[:DETAIL_MAX],
            answer.code if isinstance(answer, Refused) else None, effect_id, attempt,
        ),
    )  # fmt: skip
    if isinstance(answer, Delivered):
        observation = {
            "status": answer.status, "detail": answer.detail[:DETAIL_MAX],
            "replayed": answer.replayed, "attempt": attempt,
        }  # fmt: skip
        _deliver(tx, row, observation)
    elif isinstance(answer, Refused):
        _set(tx, effect_id, OutboxState.FAILED)
        _fail(tx, row, f"{answer.code}: {answer.detail[:DETAIL_MAX]}")
    elif row["state"] == OutboxState.UNCERTAIN:
        return  # still only an operator can say
    elif row["keyed"] or not answer.sent:
        tx.run("extend_effect_hold", (tx.now + tx.config.effect_hold_s, effect_id))
    else:
        _uncertain(tx, row, "an unkeyed send went unanswered")


def _answers_uncertain(s: Statements, row: Row, attempt: int, holder: str) -> bool:
    """Whether `holder`'s answer to `attempt` may settle `row`, which became uncertain while
    that attempt was in flight: the attempt is the holder's and still unanswered."""
    if row["state"] != OutboxState.UNCERTAIN:
        return False
    delivery = s.one(
        "unsettled_delivery_attempt", (row["step_id"], attempt, row["settled_attempts"])
    )
    return delivery is not None and delivery["holder"] == holder and delivery["answer"] is None


DETAIL_MAX = 2048


def _answer_columns(answer: Answer) -> tuple[str, int]:
    if isinstance(answer, Delivered):
        return "delivered", 1
    if isinstance(answer, Refused):
        return "refused", 1
    return "unanswered", int(answer.sent)


def _deliver(tx: Tx, row: Row, observation: dict[str, Any]) -> None:
    """The effect happened: its one effect row, the step committed with the observation as its
    output, and the task advanced (unless it has ended: the delivery is still recorded)."""
    from tether.supervisor.ledger import effects  # effects.advance starts steps through this module

    effect_id = row["step_id"]
    _set(tx, effect_id, OutboxState.DELIVERED)
    step = find_step(tx, effect_id, None)
    tx.run(
        "insert_delivered_effect",
        (
            row["effect_key"], effect_id, row["task_id"], EFFECT_FENCE, step["payload_hash"],
            dumps(observation), NO_USAGE, tx.now,
        ),
    )  # fmt: skip
    tx.run("commit_delivered_step", (dumps(observation), tx.now, effect_id))
    append_event(
        tx, row["task_id"], "step_committed", step["task_state"],
        {"step_id": effect_id, "effect_key": row["effect_key"], "delivered": True,
         "replayed": bool(observation.get("replayed"))},
    )  # fmt: skip
    tx.note(
        Decision.COMMITTED, task_id=row["task_id"], step_id=effect_id, kind=row["kind"],
        effect_key=row["effect_key"], tenant=row["tenant"], pool=step["pool"],
        replayed=bool(observation.get("replayed")),
    )  # fmt: skip
    if TaskState(step["task_state"]) not in TERMINAL:
        effects.advance(tx, step)


# An effect the supervisor delivered was committed under no lease: its effect row's fence;
# and it used no model: its usage.
EFFECT_FENCE = 0
NO_USAGE = dumps({})


def _fail(tx: Tx, row: Row, reason: str) -> None:
    """Fail the effect step, and its task unless the task has ended already."""
    step = find_step(tx, row["step_id"], None)
    if TaskState(step["task_state"]) in TERMINAL:
        tx.run("fail_effect_step", (row["step_id"],))
        return
    fail_step(tx, step, reason)


def give_up(tx: Tx, effect_id: str, holder: str, reason: str) -> None:
    """The delivery deadline passed with only unanswered attempts. The effect becomes
    `uncertain` when one of them may have reached the receiver (keyed too: a receiver that
    timed out or answered 503 may still have applied it; an unkeyed one counts its current
    gate opening), for an operator to say whether it happened; it fails
    (`delivery_deadline`) only when none can have."""
    tx.request = "give_up"
    row = _held(tx, effect_id, holder)
    if _maybe_sent(_attempts(tx, row, opening_only=not row["keyed"])):
        _uncertain(tx, row, f"delivery deadline passed: {reason}")
        return
    _set(tx, effect_id, OutboxState.FAILED)
    _fail(tx, row, f"delivery_deadline: {reason}"[:DETAIL_MAX])


def release(tx: Tx, effect_id: str, holder: str) -> None:
    """The dispatcher stops without an answer (shutdown). A keyed effect goes back to `due`;
    an unkeyed one becomes `uncertain` if an attempt began and was never answered, else goes
    back to `open`. A row whose task ended is settled (`_settle_ended`)."""
    tx.request = "release_effect"
    row = _held(tx, effect_id, holder)
    tx.run("release_unanswered_deliveries", (tx.now, effect_id))
    if _ended(row):
        _settle_ended(tx, row, "released")
    elif row["keyed"]:
        _set(tx, effect_id, OutboxState.DUE)
        tx.wake(EFFECTS)
    elif _maybe_sent(_attempts(tx, row, opening_only=True)):
        _uncertain(tx, row, "released after starting to send")
    else:
        _set(tx, effect_id, OutboxState.OPEN)
        tx.wake(EFFECTS)


# -- the operator's side ----------------------------------------------------------------------


def _effect_of(tx: Tx, tenant: str, task_id: str, step_name: str) -> Row:
    """The outbox row of `tenant`'s task's step named `step_name`; `NotFound` for another
    tenant's task, an unknown step, and a step that is not (yet) an effect with a row."""
    task = tx.one("tenant_task_id", (task_id, tenant))
    if task is None:
        raise NotFound(f"no task {task_id}")
    step = tx.one("first_step_named", (task_id, step_name))
    if step is None:
        raise NotFound(f"task {task_id} has no step {step_name!r}")
    if step["kind"] not in tx.config.effect_kinds:
        raise InvalidRequest(f"step {step_name!r} is a {step['kind']} step, not an effect")
    row = tx.one("effect_row", (step["id"],))
    if row is None:
        raise EffectNotGated(f"step {step_name!r} of task {task_id} is not due yet").about(
            task_id=task_id, step_id=step["id"]
        )
    return row


def open_gate(tx: Tx, tenant: str, task_id: str, step_name: str, digest: str, by: str) -> None:
    """Open the gate of an unkeyed effect for exactly `digest`, the digest of its rendered
    request as shown to the operator; one opening allows one send. Refused (nothing changes)
    when the effect is not `gated` (`EffectNotGated`) or `digest` is not its request's
    (`GateMismatch`). The delivery deadline starts at the opening."""
    tx.request = "gate"
    row = _effect_of(tx, tenant, task_id, step_name)
    about = {"task_id": task_id, "step_id": row["step_id"]}
    if _ended(row):
        raise TerminalState(f"task {task_id} is {row['task_state']}").about(task_id=task_id)
    if row["state"] != OutboxState.GATED:
        raise EffectNotGated(
            f"step {step_name!r} is {row['state']}: only a gated effect's gate can be opened"
        ).about(**about)
    if digest != row["digest"]:
        raise GateMismatch(
            f"digest {digest} is not the digest of step {step_name!r}'s request"
            f" ({row['digest']}); look at the request again"
        ).about(**about)
    tx.run(
        "open_effect_gate",
        (
            OutboxState.OPEN.value, row["openings"] + 1, digest, tx.now + row["deadline_s"],
            tx.now, row["step_id"],
        ),
    )  # fmt: skip
    _decided(tx, row, "open", by, digest)
    append_event(
        tx, task_id, "gate_opened", row["task_state"],
        {"step_id": row["step_id"], "digest": digest, "by": by},
    )  # fmt: skip
    tx.note(
        Decision.GATE_OPENED, task_id=task_id, step_id=row["step_id"], by=by, digest=digest,
        tenant=tenant,
    )  # fmt: skip
    tx.wake(EFFECTS)


def resolve(tx: Tx, tenant: str, task_id: str, step_name: str, happened: bool, by: str) -> None:
    """An operator's word on an `uncertain` effect; it settles every attempt made so far.
    `happened`: it is recorded as delivered (step committed, the task advances unless it
    ended). Not: for a task that ended, the effect is withdrawn; a keyed effect (uncertain
    only once its deadline passed) fails `delivery_deadline`; an unkeyed one goes back behind
    its gate, once; a second `no` for the same effect is refused (say yes, or cancel the
    task)."""
    tx.request = "happened"
    row = _effect_of(tx, tenant, task_id, step_name)
    about = {"task_id": task_id, "step_id": row["step_id"]}
    if row["state"] != OutboxState.UNCERTAIN:
        raise EffectNotGated(
            f"step {step_name!r} is {row['state']}: only an uncertain effect is resolved"
        ).about(**about)
    tx.run("settle_effect_attempts", (row["step_id"], row["step_id"]))
    if happened:
        _decided(tx, row, "happened", by, row["digest"])
        _deliver(
            tx, row,
            {"status": None, "detail": f"an operator ({by}) said it happened", "replayed": False,
             "by": by},
        )  # fmt: skip
        return
    if row["said_no"]:
        raise EffectNotGated(
            f"step {step_name!r} was already re-opened once after a `no`: say whether it"
            " happened, or cancel the task"
        ).about(**about)
    _decided(tx, row, "not_happened", by, row["digest"])
    said = f"an operator ({by}) said it did not happen"
    if _ended(row):
        tx.run("mark_effect_said_no", (row["step_id"],))
        _withdraw(tx, row, said, by=by)
        return
    if row["keyed"]:
        tx.run("mark_effect_said_no", (row["step_id"],))
        _set(tx, row["step_id"], OutboxState.FAILED)
        _fail(tx, row, f"delivery_deadline: {said}")
        return
    tx.run("regate_effect", (OutboxState.GATED.value, row["step_id"]))
    append_event(
        tx, task_id, "effect_regated", row["task_state"], {"step_id": row["step_id"], "by": by}
    )


def _decided(tx: Tx, row: Row, action: str, by: str, digest: str | None) -> None:
    tx.run("insert_effect_decision", (row["step_id"], action, digest, by, tx.now))
