"""Fakes for the runner's unit tests: a scripted supervisor and model behind `httpx.MockTransport`,
and clocks a test controls. (A module of helpers; its own tests check the fakes themselves.)

The fake supervisor keeps just enough state to be honest with the runner: leases in a queue,
the current fence of each step, cancelled tasks, a revoked token. A test scripts any call's
next answers with `script(kind, ...)`: an `httpx.Response`, an exception to raise (a transport
error), or an async callable that decides.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx

from tether.runner.credentials import SecretSource
from tether.runner.daemon import Runner
from tether.runner.kinds.registry import KindRegistry
from tether.runner.model_client import ModelClient
from tether.runner.models import wire_api
from tether.runner.settings import RunnerSettings
from tether.runner.supervisor_client import SupervisorClient
from tether.wire import content_hash

TOKEN = "runner-token-7f3c9e1d2b"
MODEL_KEY = "sk-model-key-5a8b2c4d6e"

Answer = httpx.Response | BaseException | Callable[[httpx.Request], Awaitable[httpx.Response]]


class JumpClock:
    """anyio's clock plus an offset a test can jump; sleepers wake up on a jump."""

    def __init__(self) -> None:
        self.offset = 0.0
        self._jumped = anyio.Event()

    def now(self) -> float:
        return anyio.current_time() + self.offset

    async def sleep(self, seconds: float) -> None:
        target = self.now() + seconds
        await anyio.lowlevel.checkpoint()
        while (left := target - self.now()) > 0:
            with anyio.move_on_after(left):
                await self._jumped.wait()

    def jump(self, seconds: float) -> None:
        self.offset += seconds
        self._jumped.set()
        self._jumped = anyio.Event()


class VirtualClock:
    """A clock whose sleeps pass at once, advancing it; every sleep is recorded."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += max(0.0, seconds)
        await anyio.lowlevel.checkpoint()


def json_response(
    status: int, body: Any = None, headers: dict[str, str] | None = None
) -> httpx.Response:
    if body is None:
        return httpx.Response(status, headers=headers)
    return httpx.Response(status, json=body, headers=headers)


def error(status: int, code: str, detail: str = "") -> httpx.Response:
    return json_response(status, {"error": code, "detail": detail or code})


@dataclasses.dataclass
class Call:
    kind: str
    path: str
    body: Any
    headers: dict[str, str]
    at: float
    step_id: str | None = None


def make_lease(
    step_id: str = "step-1",
    *,
    task_id: str = "task-1",
    payload: Any = None,
    fence: int = 1,
    attempt: int = 1,
    kind: str = "chat",
    ttl_s: float = 5.0,
    renew_every_s: float = 0.5,
    outputs: list[dict[str, Any]] | None = None,
    payload_hash: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A lease as a claim reply carries it; `extra` adds fields (`repository`, `resume`)."""
    if payload is None:
        payload = {"messages": [{"role": "user", "content": f"do {step_id}"}]}
    return {
        "step_id": step_id,
        "task_id": task_id,
        "name": f"name-{step_id}",
        "kind": kind,
        "attempt": attempt,
        "fence": fence,
        "payload": payload,
        "payload_hash": payload_hash or content_hash(payload),
        "ttl_s": ttl_s,
        "renew_every_s": renew_every_s,
        "outputs": outputs or [],
        **extra,
    }


