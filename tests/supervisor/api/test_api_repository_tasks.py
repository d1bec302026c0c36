"""A repository-bound task over HTTP, with real git repositories and a real artifact store
(docs/design.md, Repositories and candidates): the approval reads the head, a runner's bundle
and check logs are verified instead of believed, each forged candidate fails with its named
reason, a moved head fails the task before its next step, a fenced-out attempt's late bundle
moves nothing, and checkpoints are the pool's own."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.agent_repos import add_commit, make_origin, sh
from tests.conftest import (
    ApiHarness,
    FakeClock,
    assert_error,
    chat_payload,
    ledger_snapshot,
    open_api,
)
from tests.supervisor.repos.test_repos_mirror import Origin, rev
from tether.supervisor import admin
from tether.supervisor.repos import candidate_ref

CHECKS = {"tests": "python -m pytest -q"}
FIXED = {"src/app.py": "def answer():\n    return 42\n"}
PASSED = b"1 passed in 0.01s\n"


def make_remote(root: Path) -> Origin:
    """A bare remote under `root` whose main has two commits (a parent, then the base)."""
    seed, _ = make_origin(root / "seed")
    base = add_commit(seed, "docs/notes.md", "notes\n")
    bare = root / "origin.git"
    sh("git", "clone", "--quiet", "--bare", str(seed), str(bare), cwd=root)
    work = root / "work"
    sh("git", "clone", "--quiet", str(bare), str(work), cwd=root)
    return Origin(url=str(bare), work=work, base=base, root=root)


async def add_app(api: ApiHarness, origin: Origin, tenant: str = "acme") -> None:
    """Tenant `tenant`'s repository `app`, added as `repo add` adds it."""
    await anyio.to_thread.run_sync(admin.add_repository, api.path, tenant, "app", origin.url)


@pytest.fixture
def origin(tmp_path: Path) -> Origin:
    return make_remote(tmp_path)


@pytest.fixture
async def api(tmp_path: Path, clock: FakeClock, origin: Origin) -> AsyncIterator[ApiHarness]:
    """The API harness with tenant acme's repository `app` added."""
    async with open_api(tmp_path / "api.db", clock, synchronous="OFF") as harness:
        await add_app(harness, origin)
        yield harness


def task_body(key: str, steps: int = 1, **extra: Any) -> dict[str, Any]:
    plan = [
        {"name": f"s{i}", "kind": "chat", "payload": chat_payload(f"work {i}")}
        for i in range(steps)
    ]
    fields = {"repository": "app", "allowed_paths": ["src/"], "checks": CHECKS} | extra
    return {"idempotency_key": key, "plan": {"steps": plan}, **fields}


async def create(api: ApiHarness, key: str = "k", steps: int = 1, **extra: Any) -> dict[str, Any]:
    response = await api.client.post(
        "/v1/tasks", headers=api.operator, json=task_body(key, steps, **extra)
    )
    assert response.status_code == 201, response.text
    task: dict[str, Any] = response.json()
    return task


async def approve(api: ApiHarness, task: dict[str, Any], base: str) -> httpx.Response:
    response: httpx.Response = await api.client.post(
        f"/v1/tasks/{task['id']}/approve",
        headers=api.operator,
        json={"plan_hash": task["plan_hash"], "base_sha": base},
    )
    return response


async def queued(api: ApiHarness, origin: Origin, key: str = "k", steps: int = 1) -> str:
    task = await create(api, key, steps)
    response = await approve(api, task, origin.base)
    assert response.status_code == 200, response.text
    return str(task["id"])


async def view(api: ApiHarness, task_id: str) -> dict[str, Any]:
    response = await api.client.get(f"/v1/tasks/{task_id}", headers=api.operator)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def upload(api: ApiHarness, data: bytes, who: str = "runner") -> str:
    digest = hashlib.sha256(data).hexdigest()
    response = await api.client.put(f"/v1/artifacts/{digest}", headers=api.auth(who), content=data)
    assert response.status_code == 200, response.text
    return digest


