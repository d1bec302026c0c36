"""`tether-supervisor task ...`, `status` and `artifact get`: the operator's client for the HTTP
API.

A thin adapter: it sends what the operator typed, prints what the supervisor replied, and
decides nothing itself.
"""

from __future__ import annotations

import json
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, TextIO, TypeVar

import httpx
import msgspec
import tenacity

from tether.clocks import epoch
from tether.supervisor.ledger.states import TERMINAL, TaskState
from tether.supervisor.shown import reveal, reveal_json
from tether.wire import plan_hash, sha256_hex
from tether.wire.codec import BadMessage, decode, encode
from tether.wire.records import (
    Approval,
    Cancel,
    CandidateDiffView,
    EffectHappened,
    EffectView,
    Event,
    Events,
    GateOpen,
    PoolsAnswer,
    Record,
    ReviewDecision,
    StepDetail,
    TaskDetail,
    TaskLogs,
    TaskPage,
    TaskSummary,
    WaitingFor,
)

R = TypeVar("R", bound=Record)

TERMINAL_STATES = frozenset(state.value for state in TERMINAL)
WATCH_WAIT_S = 30.0
# While a task waits, `watch` polls at most this long, so a change in what it waits for (a
# runner appears, which writes no event) shows within seconds rather than a whole poll.
WAITING_POLL_S = 10.0

# `watch`'s exit status by the task's end (1 stays "error" and 2 "usage", as for every command).
EXIT_SUCCEEDED: Final = 0
EXIT_FAILED: Final = 3
EXIT_CANCELLED: Final = 4
EXIT_CODES: Final = {
    TaskState.SUCCEEDED.value: EXIT_SUCCEEDED,
    TaskState.FAILED.value: EXIT_FAILED,
    TaskState.CANCELLED.value: EXIT_CANCELLED,
}


class ClientError(Exception):
    """The supervisor refused the request or could not be reached; the message says which."""


class Unreachable(ClientError):
    """The supervisor did not reply; trying again later may work."""