class FakeSupervisor:
    """The supervisor's runner API, in memory."""

    def __init__(self, *, token: str = TOKEN, pool: str = "default") -> None:
        self.token = token
        self.pool = pool
        self.queue: list[dict[str, Any]] = []
        self.fences: dict[str, int] = {}
        self.cancelled_tasks: set[str] = set()
        self.leases: dict[str, dict[str, Any]] = {}
        self.calls: list[Call] = []
        self.scripts: dict[str, list[Answer]] = defaultdict(list)
        self.down = False
        self.requeue_released = True
        self.next_fence = 100
        self.batches: list[httpx.Request] = []  # requests to the batch results route
        self.batch_route_missing = False  # answer it 404, like a supervisor without it
        self.batch_gate: anyio.Event | None = None
        self.renewal_batches: list[list[str]] = []  # the step ids of each renewals request
        self.renewals_route_missing = False  # answer it 404, like a supervisor without it
        self.budget_exhausted = False  # renew replies say the tenant's budget is spent
        self.checkpoints: dict[str, list[dict[str, Any]]] = defaultdict(list)  # accepted
        self.artifacts: dict[str, bytes] = {}
        self.log_lines: list[dict[str, Any]] = []  # shipped to `POST /v1/logs`, kept
        self._changed = anyio.Event()

    # -- test controls ---------------------------------------------------------------------
    def offer(self, lease: dict[str, Any]) -> None:
        self.queue.append(lease)
        self._poke()

    def script(self, kind: str, *answers: Answer) -> None:
        self.scripts[kind].extend(answers)
        self._poke()

    def cancel_task(self, task_id: str) -> None:
        self.cancelled_tasks.add(task_id)

    def of(self, kind: str, step_id: str | None = None) -> list[Call]:
        return [
            c for c in self.calls if c.kind == kind and (step_id is None or c.step_id == step_id)
        ]

    def _poke(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def until(self, condition: Callable[[], bool], within: float = 5.0) -> None:
        with anyio.fail_after(within):
            while not condition():
                await self._changed.wait()

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self._handle)

    # -- the API ---------------------------------------------------------------------------
    async def _handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/steps/results":
            return await self._results(request)
        if request.url.path == "/v1/leases/renewals":
            return await self._renewals(request)
        if request.url.path == "/v1/logs":
            return await self._logs(request)
        parts = request.url.path.strip("/").split("/")
        if parts[1] == "artifacts":
            return await self._artifact(request, parts[2])
        kind = {
            "claim": "claim",
            "renew": "renew",
            "release": "release",
            "result": "result",
            "runner": "whoami",
            "checkpoint": "checkpoint",
        }.get(parts[-1], "other")
        step_id = parts[2] if kind in ("renew", "release", "result", "checkpoint") else None
        body = json.loads(request.content) if request.content else None
        self.calls.append(
            Call(kind, request.url.path, body, dict(request.headers), anyio.current_time(), step_id)
        )
        self._poke()
        try:
            return await self._answer(kind, request, body, step_id)
        finally:
            self._poke()

    async def _artifact(self, request: httpx.Request, digest: str) -> httpx.Response:
        """The artifact store: PUT keeps bytes under their sha256, GET returns them; scripts
        of kind `artifact` answer first."""
        self.calls.append(
            Call("artifact", request.url.path, None, dict(request.headers), anyio.current_time())
        )
        self._poke()
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.scripts["artifact"]:
            scripted = self.scripts["artifact"].pop(0)
            if isinstance(scripted, httpx.Response):
                return scripted
            if isinstance(scripted, BaseException):
                raise scripted
            return await scripted(request)
        if request.method == "PUT":
            if hashlib.sha256(request.content).hexdigest() != digest:
                return error(422, "digest_mismatch", "the bytes hash to another digest")
            created = digest not in self.artifacts
            self.artifacts[digest] = request.content
            size = len(request.content)
            return json_response(200, {"digest": digest, "size": size, "created": created})
        if digest not in self.artifacts:
            return error(404, "not_found", f"no artifact {digest}")
        return httpx.Response(200, content=self.artifacts[digest])

    async def _results(self, request: httpx.Request) -> httpx.Response:
        """The batch route as the single route once per result: each result is recorded as a
        `result` call and answered by the same rules and scripts. A scripted exception for any
        of them is the whole request's (no answer)."""
        self.batches.append(request)
        self._poke()
        if self.batch_gate is not None:  # the first batch waits for the test
            gate, self.batch_gate = self.batch_gate, None
            await gate.wait()
        if self.batch_route_missing:
            return error(404, "not_found", "no such route")
        answers = []
        for item in json.loads(request.content)["results"]:
            step_id = item.pop("step_id")
            single = httpx.Request(
                "POST",
                f"http://supervisor.test/v1/steps/{step_id}/result",
                headers=request.headers,
                json=item,
            )
            answer = await self._handle(single)
            await answer.aread()
            if answer.status_code == 200:
                answers.append({"step_id": step_id, **answer.json()})
            else:
                err = answer.json()
                answers.append({"step_id": step_id, "status": answer.status_code, **err})
        return json_response(200, {"results": answers})

    async def _logs(self, request: httpx.Request) -> httpx.Response:
        """Log lines: kept as sent, unless a script of kind `logs` answers first."""
        self.calls.append(
            Call("logs", request.url.path, None, dict(request.headers), anyio.current_time())
        )
        self._poke()
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.scripts["logs"]:
            scripted = self.scripts["logs"].pop(0)
            if isinstance(scripted, httpx.Response):
                return scripted
            if isinstance(scripted, BaseException):
                raise scripted
            return await scripted(request)
        lines = json.loads(request.content)["lines"]
        self.log_lines.extend(lines)
        self._poke()
        return json_response(200, {"kept": len(lines), "refused": 0, "over_limit": 0})

    async def _renewals(self, request: httpx.Request) -> httpx.Response:
        """The batch renew route as the single route once per lease: each is recorded as a
        `renew` call and answered by the same rules and scripts. A scripted exception for any
        of them is the whole request's (no answer)."""
        if self.renewals_route_missing:
            return error(404, "not_found", "no such route")
        held = json.loads(request.content)["leases"]
        self.renewal_batches.append([x["step_id"] for x in held])
        answers = []
        for x in held:
            single = httpx.Request(
                "POST",
                f"http://supervisor.test/v1/leases/{x['step_id']}/renew",
                headers=request.headers,
                json={"fence": x["fence"]},
                extensions=request.extensions,  # its timeout, for a scripted hang
            )
            answer = await self._handle(single)
            await answer.aread()
            if answer.status_code not in (200, 404, 409) or "json" not in answer.headers.get(
                "content-type", ""
            ):
                return answer  # the whole request's: a 401, a 5xx, a proxy's page
            extra = answer.json()
            if answer.status_code != 200:
                extra["status"] = answer.status_code
            answers.append({"step_id": x["step_id"], **extra})
        return json_response(200, {"leases": answers})

    async def _answer(
        self, kind: str, request: httpx.Request, body: Any, step_id: str | None
    ) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.scripts[kind]:
            scripted = self.scripts[kind].pop(0)
            if isinstance(scripted, httpx.Response):
                return scripted
            if isinstance(scripted, BaseException):
                raise scripted
            return await scripted(request)
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return error(401, "unauthorized", "bad token")
        if kind == "claim":
            return await self._claim(body)
        if kind == "whoami":
            return json_response(200, {"pool": self.pool, "token_id": "tok-1"})
        assert step_id is not None
        if self.fences.get(step_id) != body.get("fence"):
            return error(409, "stale_fence", "not the current fence")
        lease = self.leases[step_id]
        if kind == "renew":
            cancelled = lease["task_id"] in self.cancelled_tasks
            return json_response(
                200,
                {
                    "ttl_s": 0.0 if cancelled else lease["ttl_s"],
                    "renew_every_s": lease["renew_every_s"],
                    "cancelled": cancelled,
                    "budget_exhausted": self.budget_exhausted,
                },
            )
        if kind == "checkpoint":
            self.checkpoints[step_id].append(body)
            return json_response(200, {"turn": body["turn"]})
        if kind == "release":
            self.fences[step_id] = -1
            if body["retryable"] and self.requeue_released:
                self.next_fence += 1
                again = dict(lease, fence=self.next_fence, attempt=lease["attempt"] + 1)
                self.queue.append(again)
            return json_response(200, {"released": True})
        if kind == "result":
            if lease["task_id"] in self.cancelled_tasks:
                return error(409, "terminal", "task cancelled")
            if body["payload_hash"] != lease["payload_hash"]:
                return error(409, "payload_drift", "hash differs")
            self.fences[step_id] = -1
            return json_response(200, {"outcome": "applied"})
        return error(404, "not_found")

    async def _claim(self, body: dict[str, Any]) -> httpx.Response:
        with anyio.move_on_after(body["wait_s"]):
            while not self.queue:
                await self._changed.wait()
        if not self.queue:
            return httpx.Response(204)
        granted = self.queue[: body["capacity"]]
        del self.queue[: body["capacity"]]
        for lease in granted:
            self.fences[lease["step_id"]] = lease["fence"]
            self.leases[lease["step_id"]] = lease
        return json_response(200, {"leases": granted})