def candidate(
    origin: Origin, label: str, changes: dict[str, str] = FIXED, on: str | None = None
) -> tuple[bytes, str]:
    """What a runner sends: the bundle of `changes` on `on` (the base), and its head."""
    path = origin.candidate(label, changes, on=on)
    return path.read_bytes(), rev(origin.root / f"runner-{label}", "HEAD")


async def work(
    api: ApiHarness, origin: Origin, lease: dict[str, Any], label: str = "a", **changes: Any
) -> dict[str, Any]:
    """A well-behaved runner's result fields: bundle and log uploaded, the check passed."""
    data, sha = candidate(origin, label)
    run = {"log": await upload(api, PASSED), "exit_code": 0, "duration_s": 0.4}
    fields = {"candidate_sha": sha, "bundle": await upload(api, data), "checks": {"tests": run}}
    return fields | changes


async def test_a_verified_candidate_succeeds_after_a_stale_approval_is_refused(
    api: ApiHarness, origin: Origin
) -> None:
    parent = rev(origin.work, "HEAD~1")
    task = await create(api, base_sha=parent)
    before = ledger_snapshot(api.path)
    body = assert_error(await approve(api, task, parent), 409, "stale_base")
    assert origin.base in body["detail"]
    assert ledger_snapshot(api.path) == before
    assert (await view(api, task["id"]))["state"] == "PLANNED"

    response = await approve(api, task, origin.base)
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "QUEUED"
    [lease] = await api.claim()
    bound = lease["repository"]
    assert (bound["name"], bound["url"]) == ("app", origin.url)
    assert bound["base_sha"] == bound["start_sha"] == origin.base
    assert bound["allowed_paths"] == ["src/"]
    assert bound["checks"] == [{"name": "tests", "command": CHECKS["tests"]}]

    fields = await work(api, origin, lease)
    result = await api.report(lease, **fields)
    assert result.json() == {"outcome": "applied"}, result.text
    shown = await view(api, task["id"])
    assert (shown["state"], shown["reason"]) == ("SUCCEEDED", None)
    [step] = shown["steps"]
    assert step["candidate_sha"] == fields["candidate_sha"]
    assert step["bundle"] == fields["bundle"]
    assert step["problems"] == []
    assert [(c["name"], c["exit_code"]) for c in step["checks"]] == [("tests", 0)]
    mirror = api.app.state.mirrors.path(origin.url)
    ref = candidate_ref(task["id"], lease["step_id"], lease["fence"])
    assert rev(mirror, ref) == fields["candidate_sha"]
    review = (await api.client.get(f"/v1/tasks/{task['id']}/review", headers=api.operator)).json()
    assert review["observed_checks"]["value"] == {
        "tests": {"log": fields["checks"]["tests"]["log"], "exit_code": 0}
    }
    assert review["verdict"] == {"acceptable": True, "reasons": []}


# Each forgery takes the runner's honest fields and returns what it sends instead.
Forge = Callable[[ApiHarness, Origin, dict[str, Any]], Any]


async def _unknown_sha(api: ApiHarness, origin: Origin, fields: dict[str, Any]) -> Any:
    return fields | {"candidate_sha": "0123456789abcdef" * 2 + "01234567"}


async def _not_descendant(api: ApiHarness, origin: Origin, fields: dict[str, Any]) -> Any:
    data, sha = candidate(origin, "old", on=rev(origin.work, "HEAD~1"))
    return fields | {"candidate_sha": sha, "bundle": await upload(api, data)}


async def _outside_paths(api: ApiHarness, origin: Origin, fields: dict[str, Any]) -> Any:
    data, sha = candidate(origin, "tests", {"tests/test_app.py": "def test_answer():\n    pass\n"})
    return fields | {"candidate_sha": sha, "bundle": await upload(api, data)}


async def _missing_artifact(api: ApiHarness, origin: Origin, fields: dict[str, Any]) -> Any:
    never_sent = hashlib.sha256(b"a log nobody uploaded\n").hexdigest()
    run = fields["checks"]["tests"] | {"log": never_sent}
    return fields | {"checks": {"tests": run}}


