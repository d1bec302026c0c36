"""Which supervisor the runner talks to when `supervisor_url` lists several (issue 14, item 3).

The supervisors share one ledger, so a lease, its fence and the runner token are valid through
any of them. The runner talks to one at a time, the *current* one, shared by every call of the
daemon: it stays current until a call to it gets no answer (a transport error, a timeout, or a
reply the runner would retry: 5xx, 408, 429), then the next URL in the list becomes current,
wrapping around to the first. Each URL has its own connection pool. One log line says so when
the current supervisor changes: `from`, `to` and the reason, never a token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import httpx
import structlog

log = structlog.get_logger("runner")


def _shown(url: str) -> str:
    """`url` without a user or password, for a log line."""
    parsed = httpx.URL(url)
    if not parsed.userinfo:
        return url
    return str(parsed.copy_with(username=None, password=None))


@dataclasses.dataclass(eq=False)
class Endpoint:
    """One supervisor: its base URL and the client that holds its connection pool."""

    url: str
    http: httpx.AsyncClient
    _targets: dict[str, httpx.URL] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def shown(self) -> str:
        return _shown(self.url)

    def target(self, path: str) -> httpx.URL:
        """The URL of `path` (from the root, e.g. `/v1/steps/results`), parsed once per path:
        httpx parses a URL given as text on every request (issue 28: about 5 % of a request's
        CPU). Only for the runner's fixed paths, not ones holding a step's id."""
        found = self._targets.get(path)
        if found is None:
            # As httpx resolves a path against the client's base URL (a base path kept).
            found = self._targets[path] = self.http.build_request("GET", path).url
        return found


class Endpoints:
    """The supervisors in the order `supervisor_url` lists them, and which one is current."""

    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        if not endpoints:
            raise ValueError("at least one supervisor URL is needed")
        self.all = tuple(endpoints)
        self._current = 0
        self.switches = 0

    @property
    def current(self) -> Endpoint:
        return self.all[self._current]

    @property
    def several(self) -> bool:
        return len(self.all) > 1

    def attempts(self) -> Iterator[Endpoint]:
        """Where one call goes: the current supervisor, then, while each gives no answer (the
        caller reports it with `failed`), the next untried one; every supervisor at most once.

        The current one is read again before each try, so a call that failed on a supervisor
        another call already left goes to the one that call moved to."""
        tried: set[int] = set()
        last = self._current
        while len(tried) < len(self.all):
            if self._current not in tried:
                last = self._current
            else:
                last = next(
                    i
                    for step in range(1, len(self.all) + 1)
                    if (i := (last + step) % len(self.all)) not in tried
                )
            tried.add(last)
            yield self.all[last]

    def failed(self, endpoint: Endpoint, reason: str) -> None:
        """`endpoint` gave no answer: if it is current, the next one in order becomes current.
        A supervisor that another call already left is not left twice."""
        if not self.several or endpoint is not self.current:
            return
        self._current = (self._current + 1) % len(self.all)
        self.switches += 1
        log.warning(
            "supervisor gave no answer; switching to the next",
            **{"from": endpoint.shown, "to": self.current.shown},
            reason=reason,
        )

    def prefer(self, endpoint: Endpoint) -> None:
        """Make `endpoint` current without a log line (at start: the first that answered)."""
        self._current = self.all.index(endpoint)

    async def aclose(self) -> None:
        for endpoint in self.all:
            await endpoint.http.aclose()
