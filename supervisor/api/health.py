"""Liveness, readiness and Prometheus metrics. Unauthenticated: bind the supervisor to a
private address or put it behind a proxy that restricts them."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from supervisor.api.errors import error_response
from supervisor.ledger import Ledger, LedgerError
from tether.wire import ErrorCode

# counter key in the ledger -> (metric name, labels, help)
_COUNTERS: list[tuple[str, str, str, str]] = [
    ("leases_granted", "tether_leases_granted_total", "", "Leases granted."),
    ("leases_renewed", "tether_leases_renewed_total", "", "Lease renewals accepted."),
    ("leases_expired", "tether_leases_expired_total", "", "Leases expired by the reaper."),
    ("leases_released", "tether_leases_released_total", "", "Leases released by runners."),
    ("commits_applied", "tether_commits_total", 'outcome="applied"', "Step results reported."),
    ("commits_replayed", "tether_commits_total", 'outcome="replayed"', ""),
    ("batches", "tether_write_batches_total", "", "Group-commit transactions."),
    ("batched_rules", "tether_write_rules_total", "", "Ledger rules run in those batches."),
]


async def healthz(request: Request) -> Response:
    """Alive: the process answers and its ledger is open (its writer has not died)."""
    ledger: Ledger | None = getattr(request.app.state, "ledger", None)
    if ledger is not None and not ledger.is_open:
        return error_response(ErrorCode.UNAVAILABLE, "the ledger is closed; the supervisor stops")
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    ledger: Ledger = request.app.state.ledger
    try:
        await ledger.queue_depth()
    except (LedgerError, RuntimeError) as exc:
        return error_response(ErrorCode.UNAVAILABLE, f"the ledger is not readable: {exc}")
    return JSONResponse({"status": "ready"})


async def metrics(request: Request) -> Response:
    ledger: Ledger = request.app.state.ledger
    counters = ledger.counters
    lines: list[str] = []
    described: set[str] = set()
    for key, name, labels, text in _COUNTERS:
        if name not in described:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} counter"]
            described.add(name)
        selector = f"{{{labels}}}" if labels else ""
        lines.append(f"{name}{selector} {counters.get(key, 0)}")
    lines += ["# HELP tether_rejections_total Refused writes by code.",
              "# TYPE tether_rejections_total counter"]  # fmt: skip
    for key in sorted(k for k in counters if k.startswith("rejected:")):
        lines.append(f'tether_rejections_total{{code="{key.split(":", 1)[1]}"}} {counters[key]}')
    lines += ["# HELP tether_steps Steps by state (queued is the queue depth).",
              "# TYPE tether_steps gauge"]  # fmt: skip
    for state, count in sorted((await ledger.queue_depth()).items()):
        lines.append(f'tether_steps{{state="{state}"}} {count}')
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


ROUTES = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
