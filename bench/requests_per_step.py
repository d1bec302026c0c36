"""Requests per committed step: how many HTTP requests one runner sends the supervisor per
step it commits, with eager dispatch and batched renewals (issue 17, item 1) and without.

A real supervisor app on a temporary ledger, reached in-process (`httpx.ASGITransport`), and a
real `tether.runner.daemon.Runner` whose one step kind returns at once (or after `--work-s`). The
requests are counted by route at the transport. Run: `python -m bench.requests_per_step`.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import httpx

from tether.clocks import LoopClock
from tether.runner.credentials import SecretSource
from tether.runner.daemon import Runner
from tether.runner.kinds.base import StepContext, StepOutput
from tether.runner.kinds.registry import KindRegistry
from tether.runner.model_client import ModelClient
from tether.runner.settings import RunnerSettings
from tether.runner.supervisor_client import SupervisorClient
from tether.wire.records import WantLeases


class Counted(httpx.AsyncBaseTransport):
    """The app's transport, counting requests by their route's last segment."""

    def __init__(self, app: Any) -> None:
        self._inner = httpx.ASGITransport(app=app)
        self.seen: Counter[str] = Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen[request.url.path.rstrip("/").rsplit("/", 1)[-1]] += 1
        return await self._inner.handle_async_request(request)


class RunnerBeforeEagerDispatch(Runner):
    """A runner as before eager dispatch: its results ask for no leases."""

    def _eager_want(self, results: int) -> WantLeases | None:
        return None


def chat(k: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"step {k}"}]}


async def measure(steps: int, concurrency: int, work_s: float, *, eager: bool) -> Counter[str]:
    """The requests one runner sent to commit `steps` one-step tasks."""
    from tether.supervisor import admin
    from tether.supervisor.api import create_app
    from tether.supervisor.settings import SupervisorSettings

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.db"
        operator = admin.create_token(path, "acme", "operator", init=True).secret
        runner_token = admin.create_token(path, "default", "runner").secret
        app = create_app(SupervisorSettings(db=path, synchronous="OFF"), reaper=False)
        counted = Counted(app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=counted, base_url="http://s") as http,
        ):
            auth = {"Authorization": f"Bearer {operator}"}
            for k in range(steps):
                body = {
                    "idempotency_key": f"k{k}",
                    "plan": {"steps": [{"name": "s", "kind": "chat", "payload": chat(k)}]},
                }
                created = await http.post("/v1/tasks", headers=auth, json=body)
                assert created.status_code == 201, created.text
                task = created.json()
                await http.post(
                    f"/v1/tasks/{task['id']}/approve",
                    headers=auth,
                    json={"plan_hash": task["plan_hash"]},
                )
            counted.seen.clear()
            done = 0

            async def instant(ctx: StepContext) -> StepOutput:
                nonlocal done
                if work_s:
                    await anyio.sleep(work_s)
                done += 1
                return StepOutput(output={"n": ctx.step_id})

            key = Path(tmp) / "key"
            key.write_text("unused\n")
            settings = RunnerSettings(
                supervisor_url="http://s",
                model_url="http://m/v1",
                model="m",
                concurrency=concurrency,
                claim_wait_s=1.0,
                runner_id="bench",
                model_key_file=key,
            )
            clock = LoopClock()
            runner = (Runner if eager else RunnerBeforeEagerDispatch)(
                settings=settings,
                supervisor=SupervisorClient(
                    base_url="http://s", token=runner_token, clock=clock, transport=counted
                ),
                model=ModelClient(base_url="http://m/v1", clock=clock),
                model_key=SecretSource(path=key, credential="model-key", setting="k"),
                kinds=KindRegistry([("chat", instant)]),  # answers at once, no model
                clock=clock,
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(runner.run)
                await runner.wait_until(lambda: done >= steps)
                runner.request_shutdown()
        return counted.seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--work-s", type=float, default=0.0)
    args = parser.parse_args()
    for eager in (False, True):
        seen = anyio.run(
            functools.partial(measure, eager=eager), args.steps, args.concurrency, args.work_s
        )
        seen.pop("runner", None)  # the start-up `GET /v1/runner`
        total = sum(seen.values())
        label = "eager dispatch" if eager else "claims only   "
        print(
            f"{label}: {total / args.steps:.2f} requests per committed step"
            f" ({dict(sorted(seen.items()))}, {args.steps} steps, concurrency"
            f" {args.concurrency}, work {args.work_s} s)"
        )


if __name__ == "__main__":
    main()
