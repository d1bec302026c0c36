"""Preemption notices: a runner on a spot or preemptible server hears that its cloud reclaims
the server, and hands its steps on before it goes (docs/design.md, The runner).

One module per source (`aws`, `gcp`, `azure`, `file`), each a `NoticeSource` whose `poll`
reads the provider's answer once; `watch.PreemptionWatch` polls it. What the runner does on a
notice is `tether.runner.daemon.Runner.preempt`.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from tether.clocks import MonotonicClock
from tether.runner.http import make_client
from tether.runner.preemption import aws, azure, gcp
from tether.runner.preemption.file import FileNotice
from tether.runner.preemption.notice import PROVIDERS, Notice, NoticeUnreadable
from tether.runner.preemption.watch import NoticeSource, PreemptionWatch

__all__ = [
    "PROVIDERS",
    "Notice",
    "NoticeSource",
    "NoticeUnreadable",
    "PreemptionWatch",
    "metadata_client",
    "source_for",
    "where",
]

# Each cloud's documented metadata address.
DEFAULT_URLS = {"aws": aws.DEFAULT_URL, "gcp": gcp.DEFAULT_URL, "azure": azure.DEFAULT_URL}
# A metadata service answers from the host in milliseconds.
REQUEST_TIMEOUT_S = 2.0


def metadata_client() -> httpx.AsyncClient:
    """A client for the metadata service: never through a proxy the environment names (the
    address is link-local), no cookies, no redirects."""
    return make_client(timeout=REQUEST_TIMEOUT_S, trust_env=False)


def where(provider: str, url: str) -> str:
    """The address (or, for `file`, the path) `provider` is read at."""
    return url or DEFAULT_URLS.get(provider, "")


def source_for(
    provider: str, url: str, *, http: httpx.AsyncClient, clock: MonotonicClock
) -> NoticeSource:
    """The source of `provider` (any of `PROVIDERS` but `none`) at `url`, its default when
    empty; for `file`, `url` is the path."""
    base = where(provider, url)
    if provider == "aws":
        return aws.AwsSpot(http, base, clock)
    if provider == "gcp":
        return gcp.GcpPreempted(http, base)
    if provider == "azure":
        return azure.AzureScheduledEvents(http, base)
    if provider == "file":
        return FileNotice(Path(url))
    raise ValueError(f"no preemption source {provider!r}")
