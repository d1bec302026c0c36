"""The status page's sign-in against a real supervisor (`serve`; docs/design.md, Threat model:
The owned side; issue 23, finding 5): the cookie holds a session id the ledger keeps, never the
operator's token, and the session ends at sign-out (the old cookie replayed is refused), when
its token is revoked from another process (`token revoke`), and at `ui_session_ttl_s`.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.runner.test_runner_processes import Cluster, environment, program
from tests.ui_pages import csrf_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TTL_S = 6.0


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path)
    try:
        cluster.start_supervisor(TETHER_UI_SESSION_TTL_S=str(TTL_S))
        yield cluster
    finally:
        cluster.stop_all()


def browser(cluster: Cluster) -> httpx.Client:
    return httpx.Client(base_url=cluster.url, trust_env=False, timeout=10)


def sign_in(client: httpx.Client, token: str) -> str:
    """Sign in with `token`; the session cookie's value."""
    answer = client.post(
        "/ui/login", data={"token": token}, headers={"Origin": str(client.base_url)}
    )
    assert (answer.status_code, answer.headers["location"]) == (303, "/ui"), answer.text
    assert token not in answer.headers["set-cookie"]
    cookie = client.cookies["tether_ui"]
    assert cookie.startswith("tether_ui_")
    assert token not in cookie
    return cookie


def replayed(cluster: Cluster, cookie: str) -> int:
    """The status of `/ui` for a client that sends `cookie` (303 to the login: signed out)."""
    with httpx.Client(base_url=cluster.url, trust_env=False, timeout=10) as client:
        client.cookies.set("tether_ui", cookie, path="/ui")
        return client.get("/ui").status_code


def test_the_cookie_is_a_session_that_sign_out_ends(supervisor: Cluster) -> None:
    with browser(supervisor) as client:
        cookie = sign_in(client, supervisor.operator_token)
        listing = client.get("/ui")
        assert listing.status_code == 200
        assert supervisor.operator_token not in listing.text
        out = client.post(
            "/ui/logout",
            data={"csrf": csrf_of(listing.text)},
            headers={"Origin": supervisor.url},
        )
        assert out.status_code == 303
    assert replayed(supervisor, cookie) == 303, "the old cookie still signs in"
    ledger = (supervisor.db).read_bytes()
    assert supervisor.operator_token.encode() not in ledger
    assert cookie.encode() not in ledger  # only its hash is kept


def admin(cluster: Cluster, *argv: str) -> str:
    """`tether-supervisor token ...` on the cluster's ledger, from another process."""
    done = subprocess.run(
        [*program("tether-supervisor"), "token", *argv, "--db", str(cluster.db)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env=environment(),
    )
    return done.stdout.strip()


def test_revoking_the_token_ends_its_sessions(supervisor: Cluster) -> None:
    token = admin(supervisor, "create", "--tenant", "acme", "--role", "operator", "--name", "web")
    with browser(supervisor) as client:
        cookie = sign_in(client, token)
        assert client.get("/ui").status_code == 200
        admin(supervisor, "revoke", "web")
        assert client.get("/ui").status_code == 303
    assert replayed(supervisor, cookie) == 303


def test_a_session_ends_at_its_expiry(supervisor: Cluster) -> None:
    with browser(supervisor) as client:
        started = time.monotonic()
        cookie = sign_in(client, supervisor.operator_token)
        assert client.get("/ui").status_code == 200
        time.sleep(max(0.0, TTL_S + 0.5 - (time.monotonic() - started)))
        assert client.get("/ui").status_code == 303
    assert replayed(supervisor, cookie) == 303
