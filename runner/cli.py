"""`tether-runner run`: read settings and secrets, then serve until SIGTERM.

Exit codes: 0 after a graceful shutdown; 2 for bad usage or configuration (one line on
stderr naming what is wrong), or for a `supervisor_url` that replies but not as a tether
supervisor (one error line in the log naming the URL; `READY=1` is never sent); 128+N when a
second signal N cut the shutdown short. With several supervisor URLs the runner starts once one
of them answers as a supervisor (`tether.runner.supervisor_client`, `whoami`).
A missing runner token stops the runner at start; a missing model key does not (see
`tether.runner.settings`).
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
from collections.abc import Sequence
from typing import Any

import anyio
import httpx
import structlog

from tether.cli import USAGE_EXIT, Parser
from tether.clocks import LoopClock
from tether.logs import configure_logging
from tether.runner import tracing
from tether.runner.credentials import SecretMissing, SecretSource
from tether.runner.daemon import Runner
from tether.runner.http import SUPERVISOR_KEEPALIVE_EXPIRY_S, pooled_transport
from tether.runner.kinds.registry import KindRegistry
from tether.runner.log_shipping import LogBuffer
from tether.runner.models import MODEL_APIS, ModelClient, wire_api
from tether.runner.preemption import metadata_client, source_for
from tether.runner.settings import LOG_FORMATS, LOG_LEVELS, RunnerSettings
from tether.runner.supervisor_client import SupervisorClient
from tether.sdnotify import Notifier
from tether.settings import SettingsError, config_file_from, load_settings

PROG = "tether-runner"

log = structlog.get_logger("runner")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="The tether runner: claims steps from a supervisor and runs them.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run",
        help="serve until SIGTERM",
        description=(
            "Claim steps from the supervisor and run them. Settings: defaults < --config TOML"
            " < TETHER_* environment < these flags."
        ),
    )
    run.add_argument("--config", metavar="FILE", help="TOML settings file (or TETHER_CONFIG)")
    run.add_argument(
        "--supervisor",
        dest="supervisor_url",
        metavar="URL",
        help="the supervisor's base URL; several supervisors of one ledger comma-separated,"
        " in failover order",
    )
    run.add_argument("--token-file", metavar="F", help="file holding the runner token")
    run.add_argument("--model-url", metavar="URL", help="the model API's base URL")
    run.add_argument(
        "--model-api", choices=MODEL_APIS, help="the API model_url speaks (default chat)"
    )
    run.add_argument("--model-key-file", metavar="F", help="file holding the model API key")
    run.add_argument("--model", metavar="NAME", help="model name sent to the provider")
    run.add_argument("--concurrency", type=int, metavar="N", help="steps at once (default 4)")
    run.add_argument("--runner-id", metavar="ID", help="default: hostname-pid")
    run.add_argument("--log-level", choices=LOG_LEVELS)
    run.add_argument("--log-format", choices=LOG_FORMATS)
    run.add_argument(
        "--commands-without-sandbox",
        action="store_true",
        default=None,  # not given: the file or the environment decides
        help="let agent steps run commands without bubblewrap; they can then read the"
        " runner's credentials",
    )
    return parser


_FLAGS = (
    "supervisor_url",
    "token_file",
    "model_url",
    "model_api",
    "model_key_file",
    "model",
    "concurrency",
    "runner_id",
    "log_level",
    "log_format",
    "commands_without_sandbox",
)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(
            RunnerSettings,
            config_file=config_file_from(args.config),
            flags={name: getattr(args, name) for name in _FLAGS},
        )
        token = SecretSource(
            path=settings.token_file, credential="runner-token", setting="token_file"
        )
        token_value = token.read_now()
        kinds = KindRegistry.default(
            commands_without_sandbox=settings.commands_without_sandbox,
            command_limits=settings.command_limits,
            sandbox_read_only=settings.sandbox_read_only_paths,
        )
    except (SettingsError, SecretMissing) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return USAGE_EXIT
    except Exception as exc:  # a broken step-kind entry point, named clearly
        print(f"{PROG}: cannot load step kinds: {type(exc).__name__}: {exc}", file=sys.stderr)
        return USAGE_EXIT
    assert token_value is not None
    model_key = SecretSource(
        path=settings.model_key_file,
        credential="model-key",
        setting="model_key_file",
        optional=True,
    )
    log_buffer = LogBuffer() if settings.ship_logs else None
    configure_logging(
        json_lines=settings.json_logs,
        level=settings.log_level,
        tap=log_buffer,  # after masking, so a shipped line holds no secret either
    )
    try:
        if model_key.read_now() is None:
            log.info("no model key configured; requests go without Authorization")
    except SecretMissing as exc:
        log.warning(
            f"model key missing: {exc}. Steps are released until it is there",
            operator_action=f"put the model API key in {model_key.describe()}",
        )
    options = event_loop_options()
    log.info("event loop", loop="uvloop" if options else "asyncio")
    return anyio.run(
        serve,
        settings,
        token_value,
        token,
        model_key,
        kinds,
        None,
        None,
        log_buffer,
        backend_options=options,
    )


def event_loop_options() -> dict[str, Any]:
    """anyio's asyncio backend on uvloop when it is installed (`tether[fast]`), plain asyncio
    otherwise. Measured with four runners of 16 slots on this project's 2-core machine: 3.1 ->
    2.7 ms of runner CPU per step. Optional, so a borrowed server needs no compiler."""
    if importlib.util.find_spec("uvloop") is None:
        return {}
    return {"use_uvloop": True}


async def serve(
    settings: RunnerSettings,
    token_value: str,
    token: SecretSource,
    model_key: SecretSource,
    kinds: KindRegistry,
    supervisor_transport: httpx.AsyncBaseTransport | None = None,
    model_transport: httpx.AsyncBaseTransport | None = None,
    log_buffer: LogBuffer | None = None,
) -> int:
    """Run the daemon with signal handling; return the exit code."""
    clock = LoopClock()
    urls = settings.supervisor_urls
    supervisor = SupervisorClient(
        base_url=urls,
        token=token_value,
        clock=clock,
        timeout_s=settings.request_timeout_s,
        transport=supervisor_transport
        or [  # one set of pools per supervisor
            pooled_transport(settings.concurrency, keepalive_expiry_s=SUPERVISOR_KEEPALIVE_EXPIRY_S)
            for _ in urls
        ],
    )
    model = ModelClient(
        base_url=settings.model_url,
        clock=clock,
        transport=model_transport or pooled_transport(settings.concurrency),
        api=wire_api(settings.model_api, anthropic_max_tokens=settings.anthropic_max_tokens),
    )
    tracing.record_content(settings.trace_content)
    metadata = metadata_client()
    try:
        preemption = None
        if settings.preemption != "none":
            preemption = source_for(
                settings.preemption, settings.preemption_url, http=metadata, clock=clock
            )
        runner = Runner(
            settings=settings,
            supervisor=supervisor,
            model=model,
            model_key=model_key,
            token=token,
            kinds=kinds,
            clock=clock,
            notifier=Notifier(),
            log_buffer=log_buffer,
            preemption=preemption,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(_handle_signals, runner)
            code = await runner.run()
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await supervisor.aclose()
            await model.aclose()
            await metadata.aclose()
    return code


async def _handle_signals(runner: Runner) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            name: Any = signal.Signals(signum).name
            if runner.stopping:
                runner.force_stop(128 + signum)
            else:
                log.info("signal received", signal=name)
                runner.request_shutdown()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
