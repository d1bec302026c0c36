"""The artifact store (docs/design.md, Artifacts): `PUT /v1/artifacts/{sha256}` and `GET`
through a real supervisor app, the files it keeps, who may read them, and
`tether-supervisor artifact get`."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ApiHarness, FakeClock, assert_error, ledger_snapshot, open_api, raw_db
from tether.supervisor import cli
from tether.supervisor import operator_client as oc
from tether.supervisor.artifacts import ArtifactStore, Held, collector
from tether.supervisor.artifacts.collector import Collected
from tether.supervisor.ledger import schema
from tether.supervisor.ledger.schema import migrations

LOG = b"===== 3 passed in 0.01s =====\n" * 100
LOG_DIGEST = hashlib.sha256(LOG).hexdigest()


def store_of(api: ApiHarness) -> ArtifactStore:
    store: ArtifactStore = api.app.state.artifacts
    return store


def stored_files(api: ApiHarness) -> list[Path]:
    """Every file in the store's folder, temporary ones included."""
    return sorted(p for p in store_of(api).root.rglob("*") if p.is_file())


async def put(
    api: ApiHarness,
    who: str,
    data: bytes,
    digest: str | None = None,
    lease: dict[str, Any] | None = None,
) -> httpx.Response:
    """`who` uploads `data`; a runner for `lease` when given."""
    query = {} if lease is None else {"step_id": lease["step_id"], "fence": lease["fence"]}
    response: httpx.Response = await api.client.put(
        f"/v1/artifacts/{digest or hashlib.sha256(data).hexdigest()}",
        headers=api.auth(who),
        content=data,
        params=query,
    )
    return response


async def leased(api: ApiHarness, key: str = "k1") -> dict[str, Any]:
    """A lease `runner` holds on a step of a new task of tenant acme."""
    await api.queued(key)
    [lease] = await api.claim()
    return lease


async def get(api: ApiHarness, who: str, digest: str) -> httpx.Response:
    response: httpx.Response = await api.client.get(
        f"/v1/artifacts/{digest}", headers=api.auth(who)
    )
    return response


async def test_a_runners_upload_reads_back_as_the_same_bytes(api: ApiHarness) -> None:
    response = await put(api, "runner", LOG, lease=await leased(api))
    assert response.status_code == 200, response.text
    assert response.json() == {"digest": LOG_DIGEST, "size": len(LOG), "created": True}

    read = await get(api, "operator", LOG_DIGEST)
    assert read.status_code == 200
    assert read.content == LOG
    assert read.headers["content-type"] == "application/octet-stream"
    path = store_of(api).root / "sha256" / LOG_DIGEST[:2] / LOG_DIGEST
    assert stored_files(api) == [path]
    assert path.read_bytes() == LOG
    assert store_of(api).root == api.path.parent / "artifacts"
    rows = (
        raw_db(api.path).execute("SELECT digest, role, scope, size FROM artifact_owners").fetchall()
    )
    assert [tuple(r) for r in rows] == [(LOG_DIGEST, "runner", "default", len(LOG))]


async def test_bytes_that_are_not_the_digest_are_refused_and_nothing_is_stored(
    api: ApiHarness,
) -> None:
    before = ledger_snapshot(api.path)
    body = assert_error(await put(api, "runner", LOG, digest="0" * 64), 422, "digest_mismatch")
    assert LOG_DIGEST in body["detail"]
    assert stored_files(api) == []
    assert ledger_snapshot(api.path) == before
    assert_error(await get(api, "operator", "0" * 64), 404, "not_found")


