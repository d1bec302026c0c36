"""Issue 26, finding 2: a candidate is easy to see and take. The API and `task candidate`
(through `--url` and from the ledger with `--db`) give its diff against the approved base,
and `--bundle FILE` writes a bundle that plain git takes with `git fetch FILE tether/<task>`;
the task page shows the diff, escaped. Real git repositories, a real artifact store."""

from __future__ import annotations

import contextlib
import io
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tests.agent_repos import sh
from tests.conftest import ApiHarness, FakeClock, open_api
from tests.supervisor.api.test_api_repository_tasks import add_app, make_remote, queued, view, work
from tests.supervisor.repos.test_repos_mirror import Origin, rev
from tests.supervisor.test_cli_serve import serving
from tests.ui_pages import sign_in, strict
from tether.supervisor import cli

HOSTILE_LINE = "    return 42  # <script>alert(1)</script>\u202e"


@pytest.fixture
def origin(tmp_path: Path) -> Origin:
    return make_remote(tmp_path / "remote")


@pytest.fixture
async def api(tmp_path: Path, clock: FakeClock, origin: Origin) -> AsyncIterator[ApiHarness]:
    async with open_api(tmp_path / "api.db", clock, synchronous="OFF") as harness:
        await add_app(harness, origin)
        yield harness


async def succeeded(api: ApiHarness, origin: Origin) -> tuple[str, str]:
    """A task whose one step's verified candidate changes src/app.py; its id and candidate."""
    task_id = await queued(api, origin)
    [lease] = await api.claim()
    fields = await work(api, origin, lease)
    answer = await api.report(lease, **fields)
    assert answer.json() == {"outcome": "applied"}, answer.text
    assert (await view(api, task_id))["state"] == "SUCCEEDED"
    return task_id, str(fields["candidate_sha"])


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def fetched(clone: Path, bundle: Path, task_id: str) -> str:
    """What plain git takes from `bundle`: `git fetch FILE tether/<task>`, as the README says."""
    sh("git", "fetch", "--quiet", str(bundle), f"tether/{task_id}", cwd=clone)
    return rev(clone, "FETCH_HEAD")


async def test_the_api_shows_the_diff_and_its_bundle_is_fetched_by_plain_git(
    api: ApiHarness, origin: Origin, tmp_path: Path
) -> None:
    task_id, sha = await succeeded(api, origin)
    answer = await api.client.get(f"/v1/tasks/{task_id[:10]}/candidate", headers=api.operator)
    assert answer.status_code == 200, answer.text
    shown = answer.json()
    assert (shown["task_id"], shown["candidate_sha"]) == (task_id, sha)
    assert shown["base_sha"] == origin.base
    assert shown["branch"] == f"tether/{task_id}"
    assert [(f["path"], f["added"], f["removed"]) for f in shown["files"]] == [("src/app.py", 1, 1)]
    assert "+    return 42" in shown["patch"]
    data = await api.client.get(f"/v1/tasks/{task_id}/candidate/bundle", headers=api.operator)
    assert data.status_code == 200, data.text
    bundle = tmp_path / "cand.bundle"
    bundle.write_bytes(data.content)
    assert fetched(origin.work, bundle, task_id) == sha
    none = await api.client.get(f"/v1/tasks/{task_id}/candidate?step=nope", headers=api.operator)
    assert none.status_code == 404


async def test_task_candidate_with_db_and_with_url(
    api: ApiHarness, origin: Origin, tmp_path: Path
) -> None:
    task_id, sha = await succeeded(api, origin)
    db = str(api.path)
    code, out, err = await anyio.to_thread.run_sync(
        run_cli, ["task", "candidate", task_id[:10], "--db", db]
    )
    assert code == 0, err
    assert out.splitlines()[0] == f"candidate {sha} of step 's0' against base {origin.base}"
    assert "+1 -1  src/app.py" in out
    code, out, err = await anyio.to_thread.run_sync(
        run_cli, ["task", "candidate", task_id, "--db", db, "--patch"]
    )
    assert code == 0, err
    assert "+    return 42" in out

    by_db = tmp_path / "by-db.bundle"
    code, out, err = await anyio.to_thread.run_sync(
        run_cli, ["task", "candidate", task_id, "s0", "--db", db, "--bundle", str(by_db)]
    )
    assert (code, out) == (0, ""), err
    assert f"git fetch {by_db} tether/{task_id}:tether/{task_id}" in err
    clone = tmp_path / "clone"
    sh("git", "clone", "--quiet", origin.url, str(clone), cwd=tmp_path)
    assert fetched(clone, by_db, task_id) == sha
    sh("git", "fetch", "--quiet", str(by_db), f"tether/{task_id}:tether/{task_id}", cwd=clone)
    assert rev(clone, f"tether/{task_id}") == sha

    token = tmp_path / "operator-token"
    token.write_text(api.secrets["operator"] + "\n")
    by_url = tmp_path / "by-url.bundle"
    with serving(api.path, tmp_path / "serve.log") as (_proc, url):
        flags = ["--url", url, "--token-file", str(token)]
        code, out, err = await anyio.to_thread.run_sync(
            run_cli, ["task", "candidate", task_id[:12], *flags]
        )
        assert code == 0, err
        assert "+1 -1  src/app.py" in out
        code, out, err = await anyio.to_thread.run_sync(
            run_cli, ["task", "candidate", task_id, "--bundle", str(by_url), *flags]
        )
        assert code == 0, err
    assert fetched(origin.work, by_url, task_id) == sha


async def test_the_task_page_shows_the_diff_escaped(
    api: ApiHarness, origin: Origin, tmp_path: Path
) -> None:
    task_id = await queued(api, origin)
    [lease] = await api.claim()
    hostile = {"src/app.py": f"def answer():\n{HOSTILE_LINE}\n"}
    data, sha = _candidate(origin, hostile)
    fields = await work(api, origin, lease)
    fields |= {"candidate_sha": sha, "bundle": await _upload(api, data)}
    assert (await api.report(lease, **fields)).json() == {"outcome": "applied"}
    answer = await sign_in(api.client, api.secrets["operator"])
    assert answer.status_code == 303
    page = await api.client.get(f"/ui/tasks/{task_id}")
    assert page.status_code == 200
    strict(page.text)
    assert 'aria-label="Candidate diff"' in page.text
    assert "src/app.py" in page.text
    assert '<span class="added">+1</span> <span class="removed">-1</span>' in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\u202e" in page.text
    assert "<script>alert(1)" not in page.text


def _candidate(origin: Origin, changes: dict[str, str]) -> tuple[bytes, str]:
    from tests.supervisor.api.test_api_repository_tasks import candidate

    return candidate(origin, "hostile", changes)


async def _upload(api: ApiHarness, data: bytes) -> str:
    from tests.supervisor.api.test_api_repository_tasks import upload

    return await upload(api, data)
