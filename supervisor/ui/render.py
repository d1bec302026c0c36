"""How the status page's HTML is made: one Jinja2 environment (autoescaped; every value passed
through `printable` first), the headers every page carries, and the shared page shapes."""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any, Final

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.templating import Jinja2Templates

from tether.clocks import iso
from tether.supervisor.ledger import TERMINAL, TaskState
from tether.supervisor.ui import session
from tether.wire.payloads import EFFECT_KINDS

# Code points a strict HTML5 parser reports as errors in text (controls other than tab, line
# feed and carriage return; noncharacters), and lone surrogates, which UTF-8 cannot encode: a
# runner's output or a log may hold any of them, so each is shown as U+FFFD.
_UNPRINTABLE = re.compile(
    "[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufdd0-\ufdef"
    + "".join(f"{chr(plane << 16 | 0xFFFE)}{chr(plane << 16 | 0xFFFF)}" for plane in range(17))
    + "]"
)

HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
        " img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
# A digest is linked to its text under these keys, and as any value of these mappings.
ARTIFACT_KEYS: Final = frozenset({"log", "bundle", "transcript"})
ARTIFACT_MAPS: Final = frozenset({"artifacts", "observed_checks"})
_DIGEST = re.compile(r"[0-9a-f]{64}")


def printable(text: str) -> str:
    """`text` with what HTML cannot carry shown as U+FFFD (see `_UNPRINTABLE`)."""
    return _UNPRINTABLE.sub("\ufffd", text)


def _finalize(value: Any) -> Any:
    # A macro's output is Markup, already made of finalized values.
    if isinstance(value, str) and not isinstance(value, Markup):
        return printable(value)
    return value


def when(value: Any) -> str:
    """A ledger time (epoch seconds) as ISO 8601 UTC; an ISO string as it is."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return iso(float(value)) or ""
    return "" if value is None else str(value)


def is_digest(value: Any) -> bool:
    return isinstance(value, str) and bool(_DIGEST.fullmatch(value))


SHORT_ID_MIN: Final = 8  # what the CLI takes as a prefix, too


def short_ids(ids: list[str]) -> dict[str, str]:
    """Each id's shortest prefix of at least `SHORT_ID_MIN` characters that no other id of
    `ids` starts with (the whole id when it is a prefix of another)."""
    short = {}
    for one in ids:
        size = SHORT_ID_MIN
        while size < len(one) and any(o != one and o.startswith(one[:size]) for o in ids):
            size += 1
        short[one] = one[:size]
    return short


def is_ended(state: str) -> bool:
    return state in TaskState.__members__ and TaskState(state) in TERMINAL


templates = Jinja2Templates(directory=str(resources.files("tether.supervisor.ui") / "templates"))
templates.env.finalize = _finalize
templates.env.filters["when"] = when
templates.env.tests["digest"] = is_digest
templates.env.globals["ARTIFACT_KEYS"] = ARTIFACT_KEYS
templates.env.globals["ARTIFACT_MAPS"] = ARTIFACT_MAPS
templates.env.globals["STATES"] = list(TaskState.__members__)
templates.env.globals["is_ended"] = is_ended
# The built-in effect kinds: a step of one that is not due yet has no effect to show.
templates.env.globals["EFFECT_KINDS"] = EFFECT_KINDS


def page(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> Response:
    """The template `name` as a page, with the session's CSRF token and the headers."""
    response = templates.TemplateResponse(
        request, name, {"csrf": session.csrf_token(request), **context}, status_code=status_code
    )
    response.headers.update(HEADERS)
    return response


def message(request: Request, title: str, text: str, status_code: int) -> Response:
    """A page that says one thing: a refusal, or something not found."""
    return page(request, "message.html", {"title": title, "text": text}, status_code)


@functools.cache
def _static_bytes(name: str) -> bytes:
    return (resources.files("tether.supervisor.ui") / "static" / name).read_bytes()


def static(name: str, media_type: str) -> Response:
    """One of the page's own static files (no asset comes from elsewhere)."""
    response = Response(_static_bytes(name), media_type=media_type)
    response.headers.update({**HEADERS, "Cache-Control": "max-age=300"})
    return response


def html(text: str, status_code: int = 200) -> Response:
    response = HTMLResponse(text, status_code=status_code)
    response.headers.update(HEADERS)
    return response
