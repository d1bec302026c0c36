"""One structlog configuration for both programs.

JSON lines when stdout is not a terminal (systemd's journal, a pipe, a file), colour when it
is. Every secret the program reads is registered here and masked wherever it appears, before
rendering and again in the rendered line, so a token that slips into an exception message
still never reaches a log line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from structlog.typing import Processor

_REDACTED = "***"
_SENSITIVE_KEYS = frozenset(
    {"authorization", "token", "api_key", "model_key", "secret", "password"}
)
_secrets: set[str] = set()


def register_secret(value: str) -> None:
    """Mask `value` wherever it appears in later log lines."""
    if value:
        _secrets.add(value)


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        for secret in _secrets:
            if secret in value:
                value = value.replace(secret, _REDACTED)
        return value
    if isinstance(value, dict):
        return {
            k: _REDACTED if str(k).lower() in _SENSITIVE_KEYS else _scrub(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(_scrub(v) for v in value)
    return value


def mask(text: str) -> str:
    """`text` with every registered secret's text masked."""
    scrubbed: str = _scrub(text)
    return scrubbed


def redact_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: mask sensitive keys and every registered secret's text."""
    for key in list(event_dict):
        if key.lower() in _SENSITIVE_KEYS:
            event_dict[key] = _REDACTED
        else:
            event_dict[key] = _scrub(event_dict[key])
    return event_dict


def scrub_rendered(_logger: Any, _method: str, rendered: Any) -> Any:
    """Last in the chain, after the renderer: a secret hidden in something the key-wise pass
    cannot see into (an exception object, bytes, a dict key) is masked in the final text."""
    if isinstance(rendered, str):
        return _scrub(rendered)
    return rendered


def configure_logging(
    *, json_lines: bool | None = None, level: str = "info", tap: Processor | None = None
) -> None:
    """Set up structlog for a program. `json_lines=None` decides by whether stdout is a TTY.
    `tap`, when given, sees every structlog line after its secrets are masked and before it is
    rendered (the runner's log shipping, `tether.runner.log_shipping`)."""
    if json_lines is None:
        json_lines = not sys.stdout.isatty()
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json_lines
        else structlog.dev.ConsoleRenderer(colors=True)
    )
    # Every line, structlog's own or the standard library's, ends the same way.
    stamp: list[Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    finish: list[Processor] = [
        structlog.processors.format_exc_info,
        redact_secrets,
        renderer,
        scrub_rendered,
    ]
    tapped = [*finish[:2], tap, *finish[2:]] if tap is not None else finish
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *stamp, *tapped],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *stamp],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *finish],
        )
    )
    # The standard library's lines (uvicorn's, asyncio's) become the same JSON lines, with
    # `logger` naming their source; httpx's per-request lines are left out below warning.
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
