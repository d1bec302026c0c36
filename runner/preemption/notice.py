"""What a cloud's preemption notice tells the runner, read from the provider's own answer.

The time left is counted on the provider's clocks only: the deadline it names against the
`Date` header of the same answer (docs/design.md, Borrowed servers), else the notice the
provider documents. The borrowed server's wall clock is never read.
"""

from __future__ import annotations

import dataclasses
import email.utils
from datetime import datetime

import httpx

# `none` turns the watch off; `file` is a path whose existence is the notice.
PROVIDERS = ("none", "aws", "gcp", "azure", "file")

# An answer larger than this is not a metadata service's.
ANSWER_MAX_BYTES = 65_536


class NoticeUnreadable(Exception):
    """The notice source could not be read this time (no answer, an answer in another shape);
    the watch tries again with backoff."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Notice:
    """The provider said it reclaims this server."""

    provider: str
    action: str  # what it will do, in its words: terminate, stop, hibernate, Preempt, ...
    deadline: str | None  # when, in its words and on its clock; None when it names no time
    left_s: float | None  # seconds from its answer to the deadline; None when unknown


def seconds_until(when: datetime, answer: httpx.Response) -> float | None:
    """Seconds from the `Date` of `answer` to `when` (at least 0), both the provider's
    clock; None when the answer carries no usable `Date` or `when` has no time zone."""
    date = answer.headers.get("date")
    if date is None or when.tzinfo is None:
        return None
    try:
        now = email.utils.parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return None
    if now.tzinfo is None:
        return None
    return max(0.0, (when - now).total_seconds())


def body_of(answer: httpx.Response, what: str) -> str:
    """The text of a 200 answer, or `NoticeUnreadable` naming `what` was asked."""
    if answer.status_code != 200:
        raise NoticeUnreadable(f"{what} answered {answer.status_code}")
    if len(answer.content) > ANSWER_MAX_BYTES:
        raise NoticeUnreadable(f"{what} answered {len(answer.content)} bytes, too many")
    return answer.text
