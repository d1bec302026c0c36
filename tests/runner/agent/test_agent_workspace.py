"""The attempt's repository workspace, on real git repositories: a fresh worktree at the base
for every attempt, a deterministic candidate commit, a bundle another repository can import,
and a cleanup record that proves the worktree is gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent_repos import add_commit, make_origin, sh, status
from tether.runner.agent import BaseNotFound, CleanupRecord, FetchFailed, RepoCache, commit_date


@pytest.fixture
def origin(tmp_path: Path) -> tuple[Path, str]:
    return make_origin(tmp_path / "origin")


@pytest.fixture
def cache(tmp_path: Path) -> RepoCache:
    return RepoCache(tmp_path / "cache")


async def test_a_fresh_worktree_is_at_the_base_and_clean(
    cache: RepoCache, origin: tuple[Path, str]
) -> None:
    url, base = origin
    async with cache.attempt(url=str(url), base_sha=base, label="s1-1") as ws:
        assert sh("git", "rev-parse", "HEAD", cwd=ws.tree).strip() == base
        assert (ws.tree / "src" / "app.py").read_text() == "def answer():\n    return 41\n"
        assert status(ws.tree) == ""
        assert ws.tree.is_relative_to(cache.cache_dir)
        assert cache.mirror_path(str(url)).is_relative_to(cache.cache_dir)


async def test_a_second_attempt_never_sees_the_first_attempts_files(
    cache: RepoCache, origin: tuple[Path, str]
) -> None:
    url, base = origin
    # The first attempt is "killed": its workspace is never removed.
    first = await cache.open(url=str(url), base_sha=base, label="s1-1")
    (first.tree / "src" / "app.py").write_text("def answer():\n    return 42\n")
    (first.tree / "src" / "leftover.py").write_text("x = 1\n")
    await first.commit(step_id="s1")
    async with cache.attempt(url=str(url), base_sha=base, label="s1-2") as second:
        assert second.tree != first.tree
        assert not (second.tree / "src" / "leftover.py").exists()
        assert (second.tree / "src" / "app.py").read_text().endswith("return 41\n")
        assert sh("git", "rev-parse", "HEAD", cwd=second.tree).strip() == base
        assert status(second.tree) == ""


async def test_the_candidate_sha_depends_only_on_the_step_and_the_changes(
    cache: RepoCache, origin: tuple[Path, str]
) -> None:
    url, base = origin
    shas = []
    for step_id, label in (("step-a", "a1"), ("step-a", "a2"), ("step-b", "b1")):
        async with cache.attempt(url=str(url), base_sha=base, label=label) as ws:
            (ws.tree / "src" / "app.py").write_text("def answer():\n    return 42\n")
            shas.append(await ws.commit(step_id=step_id, paths=["src/"]))
            sha = shas[-1]
            assert sha is not None
            who = sh(
                "git",
                "log",
                "-1",
                "--format=%an <%ae>|%cn <%ce>|%ad",
                "--date=raw",
                sha,
                cwd=ws.tree,
            ).strip()
            date = commit_date(step_id).lstrip("@")
            assert who == f"tether <tether@localhost>|tether <tether@localhost>|{date}"
            assert sh("git", "rev-parse", f"{sha}^", cwd=ws.tree).strip() == base
            # The commit is made beside the worktree: HEAD and the index the tools see stay.
            assert sh("git", "rev-parse", "HEAD", cwd=ws.tree).strip() == base
            assert status(ws.tree) == " M src/app.py\n"
    assert shas[0] is not None
    assert shas[0] == shas[1]  # a replayed attempt with the same changes
    assert shas[2] != shas[0]  # another step


async def test_no_change_means_no_candidate_and_changes_outside_paths_are_left_out(
    cache: RepoCache, origin: tuple[Path, str]
) -> None:
    url, base = origin
    async with cache.attempt(url=str(url), base_sha=base, label="n1") as ws:
        assert await ws.commit(step_id="n") is None
        (ws.tree / "README.md").write_text("changed outside src/\n")
        assert await ws.commit(step_id="n", paths=["src/", "docs/"]) is None
        (ws.tree / "src" / "new.py").write_text("y = 2\n")
        candidate = await ws.commit(step_id="n", paths=["src/", "docs/"])
        assert candidate is not None
        changed = sh("git", "diff", "--name-only", base, candidate, cwd=ws.tree).split()
        assert changed == ["src/new.py"]


async def test_the_bundle_gives_another_repository_the_candidate(
    cache: RepoCache, origin: tuple[Path, str], tmp_path: Path
) -> None:
    url, base = origin
    async with cache.attempt(url=f"file://{url}", base_sha=base, label="b1") as ws:
        (ws.tree / "src" / "app.py").write_text("def answer():\n    return 42\n")
        candidate = await ws.commit(step_id="b")
        assert candidate is not None
        bundle = await ws.write_bundle(tmp_path / "candidate.bundle", candidate)
    # The supervisor's side: a mirror of its own that has the base, and the bundle.
    other = tmp_path / "supervisor-mirror.git"
    sh("git", "clone", "--quiet", "--bare", str(url), str(other), cwd=tmp_path)
    sh("git", "bundle", "verify", "--quiet", str(bundle), cwd=other)
    (head,) = sh("git", "bundle", "list-heads", str(bundle), cwd=other).splitlines()
    assert head.split()[0] == candidate
    sh("git", "fetch", "--quiet", str(bundle), f"{head.split()[1]}:refs/tether/t/b/1", cwd=other)
    assert sh("git", "rev-parse", "refs/tether/t/b/1", cwd=other).strip() == candidate
    assert sh("git", "show", f"{candidate}:src/app.py", cwd=other).endswith("return 42\n")


async def test_removal_reports_what_it_removed_and_that_it_is_gone(
    cache: RepoCache, origin: tuple[Path, str]
) -> None:
    url, base = origin
    ws = await cache.open(url=str(url), base_sha=base, label="c1")
    (ws.tree / "src" / "big.bin").write_bytes(b"x" * 10_000)
    record = await ws.remove()
    assert isinstance(record, CleanupRecord)
    assert record.gone
    assert record.path == str(ws.folder)
    assert record.bytes_removed >= 10_000
    assert record.files_removed >= 4
    assert not ws.folder.exists()
    listed = sh("git", "worktree", "list", "--porcelain", cwd=ws.mirror)
    assert str(ws.tree) not in listed
    assert await ws.remove() is record  # asking again changes nothing


async def test_the_mirror_fetches_a_base_it_lacks_and_refuses_an_unknown_one(
    cache: RepoCache, origin: tuple[Path, str]
) -> None:
    url, base = origin
    async with cache.attempt(url=str(url), base_sha=base, label="m1"):
        pass
    moved = add_commit(url, "src/more.py", "z = 3\n")
    async with cache.attempt(url=str(url), base_sha=moved, label="m2") as ws:
        assert (ws.tree / "src" / "more.py").exists()
    with pytest.raises(BaseNotFound):
        await cache.open(url=str(url), base_sha="0" * 40, label="m3")
    with pytest.raises(BaseNotFound, match="full lowercase commit SHA"):
        await cache.open(url=str(url), base_sha="HEAD", label="m4")
    assert not list((cache.cache_dir / "attempts").glob("m3-*"))


async def test_a_repository_that_cannot_be_fetched_fails_without_naming_its_credentials(
    cache: RepoCache,
) -> None:
    url = "https://reader:hunter2@127.0.0.1:9/missing.git"
    with pytest.raises(FetchFailed) as caught:
        await cache.open(url=url, base_sha="1" * 40, label="f1")
    assert "hunter2" not in str(caught.value)
    assert "127.0.0.1" in str(caught.value)
