"""Issue 26, finding 5: the CLI's edges. `status` says which runners are online; an error line
names what to do: the URL nobody answered at, "is this an http port?" for TLS spoken to plain
HTTP, "not writable by this user" for a read-only ledger; a typo gets one hint, the closest."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.conftest import ApiHarness, FakeClock, open_api
from tests.supervisor.test_cli_serve import clean_env, free_port, program
from tether.supervisor import admin
from tether.wire.codec import BadMessage, decode
from tether.wire.records import TaskCreate


@pytest.fixture
async def api(tmp_path: Path, clock: FakeClock) -> AsyncIterator[ApiHarness]:
    async with open_api(tmp_path / "edges.db", clock, synchronous="OFF") as harness:
        yield harness


async def test_a_runner_silent_past_one_claim_is_offline(api: ApiHarness, clock: FakeClock) -> None:
    """A runner that claimed 46 s ago and holds no lease (killed: no claim since) is listed
    `offline` beside one that just claimed; one holding a lease is online however long ago it
    claimed (it renews instead)."""
    await api.queued("busy")
    [lease] = await api.claim(runner_id="busy-1")
    await api.claim(runner_id="killed-1")  # nothing left to lease: an idle claim
    clock.advance(46)
    await api.claim(runner_id="live-1")
    answer = await api.client.get("/v1/pools", headers=api.operator)
    assert answer.status_code == 200, answer.text
    [pool] = [p for p in answer.json()["pools"] if p["pool"] == "default"]
    online = {r["runner_id"]: r["online"] for r in pool["runners"]}
    assert online == {"busy-1": True, "killed-1": False, "live-1": True}
    assert lease["step_id"]


def run_cli(*argv: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
    """`tether-supervisor ARGV` as a process (as the uid `user` when given)."""
    prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user else []
    return subprocess.run(
        [*prefix, *program(), *argv],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "operator-token"
    path.write_text("tether_not-a-real-token\n")
    return path


def test_a_refused_connection_names_the_url(token_file: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = run_cli("status", "--url", url, "--token-file", str(token_file))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert f"cannot reach the supervisor at {url}" in done.stderr


@pytest.fixture
def plain_http() -> Iterator[int]:
    """A plain-HTTP server on a free port, answering nothing in particular."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_https_to_an_http_port_asks_if_it_is_one(plain_http: int, token_file: Path) -> None:
    done = run_cli(
        "status", "--url", f"https://127.0.0.1:{plain_http}", "--token-file", str(token_file)
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "is this an http port?" in done.stderr
    assert f"--url http://127.0.0.1:{plain_http}" in done.stderr


def test_a_read_only_ledger_says_who_cannot_write_it(tmp_path: Path) -> None:
    """As another user (root ignores file modes), or with the file's mode read-only."""
    db = tmp_path / "ledger.db"
    admin.init_ledger(db)
    user = None
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot be another user")
        user = 65534  # nobody: may read the folder and the file, write neither
        tmp_path.chmod(0o755)
        # The folders down to it, pytest's base included (one more under pytest-xdist).
        for path in tmp_path.parents:
            if path.stat().st_mode & 0o005 == 0o005:
                break
            path.chmod(path.stat().st_mode | 0o005)
        db.chmod(0o644)
    else:
        db.chmod(0o444)
    before = db.read_bytes()
    done = run_cli(
        "token", "create", "--db", str(db), "--tenant", "acme", "--role", "operator", user=user
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert "the ledger file is not writable by this user" in done.stderr
    assert db.read_bytes() == before


def test_a_typo_gets_one_hint_the_closest() -> None:
    body = {
        "idempotency_key": "k",
        "plan": {
            "steps": [
                {
                    "name": "fix",
                    "kind": "agent",
                    "payload": {
                        "messages": [{"role": "user", "content": "x"}],
                        "allowed_command": ["ls"],
                    },
                }
            ]
        },
    }
    with pytest.raises(BadMessage) as refused:
        decode(json.dumps(body).encode(), TaskCreate)
    detail = refused.value.detail
    assert detail.count("did you mean") == 1
    assert "(did you mean `allowed_commands`?)" in detail
