"""`tether-supervisor task ...`: the operator's client for the HTTP API.

A thin adapter: it sends what the operator typed, prints what the supervisor answered, and
decides nothing itself. `watch` follows the event journal by long-poll and prints one readable
line per event, applying events in sequence order and skipping any it has already shown.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import httpx
import tenacity

from supervisor.ledger.states import TERMINAL
from tether.codec import encode
from tether.messages import Approval, Cancel, Record, ReviewDecision
from tether.wire import plan_hash

TERMINAL_STATES = frozenset(state.value for state in TERMINAL)
WATCH_WAIT_S = 30.0


class ClientError(Exception):
    """The supervisor refused the request or could not be reached; the message says which."""


class Unreachable(ClientError):
    """The supervisor did not answer; trying again later may work."""


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

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach the supervisor: {exc}") from None
        if response.status_code >= 400:
            try:
                body = response.json()
                message = f"{body['error']}: {body['detail']}"
            except (ValueError, KeyError, TypeError):
                message = f"not a tether supervisor's answer: {_one_line(response.text)}"
            raise ClientError(f"{response.status_code} {_one_line(message)}")
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

    def submit(self, body: dict[str, Any]) -> Any:
        """Send a task file as it is: the supervisor reads it into its record and says what is
        wrong with it, if anything."""
        return self._call("POST", "/v1/tasks", json=body)

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

    def show(self, task_id: str) -> Any:
        return self._call("GET", f"/v1/tasks/{task_id}")

    def events(self, task_id: str, after: int, wait_s: float) -> list[dict[str, Any]]:
        body = self._call(
            "GET", f"/v1/tasks/{task_id}/events", params={"after": after, "wait": wait_s}
        )
        if not isinstance(body, dict) or not isinstance(body.get("events"), list):
            raise ClientError("not a tether supervisor's answer: no 'events' list")
        return list(body["events"])


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
    return plan_hash(steps)


def describe(event: dict[str, Any]) -> str:
    """One readable line per event."""
    stamp = time.strftime("%H:%M:%S", time.gmtime(event.get("at", 0)))
    data = event.get("data") or {}
    details = " ".join(
        f"{k}={v}" for k, v in data.items() if k in {"step_id", "attempt", "fence", "reason",
                                                      "runner_id", "why", "head_sha", "from"}
    )  # fmt: skip
    return f"{event['seq']:>6} {stamp} {event['state']:<9} {event['kind']:<14} {details}".rstrip()


def watch(
    client: OperatorClient, task_id: str, *, after: int = 0, out: TextIO | None = None
) -> str:
    """Print events until the task ends; answer its terminal state. Survives restarts of the
    supervisor by retrying the long-poll, for up to five minutes, once it has reached the
    supervisor: a wrong URL, or nothing listening there, fails at once like the other commands.

    A task that ended at or before `after` has no event left to show: the task itself says so,
    before the first long-poll and after any that comes back empty, so watching never hangs.
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
    task: Any = client.show(task_id)  # not retried: the first contact says if the URL is right
    while True:
        if task is not None and task["state"] in TERMINAL_STATES and task["seq"] <= last:
            return str(task["state"])
        task = None
        try:
            batch = retrying(client.events, task_id, last, wait_s)
        except ClientError as exc:
            if not (str(exc).startswith("422 ") and "'wait'" in str(exc) and wait_s > 1):
                raise
            wait_s /= 2  # and ask again at once
            continue
        for event in batch:
            if event["seq"] <= last:
                continue  # already shown: never move the view backwards
            last = event["seq"]
            print(describe(event), file=out, flush=True)
            if event["kind"] == "state" and event["state"] in TERMINAL_STATES:
                return str(event["state"])
        if not batch:  # the poll timed out: does the task itself say it ended?
            task = retrying(client.show, task_id)
