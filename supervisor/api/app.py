"""The supervisor's HTTP app (docs/design.md, Wire protocol v1): thin routes over the ledger store.

The app's lifespan opens the artifact store (files beside a SQLite ledger, the database of a
PostgreSQL one: `artifacts.opening`) and the ledger, and starts the reaper; tests enter it
explicitly when they talk to the app through `httpx.ASGITransport`, which does not run
lifespans by itself.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from tether.clocks import WallClock
from tether.supervisor import ui
from tether.supervisor.api import health
from tether.supervisor.api.auth import TokenCache
from tether.supervisor.api.contract import OPERATIONS
from tether.supervisor.api.errors import (
    ApiError,
    on_api_error,
    on_client_gone,
    on_http_exception,
    on_ledger_error,
    on_repository_unavailable,
    on_unexpected,
)
from tether.supervisor.api.longpoll import LongPolls
from tether.supervisor.api.nul import RefuseNul
from tether.supervisor.api.refusal_log import RefusalLog
from tether.supervisor.artifacts.collector import DigestLocks, collect_forever
from tether.supervisor.artifacts.opening import open_artifacts
from tether.supervisor.effects.addresses import Resolver, system_resolver
from tether.supervisor.head_timeout import HeadTimeouts
from tether.supervisor.ledger import LedgerError
from tether.supervisor.repos import Mirrors
from tether.supervisor.repos.evidence import RepositoryUnavailable
from tether.supervisor.service import running_ledger
from tether.supervisor.settings import SupervisorSettings
from tether.supervisor.usecases.unbound import UnboundSteps


def create_app(
    settings: SupervisorSettings,
    *,
    clock: WallClock = time.time,
    reaper: bool = True,
    resolver: Resolver = system_resolver,
) -> Starlette:
    """The app; `resolver` answers the names effects are sent to (the system's resolver)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with (
            open_artifacts(settings) as artifacts,
            running_ledger(
                settings,
                clock=clock,
                reaper=reaper,
                artifacts=artifacts,
                resolver=resolver,
                mirrors=app.state.mirrors,
            ) as ledger,
        ):
            app.state.ledger = ledger
            app.state.tokens = TokenCache(ledger)
            app.state.metrics = health.Metrics(ledger)
            app.state.metrics.add(app.state.refusal_log)
            app.state.metrics.add(app.state.head_timeouts)
            app.state.artifacts = artifacts
            async with anyio.create_task_group() as tg:
                collector = functools.partial(
                    collect_forever,
                    keep_s=settings.artifact_keep_unreferenced_s,
                    every_s=settings.artifact_collect_every_s,
                    clock=clock,
                )
                tg.start_soon(collector, ledger, artifacts, app.state.artifact_locks)
                yield
                tg.cancel_scope.cancel()

    app = Starlette(
        routes=[
            *(
                Route(op.path, op.endpoint(), methods=[op.method], name=op.name)
                for op in OPERATIONS
            ),
            *ui.ROUTES,
        ],
        exception_handlers={
            ApiError: on_api_error,
            LedgerError: on_ledger_error,
            RepositoryUnavailable: on_repository_unavailable,
            HTTPException: on_http_exception,
            ClientDisconnect: on_client_gone,
            Exception: on_unexpected,
        },
        middleware=[Middleware(RefuseNul)],
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.operations = OPERATIONS  # what the app serves, and its document describes
    app.state.long_polls = LongPolls()
    app.state.mirrors = Mirrors(settings.mirror_root)
    app.state.unbound_steps = UnboundSteps()
    app.state.refusal_log = RefusalLog()
    app.state.artifact_locks = DigestLocks()  # uploads' and the collector's (artifacts.collector)
    app.state.head_timeouts = HeadTimeouts()  # counted by `serve`'s protocol (head_timeout)
    return app


def drain(app: Starlette) -> None:
    """Shutdown has begun: end the long-polls in flight now (see `longpoll`)."""
    polls: LongPolls = app.state.long_polls
    polls.drain()
