"""Liveness, readiness and Prometheus metrics. `/healthz` and `/readyz` are unauthenticated
(they tell only up or down); `/metrics` names tenants and their spend, so it needs a token of
the `metrics` role, which reads nothing else."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.responses import Response

from tether.supervisor.api.errors import ApiError
from tether.supervisor.api.operation import Call
from tether.supervisor.ledger import LedgerError, LedgerStore
from tether.supervisor.ledger.views import RUNNER_RECENT_S
from tether.wire import ErrorCode, Outcome
from tether.wire.answers import Alive, Ready


class Openness(Protocol):
    """All that `/healthz` (and the server's watch, `server._stop_if_the_ledger_closes`) asks
    of the ledger: whether it is still open. The tests' stand-in ledgers have only this."""

    @property
    def is_open(self) -> bool: ...


class _LedgerCounters(Collector):
    """The ledger's in-memory counts (`LedgerCounts`) as Prometheus counters, read at scrape."""

    def __init__(self, ledger: LedgerStore) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[Metric]:
        counts = self._ledger.counters
        for name, value, text in [
            ("tether_leases_granted_total", counts.leases_granted, "Leases granted."),
            ("tether_leases_renewed_total", counts.leases_renewed, "Lease renewals accepted."),
            (
                "tether_renewals_remembered_total",
                counts.renewals_remembered,
                "Of those, renewals answered from memory, without a ledger write.",
            ),
            ("tether_leases_expired_total", counts.leases_expired, "Leases expired by the reaper."),
            ("tether_leases_released_total", counts.leases_released, "Leases released by runners."),
            (
                "tether_leases_preempted_total",
                counts.leases_preempted,
                "Of those, leases released on a cloud's preemption notice.",
            ),
            ("tether_write_batches_total", counts.batches, "Group-commit transactions."),
            ("tether_write_rules_total", counts.batched_rules, "Rules run in those batches."),
        ]:
            yield CounterMetricFamily(name, text, value=value)
        commits = CounterMetricFamily(
            "tether_commits_total", "Step results reported.", labels=["outcome"]
        )
        for outcome in Outcome:
            commits.add_metric([outcome.value], counts.commits[outcome])
        yield commits
        rejections = CounterMetricFamily(
            "tether_rejections_total", "Refused writes by code.", labels=["code"]
        )
        for code, count in sorted(counts.rejections.items()):
            rejections.add_metric([code.value], count)
        yield rejections


class Metrics:
    """One app's Prometheus registry: never the process-wide default, since a process (a test
    run) may build many apps. Counters come from the ledger; the gauges (steps by state, each
    pool's queue and recent runners, each tenant's tokens spent and budget) are read from the
    ledger file when scraped. A failed or cancelled task's unrun steps count as `skipped`, never
    as waiting or queued."""

    def __init__(self, ledger: LedgerStore) -> None:
        self._ledger = ledger
        self._registry = CollectorRegistry()
        self._registry.register(_LedgerCounters(ledger))
        self._steps = Gauge(
            "tether_steps",
            "Steps by state (queued is the queue depth).",
            ["state"],
            registry=self._registry,
        )
        self._pool_gauges = {
            name: Gauge(name, text, ["pool"], registry=self._registry)
            for name, text in [
                ("tether_pool_queued", "Steps queued in the pool, waiting for a runner."),
                ("tether_pool_in_flight", "Steps of the pool leased to a runner now."),
                (
                    "tether_pool_oldest_queued_seconds",
                    "How long the pool's oldest queued step has waited (0 when none is queued).",
                ),
                (
                    "tether_pool_runners_seen",
                    f"Runners that claimed in the pool in the last {RUNNER_RECENT_S:g} s.",
                ),
            ]
        }
        self._budget = Gauge(
            "tether_budget_tokens",
            "Tokens each tenant's attempts spent (kind=spent, committed or not) and its budget"
            " (kind=limit; absent when it has none).",
            ["tenant", "kind"],
            registry=self._registry,
        )

    def add(self, collector: Collector) -> None:
        """Expose `collector`'s metrics too (counts kept outside the ledger)."""
        self._registry.register(collector)

    async def exposition(self) -> bytes:
        """The text format of every metric, as of now."""
        depth = await self._ledger.queue_depth()
        pools = await self._ledger.pools()
        budgets = await self._ledger.budgets()
        # No await from here on: a concurrent scrape cannot interleave with this one.
        self._steps.clear()
        for state, count in depth.items():
            self._steps.labels(state=state).set(count)
        for gauge in self._pool_gauges.values():
            gauge.clear()
        for pool in pools:
            for name, value in [
                ("tether_pool_queued", pool.queued),
                ("tether_pool_in_flight", pool.in_flight),
                ("tether_pool_oldest_queued_seconds", pool.oldest_queued_s or 0.0),
                ("tether_pool_runners_seen", len(pool.runners)),
            ]:
                self._pool_gauges[name].labels(pool=pool.pool).set(value)
        self._budget.clear()
        for found in budgets:
            self._budget.labels(tenant=found.tenant, kind="spent").set(found.spent)
            if found.budget is not None:
                self._budget.labels(tenant=found.tenant, kind="limit").set(found.budget)
        return generate_latest(self._registry)


async def healthz(call: Call[None]) -> Alive:
    """Alive: the process replies and its ledger is open (its writer has not died)."""
    ledger: Openness | None = getattr(call.request.app.state, "ledger", None)
    if ledger is not None and not ledger.is_open:
        raise ApiError(ErrorCode.UNAVAILABLE, "the ledger is closed; the supervisor stops")
    return Alive(status="ok")


async def readyz(call: Call[None]) -> Ready:
    ledger: LedgerStore = call.request.app.state.ledger
    try:
        await ledger.queue_depth()
    except (LedgerError, RuntimeError) as exc:
        raise ApiError(ErrorCode.UNAVAILABLE, f"the ledger is not readable: {exc}") from None
    return Ready(status="ready")


async def metrics(call: Call[None]) -> Response:
    exposition: Metrics = call.request.app.state.metrics
    return Response(await exposition.exposition(), media_type=CONTENT_TYPE_PLAIN_0_0_4)
