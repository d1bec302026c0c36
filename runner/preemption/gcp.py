"""Google Compute Engine: `GET /computeMetadata/v1/instance/preempted` with `Metadata-Flavor:
Google` answers `FALSE`, then `TRUE` once a Spot or preemptible VM is being preempted; the VM
then has 30 seconds (the documented notice; the answer names no time). An answer without
`Metadata-Flavor: Google` is not the metadata server's and is not believed.
"""

from __future__ import annotations

import httpx

from tether.runner.preemption.notice import Notice, NoticeUnreadable, body_of

DEFAULT_URL = "http://metadata.google.internal"
PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
DOCUMENTED_NOTICE_S = 30.0


class GcpPreempted:
    """Polls instance/preempted; see the module docstring."""

    provider = "gcp"

    def __init__(self, http: httpx.AsyncClient, base_url: str) -> None:
        self._http = http
        self._url = f"{base_url.rstrip('/')}{PREEMPTED_PATH}"

    async def poll(self) -> Notice | None:
        answer = await self._http.get(self._url, headers={"Metadata-Flavor": "Google"})
        text = body_of(answer, "instance/preempted").strip()
        if answer.headers.get("metadata-flavor") != "Google":
            raise NoticeUnreadable("instance/preempted answered without Metadata-Flavor: Google")
        if text == "FALSE":
            return None
        if text != "TRUE":
            raise NoticeUnreadable(f"instance/preempted answered {text[:40]!r}, not TRUE or FALSE")
        return Notice(
            provider=self.provider, action="preempt", deadline=None, left_s=DOCUMENTED_NOTICE_S
        )
