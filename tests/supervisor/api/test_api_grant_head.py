"""The head check at grant (docs/design.md, Verification), over HTTP with real git
repositories: a claim reads the head of each repository it granted a step of, and a step whose
approved base is no longer the head is not handed out, its task failed `stale_base`; an
unmoved head, or a remote that cannot be read now, hands the lease out; a chat claim reads
nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
import structlog

from tests.conftest import ApiHarness, FakeClock, open_api
from tests.supervisor.api.test_api_repository_tasks import add_app, make_remote, queued, view, work
from tests.supervisor.repos.test_repos_mirror import Origin
from tether.supervisor.repos import Mirrors


@pytest.fixture
def origin(tmp_path: Path) -> Origin:
    return make_remote(tmp_path)


@pytest.fixture
async def api(tmp_path: Path, clock: FakeClock, origin: Origin) -> AsyncIterator[ApiHarness]:
    """The API harness with tenant acme's repository `app` added."""
    async with open_api(tmp_path / "api.db", clock, synchronous="OFF") as harness:
        await add_app(harness, origin)
        yield harness


@pytest.fixture
def head_reads(api: ApiHarness, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URLs whose head the supervisor read (`git ls-remote`, still run), in order."""
    mirrors: Mirrors = api.app.state.mirrors
    reads: list[str] = []
    real = mirrors.head

    async def head(url: str, branch: str | None = None) -> str:
        reads.append(url)
        return await real(url, branch)

    monkeypatch.setattr(mirrors, "head", head)
    return reads


async def first_step_done(api: ApiHarness, origin: Origin, key: str = "k") -> str:
    """A two-step repository task whose first step committed a verified candidate."""
    task_id = await queued(api, origin, key, steps=2)
    [lease] = await api.claim()
    result = await api.report(lease, **await work(api, origin, lease, label=key))
    assert result.json() == {"outcome": "applied"}, result.text
    assert (await view(api, task_id))["state"] == "RUNNING"
    return task_id


async def test_a_head_moved_after_a_result_fails_the_task_at_the_next_grant(
    api: ApiHarness, origin: Origin
) -> None:
    task_id = await first_step_done(api, origin)
    moved = origin.push("README.md", "# moved after step 1\n")

    assert await api.claim() == []  # step 2 was granted, then held back: its base moved
    shown = await view(api, task_id)
    assert shown["state"] == "FAILED"
    assert shown["reason"].startswith("stale_base: "), shown["reason"]
    assert moved in shown["reason"]
    assert [(f["code"], moved in f["detail"]) for f in shown["findings"]] == [("stale_base", True)]
    assert [s["state"] for s in shown["steps"]] == ["committed", "failed"]
    [attempt] = shown["steps"][1]["attempts"]
    assert attempt["state"] == "failed"
    review = (await api.client.get(f"/v1/tasks/{task_id}/review", headers=api.operator)).json()
    assert review["repository_head"] == {"value": moved, "kind": "observation"}
    assert review["verdict"]["acceptable"] is False
    assert await api.claim() == []  # nothing is left to grant


async def test_an_unmoved_head_hands_the_lease_out(
    api: ApiHarness, origin: Origin, head_reads: list[str]
) -> None:
    task_id = await first_step_done(api, origin)
    head_reads.clear()

    [lease] = await api.claim()
    assert lease["task_id"] == task_id
    assert lease["repository"]["base_sha"] == origin.base
    assert head_reads == [origin.url]
    assert (await view(api, task_id))["state"] == "RUNNING"


async def test_an_unreadable_remote_still_hands_the_lease_out(
    api: ApiHarness, origin: Origin
) -> None:
    task_id = await first_step_done(api, origin)
    remote = anyio.Path(origin.url)
    await remote.rename(remote.with_name("hidden.git"))

    with structlog.testing.capture_logs() as logs:
        [lease] = await api.claim()
    assert lease["task_id"] == task_id
    [line] = [entry for entry in logs if entry["event"] == "head not read at grant"]
    assert (line["log_level"], line["repository"], line["url"]) == ("warning", "app", origin.url)
    assert (await view(api, task_id))["state"] == "RUNNING"


async def test_one_read_per_repository_and_none_for_a_chat_claim(
    api: ApiHarness, origin: Origin, head_reads: list[str]
) -> None:
    chat = await api.queued("chat")
    [lease] = await api.claim()
    assert lease["task_id"] == chat["id"]
    assert lease["repository"] is None
    assert head_reads == []

    first = await queued(api, origin, "one")
    second = await queued(api, origin, "two")
    head_reads.clear()
    leases = await api.claim(capacity=2)
    assert sorted(lease["task_id"] for lease in leases) == sorted([first, second])
    assert head_reads == [origin.url]


async def test_a_moved_head_fails_every_approved_task_on_the_old_base_but_keeps_the_rest(
    api: ApiHarness, origin: Origin
) -> None:
    """A task granted now and one still queued, both on the old base: both fail at once, and
    a chat step granted in the same claim is handed out."""
    granted = await queued(api, origin, "granted")
    chat = await api.queued("chat")
    waiting = await queued(api, origin, "waiting")
    origin.push("README.md", "# moved before the grant\n")

    leases = await api.claim(capacity=2)
    assert [lease["task_id"] for lease in leases] == [chat["id"]]
    for task_id in (granted, waiting):
        shown = await view(api, task_id)
        assert (shown["state"], shown["reason"][:11]) == ("FAILED", "stale_base:")
    assert await api.claim() == []
