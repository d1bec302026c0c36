"""AWS EC2 spot: the instance-action item of the instance metadata service, through IMDSv2.

`PUT /latest/api/token` (header `X-aws-ec2-metadata-token-ttl-seconds`) gives a session token;
`GET /latest/meta-data/spot/instance-action` with it (header `X-aws-ec2-metadata-token`)
answers 404 until EC2 decides to interrupt the instance, then `{"action": "terminate" | "stop"
| "hibernate", "time": "2026-12-06T02:00:00Z"}`, about two minutes ahead. A token refused
(401) is asked for again once.
"""

from __future__ import annotations

import json
from datetime import datetime

import httpx

from tether.clocks import MonotonicClock
from tether.runner.preemption.notice import Notice, NoticeUnreadable, body_of, seconds_until

DEFAULT_URL = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"  # noqa: S105 (a path, not a secret)
ACTION_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_TTL_S = 21_600  # IMDSv2's longest
# What EC2 documents: the notice comes two minutes before the interruption.
DOCUMENTED_NOTICE_S = 120.0


class AwsSpot:
    """Polls the spot instance-action; see the module docstring."""

    provider = "aws"

    def __init__(self, http: httpx.AsyncClient, base_url: str, clock: MonotonicClock) -> None:
        self._http = http
        self._base = base_url.rstrip("/")
        self._clock = clock
        self._token: str | None = None
        self._token_until = 0.0

    async def poll(self) -> Notice | None:
        answer = await self._action(await self._session_token())
        if answer.status_code == 401:  # the token lapsed or the service restarted
            self._token = None
            answer = await self._action(await self._session_token())
        if answer.status_code == 404:
            return None
        try:
            item = json.loads(body_of(answer, "spot/instance-action"))
            action, time = item["action"], item["time"]
            if not isinstance(action, str) or not isinstance(time, str):
                raise TypeError("action and time must be strings")
            when = datetime.fromisoformat(time)
        except (ValueError, KeyError, TypeError) as exc:
            raise NoticeUnreadable(f"spot/instance-action is not an action: {exc}") from None
        left = seconds_until(when, answer)
        if left is None:
            left = DOCUMENTED_NOTICE_S
        return Notice(provider=self.provider, action=action, deadline=time, left_s=left)

    async def _action(self, token: str) -> httpx.Response:
        return await self._http.get(
            f"{self._base}{ACTION_PATH}", headers={"X-aws-ec2-metadata-token": token}
        )

    async def _session_token(self) -> str:
        """The IMDSv2 session token, asked for again half way through its life."""
        if self._token is not None and self._clock.now() < self._token_until:
            return self._token
        answer = await self._http.put(
            f"{self._base}{TOKEN_PATH}",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
        )
        token = body_of(answer, "api/token").strip()
        if not token:
            raise NoticeUnreadable("api/token answered no token")
        self._token, self._token_until = token, self._clock.now() + TOKEN_TTL_S / 2
        return token