@pytest.mark.parametrize("digest", ["A" * 64, "a" * 63, "g" * 64, "not-a-digest", "a" * 65])
async def test_a_name_that_is_not_a_sha256_is_refused(api: ApiHarness, digest: str) -> None:
    before = ledger_snapshot(api.path)
    assert_error(await put(api, "runner", LOG, digest=digest), 422, "invalid_field")
    assert_error(await get(api, "operator", digest), 422, "invalid_field")
    assert stored_files(api) == []
    assert ledger_snapshot(api.path) == before


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def test_an_artifact_over_the_limit_is_refused_declared_or_streamed(
    tmp_path: Path, clock: FakeClock
) -> None:
    async with open_api(
        tmp_path / "api.db", clock, synchronous="OFF", artifact_max_bytes=1000
    ) as api:
        before = ledger_snapshot(api.path)
        body = assert_error(await put(api, "runner", LOG), 413, "body_too_large")
        assert "artifact_max_bytes" in body["detail"]
        # Chunked, so no Content-Length: refused while streaming, the temporary file removed.
        streamed = await api.client.put(
            f"/v1/artifacts/{LOG_DIGEST}", headers=api.runner, content=_chunks(LOG, 300)
        )
        assert "content-length" not in streamed.request.headers
        assert_error(streamed, 413, "body_too_large")
        assert stored_files(api) == []
        assert ledger_snapshot(api.path) == before
        small = LOG[:1000]
        assert (await put(api, "runner", small)).status_code == 200


async def test_another_tenant_gets_not_found(api: ApiHarness) -> None:
    assert (await put(api, "operator", LOG)).status_code == 200
    assert (await get(api, "operator", LOG_DIGEST)).content == LOG
    body = assert_error(await get(api, "rival", LOG_DIGEST), 404, "not_found")
    assert LOG_DIGEST in body["detail"]


async def test_a_pool_the_tenant_may_not_use_does_not_share_its_uploads(api: ApiHarness) -> None:
    """`stranger` is a runner of pool `elsewhere`, which tenant acme may not use."""
    other = b"from elsewhere\n"
    assert (await put(api, "stranger", other)).status_code == 200
    assert_error(await get(api, "operator", hashlib.sha256(other).hexdigest()), 404, "not_found")


async def test_only_the_tenant_whose_lease_uploaded_reads_a_runners_upload(
    api: ApiHarness,
) -> None:
    """Pool `default` is shared by acme and rival: what a runner uploads for acme's task is
    acme's alone, digest known or not; without a lease, only the pool's runners read it."""
    lease = await leased(api)
    assert (await put(api, "runner", LOG, lease=lease)).status_code == 200
    assert (await get(api, "operator", LOG_DIGEST)).content == LOG
    assert_error(await get(api, "rival", LOG_DIGEST), 404, "not_found")
    unleased = b"named no lease\n"
    assert (await put(api, "runner", unleased)).status_code == 200
    for tenant in ("operator", "rival"):
        assert_error(await get(api, tenant, hashlib.sha256(unleased).hexdigest()), 404, "not_found")
    assert (await get(api, "runner", hashlib.sha256(unleased).hexdigest())).content == unleased


async def test_an_upload_names_a_lease_its_runner_holds(api: ApiHarness) -> None:
    lease = await leased(api)
    ended = await leased(api, "k2")
    assert (await api.report(ended)).status_code == 200
    before = ledger_snapshot(api.path)
    assert_error(await put(api, "runner", LOG, lease=ended), 409, "stale_fence")
    guessed = {**lease, "fence": lease["fence"] + 7}  # never granted: like an unknown step
    assert_error(await put(api, "runner", LOG, lease=guessed), 404, "not_found")
    assert_error(await put(api, "intruder", LOG, lease=lease), 404, "not_found")  # not its lease
    unknown = {**lease, "step_id": "no-such-step"}
    assert_error(await put(api, "runner", LOG, lease=unknown), 404, "not_found")
    assert_error(await put(api, "stranger", LOG, lease=lease), 404, "not_found")
    assert_error(await put(api, "operator", LOG, lease=lease), 422, "invalid_field")
    half = await api.client.put(
        f"/v1/artifacts/{LOG_DIGEST}", headers=api.runner, content=LOG, params={"fence": "1"}
    )
    assert_error(half, 422, "invalid_field")
    api.clock.advance(10.5)  # never acknowledged: the runner's own lease lapsed
    assert_error(await put(api, "runner", LOG, lease=lease), 409, "stale_fence")
    assert stored_files(api) == []
    assert ledger_snapshot(api.path) == before


