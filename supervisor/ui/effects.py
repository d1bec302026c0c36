"""An effect step as the task page shows it (docs/design.md, Effects): its request laid out for
an operator to read before opening a gate, with what must not be shown masked.

The ledger's view already holds a credential only as its `{{ credential.<name> }}` placeholder
(filled at send time, never stored). The page also masks what the plan itself wrote where a
secret goes: the value of a header whose name says it carries one, and a URL's user and
password. The digest the page binds a gate to is the ledger's digest of the whole request,
masked parts included, so what is masked here still cannot change unseen."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from tether.git import redact
from tether.supervisor.shown import reveal, reveal_all, reveal_json, shown_header
from tether.wire.records import EffectView

WAITING: Final = frozenset({"gated", "uncertain"})
# Each outbox state in words, beside the state's name: the page never relies on colour.
MEANING: Final = {
    "due": "to be sent by the supervisor's dispatcher",
    "gated": "waiting for an operator to open its gate for this request",
    "open": "gate opened for one send; waiting for the dispatcher",
    "sending": "being sent",
    "uncertain": (
        "may have been sent: the supervisor stopped between starting the send and recording"
        " the answer; it is never sent again by itself"
    ),
    "delivered": "delivered; the receiver's answer is recorded",
    "failed": "not delivered; the step failed",
    "withdrawn": "withdrawn before it was sent",
}


def _body(body: Any) -> str | None:
    if body is None:
        return None
    return reveal_json(body)


def shown_request(kind: str, request: Any) -> dict[str, Any]:
    """The rendered request laid out by part: `method`, `url`, `headers` (see `shown_header`),
    `body` as indented JSON, and `other` for the fields of any other shape (a git.push's
    branch and commits, or a registered kind's payload)."""
    if not isinstance(request, dict):
        return {"other": reveal_all(request)}
    fields = dict(request)
    url = fields.pop("url", None)
    headers = fields.pop("headers", None) if kind == "http" else None
    shown: dict[str, Any] = {
        "method": reveal_all(fields.pop("method", None)) if kind == "http" else None,
        "url": reveal(redact(url)) if isinstance(url, str) else reveal_all(url),
        "headers": [
            shown_header(reveal(str(k)), reveal_all(v)) for k, v in sorted((headers or {}).items())
        ],
        "has_body": kind == "http" and "body" in fields,
        "body": _body(fields.pop("body", None)) if kind == "http" else None,
        "other": reveal_all(fields),
    }
    return shown


def shown_effect(effect: EffectView | None) -> dict[str, Any] | None:
    """The effect of a step's view with its request laid out (`shown`) and whether an
    operator's word is awaited (`waiting`: its gate, or whether it happened)."""
    if effect is None:
        return None
    return {
        **msgspec.structs.asdict(effect),
        "shown": shown_request(effect.kind, effect.request),
        "waiting": effect.state in WAITING,
        "meaning": MEANING.get(effect.state, ""),
    }