async def _mismatching_artifact(api: ApiHarness, origin: Origin, fields: dict[str, Any]) -> Any:
    path = api.app.state.artifacts.path_of(fields["bundle"])
    path.chmod(0o600)
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # changed on disk after the upload
    return fields


async def _failing_check(api: ApiHarness, origin: Origin, fields: dict[str, Any]) -> Any:
    failed = {"log": await upload(api, b"1 failed\n"), "exit_code": 1, "duration_s": 0.4}
    return fields | {"checks": {"tests": failed}}


async def _missing_check(api: ApiHarness, origin: Origin, fields: dict[str, Any]) -> Any:
    return fields | {"checks": {}}


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        (_unknown_sha, "unknown_candidate"),
        (_not_descendant, "not_descendant"),
        (_outside_paths, "path_not_allowed"),
        (_missing_artifact, "missing_artifact"),
        (_mismatching_artifact, "artifact_mismatch"),
        (_failing_check, "check_failed"),
        (_missing_check, "missing_check"),
    ],
)
async def test_a_forged_candidate_fails_with_its_named_reason(
    api: ApiHarness, origin: Origin, forge: Forge, reason: str
) -> None:
    task_id = await queued(api, origin)
    [lease] = await api.claim()
    sent = await forge(api, origin, await work(api, origin, lease))
    result = await api.report(lease, **sent)
    assert result.json() == {"outcome": "applied"}, result.text  # recorded, then judged
    shown = await view(api, task_id)
    assert shown["state"] == "FAILED"
    assert shown["reason"].startswith(f"{reason}: "), shown["reason"]
    assert reason in [f["code"] for f in shown["findings"]]
    review = (await api.client.get(f"/v1/tasks/{task_id}/review", headers=api.operator)).json()
    assert review["verdict"]["acceptable"] is False


async def test_a_head_moved_during_a_step_fails_the_task_before_the_next_is_granted(
    api: ApiHarness, origin: Origin
) -> None:
    task_id = await queued(api, origin, steps=2)
    [lease] = await api.claim()
    moved = origin.push("README.md", "# moved\n")
    result = await api.report(lease, **await work(api, origin, lease))
    assert result.json() == {"outcome": "applied"}
    shown = await view(api, task_id)
    assert shown["state"] == "FAILED"
    assert shown["reason"].startswith("stale_base: "), shown["reason"]
    assert moved in shown["reason"]
    assert [s["state"] for s in shown["steps"]] == ["committed", "skipped"]
    assert await api.claim() == []


async def test_a_fenced_out_attempts_late_bundle_only_makes_its_own_ref(
    api: ApiHarness, origin: Origin
) -> None:
    task_id = await queued(api, origin, steps=2)
    [first] = await api.claim(runner_id="r1")
    api.clock.advance(120)  # the first runner went quiet: its lease lapses
    assert await api.app.state.ledger.expire() == 1
    [second] = await api.claim(runner_id="r2")
    assert second["step_id"] == first["step_id"]
    assert second["fence"] > first["fence"]
    ours = await work(api, origin, second, "ours")
    assert (await api.report(second, **ours)).json() == {"outcome": "applied"}

    late = await work(api, origin, first, "late", checks={})
    late["candidate_sha"], late["bundle"] = await _late_bundle(api, origin)
    assert_error(await api.report(first, **late), 409, "stale_fence")
    mirror = api.app.state.mirrors.path(origin.url)
    step_id = first["step_id"]
    assert rev(mirror, candidate_ref(task_id, step_id, second["fence"])) == ours["candidate_sha"]
    assert rev(mirror, candidate_ref(task_id, step_id, first["fence"])) == late["candidate_sha"]
    [step, _] = (await view(api, task_id))["steps"]
    assert step["candidate_sha"] == ours["candidate_sha"]