async def test_a_pools_uploads_stop_at_its_quota_and_a_refusal_keeps_nothing(
    tmp_path: Path, clock: FakeClock
) -> None:
    async with open_api(tmp_path / "q.db", clock, artifact_quota_bytes=4000) as api:
        lease = await leased(api)
        assert (await put(api, "runner", LOG, lease=lease)).status_code == 200  # 3000 bytes
        before = ledger_snapshot(api.path)
        more = LOG[:1500] + b"!"
        body = assert_error(await put(api, "runner", more, lease=lease), 413, "quota_exceeded")
        assert "artifact_quota_bytes" in body["detail"]
        streamed = await api.client.put(  # no Content-Length: refused once received
            f"/v1/artifacts/{hashlib.sha256(more).hexdigest()}",
            headers=api.runner,
            content=chunks(more),
        )
        assert_error(streamed, 413, "quota_exceeded")
        assert stored_files(api) == [store_of(api).path_of(LOG_DIGEST)]
        assert ledger_snapshot(api.path) == before
        # The same bytes again count once; another pool and a tenant's operators have their own.
        assert (await put(api, "runner", LOG, lease=lease)).status_code == 200
        assert (await put(api, "stranger", more)).status_code == 200
        assert (await put(api, "operator", more)).status_code == 200


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), 500):
        yield data[start : start + 500]


async def test_the_collector_removes_what_no_step_names_once_its_step_ends(
    api: ApiHarness, caplog: pytest.LogCaptureFixture
) -> None:
    lease = await leased(api)
    transcript = b'[{"role": "user", "content": "go on"}]'
    for data in (transcript, LOG):
        assert (await put(api, "runner", data, lease=lease)).status_code == 200
    said = hashlib.sha256(transcript).hexdigest()
    answer = await api.client.put(
        f"/v1/steps/{lease['step_id']}/checkpoint",
        headers=api.runner,
        json={"fence": lease["fence"], "turn": 1, "transcript": said},
    )
    assert answer.status_code == 200, answer.text
    operators = b"an operator's upload nothing names\n"
    assert (await put(api, "operator", operators)).status_code == 200
    state = api.app.state

    async def collect() -> Collected:
        return await collector.collect(
            state.ledger, state.artifacts, state.artifact_locks, keep_s=10, now=api.clock.now
        )

    assert await collect() == Collected()  # nothing is ten seconds old yet
    renewed = await api.client.post(
        f"/v1/leases/{lease['step_id']}/renew", headers=api.runner, json={"fence": lease["fence"]}
    )
    assert renewed.status_code == 200, renewed.text
    api.clock.advance(11)
    gone = await collect()  # the operator's: the step is leased, so its uploads stay
    assert (gone.rows, gone.digests, gone.bytes) == (1, 1, len(operators))
    assert (await api.report(lease)).status_code == 200
    gone = await collect()
    assert (gone.rows, gone.digests, gone.bytes) == (1, 1, len(LOG))
    assert stored_files(api) == [store_of(api).path_of(said)]
    assert_error(await get(api, "operator", LOG_DIGEST), 404, "not_found")
    assert (await get(api, "operator", said)).content == transcript
    assert await collect() == Collected()


async def test_reading_needs_a_token(api: ApiHarness) -> None:
    assert (await put(api, "runner", LOG)).status_code == 200
    response = await api.client.get(f"/v1/artifacts/{LOG_DIGEST}")
    assert_error(response, 401, "unauthorized")
    unsigned = await api.client.put(f"/v1/artifacts/{LOG_DIGEST}", content=LOG)
    assert_error(unsigned, 401, "unauthorized")


async def test_a_runner_reads_only_what_its_own_pools_runners_uploaded(api: ApiHarness) -> None:
    """The bundles and checkpoints a replayed attempt resumes from: `runner` (pool default)
    reads its pool's uploads; not another pool's, nor an operator's, even of a tenant that
    may use its pool."""
    assert (await put(api, "runner", LOG)).status_code == 200
    assert (await get(api, "runner", LOG_DIGEST)).content == LOG
    assert_error(await get(api, "stranger", LOG_DIGEST), 404, "not_found")
    theirs = b"uploaded in pool elsewhere\n"
    assert (await put(api, "stranger", theirs)).status_code == 200
    theirs_digest = hashlib.sha256(theirs).hexdigest()
    assert (await get(api, "stranger", theirs_digest)).content == theirs
    assert_error(await get(api, "runner", theirs_digest), 404, "not_found")
    operators = b"an operator's upload\n"
    assert (await put(api, "operator", operators)).status_code == 200
    assert_error(await get(api, "runner", hashlib.sha256(operators).hexdigest()), 404, "not_found")


