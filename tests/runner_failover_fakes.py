"""Fakes for a runner with several supervisors on one ledger: `FakeSupervisor`s sharing their
ledger state, and a runner wired to all of them. (A module of helpers for
tests/runner/test_runner_failover.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx

from tests.runner.test_runner_fakes import MODEL_KEY, FakeModel, FakeSupervisor, Rig, settings
from tether.clocks import LoopClock
from tether.runner.credentials import SecretSource
from tether.runner.daemon import Runner
from tether.runner.kinds.registry import KindRegistry
from tether.runner.model_client import ModelClient
from tether.runner.supervisor_client import SupervisorClient


def on_one_ledger(count: int = 2) -> list[FakeSupervisor]:
    """`count` fake supervisors that share one ledger: its queue, fences, leases and
    cancelled tasks; each keeps its own calls, scripts and `down` switch. Offer work through
    `offer_all` so that a claim long-polling on any of them wakes."""
    first = FakeSupervisor()
    others = [FakeSupervisor() for _ in range(count - 1)]
    for other in others:
        other.queue = first.queue
        other.fences = first.fences
        other.leases = first.leases
        other.cancelled_tasks = first.cancelled_tasks
    return [first, *others]


def offer_all(supervisors: list[FakeSupervisor], lease: dict[str, Any]) -> None:
    supervisors[0].queue.append(lease)
    for sup in supervisors:
        sup._poke()


def url_of(n: int) -> str:
    return f"http://supervisor-{n}.test"


async def no_answer_within_timeout(request: httpx.Request) -> httpx.Response:
    """A supervisor that accepted the connection and never answers: the request times out
    after its own read timeout, as httpx's transport would make it."""
    timeout = request.extensions.get("timeout", {}).get("read") or 10.0
    await anyio.sleep(timeout)
    raise httpx.ReadTimeout("timed out", request=request)


def make_failover_rig(
    tmp_path: Path,
    supervisors: list[FakeSupervisor],
    *,
    model: FakeModel | None = None,
    urls: list[str] | None = None,
    **overrides: Any,
) -> Rig:
    """A runner whose `supervisor_url` lists every one of `supervisors` (in order); build it
    inside a running event loop. `Rig.supervisor` is the first."""
    mdl = model or FakeModel()
    key_file = tmp_path / "model-key"
    key_file.write_text(MODEL_KEY + "\n")
    token_file = tmp_path / "runner-token"
    token_file.write_text(supervisors[0].token + "\n")
    urls = urls or [url_of(n) for n in range(len(supervisors))]
    cfg = settings(
        supervisor_url=",".join(urls), model_key_file=key_file, token_file=token_file, **overrides
    )
    clock = LoopClock()
    runner = Runner(
        settings=cfg,
        supervisor=SupervisorClient(
            base_url=cfg.supervisor_urls,
            token=supervisors[0].token,
            clock=clock,
            timeout_s=cfg.request_timeout_s,
            transport=[sup.transport for sup in supervisors],
        ),
        model=ModelClient(base_url=cfg.model_url, clock=clock, transport=mdl.transport),
        model_key=SecretSource(path=key_file, credential="model-key", setting="model_key_file"),
        token=SecretSource(path=token_file, credential="runner-token", setting="token_file"),
        kinds=KindRegistry.default(entry_points=False),
        clock=clock,
        backoff_max_s=0.05,
    )
    return Rig(runner=runner, supervisor=supervisors[0], model=mdl, key_file=key_file)