async def test_another_tokens_bundle_makes_no_ref_and_the_holders_commits(
    api: ApiHarness, origin: Origin
) -> None:
    """A second runner token of the pool reports its own bundle on a lease it does not hold,
    before the holder: `not_found` before any git runs, so the attempt's ref is still free
    for the holder's candidate (the issue's finding 3: once it took the ref, the holder's
    own bundle could no longer be imported there)."""
    task_id = await queued(api, origin)
    [lease] = await api.claim()
    forged = await work(api, origin, lease, "forged", checks={})
    forged["candidate_sha"], forged["bundle"] = await _late_bundle(api, origin)
    body = {"fence": lease["fence"], "payload_hash": lease["payload_hash"], "output": "forged"}
    answer = await api.client.post(
        f"/v1/steps/{lease['step_id']}/result", headers=api.auth("intruder"), json=body | forged
    )
    assert_error(answer, 404, "not_found")
    mirror = api.app.state.mirrors.path(origin.url)
    ref = candidate_ref(task_id, lease["step_id"], lease["fence"])
    assert not mirror.exists() or sh("git", "for-each-ref", ref, cwd=mirror) == ""  # no ref
    ours = await work(api, origin, lease, "ours")
    assert (await api.report(lease, **ours)).json() == {"outcome": "applied"}
    assert rev(mirror, ref) == ours["candidate_sha"]
    [step] = (await view(api, task_id))["steps"]
    assert (step["candidate_sha"], step["output"]) == (ours["candidate_sha"], "done")


async def _late_bundle(api: ApiHarness, origin: Origin) -> tuple[str, str]:
    data, sha = candidate(origin, "late-bundle", {"src/app.py": "def answer():\n    return 7\n"})
    return sha, await upload(api, data)


async def test_an_unreadable_remote_is_unavailable_and_records_nothing(
    api: ApiHarness, origin: Origin
) -> None:
    task = await create(api)
    remote = anyio.Path(origin.url)
    hidden = remote.with_name("hidden.git")
    await remote.rename(hidden)
    before = ledger_snapshot(api.path)
    body = assert_error(await approve(api, task, origin.base), 503, "unavailable")
    assert "repository 'app'" in body["detail"]
    assert ledger_snapshot(api.path) == before
    await hidden.rename(remote)
    assert (await approve(api, task, origin.base)).status_code == 200

    [lease] = await api.claim()
    fields = await work(api, origin, lease)
    await remote.rename(hidden)
    before = ledger_snapshot(api.path)
    assert_error(await api.report(lease, **fields), 503, "unavailable")
    batch = await api.client.post(
        "/v1/steps/results",
        headers=api.runner,
        json={"results": [_item(lease, fields)]},
    )
    [item] = batch.json()["results"]
    assert (item["status"], item["error"]) == (503, "unavailable")
    assert ledger_snapshot(api.path) == before
    await hidden.rename(remote)  # the runner retries, and nothing was lost
    assert (await api.report(lease, **fields)).json() == {"outcome": "applied"}
    assert (await view(api, task["id"]))["state"] == "SUCCEEDED"


def _item(lease: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "step_id": lease["step_id"],
        "fence": lease["fence"],
        "payload_hash": lease["payload_hash"],
        "output": "done",
        **fields,
    }


async def test_the_batch_route_gathers_each_bound_reports_evidence(
    api: ApiHarness, origin: Origin
) -> None:
    """A chat task's result and a repository task's, in one request: each gets its own rule."""
    bound_id = await queued(api, origin)
    chat = await api.create("chat")
    approved = await api.client.post(
        f"/v1/tasks/{chat['id']}/approve",
        headers=api.operator,
        json={"plan_hash": chat["plan_hash"]},
    )
    assert approved.status_code == 200
    leases = {lease["task_id"]: lease for lease in await api.claim(capacity=2)}
    bound, plain = leases[bound_id], leases[chat["id"]]
    items = [_item(bound, await work(api, origin, bound)), _item(plain, {})]
    response = await api.client.post(
        "/v1/steps/results", headers=api.runner, json={"results": items}
    )
    assert [i.get("outcome") for i in response.json()["results"]] == ["applied", "applied"]
    assert (await view(api, bound_id))["state"] == "SUCCEEDED"
    assert (await view(api, chat["id"]))["state"] == "SUCCEEDED"


