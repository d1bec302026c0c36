"""`tether-supervisor serve`: uvicorn around the API app, with systemd notify and a refusal to
start on a damaged ledger file."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import structlog
import uvicorn
from starlette.applications import Starlette

from tether.logs import configure_logging
from tether.sdnotify import Notifier
from tether.supervisor import writer_lock
from tether.supervisor.api import create_app, drain
from tether.supervisor.api.health import Openness
from tether.supervisor.effects.addresses import Resolver, system_resolver
from tether.supervisor.head_timeout import head_timeout_protocol
from tether.supervisor.ledger import LedgerError
from tether.supervisor.ledger.backend_protocol import Backend
from tether.supervisor.ledger.backends import LedgerUrlError, open_backend
from tether.supervisor.settings import SupervisorSettings

log = structlog.get_logger("tether.supervisor")

# The event loop and the ledger's writer thread share the GIL. At Python's default (5 ms) a
# batch running Python on the writer thread can hold back every reply for that long. Measured
# at 300 steps/s through runners (claim->commit p99 overhead, three paired runs): 120 -> 58,
# 180 -> 89, 55 -> 45 ms at 0.5 ms, with the same steps/s for the supervisor alone.
GIL_SWITCH_INTERVAL_S = 0.0005

# How long an idle keep-alive connection stays open (uvicorn's default is 5 s). A client must
# let go of an idle connection before the server closes it, or a request sent just as the
# close is on the wire gets no reply: runners let go after 20 s (`runner/http.py`,
# SUPERVISOR_KEEPALIVE_EXPIRY_S), well below this, and above their renew interval (10 s by
# default), so that renewals reuse their connection.
TIMEOUT_KEEP_ALIVE_S = 30


def ledger_backend(settings: SupervisorSettings) -> Backend:
    return open_backend(settings.db, synchronous=settings.synchronous)


def preflight(settings: SupervisorSettings) -> str | None:
    """Open, integrity-check and migrate the ledger (a file, or a database that other
    supervisors may share); return the one line to print on failure."""
    try:
        backend = ledger_backend(settings)
    except LedgerUrlError as exc:
        return str(exc)
    try:
        backend.close_writer(backend.open_writer())
    except (LedgerError, sqlite3.DatabaseError) as exc:
        return f"ledger {backend.where} refused: {exc}"
    return None


async def _notify_when_started(server: uvicorn.Server, notifier: Notifier) -> None:
    while not server.started:
        if server.should_exit:
            return
        await anyio.sleep(0.05)
    notifier.ready()
    notifier.status("serving")
    interval = notifier.watchdog_interval_s
    while interval is not None and not server.should_exit:
        notifier.watchdog()
        await anyio.sleep(interval)


LEDGER_CHECK_EVERY_S = 0.5


async def _stop_if_the_ledger_closes(server: uvicorn.Server, app: Starlette) -> None:
    """The ledger closes by itself only if its writer or reaper died. uvicorn would go on
    serving without it (every call failing), and systemd's watchdog would go on hearing from
    it: stop instead, with exit 1, so that the service manager restarts the supervisor."""
    while not server.should_exit:
        await anyio.sleep(LEDGER_CHECK_EVERY_S)
        ledger: Openness | None = getattr(app.state, "ledger", None)
        if server.started and ledger is not None and not ledger.is_open and not server.should_exit:
            log.error("the ledger closed while serving; stopping so that it is restarted")
            app.state.failed = True
            server.should_exit = True
            drain(app)


class _Server(uvicorn.Server):
    """uvicorn re-raises a captured SIGTERM once it has shut down, which kills the process
    before its last log lines are flushed; we take the signals ourselves instead."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _stop_on_signals(server: uvicorn.Server, notifier: Notifier, app: Starlette) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            if server.should_exit:
                server.force_exit = True  # a second signal: stop without waiting
            server.should_exit = True
            drain(app)  # runners' claims and operators' watches get a reply now, not at timeout
            notifier.stopping()
            log.info("supervisor stopping", signal=signal.Signals(signum).name)


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here rather than inside uvicorn, so that an address in use
    is one clear line and exit 1 instead of uvicorn's `sys.exit` inside our task group."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


class ListenError(Exception):
    """The supervisor cannot listen where it was told to; the message is the line to print."""


async def _serve(
    server: uvicorn.Server, notifier: Notifier, app: Starlette, sock: socket.socket
) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(_notify_when_started, server, notifier)
        tg.start_soon(_stop_on_signals, server, notifier, app)
        tg.start_soon(_stop_if_the_ledger_closes, server, app)
        # uvicorn raises SystemExit when the app's startup fails (having logged why); `serve`
        # then sees `server.started` is false and exits 1 with one line of its own.
        with contextlib.suppress(SystemExit):
            await server.serve(sockets=[sock])
        notifier.stopping()
        tg.cancel_scope.cancel()


def server_config(app: Starlette, settings: SupervisorSettings) -> uvicorn.Config:
    """uvicorn's settings for the supervisor: our logging, no access log, our keep-alive, and
    its httptools protocol with a bound on reading a request's head (`head_timeout`)."""
    return uvicorn.Config(
        app,
        http=head_timeout_protocol(
            settings.header_read_timeout_s, app.state.head_timeouts, app.state.refusal_log
        ),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
        timeout_keep_alive=TIMEOUT_KEEP_ALIVE_S,
    )


def serve(settings: SupervisorSettings, *, resolver: Resolver = system_resolver) -> int:
    """Run the supervisor until a signal; its exit code. `resolver` answers the names effects
    are sent to (the system's resolver)."""
    configure_logging(level=settings.log_level)
    try:  # one writer per ledger file, for as long as this one serves (`writer_lock`)
        held = writer_lock.hold(settings.db) if isinstance(settings.db, Path) else None
    except writer_lock.LedgerHeld as exc:
        sys.stderr.write(f"tether-supervisor: error: {exc}\n")
        return 1
    try:
        return _serve_holding_the_ledger(settings, resolver)
    finally:
        if held is not None:
            os.close(held)


def _serve_holding_the_ledger(settings: SupervisorSettings, resolver: Resolver) -> int:
    problem = preflight(settings)
    if problem is not None:
        sys.stderr.write(f"tether-supervisor: error: {problem}\n")
        return 1
    try:
        sock = listen(settings.host, settings.port)
    except ListenError as exc:
        sys.stderr.write(f"tether-supervisor: error: {exc}\n")
        return 1
    app = create_app(settings, resolver=resolver)
    server = _Server(server_config(app, settings))
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    where = ledger_backend(settings).where  # without a database URL's password
    log.info("supervisor starting", db=where, host=settings.host, port=settings.port)
    try:
        anyio.run(_serve, server, Notifier(), app, sock)
    finally:
        sock.close()
    if not server.started:
        sys.stderr.write("tether-supervisor: error: the supervisor failed to start (see above)\n")
        return 1
    if getattr(app.state, "failed", False):
        sys.stderr.write("tether-supervisor: error: the ledger closed while serving (see above)\n")
        return 1
    log.info("supervisor stopped")
    return 0