class OperatorClient:
    def __init__(self, url: str, token: str, *, transport: httpx.BaseTransport | None = None):
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise ClientError(f"--url {url!r} is not a URL: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ClientError(f"--url {url!r} must be http(s)://HOST[:PORT]")
        if parsed.path.rstrip("/").endswith("/v1"):
            raise ClientError(
                f"--url {url!r}: give the supervisor's address without /v1 (the client adds it)"
            )
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(10.0, read=70.0),
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(unreachable_line(str(self._http.base_url), exc)) from None
        if response.status_code >= 400:
            try:
                body = response.json()
                message = f"{body['error']}: {body['detail']}"
            except (ValueError, KeyError, TypeError):
                message = f"not a tether supervisor's answer: {_one_line(response.text)}"
            raise ClientError(f"{response.status_code} {_one_line(message)}")
        return response

    def _read(self, path: str, into: type[R], **params: Any) -> R:
        """GET `path` and read the response into its record."""
        response = self._request("GET", path, params=params)
        try:
            return decode(response.content, into)
        except BadMessage as exc:
            raise ClientError(
                f"{response.status_code} not a tether supervisor's answer: {exc.detail}"
            ) from None

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._request(method, path, **kwargs)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise ClientError(
                f"{response.status_code} not a tether supervisor's answer:"
                f" {_one_line(response.text)}"
            ) from None

    def _send(self, path: str, record: Record) -> Any:
        headers = {"Content-Type": "application/json"}
        return self._call("POST", path, content=encode(record), headers=headers)

    def submit(self, body: dict[str, Any]) -> tuple[Any, bool]:
        """Send a task file as it is: the supervisor reads it into its record and says what is
        wrong with it, if anything. Answers the task and whether it is new (201), not one its
        idempotency key made before (200)."""
        response = self._request("POST", "/v1/tasks", json=body)
        try:
            return response.json(), response.status_code == 201
        except ValueError:
            raise ClientError(
                f"{response.status_code} not a tether supervisor's answer:"
                f" {_one_line(response.text)}"
            ) from None

    def approve(self, task_id: str, plan_hash: str, base_sha: str | None) -> Any:
        approval = Approval(plan_hash=plan_hash, base_sha=base_sha)
        return self._send(f"/v1/tasks/{task_id}/approve", approval)

    def cancel(self, task_id: str, reason: str) -> Any:
        return self._send(f"/v1/tasks/{task_id}/cancel", Cancel(reason=reason))

    def review(self, task_id: str, decision: str | None, note: str) -> Any:
        if decision is None:
            return self._call("GET", f"/v1/tasks/{task_id}/review")
        return self._send(
            f"/v1/tasks/{task_id}/review", ReviewDecision(decision=decision, note=note)
        )

    def open_gate(self, task_id: str, step: str, digest: str) -> Any:
        """Open an unkeyed effect's gate for exactly the request whose digest is `digest`."""
        return self._send(_step_path(task_id, step, "gate"), GateOpen(digest=digest))

    def effect_happened(self, task_id: str, step: str, happened: bool) -> Any:
        """An operator's word on an uncertain effect."""
        return self._send(_step_path(task_id, step, "happened"), EffectHappened(happened=happened))

    def show(self, task_id: str) -> Any:
        """The task view as the supervisor sent it, every field kept (`task show` prints it)."""
        return self._call("GET", f"/v1/tasks/{task_id}")

    def view(self, task_id: str) -> TaskDetail:
        return self._read(f"/v1/tasks/{task_id}", TaskDetail)

    def tasks(self, state: str | None = None, limit: int = 50) -> Iterator[TaskSummary]:
        """Every task of the tenant, newest first, following the pages' `next` cursors."""
        params: dict[str, Any] = {"limit": limit}
        if state is not None:
            params["state"] = state
        while True:
            page = self._read("/v1/tasks", TaskPage, **params)
            yield from page.tasks
            if page.next is None:
                return
            params["cursor"] = page.next

    def candidate(self, task_id: str, step: str | None) -> CandidateDiffView:
        """A step's candidate against the approved base (default: the last with one)."""
        params = {} if step is None else {"step": step}
        return self._read(f"/v1/tasks/{_quoted(task_id)}/candidate", CandidateDiffView, **params)

    def candidate_bundle(self, task_id: str, step: str | None) -> bytes:
        """A bundle of the candidate whose one head is `tether/<task_id>`."""
        params = {} if step is None else {"step": step}
        return self._request(
            "GET", f"/v1/tasks/{_quoted(task_id)}/candidate/bundle", params=params
        ).content

    def pools(self) -> PoolsAnswer:
        return self._read("/v1/pools", PoolsAnswer)

    def artifact(self, digest: str) -> bytes:
        """The bytes stored under `digest`, checked against it."""
        if not (len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise ClientError(f"{digest[:80]!r} is not a sha256 digest (64 lowercase hex)")
        data = self._request("GET", f"/v1/artifacts/{digest}").content
        if sha256_hex(data) != digest:
            raise ClientError(f"the supervisor sent bytes whose sha256 is not {digest}")
        return data

    def task_log(self, task_id: str, after_seq: int, after_line: int) -> TaskLogs:
        """`GET /v1/tasks/{id}/logs`: the task's journal and runner lines after the cursor."""
        path = f"/v1/tasks/{urllib.parse.quote(task_id, safe='')}/logs"
        return self._read(path, TaskLogs, after_seq=after_seq, after_line=after_line)

    def events(self, task_id: str, after: int, wait_s: float) -> tuple[Event, ...]:
        path = f"/v1/tasks/{task_id}/events"
        return self._read(path, Events, after=after, wait=wait_s).events


def unreachable_line(url: str, exc: Exception) -> str:
    """Why the supervisor at `url` did not answer, naming the URL and what to check: TLS
    spoken to a plain-HTTP port fails with OpenSSL's `WRONG_VERSION_NUMBER`."""
    said = _one_line(str(exc)) or type(exc).__name__
    if "WRONG_VERSION_NUMBER" in said or "wrong version number" in said:
        plain = "http://" + url.split("://", 1)[-1]
        return (
            f"cannot reach the supervisor at {url}: it did not answer TLS; is this an http port?"
            f" (try --url {plain}) ({said})"
        )
    return f"cannot reach the supervisor at {url}: {said}"


def _quoted(task_id: str) -> str:
    return urllib.parse.quote(task_id, safe="")


def candidate_text(view: CandidateDiffView, *, patch: bool) -> str:
    """`task candidate`: which commit against which base, then each file's counts and the
    total (`--stat`), or the patch (`--patch`), hiding characters revealed either way."""
    head = (
        f"candidate {view.candidate_sha} of step {reveal(view.step)!r} against base {view.base_sha}"
    )
    if patch:
        cut = "\n(the patch is cut at 512 KiB)" if view.truncated else ""
        return f"{head}\n{reveal(view.patch).rstrip()}{cut}"
    lines = [head]
    for f in view.files:
        counts = "binary" if f.added is None else f"+{f.added} -{f.removed}"
        lines.append(f"  {counts:>14}  {reveal(f.path)}")
    added = sum(f.added or 0 for f in view.files)
    removed = sum(f.removed or 0 for f in view.files)
    lines.append(f"{len(view.files)} file(s) changed, +{added} -{removed}")
    return "\n".join(lines)


def _step_path(task_id: str, step: str, action: str) -> str:
    quoted = urllib.parse.quote(step, safe="")
    return f"/v1/tasks/{urllib.parse.quote(task_id, safe='')}/steps/{quoted}/{action}"


def effect_of(task: TaskDetail, step_name: str) -> tuple[StepDetail, EffectView]:
    """The step named `step_name` and its effect; `ClientError` if it is no effect yet."""
    step = next((s for s in task.steps if s.name == step_name), None)
    if step is None:
        names = ", ".join(repr(s.name) for s in task.steps)
        raise ClientError(f"task {task.id} has no step named {step_name!r} (steps: {names})")
    if step.effect is None:
        raise ClientError(
            f"step {step_name!r} of task {task.id} is a {step.kind} step in state {step.state}:"
            " it has no effect to show (an effect step shows one once it is due)"
        )
    return step, step.effect


def gate_text(step: StepDetail, effect: EffectView) -> str:
    """What `task gate` shows: the request exactly as it will be sent (a credential only as
    its `{{ credential.<name> }}` placeholder, never its value), its digest, and where the
    effect stands."""
    keyed = "keyed (sent with its Idempotency-Key)" if effect.keyed else "unkeyed (behind a gate)"
    lines = [
        f"step {step.name!r}: {effect.kind} effect, {keyed}, {effect.state}",
        reveal_json(effect.request),
        f"digest {effect.digest}",
    ]
    for d in effect.deliveries:
        answer = d.answer or "no answer"
        status = "" if d.status is None else f" {d.status}"
        lines.append(f"  attempt {d.attempt} at {d.started_at}: {answer}{status}")
    if effect.gate is not None:
        lines.append(f"gate last opened by {effect.gate.opened_by} at {effect.gate.opened_at}")
    if effect.resolved is not None:
        said = "happened" if effect.resolved.happened else "did not happen"
        lines.append(f"{effect.resolved.by} said it {said} at {effect.resolved.at}")
    return "\n".join(lines)


def _one_line(text: str, limit: int = 200) -> str:
    """Whatever a server said, as one line of the CLI's one-line error."""
    return " ".join(text.split())[:limit]


def load_task_file(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ClientError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ClientError(f"{path} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ClientError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("plan"), dict):
        raise ClientError(f"{path} must hold a task object with a 'plan'")
    return body


def plan_hash_of(body: dict[str, Any]) -> str:
    """The hash the supervisor computes for this task file's plan, so approving with it binds
    exactly what was sent. The supervisor hashes only each step's name, kind and payload (other
    keys in a task file, such as a step's description, are not part of the plan), and so must
    we, or a task file with one extra key could be submitted but never approved."""
    steps = body["plan"].get("steps")
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise ClientError("the task's plan must hold a 'steps' list of objects")
    verify = body.get("verify")
    if verify is not None and not isinstance(verify, dict):
        raise ClientError("the task's 'verify' must be an object, {\"pool\": POOL}")
    return plan_hash(steps, verify)


def view_of(raw: Any) -> TaskDetail:
    """A task view already read as JSON (`show`), as its record."""
    try:
        return msgspec.convert(raw, TaskDetail)
    except msgspec.ValidationError as exc:
        raise ClientError(f"not a tether supervisor's task view: {exc}") from None


def waiting_line(waiting: WaitingFor, task_id: str = "TASK_ID") -> str:
    """What a task waits for, in one line; the command it names is for `task_id`."""
    if waiting.reason == "approval":
        return "waiting for approval (tether-supervisor task approve)"
    if waiting.reason == "budget":
        return (
            f"waiting for budget: tenant {waiting.tenant!r} has spent {waiting.spent} of its"
            f" {waiting.budget} tokens (tether-supervisor budget)"
        )
    if waiting.reason == "gate":
        return (
            f"waiting for an operator to open the gate of effect {waiting.step!r}"
            f" (tether-supervisor task gate {task_id} {waiting.step})"
        )
    if waiting.reason == "uncertain":
        return (
            f"waiting for an operator: effect {waiting.step!r} may have been sent; say whether"
            f" it happened (tether-supervisor task gate {task_id} {waiting.step} --happened yes|no)"
        )
    if waiting.reason == "runner":
        pool = f"waiting for a runner in pool {waiting.pool!r}"
        if waiting.pool_last_seen_s is None:
            return f"{pool}: none has ever claimed there"
        if waiting.last_seen_s is None:
            return (
                f"{pool} serving kind {waiting.kind!r}: its runners serve other kinds"
                f" (last claim {waiting.pool_last_seen_s:g} s ago)"
            )
        return f"{pool}: last claim {waiting.last_seen_s:g} s ago"
    return f"waiting for {waiting.reason}"


def _waiting_key(waiting: WaitingFor | None) -> tuple[Any, ...] | None:
    """What makes a waiting line new: not the seconds counting up, but a reason, pool or kind
    that changed, or a runner seen for the first time."""
    if waiting is None:
        return None
    return (
        waiting.reason,
        waiting.pool,
        waiting.kind,
        waiting.tenant,
        waiting.step,
        waiting.last_seen_s is None,
        waiting.pool_last_seen_s is None,
    )


_TASK_COLUMNS: Final = "{id:<32}  {state:<9}  {created:<24}  {steps:>5}  {waits:<11}  {key}"
TASK_HEADER: Final = _TASK_COLUMNS.format(
    id="ID", state="STATE", created="CREATED", steps="STEPS", waits="WAITING-FOR", key="KEY"
).rstrip()


def task_line(task: TaskSummary) -> str:
    """One line of `task list` under `TASK_HEADER`: id, state, created, steps committed/total,
    what it waits for, and the idempotency key it was submitted with (last: it is free text
    of any length, revealed so it cannot hide characters)."""
    steps = f"{task.steps_committed}/{task.steps_total}"
    waits = task.waiting_for.reason if task.waiting_for is not None else "-"
    key = reveal(task.idempotency_key)
    return _TASK_COLUMNS.format(
        id=task.id, state=task.state, created=task.created_at, steps=steps, waits=waits, key=key
    )


def status_lines(answer: PoolsAnswer) -> list[str]:
    """`status`: per pool, one line for its queue, then one per runner seen recently."""
    lines = []
    for pool in answer.pools:
        oldest = "" if pool.oldest_queued_s is None else f", oldest {pool.oldest_queued_s:g} s"
        lines.append(f"{pool.pool}: {pool.queued} queued{oldest}, {pool.in_flight} in flight")
        for runner in pool.runners:
            state = "online" if runner.online else "seen" if runner.online is None else "offline"
            lines.append(
                f"  runner {runner.runner_id} {state}, serves {', '.join(runner.kinds)};"
                f" last claim {runner.last_seen_s:g} s ago"
            )
        if not pool.runners:
            lines.append("  no runner claimed recently")
    return lines


def pick_step(task: TaskDetail, which: str | None) -> StepDetail:
    """The step `which` names (a step name, id or 0-based position), or the last committed."""
    if which is None:
        committed = [s for s in task.steps if s.state == "committed"]
        if not committed:
            raise ClientError(f"task {task.id} has no committed step yet ({task.state})")
        return committed[-1]
    for i, step in enumerate(task.steps):
        if which in (step.name, step.id, str(i)):
            return step
    names = ", ".join(repr(s.name) for s in task.steps)
    raise ClientError(f"task {task.id} has no step {which!r} (steps: {names}; or 0-based)")


def output_text(step: StepDetail) -> str:
    """A step's output to print: a chat step's text, any other output as JSON (so is a chat
    answer that called tools instead of writing text: its `tool_calls` are what it said)."""
    if step.state != "committed":
        raise ClientError(f"step {step.name!r} has no output: it is {step.state}")
    out = step.output
    chat_text = step.kind == "chat" and isinstance(out, dict) and isinstance(out.get("text"), str)
    if chat_text and (out["text"] or not out.get("tool_calls")):
        return str(out["text"])
    return json.dumps(out, indent=2, sort_keys=True)


def describe(event: Event, names: dict[str, str] | None = None, took: float | None = None) -> str:
    """One readable line per event: steps by name (by id when the name is not known), and
    `took`, the seconds since the step's lease or the task's creation, when given."""
    stamp = event.at or "-"
    data = event.data or {}
    parts = []
    if "step_id" in data:
        parts.append(f"step={(names or {}).get(data['step_id'], data['step_id'])}")
    parts += [
        f"{k}={v}"
        for k, v in data.items()
        if k
        in {"attempt", "fence", "reason", "runner_id", "why", "head_sha", "from", "candidate_sha"}
        and v is not None
    ]
    if took is not None:
        parts.append(f"took={took:.1f}s")
    details = " ".join(parts)
    return f"{event.seq:>6} {stamp} {event.state:<9} {event.kind:<14} {details}".rstrip()


def _epoch(at: Any) -> float:
    """A time the supervisor sent (ISO 8601), in seconds, for a duration between two; 0.0 for
    one that is not a time."""
    try:
        return epoch(at) if isinstance(at, str) else 0.0
    except ValueError:
        return 0.0


class _Story:
    """What `watch` remembers to make its lines readable: step names, when each step's last
    lease began, and the last waiting line shown."""

    def __init__(self, task: TaskDetail) -> None:
        self.created_at = _epoch(task.created_at)
        self.names = {s.id: s.name for s in task.steps}
        self.leased_at: dict[str, float] = {}
        self.shown: tuple[Any, ...] | None = None
        self.waiting = False

    def line(self, event: Event) -> str:
        data, at = event.data or {}, _epoch(event.at)
        step_id, took = data.get("step_id"), None
        if event.kind == "step_leased" and step_id is not None:
            self.leased_at[step_id] = at
        elif step_id in self.leased_at:
            took = at - self.leased_at.pop(step_id)
        elif event.kind == "state" and event.state in TERMINAL_STATES:
            took = at - self.created_at
        return describe(event, self.names, took)

    def wait_line(self, task: TaskDetail) -> str | None:
        """The waiting line to print if what the task waits for changed, else None."""
        key = _waiting_key(task.waiting_for)
        self.waiting = key is not None
        if key == self.shown:
            return None
        self.shown = key
        if task.waiting_for is None:
            return None
        return f"{'':>6} {'':8} {task.state:<9} {waiting_line(task.waiting_for, task.id)}"


def watch(
    client: OperatorClient, task_id: str, *, after: int = 0, out: TextIO | None = None
) -> str:
    """Print events until the task ends, one readable line each, in sequence order and
    skipping any already shown; return its terminal state (`EXIT_CODES` maps it to the exit
    status). Survives restarts of the supervisor by retrying the long-poll, for up to
    five minutes, once it has reached the supervisor: a wrong URL, or nothing listening there,
    fails at once like the other commands.

    What the task waits for (approval, a runner, the budget) is printed at once and again
    whenever it changes, so a task that cannot start does not look like a hung watch.
    A task that ended at or before `after` has no event left to show: the task itself says so,
    before the first long-poll and after each, so watching never hangs.
    A supervisor whose `events_wait_max_s` is below the poll's wait refuses it (422); the wait
    is then halved until it is accepted.
    """
    out = sys.stdout if out is None else out  # looked up per call: redirections apply
    last = after

    def lost(state: tenacity.RetryCallState) -> None:
        if state.attempt_number == 1 and state.outcome is not None:
            print(f"{state.outcome.exception()}; retrying for up to 5 min", file=sys.stderr)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(Unreachable),
        wait=tenacity.wait_random_exponential(multiplier=0.5, max=10),
        stop=tenacity.stop_after_delay(300),
        before_sleep=lost,
        reraise=True,
    )
    wait_s = WATCH_WAIT_S
    task = client.view(task_id)  # not retried: the first contact says if the URL is right
    story = _Story(task)
    while True:
        waiting = story.wait_line(task)
        if waiting is not None:
            print(waiting, file=out, flush=True)
        if task.state in TERMINAL_STATES and task.seq <= last:
            return task.state
        poll = min(wait_s, WAITING_POLL_S) if story.waiting else wait_s
        try:
            batch = retrying(client.events, task_id, last, poll)
        except ClientError as exc:
            if not (str(exc).startswith("422 ") and "'wait'" in str(exc) and poll > 1):
                raise
            wait_s = poll / 2  # and ask again at once
            continue
        for event in batch:
            if event.seq <= last:
                continue  # already shown: never move the view backwards
            last = event.seq
            print(story.line(event), file=out, flush=True)
            if event.kind == "state" and event.state in TERMINAL_STATES:
                return event.state
        task = retrying(client.view, task_id)
