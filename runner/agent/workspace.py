"""An attempt's repository workspace in the runner's cache directory: a bare mirror per
repository URL, a fresh worktree at the approved base for every attempt, the candidate commit
and its bundle. Deleting the cache loses nothing (docs/design.md, Borrowed servers):

    mirrors/<sha256(url)[:24]>.git    bare mirror, fetched when it lacks the base
    attempts/<name>/tree              the attempt's worktree (`git worktree add --detach`)
    attempts/<name>/home              HOME for the attempt's commands
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import secrets
import shutil
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from runner.agent.errors import BaseNotFound, FetchFailed, WorkspaceFailed
from tether.git import GitError, git, redact

AUTHOR_NAME = "tether"
AUTHOR_EMAIL = "tether@localhost"
# Commit dates are derived from the step id and fall in [EPOCH, EPOCH + SPAN): a replayed
# attempt that makes the same changes makes the same commit.
_DATE_EPOCH = 1_600_000_000
_DATE_SPAN = 300_000_000
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_FETCH_REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CleanupRecord:
    """What removing an attempt's workspace removed, and the proof that it is gone."""

    path: str
    bytes_removed: int
    files_removed: int
    exists_after: bool  # the attempt's folder still exists
    listed_after: bool  # `git worktree list` of the mirror still names the worktree

    @property
    def gone(self) -> bool:
        return not self.exists_after and not self.listed_after

    def as_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "bytes_removed": self.bytes_removed,
            "files_removed": self.files_removed,
            "exists_after": self.exists_after,
            "listed_after": self.listed_after,
            "gone": self.gone,
        }


def commit_date(step_id: str) -> str:
    """The author and committer date of a step's candidate, in git's `@seconds +zone` form."""
    digest = int.from_bytes(hashlib.sha256(step_id.encode()).digest()[:8], "big")
    return f"@{_DATE_EPOCH + digest % _DATE_SPAN} +0000"


class RepoCache:
    """Mirrors and attempt workspaces under one cache directory.

    One runner process owns a cache directory; attempts of the same repository share its
    mirror under a lock, so fetches and worktree bookkeeping never interleave.
    """

    def __init__(self, cache_dir: Path) -> None:
        # Resolved once, so the paths git records for worktrees are the ones we compare.
        self.cache_dir = cache_dir.resolve()
        self._locks: dict[Path, anyio.Lock] = {}

    def mirror_path(self, url: str) -> Path:
        name = hashlib.sha256(url.encode()).hexdigest()[:24]
        return self.cache_dir / "mirrors" / f"{name}.git"

    @asynccontextmanager
    async def attempt(self, *, url: str, base_sha: str, label: str) -> AsyncIterator[Workspace]:
        """A fresh workspace at `base_sha`, removed on the way out (even when cancelled).

        `label` (e.g. the step id and attempt number) goes into the folder's name, after
        which a random suffix keeps every attempt's folder its own."""
        workspace = await self.open(url=url, base_sha=base_sha, label=label)
        try:
            yield workspace
        finally:
            with anyio.CancelScope(shield=True):
                await workspace.remove()

    async def open(self, *, url: str, base_sha: str, label: str) -> Workspace:
        """Fetch the mirror if it lacks `base_sha`, then add a fresh worktree at it."""
        if not _SHA.fullmatch(base_sha):
            raise BaseNotFound(f"base {base_sha!r} is not a full lowercase commit SHA")
        mirror = self.mirror_path(url)
        safe_label = re.sub(r"[^A-Za-z0-9._-]", "_", label)[:80]
        folder = self.cache_dir / "attempts" / f"{safe_label}-{secrets.token_hex(4)}"
        async with self._lock(mirror):
            await self._ensure_mirror(mirror)
            if not await _has_commit(mirror, base_sha):
                await self._fetch(mirror, url, base_sha)
            await anyio.Path(folder / "home").mkdir(parents=True)
            try:
                await git(
                    "worktree",
                    "add",
                    "--detach",
                    "--quiet",
                    str(folder / "tree"),
                    base_sha,
                    cwd=mirror,
                )
            except GitError as exc:
                await anyio.to_thread.run_sync(shutil.rmtree, folder)
                raise WorkspaceFailed(f"cannot create the worktree: {exc}") from exc
        return Workspace(cache=self, mirror=mirror, folder=folder, base_sha=base_sha)

    def _lock(self, mirror: Path) -> anyio.Lock:
        return self._locks.setdefault(mirror, anyio.Lock())

    async def _ensure_mirror(self, mirror: Path) -> None:
        if await anyio.Path(mirror / "HEAD").exists():
            return
        # Initialised beside its place and renamed in, so a crash never leaves half a mirror.
        partial = mirror.with_name(f"{mirror.name}.{secrets.token_hex(4)}.partial")
        await anyio.Path(partial.parent).mkdir(parents=True, exist_ok=True)
        try:
            await git("init", "--bare", "--quiet", str(partial), cwd=partial.parent)
            await anyio.Path(partial).rename(mirror)
        except (GitError, OSError) as exc:
            raise WorkspaceFailed(f"cannot create the mirror: {exc}") from exc

    async def _fetch(self, mirror: Path, url: str, base_sha: str) -> None:
        try:
            await git(
                "fetch", "--quiet", "--prune", "--no-tags", "--", url, *_FETCH_REFSPECS, cwd=mirror
            )
        except GitError as exc:
            raise FetchFailed(f"cannot fetch {redact(url)}: {exc}") from exc
        if await _has_commit(mirror, base_sha):
            return
        # Not under a branch or tag: ask for the commit itself (servers that allow it).
        await git("fetch", "--quiet", "--no-tags", "--", url, base_sha, cwd=mirror, check=False)
        if not await _has_commit(mirror, base_sha):
            raise BaseNotFound(f"base {base_sha} is not a commit of {redact(url)}")


