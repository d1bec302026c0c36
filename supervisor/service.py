"""The running supervisor's core, without HTTP: the ledger opened on its file plus the reaper
and the effects dispatcher.

The HTTP app's lifespan, the demo and the benchmarks all start the supervisor through
`running_ledger`, so there is exactly one way the reaper and the dispatcher get attached to a
ledger. The dispatcher always runs (docs/design.md, Effects): a ledger with no effect steps
gives it nothing to do but a look at the outbox each second.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator

import anyio
import httpx
import structlog

from tether.clocks import WallClock
from tether.git import GitError, redact
from tether.supervisor.artifacts.port import Artifacts
from tether.supervisor.effects.addresses import Resolver, system_resolver
from tether.supervisor.effects.credentials import Credentials
from tether.supervisor.effects.dispatcher import Dispatcher
from tether.supervisor.effects.git_push import GitPushDeliverer
from tether.supervisor.effects.http import HttpDeliverer
from tether.supervisor.effects.registry import EffectKindError, EffectKinds
from tether.supervisor.ledger import StorageError, repositories
from tether.supervisor.ledger.reaper import TURN_MAX_S
from tether.supervisor.ledger.store import LedgerStore, open_ledger
from tether.supervisor.repos.candidates import SharedCandidates
from tether.supervisor.repos.mirror import MirrorError, Mirrors
from tether.supervisor.settings import SupervisorSettings

log = structlog.get_logger("tether.supervisor")

REAP_EVERY_MAX_S = TURN_MAX_S  # each turn stamps 'alive' (reaper.refresh_after_restart)


async def reap_forever(ledger: LedgerStore) -> None:
    """Expire leases past their deadline, waking at the next deadline or at least every second.

    A lease granted while the reaper sleeps has a deadline at least `accept_window_s` away, so
    the cap bounds how late any expiry is noticed. A storage error (a full disk, the file
    locked by another process past the busy timeout) is logged and the reaper tries again at
    its next turn: the condition may pass, and a reaper that ended would take the ledger, and
    every lease's expiry, down with it. A bug in its rules is not retried: it ends the reaper
    and closes the ledger, and `serve` then stops with exit 1 for the service manager.
    """
    cap = min(REAP_EVERY_MAX_S, ledger.config.accept_window_s / 4)
    failing = False
    while True:
        pause = cap
        try:
            reaped = await ledger.expire()
            if reaped:
                log.info("leases expired", count=reaped)
            deadline = await ledger.next_deadline()
        except StorageError as exc:
            if not failing:
                log.error(  # noqa: TRY400 - the detail says it all; no traceback
                    "the reaper cannot write to the ledger; trying again", error=exc.detail
                )
            failing = True
        else:
            if failing:
                log.info("the reaper writes to the ledger again")
            failing = False
            if deadline is not None:
                pause = min(cap, max(0.01, deadline - ledger.clock()))
        await anyio.sleep(pause)


async def check_mirrors(mirrors: Mirrors, ledger: LedgerStore) -> None:
    """At start, the first-use check of the mirror of every repository the ledger knows that
    has one: a damaged mirror is made anew (and gets its candidates back) now, not when a
    runner's report needs it. A remote that cannot be read is logged; the next use retries."""
    for repository in await ledger.read(repositories.list_repositories):
        if not mirrors.path(repository.url).exists():
            continue
        try:
            await mirrors.open(repository.url)
        except (MirrorError, GitError, OSError) as exc:
            log.warning(
                "cannot check a mirror at start; its next use tries again",
                repository=redact(repository.url),
                error=str(exc),
            )


def effect_kinds(
    settings: SupervisorSettings,
    client: httpx.AsyncClient,
    clock: WallClock,
    candidates: SharedCandidates | None = None,
    resolver: Resolver = system_resolver,
    mirrors: Mirrors | None = None,
) -> EffectKinds:
    """The built-in deliverers plus the entry points' (`tether.effects`); a clash or a broken
    entry point stops the start with one line naming it. The built-in ones send only where
    `effect_allowed_hosts` allows, to addresses `resolver` answered (the system's). `mirrors`
    are the app's (one instance per folder: its locks and first-use checks are per instance)."""
    destinations = settings.effect_destinations
    built_ins = (
        HttpDeliverer(client, clock=clock, destinations=destinations, resolver=resolver),
        GitPushDeliverer(
            mirrors or Mirrors(settings.mirror_root),
            candidates,
            destinations=destinations,
            resolver=resolver,
        ),
    )
    try:
        return EffectKinds.with_entry_points(built_ins)
    except EffectKindError as exc:
        log.error("refusing to start", error=str(exc))  # noqa: TRY400 - one line, no traceback
        raise


def effects_client() -> httpx.AsyncClient:
    """The HTTP client `http` effects are sent with: no redirect followed, no proxy from the
    environment (the address checked must be the one connected to; a CA bundle named by
    `SSL_CERT_FILE` or `SSL_CERT_DIR` is still used), and no connection kept alive, so each
    attempt connects anew to the address checked for it, under its own TLS server name."""
    return httpx.AsyncClient(
        follow_redirects=False,
        trust_env=False,
        verify=httpx.create_ssl_context(trust_env=True),
        limits=httpx.Limits(max_keepalive_connections=0),
    )


@contextlib.asynccontextmanager
async def running_ledger(
    settings: SupervisorSettings,
    *,
    clock: WallClock = time.time,
    reaper: bool = True,
    artifacts: Artifacts | None = None,
    resolver: Resolver = system_resolver,
    mirrors: Mirrors | None = None,
) -> AsyncIterator[LedgerStore]:
    """The ledger open with its reaper (unless `reaper` is off, for tests that expire leases
    by hand) and its effects dispatcher running; both stop when the block ends. With the
    app's `artifacts`, a `git.push` imports a candidate its mirror lacks from its bundle, and
    a mirror made anew gets the ledger's committed candidates back from theirs. Effects'
    destinations are resolved by `resolver`."""
    candidates = None if artifacts is None else SharedCandidates(artifacts)
    mirrors = mirrors or Mirrors(settings.mirror_root)
    async with effects_client() as client:
        kinds = effect_kinds(settings, client, clock, candidates, resolver, mirrors)
        config = settings.ledger_config
        config = dataclasses.replace(config, effect_kinds=config.effect_kinds | kinds.names())
        async with (
            open_ledger(
                settings.db,
                config=config,
                clock=clock,
                synchronous=settings.synchronous,
            ) as ledger,
            anyio.create_task_group() as tg,
        ):
            if candidates is not None:
                candidates.ledger = ledger
                shared = candidates

                async def restore(url: str) -> None:
                    await shared.restore(mirrors, url)

                mirrors.on_new_mirror = restore
                tg.start_soon(check_mirrors, mirrors, ledger)
            if reaper:
                tg.start_soon(reap_forever, ledger)
            secrets = Credentials(settings.credentials_folder)
            dispatcher = Dispatcher(
                ledger, kinds, secrets, hold_s=config.effect_hold_s, clock=clock
            )
            tg.start_soon(dispatcher.run)
            try:
                yield ledger
            finally:
                tg.cancel_scope.cancel()