async def test_uploading_the_same_bytes_again_keeps_the_first_file(api: ApiHarness) -> None:
    assert (await put(api, "operator", LOG)).json()["created"] is True
    path = store_of(api).root / "sha256" / LOG_DIGEST[:2] / LOG_DIGEST
    first = path.stat()
    api.clock.advance(5)

    again = await put(api, "operator", LOG)
    assert again.status_code == 200
    assert again.json() == {"digest": LOG_DIGEST, "size": len(LOG), "created": False}
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    assert stored_files(api) == [path]
    # The rival proves it holds the same bytes by sending them: then it may read them too.
    assert_error(await get(api, "rival", LOG_DIGEST), 404, "not_found")
    assert (await put(api, "rival", LOG)).json()["created"] is False
    assert (await get(api, "rival", LOG_DIGEST)).content == LOG
    rows = (
        raw_db(api.path)
        .execute("SELECT scope, created_at FROM artifact_owners ORDER BY created_at")
        .fetchall()
    )
    assert [tuple(r) for r in rows] == [("acme", api.clock.now - 5), ("rival", api.clock.now)]


async def test_artifact_bytes_present_rehashes_the_file(api: ApiHarness) -> None:
    store = store_of(api)
    assert store.artifact_bytes_present(LOG_DIGEST) is False
    assert (await put(api, "runner", LOG)).status_code == 200
    assert store.artifact_bytes_present(LOG_DIGEST) is True
    assert store.artifact_bytes_present("not a digest") is False
    path = store.path_of(LOG_DIGEST)
    path.chmod(0o600)
    assert store.examine(LOG_DIGEST) is Held.INTACT
    path.write_bytes(LOG[:-1] + b"!")  # the disk, or someone, changed one byte
    assert store.artifact_bytes_present(LOG_DIGEST) is False
    assert store.examine(LOG_DIGEST) is Held.CHANGED
    path.unlink()
    assert store.artifact_bytes_present(LOG_DIGEST) is False
    assert store.examine(LOG_DIGEST) is Held.MISSING
    assert store.examine("not a digest") is Held.MISSING


