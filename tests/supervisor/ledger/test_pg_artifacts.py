"""Artifacts and candidates shared by two supervisors on one PostgreSQL ledger (issue 14): bytes
uploaded through A are read, and used as a report's evidence, through B; a too-large or
wrong-digest upload leaves nothing in the database; a runner that failed over fetches its
checkpoint's bundle from B; a `git.push` taken by B's dispatcher after A verified the task
imports the candidate its own mirror never saw; `migrate` copies a SQLite ledger's artifact
files into the database."""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests import pgdb
from tests.conftest import ApiHarness, FakeClock, assert_error, chat_payload, open_api
from tests.supervisor.api.test_api_repository_tasks import CHECKS, PASSED, candidate, make_remote
from tests.supervisor.artifacts.test_artifacts import leased, put
from tests.supervisor.repos.test_repos_mirror import Origin, rev
from tether.supervisor import admin
from tether.supervisor.artifacts import Held, collector
from tether.supervisor.artifacts.pg import CHUNK_BYTES, CONNECTIONS, WAIT_S, PgArtifactStore
from tether.supervisor.ledger.copy import copy_ledger
from tether.supervisor.ledger.pg_schema import connect
from tether.supervisor.repos import candidate_ref

pg_url = pgdb.pg_url

MAX_BYTES = 3 * CHUNK_BYTES


@contextlib.asynccontextmanager
async def supervisor(
    url: str, root: Path, clock: FakeClock, **settings: Any
) -> AsyncIterator[ApiHarness]:
    """A supervisor app on the database `url` with its own artifact and mirror folders."""
    async with open_api(
        url,  # type: ignore[arg-type]
        clock,
        artifact_dir=root / "artifacts",
        mirror_dir=root / "mirrors",
        artifact_max_bytes=MAX_BYTES,
        **settings,
    ) as harness:
        yield harness


async def add_app(url: str, origin: Origin) -> None:
    """Tenant acme's repository `app`, added as `repo add` adds it."""
    await anyio.to_thread.run_sync(admin.add_repository, url, "acme", "app", origin.url)


@pytest.fixture
def origin(tmp_path: Path) -> Origin:
    return make_remote(tmp_path / "remote")


def rows(url: str, query: str) -> list[tuple[Any, ...]]:
    with connect(url) as conn:
        return [tuple(r) for r in conn.execute(query.encode()).fetchall()]


async def upload(api: ApiHarness, data: bytes, who: str = "runner") -> str:
    digest = hashlib.sha256(data).hexdigest()
    response = await api.client.put(f"/v1/artifacts/{digest}", headers=api.auth(who), content=data)
    assert response.status_code == 200, response.text
    return digest


async def view(api: ApiHarness, task_id: str) -> dict[str, Any]:
    response = await api.client.get(f"/v1/tasks/{task_id}", headers=api.operator)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def queued(api: ApiHarness, origin: Origin, key: str, *steps: dict[str, Any]) -> str:
    """A repository task of `steps` (one chat step by default), created and approved at the
    origin's base; its id."""
    plan = list(steps) or [{"name": "s0", "kind": "chat", "payload": chat_payload("work")}]
    body = {
        "idempotency_key": key,
        "plan": {"steps": plan},
        "repository": "app",
        "allowed_paths": ["src/"],
        "checks": CHECKS,
    }
    created = await api.client.post("/v1/tasks", headers=api.operator, json=body)
    assert created.status_code == 201, created.text
    task = created.json()
    approved = await api.client.post(
        f"/v1/tasks/{task['id']}/approve",
        headers=api.operator,
        json={"plan_hash": task["plan_hash"], "base_sha": origin.base},
    )
    assert approved.status_code == 200, approved.text
    return str(task["id"])