# -- PUT /v1/steps/{step_id}/checkpoint ----------------------------------------------------------


async def put_checkpoint(
    api: ApiHarness, lease: dict[str, Any], who: str = "runner", **fields: Any
) -> httpx.Response:
    body = {"fence": lease["fence"], "turn": 1, **fields}
    response: httpx.Response = await api.client.put(
        f"/v1/steps/{lease['step_id']}/checkpoint", headers=api.auth(who), json=body
    )
    return response


async def test_a_checkpoint_is_accepted_and_a_replay_resumes_from_it(
    api: ApiHarness, origin: Origin
) -> None:
    await queued(api, origin)
    [first] = await api.claim()
    transcript = await upload(api, b'[{"role": "user", "content": "fix it"}]')
    data, sha = candidate(origin, "wip")
    wip = await upload(api, data)
    response = await put_checkpoint(api, first, transcript=transcript, bundle=wip, sha=sha)
    assert response.status_code == 200, response.text
    assert response.json() == {"turn": 1}
    again = await put_checkpoint(api, first, transcript=transcript, bundle=wip, sha=sha)
    assert again.json() == {"turn": 1}

    api.clock.advance(120)
    assert await api.app.state.ledger.expire() == 1
    [replayed] = await api.claim(runner_id="r2")
    resume = replayed["resume"]
    assert (resume["turn"], resume["fence"]) == (1, first["fence"])
    assert (resume["transcript"], resume["bundle"], resume["sha"]) == (transcript, wip, sha)
    # The replaying runner (same pool) reads what it resumes from; another pool's does not.
    got = await api.client.get(f"/v1/artifacts/{transcript}", headers=api.runner)
    assert got.content == b'[{"role": "user", "content": "fix it"}]'
    assert_error(
        await api.client.get(f"/v1/artifacts/{wip}", headers=api.auth("stranger")), 404, "not_found"
    )

    stale = await put_checkpoint(api, first, transcript=transcript, turn=2)
    assert_error(stale, 409, "stale_fence")


async def test_a_checkpoint_naming_bytes_the_pool_did_not_upload_is_refused(
    api: ApiHarness, origin: Origin
) -> None:
    await queued(api, origin)
    [lease] = await api.claim()
    before = ledger_snapshot(api.path)
    unknown = hashlib.sha256(b"never uploaded").hexdigest()
    body = assert_error(await put_checkpoint(api, lease, transcript=unknown), 422, "invalid_field")
    assert body["detail"].startswith("'transcript'")
    transcript = await upload(api, b"[]")
    theirs = await upload(api, b"another pool's bundle", who="stranger")
    after_uploads = ledger_snapshot(api.path)
    assert after_uploads != before
    response = await put_checkpoint(api, lease, transcript=transcript, bundle=theirs, sha="a" * 40)
    body = assert_error(response, 422, "invalid_field")
    assert body["detail"].startswith("'bundle'")
    assert "pool 'default'" in body["detail"]
    assert ledger_snapshot(api.path) == after_uploads
    # A runner of another pool cannot checkpoint this pool's step at all.
    own = await upload(api, b"[]", who="stranger")
    assert own == transcript
    assert_error(await put_checkpoint(api, lease, "stranger", transcript=own), 404, "not_found")


async def test_a_lease_carries_the_repository_setup_commands(
    api: ApiHarness, origin: Origin
) -> None:
    setup = ("uv sync --frozen", "npm ci --offline")
    await anyio.to_thread.run_sync(admin.add_repository, api.path, "acme", "app", origin.url, setup)
    await queued(api, origin)
    [lease] = await api.claim()
    assert lease["repository"]["setup"] == list(setup)
