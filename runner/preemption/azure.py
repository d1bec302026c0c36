"""Azure: Scheduled Events of the instance metadata service.

`GET /metadata/scheduledevents?api-version=2020-07-01` with `Metadata: true` answers
`{"DocumentIncarnation", "Events": [...]}`; a Spot VM about to be evicted gets an event of
`EventType` `Preempt` naming it among its `Resources`, with `NotBefore` (an HTTP date, at
least 30 seconds ahead). This VM's name is asked once, from
`/metadata/instance/compute/name`, so an event for another VM of the same set is not taken
for one's own. The service starts on the first request for events, which Azure documents may
take up to two minutes to answer; later ones answer at once.
"""

from __future__ import annotations

import email.utils
import json
from typing import Any

import httpx

from tether.runner.preemption.notice import Notice, NoticeUnreadable, body_of, seconds_until

DEFAULT_URL = "http://169.254.169.254"
EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
DOCUMENTED_NOTICE_S = 30.0
FIRST_ANSWER_S = 120.0


class AzureScheduledEvents:
    """Polls Scheduled Events for a `Preempt` of this VM; see the module docstring."""

    provider = "azure"

    def __init__(self, http: httpx.AsyncClient, base_url: str) -> None:
        self._http = http
        self._base = base_url.rstrip("/")
        self._name: str | None = None
        self._answered = False

    async def poll(self) -> Notice | None:
        name = await self._vm_name()
        answer = await self._http.get(
            f"{self._base}{EVENTS_PATH}",
            headers={"Metadata": "true"},
            timeout=httpx.USE_CLIENT_DEFAULT if self._answered else FIRST_ANSWER_S,
        )
        try:
            events = json.loads(body_of(answer, "scheduledevents"))["Events"]
            if not isinstance(events, list):
                raise TypeError("Events is not a list")
        except (ValueError, KeyError, TypeError) as exc:
            raise NoticeUnreadable(f"scheduledevents is not a list of events: {exc}") from None
        self._answered = True
        event = next((e for e in events if _preempts(e, name)), None)
        if event is None:
            return None
        not_before = event.get("NotBefore")
        deadline = not_before if isinstance(not_before, str) and not_before else None
        left = None
        if deadline is not None:
            try:
                left = seconds_until(email.utils.parsedate_to_datetime(deadline), answer)
            except (TypeError, ValueError):
                left = None
        if left is None:
            left = DOCUMENTED_NOTICE_S
        return Notice(provider=self.provider, action="Preempt", deadline=deadline, left_s=left)

    async def _vm_name(self) -> str:
        if self._name is None:
            answer = await self._http.get(f"{self._base}{NAME_PATH}", headers={"Metadata": "true"})
            name = body_of(answer, "instance/compute/name").strip()
            if not name:
                raise NoticeUnreadable("instance/compute/name answered no name")
            self._name = name
        return self._name


def _preempts(event: Any, name: str) -> bool:
    """A `Preempt` event naming this VM among its resources."""
    if not isinstance(event, dict) or event.get("EventType") != "Preempt":
        return False
    resources = event.get("Resources")
    return isinstance(resources, list) and name in resources