class Workspace:
    """One attempt's worktree: `tree` is what the tools see, `home` the commands' HOME."""

    def __init__(self, *, cache: RepoCache, mirror: Path, folder: Path, base_sha: str) -> None:
        self._cache = cache
        self.mirror = mirror
        self.folder = folder
        self.tree = folder / "tree"
        self.home = folder / "home"
        self.base_sha = base_sha
        self.cleanup: CleanupRecord | None = None

    async def commit(self, *, step_id: str, paths: Sequence[str] = ()) -> str | None:
        """Commit what changed since the base and return the candidate SHA, or None when
        nothing changed. With `paths`, only changes under those prefixes are committed.

        Author, committer and date are fixed by the step id, so the same changes give the
        same SHA on every attempt of the step."""
        try:
            pathspecs = await self._pathspecs(paths) if paths else ["."]
            if not pathspecs:
                return None
            await git("add", "--all", "--", *pathspecs, cwd=self.tree)
            staged = await git(
                "diff", "--cached", "--quiet", self.base_sha, cwd=self.tree, check=False
            )
            if staged.returncode == 0:
                return None
            date = commit_date(step_id)
            identity = {
                "GIT_AUTHOR_NAME": AUTHOR_NAME, "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
                "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_NAME": AUTHOR_NAME,
                "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL, "GIT_COMMITTER_DATE": date,
            }  # fmt: skip
            await git(
                "-c",
                "commit.gpgsign=false",
                "commit",
                "--quiet",
                "--no-verify",
                "--allow-empty-message",
                "-m",
                f"tether step {step_id}",
                cwd=self.tree,
                env=identity,
            )
            head = await git("rev-parse", "HEAD", cwd=self.tree)
        except GitError as exc:
            raise WorkspaceFailed(f"cannot commit the candidate: {exc}") from exc
        return head.stdout.decode().strip()

    async def _pathspecs(self, paths: Sequence[str]) -> list[str]:
        """The prefixes as literal pathspecs, less those that match nothing (git add refuses
        a pathspec that matches no file, on disk or in the index)."""
        kept = []
        for prefix in paths:
            spec = f":(literal){prefix}"
            on_disk = await anyio.to_thread.run_sync(os.path.lexists, self.tree / prefix)
            if on_disk or (await git("ls-files", "-z", "--", spec, cwd=self.tree)).stdout:
                kept.append(spec)
        return kept

    async def write_bundle(self, dest: Path) -> Path:
        """Write a git bundle of base..HEAD (the candidate, named `HEAD`) to `dest`."""
        try:
            await git(
                "bundle", "create", "--quiet", str(dest), "HEAD", f"^{self.base_sha}", cwd=self.tree
            )
        except GitError as exc:
            raise WorkspaceFailed(f"cannot write the bundle: {exc}") from exc
        return dest

    async def remove(self) -> CleanupRecord:
        """Remove the worktree and its folder; return (and keep) the record of the removal."""
        if self.cleanup is not None:
            return self.cleanup
        files, size = await anyio.to_thread.run_sync(tree_size, self.folder)
        async with self._cache._lock(self.mirror):
            await git(
                "worktree",
                "remove",
                "--force",
                "--force",
                str(self.tree),
                cwd=self.mirror,
                check=False,
            )
            if await anyio.Path(self.folder).exists():
                await anyio.to_thread.run_sync(_rmtree, self.folder)
            await git("worktree", "prune", cwd=self.mirror, check=False)
            listed = await git("worktree", "list", "--porcelain", cwd=self.mirror, check=False)
        names = {
            line.removeprefix("worktree ")
            for line in listed.stdout.decode(errors="replace").splitlines()
            if line.startswith("worktree ")
        }
        self.cleanup = CleanupRecord(
            path=str(self.folder),
            bytes_removed=size,
            files_removed=files,
            exists_after=await anyio.Path(self.folder).exists(),
            listed_after=str(self.tree) in names,
        )
        return self.cleanup


def _rmtree(root: Path) -> None:
    # What cannot be removed stays, and the record says so (exists_after).
    shutil.rmtree(root, ignore_errors=True)


def tree_size(root: Path) -> tuple[int, int]:
    """Files and bytes under `root`, symlinks counted as links, never followed."""
    files = size = 0
    for folder, _dirs, names in os.walk(root):
        for name in names:
            try:
                size += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
            files += 1
    return files, size


async def _has_commit(mirror: Path, sha: str) -> bool:
    found = await git("cat-file", "-e", f"{sha}^{{commit}}", cwd=mirror, check=False)
    return found.returncode == 0