def test_opening_the_store_removes_uploads_a_crash_cut_short(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts", max_bytes=10)
    store.open()
    leftover = store.root / "tmp" / "upload-x"
    leftover.write_bytes(b"half")
    store.open()
    assert not leftover.exists()
    assert (store.root / "tmp").is_dir()
    assert oct((store.root / "sha256").stat().st_mode & 0o777) == "0o700"


# -- tether-supervisor artifact get ---------------------------------------------------------


class Supervisor:
    """The supervisor's replies to the CLI: `LOG` under `LOG_DIGEST`, 404 otherwise."""

    def __init__(self, body: bytes = LOG) -> None:
        self.body = body
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == f"/v1/artifacts/{LOG_DIGEST}":
            return httpx.Response(200, content=self.body)
        detail = f"no artifact {request.url.path.rsplit('/', 1)[-1]}"
        return httpx.Response(404, json={"error": "not_found", "detail": detail})


def run_cli(monkeypatch: pytest.MonkeyPatch, supervisor: Supervisor, argv: list[str]) -> int:
    real = oc.OperatorClient

    def client(url: str, token: str) -> oc.OperatorClient:
        return real(url, token, transport=httpx.MockTransport(supervisor))

    monkeypatch.setattr(oc, "OperatorClient", client)
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "operator-token"
    path.write_text("tok\n")
    return path


def test_artifact_get_prints_the_bytes_alone(
    monkeypatch: pytest.MonkeyPatch, capfdbinary: pytest.CaptureFixture[bytes], token_file: Path
) -> None:
    supervisor = Supervisor()
    argv = ["artifact", "get", LOG_DIGEST, "--url", "http://sup", "--token-file", str(token_file)]
    assert run_cli(monkeypatch, supervisor, argv) == 0
    out, err = capfdbinary.readouterr()
    assert out == LOG
    assert err == b""
    [request] = supervisor.requests
    assert request.method == "GET"
    assert request.headers["authorization"] == "Bearer tok"


def test_artifact_get_reads_tether_url_and_token_file(
    monkeypatch: pytest.MonkeyPatch, capfdbinary: pytest.CaptureFixture[bytes], token_file: Path
) -> None:
    monkeypatch.setenv("TETHER_URL", "http://from-env:9000")
    monkeypatch.setenv("TETHER_TOKEN_FILE", str(token_file))
    supervisor = Supervisor()
    assert run_cli(monkeypatch, supervisor, ["artifact", "get", LOG_DIGEST]) == 0
    assert capfdbinary.readouterr().out == LOG
    assert supervisor.requests[0].url.host == "from-env"


@pytest.mark.parametrize(
    ("digest", "body", "words"),
    [
        ("b" * 64, LOG, "404 not_found: no artifact " + "b" * 64),
        (LOG_DIGEST, LOG + b"tampered", "sha256 is not " + LOG_DIGEST),
        ("../tasks", LOG, "is not a sha256 digest"),
    ],
)
def test_artifact_get_fails_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capfdbinary: pytest.CaptureFixture[bytes],
    token_file: Path,
    digest: str,
    body: bytes,
    words: str,
) -> None:
    supervisor = Supervisor(body)
    argv = ["artifact", "get", digest, "--url", "http://sup", "--token-file", str(token_file)]
    assert run_cli(monkeypatch, supervisor, argv) == 1
    out, err = capfdbinary.readouterr()
    assert out == b""
    assert err.decode().count("\n") == 1
    assert words in err.decode()
    assert err.startswith(b"tether-supervisor: error: ")


def test_the_store_never_leaves_its_files_readable_by_others(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "a", max_bytes=10)
    store.open()
    assert os.stat(store.root / "tmp").st_mode & 0o077 == 0


async def test_migration_0012_gives_old_rows_the_tenants_whose_steps_named_them(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Rows from before 0012: an operator's becomes its tenant's; a runner's becomes the tenant
    of each task whose step named the digest, or no tenant's when none did."""
    path = tmp_path / "old.db"
    said = b'[{"role": "user", "content": "resume"}]'
    said_digest = hashlib.sha256(said).hexdigest()
    async with open_api(path, clock) as api:
        lease = await leased(api)
        assert (await put(api, "runner", said, lease=lease)).status_code == 200
        answer = await api.client.put(
            f"/v1/steps/{lease['step_id']}/checkpoint",
            headers=api.runner,
            json={"fence": lease["fence"], "turn": 1, "transcript": said_digest},
        )
        assert answer.status_code == 200, answer.text
    before_0012 = dict(migrations())[4]  # the table as 0004 made it
    db = raw_db(path)
    for index in (
        "artifacts_by_digest",
        "steps_by_bundle",
        "check_runs_by_log",
        "checkpoints_by_transcript",
        "checkpoints_by_bundle",
    ):
        db.execute(f"DROP INDEX {index}")
    db.execute("DROP TABLE artifact_owners")
    db.executescript(before_0012)
    rows = [
        (said_digest, "runner", "default"),
        (LOG_DIGEST, "runner", "default"),
        (LOG_DIGEST, "operator", "acme"),
    ]
    for digest, role, scope in rows:
        db.execute(
            "INSERT INTO artifact_owners VALUES (?, ?, ?, 1, NULL, 0)", (digest, role, scope)
        )
    with db:  # 0012 alone, statement by statement as `migrate` runs it
        for statement in schema._statements(dict(migrations())[12]):
            db.execute(statement)
    db.close()

    found = raw_db(path).execute(
        "SELECT digest, role, scope, tenant FROM artifact_owners ORDER BY digest, role"
    )
    assert sorted(tuple(r) for r in found) == sorted(
        [
            (said_digest, "runner", "default", "acme"),
            (LOG_DIGEST, "runner", "default", ""),
            (LOG_DIGEST, "operator", "acme", "acme"),
        ]
    )