def completion(
    text: str = "hello", *, prompt: int = 3, out: int = 2, model: str = "m"
) -> httpx.Response:
    return json_response(
        200,
        {
            "model": model,
            "choices": [
                {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": out,
                "total_tokens": prompt + out,
            },
        },
    )


class FakeModel:
    """An OpenAI-compatible endpoint: scripted answers first, then `completion()`."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.answers: list[Answer] = []
        self.default: Answer = completion()
        self._changed = anyio.Event()

    def script(self, *answers: Answer) -> None:
        self.answers.extend(answers)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self._handle)

    def bodies(self) -> list[Any]:
        return [json.loads(r.content) for r in self.requests]

    async def until(self, condition: Callable[[], bool], within: float = 5.0) -> None:
        with anyio.fail_after(within):
            while not condition():
                await self._changed.wait()

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self._changed.set()
        self._changed = anyio.Event()
        answer = self.answers.pop(0) if self.answers else self.default
        if isinstance(answer, httpx.Response):
            return answer
        if isinstance(answer, BaseException):
            raise answer
        return await answer(request)


async def hang(_request: httpx.Request) -> httpx.Response:
    await anyio.sleep(math.inf)
    raise AssertionError("unreachable")


def settings(**overrides: Any) -> RunnerSettings:
    values: dict[str, Any] = {
        "supervisor_url": "http://supervisor.test",
        "model_url": "http://model.test/v1",
        "model": "m",
        "concurrency": 2,
        "claim_wait_s": 0.2,
        "shutdown_grace_s": 2.0,
        "pause_initial_s": 0.2,
        "pause_max_s": 1.0,
        "runner_id": "test-runner",
        "model_timeout_s": 5.0,
    }
    values.update(overrides)
    if "pause_max_s" not in overrides:
        values["pause_max_s"] = max(values["pause_max_s"], 10 * values["pause_initial_s"])
    return RunnerSettings(**values)


@dataclasses.dataclass
class Rig:
    """A runner wired to the fakes; `start()` runs it in a task group the test owns."""

    runner: Runner
    supervisor: FakeSupervisor
    model: FakeModel
    key_file: Path
    exit_code: int | None = None

    async def serve(self) -> None:
        self.exit_code = await self.runner.run()


def make_rig(
    tmp_path: Path,
    *,
    supervisor: FakeSupervisor | None = None,
    model: FakeModel | None = None,
    clock: Any = None,
    key: str | None = MODEL_KEY,
    kinds: KindRegistry | None = None,
    notifier: Any = None,
    log_buffer: Any = None,
    **overrides: Any,
) -> Rig:
    """Build inside a running event loop (anyio primitives need one)."""
    sup = supervisor or FakeSupervisor()
    mdl = model or FakeModel()
    key_file = tmp_path / "model-key"
    if key is not None:
        key_file.write_text(key + "\n")
    token_file = tmp_path / "runner-token"
    token_file.write_text(sup.token + "\n")
    cfg = settings(model_key_file=key_file, token_file=token_file, **overrides)
    from tether.clocks import LoopClock

    clk = clock or LoopClock()
    runner = Runner(
        settings=cfg,
        supervisor=SupervisorClient(
            base_url=cfg.supervisor_url, token=sup.token, clock=clk, transport=sup.transport
        ),
        model=ModelClient(
            base_url=cfg.model_url,
            clock=clk,
            transport=mdl.transport,
            api=wire_api(cfg.model_api, anthropic_max_tokens=cfg.anthropic_max_tokens),
        ),
        model_key=SecretSource(path=key_file, credential="model-key", setting="model_key_file"),
        token=SecretSource(path=token_file, credential="runner-token", setting="token_file"),
        kinds=kinds or KindRegistry.default(entry_points=False),
        clock=clk,
        notifier=notifier,
        backoff_max_s=0.05,
        log_buffer=log_buffer,
    )
    return Rig(runner=runner, supervisor=sup, model=mdl, key_file=key_file)


# -- the fakes' own tests ----------------------------------------------------------------------


async def test_fake_supervisor_refuses_a_stale_fence_and_a_wrong_token() -> None:
    sup = FakeSupervisor()
    sup.offer(make_lease("s1", fence=7))
    async with httpx.AsyncClient(transport=sup.transport, base_url="http://x") as http:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        claimed = await http.post(
            "/v1/leases/claim", json={"runner_id": "r", "capacity": 1, "wait_s": 0}, headers=auth
        )
        assert claimed.json()["leases"][0]["fence"] == 7
        stale = await http.post("/v1/leases/s1/renew", json={"fence": 6}, headers=auth)
        assert stale.status_code == 409
        assert stale.json()["error"] == "stale_fence"
        wrong = await http.post(
            "/v1/leases/s1/renew", json={"fence": 7}, headers={"Authorization": "Bearer no"}
        )
        assert wrong.status_code == 401


async def test_virtual_clock_records_sleeps_without_waiting() -> None:
    clock = VirtualClock()
    before = anyio.current_time()
    await clock.sleep(3600)
    assert clock.sleeps == [3600]
    assert clock.now() == 4600.0
    assert anyio.current_time() - before < 60