async def test_bytes_uploaded_to_a_are_read_and_are_evidence_through_b(
    pg_url: str, tmp_path: Path, clock: FakeClock, origin: Origin
) -> None:
    big = bytes(range(256)) * (CHUNK_BYTES // 256) * 2 + b"tail"  # three chunks
    async with (
        supervisor(pg_url, tmp_path / "a", clock) as a,
        supervisor(pg_url, tmp_path / "b", clock) as b,
    ):
        await add_app(pg_url, origin)
        digest = await upload(a, big)
        assert rows(pg_url, "SELECT n, octet_length(data) FROM artifact_chunks ORDER BY n") == [
            (0, CHUNK_BYTES),
            (1, CHUNK_BYTES),
            (2, 4),
        ]
        got = await b.client.get(f"/v1/artifacts/{digest}", headers=b.runner)
        assert got.status_code == 200
        assert got.headers["content-length"] == str(len(big))
        assert got.content == big
        assert not (tmp_path / "a" / "artifacts" / "sha256").exists()  # no file on either box

        # A runner uploads its bundle and log to A, then reports through B.
        task_id = await queued(b, origin, "k1")
        [lease] = await b.claim()
        data, sha = candidate(origin, "a")
        fields = {
            "candidate_sha": sha,
            "bundle": await upload(a, data),
            "checks": {"tests": {"log": await upload(a, PASSED), "exit_code": 0, "duration_s": 1}},
        }
        result = await b.report(lease, **fields)
        assert result.json() == {"outcome": "applied"}, result.text
        shown = await view(a, task_id)
        assert (shown["state"], shown["steps"][0]["problems"]) == ("SUCCEEDED", [])
        ref = candidate_ref(task_id, lease["step_id"], lease["fence"])
        assert rev(b.app.state.mirrors.path(origin.url), ref) == sha


async def test_a_refused_upload_leaves_nothing_and_a_repeat_keeps_the_first(
    pg_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    async with supervisor(pg_url, tmp_path / "a", clock) as a:

        async def streamed(data: bytes) -> AsyncIterator[bytes]:
            for start in range(0, len(data), 256 * 1024):
                yield data[start : start + 256 * 1024]

        too_large = b"x" * (MAX_BYTES + 1)
        digest = hashlib.sha256(too_large).hexdigest()
        response = await a.client.put(
            f"/v1/artifacts/{digest}", headers=a.runner, content=streamed(too_large)
        )
        assert_error(response, 413, "body_too_large")
        wrong = hashlib.sha256(b"other bytes").hexdigest()
        response = await a.client.put(
            f"/v1/artifacts/{wrong}", headers=a.runner, content=streamed(b"y" * CHUNK_BYTES * 2)
        )
        assert_error(response, 422, "digest_mismatch")
        assert rows(pg_url, "SELECT count(*) FROM artifact_chunks") == [(0,)]
        assert rows(pg_url, "SELECT count(*) FROM artifact_owners") == [(0,)]
        for refused in (digest, wrong):
            got = await a.client.get(f"/v1/artifacts/{refused}", headers=a.runner)
            assert_error(got, 404, "not_found")

        once = await a.client.put(
            f"/v1/artifacts/{wrong}", headers=a.runner, content=b"other bytes"
        )
        again = await a.client.put(
            f"/v1/artifacts/{wrong}", headers=a.runner, content=b"other bytes"
        )
        assert (once.json()["created"], again.json()["created"]) == (True, False)
        assert rows(pg_url, "SELECT digest, n FROM artifact_chunks") == [(wrong, 0)]
        store = a.app.state.artifacts
        assert isinstance(store, PgArtifactStore)
        assert await store.held(wrong) is Held.INTACT
        assert await store.held(digest) is Held.MISSING
        empty = hashlib.sha256(b"").hexdigest()
        assert (await upload(a, b"")) == empty
        assert (await a.client.get(f"/v1/artifacts/{empty}", headers=a.runner)).content == b""
        # Bytes changed in the database after they were stored are seen as changed.
        with connect(pg_url) as conn:
            conn.execute("UPDATE artifact_chunks SET data = 'tampered' WHERE digest = %s", (wrong,))
        assert await store.held(wrong) is Held.CHANGED


async def test_a_runner_that_failed_over_fetches_its_checkpoint_through_b(
    pg_url: str, tmp_path: Path, clock: FakeClock, origin: Origin
) -> None:
    async with (
        supervisor(pg_url, tmp_path / "a", clock) as a,
        supervisor(pg_url, tmp_path / "b", clock) as b,
    ):
        await add_app(pg_url, origin)
        await queued(a, origin, "k1")
        [first] = await a.claim()
        transcript = await upload(a, b'[{"role": "user", "content": "fix it"}]')
        data, sha = candidate(origin, "wip")
        wip = await upload(a, data)
        body = {"fence": first["fence"], "turn": 1, "transcript": transcript, "bundle": wip}
        put = await a.client.put(
            f"/v1/steps/{first['step_id']}/checkpoint", headers=a.runner, json=body | {"sha": sha}
        )
        assert put.status_code == 200, put.text

        clock.advance(120)  # A is gone; its runner's lease lapses and the step is granted again
        assert await b.app.state.ledger.expire() == 1
        [replayed] = await b.claim(runner_id="r2")
        resume = replayed["resume"]
        assert (resume["bundle"], resume["sha"]) == (wip, sha)
        got = await b.client.get(f"/v1/artifacts/{wip}", headers=b.runner)
        assert got.content == data
        said = await b.client.get(f"/v1/artifacts/{transcript}", headers=b.runner)
        assert said.content == b'[{"role": "user", "content": "fix it"}]'


async def test_a_push_taken_by_b_imports_the_candidate_a_verified(
    pg_url: str, tmp_path: Path, clock: FakeClock, origin: Origin
) -> None:
    """A verifies the candidate of the task's first step and stops; its second step (no
    candidate) is reported through B, so the push falls due to B's dispatcher, whose mirror
    never imported the candidate."""
    steps = [
        {"name": "s0", "kind": "chat", "payload": chat_payload("work")},
        {"name": "s1", "kind": "chat", "payload": chat_payload("describe it")},
        {"name": "push", "kind": "git.push", "payload": {"branch": "main"}},
    ]
    async with supervisor(pg_url, tmp_path / "a", clock) as a:
        await add_app(pg_url, origin)
        task_id = await queued(a, origin, "k1", *steps)
        [lease] = await a.claim()
        data, sha = candidate(origin, "a")
        fields = {
            "candidate_sha": sha,
            "bundle": await upload(a, data),
            "checks": {"tests": {"log": await upload(a, PASSED), "exit_code": 0, "duration_s": 1}},
        }
        assert (await a.report(lease, **fields)).json() == {"outcome": "applied"}
        verified = a.app.state.mirrors.path(origin.url)
        assert rev(verified, candidate_ref(task_id, lease["step_id"], lease["fence"])) == sha
    async with supervisor(pg_url, tmp_path / "b", clock) as b:
        mirror = b.app.state.mirrors.path(origin.url)
        [second] = await b.claim()
        assert (await b.report(second, output="a fix")).json() == {"outcome": "applied"}
        ended = ("SUCCEEDED", "FAILED")
        with anyio.fail_after(20):
            while (shown := await view(b, task_id))["state"] not in ended:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert (shown["state"], shown["reason"]) == ("SUCCEEDED", None), shown["steps"][2]
        assert rev(Path(origin.url), "refs/heads/main") == sha
        assert rev(mirror, candidate_ref(task_id, lease["step_id"], lease["fence"])) == sha


async def test_migrate_copies_the_artifact_files_into_the_database(
    tmp_path: Path, clock: FakeClock
) -> None:
    ledger = tmp_path / "ledger.db"
    async with open_api(ledger, clock) as lite:
        small, big = b"a check's log\n", b"z" * (CHUNK_BYTES + 10)
        digests = [await upload(lite, small), await upload(lite, big), await upload(lite, b"")]
    with pgdb.fresh_database() as url:
        report = copy_ledger(ledger, url)
        assert (report.artifacts, report.artifact_bytes) == (3, len(small) + len(big))
        assert report.summary().endswith(f"; 3 artifacts ({len(small) + len(big)} bytes)")
        async with supervisor(url, tmp_path / "pg", clock) as pg:
            for digest, data in zip(digests, (small, big, b""), strict=True):
                got = await pg.client.get(f"/v1/artifacts/{digest}", headers=pg.runner)
                assert (got.status_code, got.content) == (200, data)
    db = sqlite3.connect(ledger)
    assert db.execute("SELECT count(*) FROM artifact_chunks").fetchone() == (0,)
    db.close()


async def test_download_streams_through_a_slow_reader_without_holding_a_connection(
    pg_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    """More downloads in flight than the store has connections: each chunk takes one and gives
    it back, so none waits on another's reader."""
    data = b"q" * (CHUNK_BYTES * 2 + 1)
    async with supervisor(pg_url, tmp_path / "a", clock) as a:
        digest = await upload(a, data)
        store = a.app.state.artifacts
        assert isinstance(store, PgArtifactStore)
        readers = [store.chunks(digest) for _ in range(8)]
        firsts = [await anext(r) for r in readers]  # eight readers paused after one chunk
        assert all(len(f) == CHUNK_BYTES for f in firsts)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=a.app), base_url="http://supervisor.test"
        ) as client:
            got = await client.get(f"/v1/artifacts/{digest}", headers=a.runner)
        assert got.content == data
        for reader in readers:
            assert b"".join([firsts[0], *[c async for c in reader]]) == data


async def test_stalled_uploads_hold_no_connection_and_no_transaction(
    pg_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    """Uploads whose clients sent part of the body and stopped (more of them than the store
    has connections) leave every connection free: another artifact is read at once, and no
    session of the database sits idle in a transaction. Once the clients go on, each upload
    is stored."""
    stalled = 2 * CONNECTIONS
    part, rest = b"p" * (CHUNK_BYTES + 7), b"r" * 100
    digest = hashlib.sha256(part + rest).hexdigest()
    go_on = anyio.Event()
    received = 0
    answers: list[httpx.Response] = []

    async def slow_body() -> AsyncIterator[bytes]:
        nonlocal received
        yield part
        received += 1  # asked for more: the supervisor took the part
        await go_on.wait()
        yield rest

    async with supervisor(pg_url, tmp_path / "a", clock) as a:
        other = await upload(a, b"another artifact")

        async def put() -> None:
            answers.append(
                await a.client.put(f"/v1/artifacts/{digest}", headers=a.runner, content=slow_body())
            )

        async with anyio.create_task_group() as group:
            for _ in range(stalled):
                group.start_soon(put)
            with anyio.fail_after(10):
                while received < stalled:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            assert rows(
                pg_url,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND state LIKE 'idle in transaction%'",
            ) == [(0,)]
            with anyio.fail_after(WAIT_S / 2):
                got = await a.client.get(f"/v1/artifacts/{other}", headers=a.runner)
            assert (got.status_code, got.content) == (200, b"another artifact")
            go_on.set()
        assert sorted(r.json()["created"] for r in answers) == [False] * (stalled - 1) + [True]
        assert rows(pg_url, f"SELECT n FROM artifact_chunks WHERE digest = '{digest}'") == [
            (0,),
            (1,),
        ]


async def test_tenants_quota_and_collector_hold_on_the_shared_database(
    pg_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    """Issue 23 on PostgreSQL: what a runner uploads to A for acme's lease is read by acme
    through B and by no other tenant; the pool's quota counts the database's rows; the
    collector run by B removes the chunks no step names."""
    quota = CHUNK_BYTES + 1000
    async with (
        supervisor(pg_url, tmp_path / "a", clock, artifact_quota_bytes=quota) as a,
        supervisor(pg_url, tmp_path / "b", clock, artifact_quota_bytes=quota) as b,
    ):
        lease = await leased(a)
        renewed = await a.client.post(
            f"/v1/leases/{lease['step_id']}/renew", headers=a.runner, json={"fence": lease["fence"]}
        )
        assert renewed.status_code == 200, renewed.text
        big = b"z" * CHUNK_BYTES
        assert (await put(a, "runner", big, lease=lease)).status_code == 200
        digest = hashlib.sha256(big).hexdigest()
        assert (await b.client.get(f"/v1/artifacts/{digest}", headers=b.operator)).content == big
        rival = await b.client.get(f"/v1/artifacts/{digest}", headers=b.auth("rival"))
        assert_error(rival, 404, "not_found")

        more = b"w" * 2000
        through_b = await b.client.put(  # the same runner token, the other supervisor
            f"/v1/artifacts/{hashlib.sha256(more).hexdigest()}",
            headers=a.runner,
            content=more,
            params={"step_id": lease["step_id"], "fence": lease["fence"]},
        )
        assert_error(through_b, 413, "quota_exceeded")
        more_digest = hashlib.sha256(more).hexdigest()
        assert rows(pg_url, f"SELECT count(*) FROM artifact_chunks WHERE digest = '{more_digest}'")[
            0
        ] == (0,)

        assert (await a.report(lease)).status_code == 200
        clock.advance(11)
        state = b.app.state
        gone = await collector.collect(
            state.ledger, state.artifacts, state.artifact_locks, keep_s=10, now=clock.now
        )
        assert (gone.rows, gone.digests, gone.bytes) == (1, 1, len(big))
        assert rows(pg_url, "SELECT count(*) FROM artifact_chunks") == [(0,)]
        assert_error(
            await a.client.get(f"/v1/artifacts/{digest}", headers=a.operator), 404, "not_found"
        )
