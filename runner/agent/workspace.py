"""An attempt's repository workspace in the runner's cache directory: a bare mirror per
repository URL, a fresh worktree at the step's start point for every attempt, snapshots of its
changes (the per-turn wip commits and the candidate) and their bundles. Deleting the cache
loses nothing (docs/design.md, Borrowed servers):

    mirrors/<sha256(url)[:24]>.git    bare mirror, fetched when it lacks the base; commits
                                      that came in bundles are kept under refs/tether/fetched/
    attempts/<name>/tree              the attempt's worktree (`git worktree add --detach`),
                                      made beside the step's first model call when the caller
                                      asks (`attempt(checkout_beside=True)`; `ready()` waits)
    attempts/<name>/git               a symlink to the worktree's git dir in the mirror
    attempts/<name>/home              HOME for the attempt's commands
    attempts/<name>/io                downloaded and written bundles, logs

Every git on the worktree is a `TreeGit` on that git dir: whatever the attempt's commands put
in the tree (a `.git` of their own, `.gitattributes` naming a filter) steers none of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import secrets
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from tether.git import GitError, TreeGit, git, redact, write_neutral_attributes
from tether.runner.agent.errors import BaseNotFound, FetchFailed, WorkspaceFailed

AUTHOR_NAME = "tether"
AUTHOR_EMAIL = "tether@localhost"
# Commit dates are derived from the step id and fall in [EPOCH, EPOCH + SPAN): a replayed
# attempt that makes the same changes makes the same commit.
_DATE_EPOCH = 1_600_000_000
_DATE_SPAN = 300_000_000
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_FETCH_REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
# A snapshot is bundled under a ref of the worktree's own (git keeps refs/worktree/ per
# worktree and drops them with it), so concurrent attempts never share one.
_SNAPSHOT_REF = "refs/worktree/tether/snapshot"

# Made every turn, under the shielded checkpoint, so made cheaply: a snapshot's objects are
# written uncompressed (they stay in the cache), a checkpoint's bundle is packed without a
# delta search and with zlib's fastest level (it still travels, so it is compressed).
_FAST_OBJECTS = ("-c", "core.looseCompression=0")
_FAST_PACK = ("-c", "pack.window=0", "-c", "pack.compression=1")

# Writes the start point's bundle to the path it is given (the artifact store's download).
BundleSource = Callable[[Path], Awaitable[None]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Snapshot:
    """A commit of the worktree's changes under the allowed paths, parent the start point."""

    sha: str
    tree: str


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
    async def attempt(
        self,
        *,
        url: str,
        base_sha: str,
        label: str,
        start_sha: str | None = None,
        start_bundle: BundleSource | None = None,
        checkout_beside: bool = False,
    ) -> AsyncIterator[Workspace]:
        """A fresh workspace (see `open`), removed on the way out (even when cancelled).

        `checkout_beside`: the mirror and the start point are made ready first, as by `open`,
        but the worktree is checked out while the block already runs (an agent step's first
        model call needs no files); every method that needs the tree waits for it, and so
        must anything else that touches `tree` (`ready()`). A failed checkout cancels the
        block and raises its `WorkspaceFailed` here, as `open` would have."""
        if not checkout_beside:
            workspace = await self.open(
                url=url,
                base_sha=base_sha,
                label=label,
                start_sha=start_sha,
                start_bundle=start_bundle,
            )
            try:
                yield workspace
            finally:
                with anyio.CancelScope(shield=True):
                    await workspace.remove()
            return
        workspace = await self._prepare(
            url=url, base_sha=base_sha, label=label, start_sha=start_sha, start_bundle=start_bundle
        )
        failure: Exception | None = None
        try:
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as body:
                    workspace._checked_out = done = anyio.Event()
                    tg.start_soon(workspace._check_out_beside, body, done)
                    try:
                        yield workspace
                    except Exception as exc:  # raised below: a task group would wrap it
                        failure = exc
                tg.cancel_scope.cancel()  # a checkout the block ended without waiting for
        finally:
            with anyio.CancelScope(shield=True):
                await workspace.remove()
        if failure is not None:
            raise failure
        if body.cancelled_caught:
            await workspace.ready()  # raises the checkout's failure, which cancelled the block

    async def open(
        self,
        *,
        url: str,
        base_sha: str,
        label: str,
        start_sha: str | None = None,
        start_bundle: BundleSource | None = None,
    ) -> Workspace:
        """A fresh worktree at `start_sha` (the base when None): the mirror is fetched if it
        lacks the base, and when it lacks the start point, `start_bundle` writes the bundle
        that holds it (`base..start`) and the mirror fetches that.

        `label` (e.g. the step id and attempt number) goes into the folder's name, after
        which a random suffix keeps every attempt's folder its own."""
        workspace = await self._prepare(
            url=url, base_sha=base_sha, label=label, start_sha=start_sha, start_bundle=start_bundle
        )
        try:
            await workspace._check_out()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_rmtree, workspace.folder)
            raise
        return workspace

    async def _prepare(
        self,
        *,
        url: str,
        base_sha: str,
        label: str,
        start_sha: str | None,
        start_bundle: BundleSource | None,
    ) -> Workspace:
        """The attempt's folder (less its tree) and a mirror that holds the start point."""
        start = start_sha or base_sha
        for what, sha in (("base", base_sha), ("start point", start)):
            if not _SHA.fullmatch(sha):
                raise BaseNotFound(f"{what} {sha!r} is not a full lowercase commit SHA")
        mirror = self.mirror_path(url)
        safe_label = re.sub(r"[^A-Za-z0-9._-]", "_", label)[:80]
        folder = self.cache_dir / "attempts" / f"{safe_label}-{secrets.token_hex(4)}"
        await anyio.Path(folder / "home").mkdir(parents=True)
        await anyio.Path(folder / "io").mkdir()
        try:
            async with self._lock(mirror):
                await self._ensure_mirror(mirror)
                if not await _has_commit(mirror, base_sha):
                    await self._fetch(mirror, url, base_sha)
            if not await _has_commit(mirror, start):
                await self._fetch_start(mirror, start, start_bundle, folder / "io")
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_rmtree, folder)
            raise
        return Workspace(
            cache=self, mirror=mirror, folder=folder, base_sha=base_sha, start_sha=start
        )

    async def _fetch_start(
        self, mirror: Path, start: str, source: BundleSource | None, io: Path
    ) -> None:
        if source is None:
            raise WorkspaceFailed(
                f"the start point {start} is not in the repository and the lease names no"
                " bundle that holds it"
            )
        path = io / "start.bundle"
        await source(path)
        await self.import_bundle(mirror, path, start)

    async def import_bundle(self, mirror: Path, bundle: Path, sha: str) -> None:
        """Fetch `bundle` into `mirror`, its head kept as `refs/tether/fetched/<sha>`;
        `WorkspaceFailed` unless its one head is `sha` and it applies (its prerequisites in
        the mirror)."""
        async with self._lock(mirror):
            try:
                heads = (await git("bundle", "list-heads", str(bundle), cwd=mirror)).text.split()
                if len(heads) != 2 or heads[0] != sha:
                    raise WorkspaceFailed(
                        f"bundle {bundle.name} does not hold exactly the commit {sha}"
                    )
                await git(
                    "fetch",
                    "--quiet",
                    "--no-tags",
                    "--no-write-fetch-head",
                    str(bundle),
                    f"+{heads[1]}:refs/tether/fetched/{sha}",
                    cwd=mirror,
                )
            except GitError as exc:
                raise WorkspaceFailed(f"cannot fetch bundle {bundle.name}: {exc}") from exc

    def _lock(self, mirror: Path) -> anyio.Lock:
        return self._locks.setdefault(mirror, anyio.Lock())

    async def _ensure_mirror(self, mirror: Path) -> None:
        """A bare mirror whose info/attributes turn off every conversion (`TreeGit`)."""
        if not await anyio.Path(mirror / "HEAD").exists():
            # Initialised beside its place and renamed in, so a crash never leaves half one.
            partial = mirror.with_name(f"{mirror.name}.{secrets.token_hex(4)}.partial")
            await anyio.Path(partial.parent).mkdir(parents=True, exist_ok=True)
            try:
                await git("init", "--bare", "--quiet", str(partial), cwd=partial.parent)
                await anyio.Path(partial).rename(mirror)
            except (GitError, OSError) as exc:
                raise WorkspaceFailed(f"cannot create the mirror: {exc}") from exc
        try:
            await anyio.to_thread.run_sync(write_neutral_attributes, mirror)
        except OSError as exc:
            raise WorkspaceFailed(f"cannot write the mirror's attributes: {exc}") from exc

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
    """One attempt's worktree: `tree` is what the tools see, `home` the commands' HOME, `io`
    where bundles and logs are written."""

    def __init__(
        self, *, cache: RepoCache, mirror: Path, folder: Path, base_sha: str, start_sha: str
    ) -> None:
        self._cache = cache
        self.mirror = mirror
        self.folder = folder
        self.tree = folder / "tree"
        self.home = folder / "home"
        self.io = folder / "io"
        # Every git on the tree: the symlink is made at the checkout, to the git dir that
        # `git worktree add` made in the mirror.
        self.git = TreeGit(git_dir=folder / "git", work_tree=self.tree)
        self.base_sha = base_sha
        self.start_sha = start_sha
        self.cleanup: CleanupRecord | None = None
        # What setup made (runner/agent/setup.py): never committed, kept by clean checkouts.
        self.kept: tuple[str, ...] = ()
        self._start_tree: str | None = None  # set once the private index exists
        self._index_tree: str | None = None  # the private index's tree, as last written
        self._checked_out: anyio.Event | None = None  # set when a checkout beside ends
        self._checkout_failed: WorkspaceFailed | None = None

    async def _check_out(self) -> None:
        """Make the worktree at the start point: `git worktree add` without its checkout,
        which `TreeGit` then does."""
        async with self._cache._lock(self.mirror):
            try:
                await git(
                    "worktree",
                    "add",
                    "--detach",
                    "--no-checkout",
                    "--quiet",
                    str(self.tree),
                    self.start_sha,
                    cwd=self.mirror,
                )
                admin = await anyio.to_thread.run_sync(_worktree_git_dir, self.mirror, self.tree)
                await anyio.Path(self.git.git_dir).symlink_to(admin)
            except (GitError, OSError) as exc:
                raise WorkspaceFailed(f"cannot create the worktree: {exc}") from exc
        try:
            await self.git("checkout", "--force", "--quiet", "--detach", self.start_sha)
        except GitError as exc:
            raise WorkspaceFailed(f"cannot check out the worktree: {exc}") from exc

    async def _check_out_beside(self, body: anyio.CancelScope, done: anyio.Event) -> None:
        """`_check_out` as a task beside `body`, which it cancels when it fails; `done` is
        set when it ends."""
        try:
            await self._check_out()
        except WorkspaceFailed as exc:
            self._checkout_failed = exc
            body.cancel()
        finally:
            done.set()

    async def ready(self) -> None:
        """Wait until the worktree exists; `WorkspaceFailed` when its checkout failed."""
        if self._checked_out is not None and not self._checked_out.is_set():
            await self._checked_out.wait()
        if self._checkout_failed is not None:
            raise self._checkout_failed

    async def commit(self, *, step_id: str, paths: Sequence[str] = ()) -> str | None:
        """The candidate: a snapshot of what changed since the start point (under `paths`
        when given), or None when nothing did. Same author, committer and date for every
        attempt of the step, so the same changes give the same SHA."""
        snap = await self.snapshot(step_id=step_id, paths=paths, message=f"tether step {step_id}")
        return None if snap is None else snap.sha

    async def snapshot(
        self,
        *,
        step_id: str,
        paths: Sequence[str] = (),
        message: str,
        previous: Snapshot | None = None,
    ) -> Snapshot | None:
        """Commit the changes under `paths` (all of the tree when empty) on the start point,
        without touching HEAD or the index the tools see; None when nothing changed.

        The commit's tree comes from a private index, made once from the start point's tree
        (with the real index's stat data) and kept for the attempt: each snapshot only adds
        the paths to it, so git hashes only the files that changed since the last one, and
        whatever happened outside the paths (or in the real index) never gets in. When the
        tree is `previous`'s, `previous` is returned as it is."""
        tree = await self.stage(paths)
        return await self.commit_tree(tree, step_id=step_id, message=message, previous=previous)

    async def stage(self, paths: Sequence[str] = ()) -> str:
        """Add what changed under `paths` (all of the tree when empty; a file's own path is a
        path too) to the private index (see `snapshot`) and return the index's tree.

        Only the changes under `paths` get in: a caller that knows which files changed since
        the last call names only those, and git then reads no other file of the tree."""
        await self.ready()
        env = {"GIT_INDEX_FILE": str(self.io / "snapshot.index")}
        try:
            if self._start_tree is None:
                await self._start_index(env)
            pathspecs = await self._pathspecs(paths, env) if paths else ["."]
            if pathspecs:
                pathspecs += [f":(exclude,literal){path}" for path in self.kept]
                await self.git(*_FAST_OBJECTS, "add", "--all", "--", *pathspecs, env=env)
                written = await self.git("write-tree", env=env)
                self._index_tree = written.text.strip()
        except GitError as exc:
            raise WorkspaceFailed(f"cannot commit the changes: {exc}") from exc
        assert self._index_tree is not None  # set by _start_index
        return self._index_tree

    async def commit_tree(
        self, tree: str, *, step_id: str, message: str, previous: Snapshot | None = None
    ) -> Snapshot | None:
        """A commit of `tree` on the start point (see `snapshot`): None when `tree` is the
        start point's, `previous` when it is `previous`'s."""
        if tree == self._start_tree:
            return None
        if previous is not None and previous.tree == tree:
            return previous
        try:
            date = commit_date(step_id)
            identity = {
                "GIT_AUTHOR_NAME": AUTHOR_NAME,
                "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
                "GIT_AUTHOR_DATE": date,
                "GIT_COMMITTER_NAME": AUTHOR_NAME,
                "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
                "GIT_COMMITTER_DATE": date,
            }
            made = await self.git(
                "commit-tree", tree, "-p", self.start_sha, "-m", message, env=identity
            )
        except GitError as exc:
            raise WorkspaceFailed(f"cannot commit the changes: {exc}") from exc
        return Snapshot(sha=made.text.strip(), tree=tree)

    async def _start_index(self, env: dict[str, str]) -> None:
        await anyio.to_thread.run_sync(
            _copy_if_present, self.git.git_dir / "index", Path(env["GIT_INDEX_FILE"])
        )
        merged = await self.git("read-tree", "-m", self.start_sha, env=env, check=False)
        if merged.returncode != 0:  # e.g. an index with conflicts: start from the tree alone
            await self.git("read-tree", self.start_sha, env=env)
        self._start_tree = self._index_tree = await self.tree_of(self.start_sha)

    async def _pathspecs(self, paths: Sequence[str], env: dict[str, str]) -> list[str]:
        """The prefixes as literal pathspecs, less those that match nothing (git add refuses
        a pathspec that matches no file, on disk or in the index)."""
        kept = []
        for prefix in paths:
            spec = f":(literal){prefix}"
            on_disk = await anyio.to_thread.run_sync(os.path.lexists, self.tree / prefix)
            if on_disk or (await self.git("ls-files", "-z", "--", spec, env=env)).stdout:
                kept.append(spec)
        return kept

    async def write_bundle(
        self, dest: Path, sha: str, *, since: str | None = None, fast: bool = False
    ) -> Path:
        """Write a git bundle of `since..sha` (`since` the start point when None) to `dest`;
        its one head is a ref of this worktree's own. `fast`: no delta search and light
        compression (a checkpoint's bundle, made every turn and read at most once)."""
        options = _FAST_PACK if fast else ()
        await self.ready()
        try:
            await self.git("update-ref", _SNAPSHOT_REF, sha)
            await self.git(
                *options,
                "bundle",
                "create",
                "--quiet",
                str(dest),
                _SNAPSHOT_REF,
                f"^{since or self.start_sha}",
            )
        except GitError as exc:
            raise WorkspaceFailed(f"cannot write the bundle: {exc}") from exc
        return dest

    async def import_bundle(self, bundle: Path, sha: str) -> None:
        """Fetch `bundle`, whose one head must be `sha`, into the mirror."""
        await self._cache.import_bundle(self.mirror, bundle, sha)

    async def apply(self, sha: str) -> None:
        """Make the worktree hold `sha`'s tree as uncommitted changes on the start point
        (deletions included); HEAD and the index stay at the start point."""
        await self.ready()
        try:
            await self.git("read-tree", "-m", "-u", "HEAD", sha)
            await self.git("reset", "--quiet")
        except GitError as exc:
            raise WorkspaceFailed(f"cannot apply {sha} to the worktree: {exc}") from exc

    async def tree_of(self, sha: str) -> str:
        await self.ready()
        try:
            return (await self.git("rev-parse", f"{sha}^{{tree}}")).text.strip()
        except GitError as exc:
            raise WorkspaceFailed(f"cannot read the tree of {sha}: {exc}") from exc

    async def clean_checkout(self, sha: str) -> None:
        """Put the worktree at `sha` exactly: tracked files as committed, every untracked or
        ignored file removed but what setup made (`kept`)."""
        await self.ready()
        keep = [arg for path in self.kept for arg in ("-e", "/" + _literal_pattern(path))]
        try:
            await self.git("checkout", "--force", "--quiet", "--detach", sha)
            await self.git("clean", "-ffdxq", *keep)
        except GitError as exc:
            raise WorkspaceFailed(f"cannot check out {sha} cleanly: {exc}") from exc

    async def untracked(self) -> tuple[str, ...]:
        """The untracked paths in the worktree, ignored ones included, a folder of them named
        once (`dir/`)."""
        await self.ready()
        try:
            listed = await self.git("ls-files", "--others", "--directory", "-z")
        except GitError as exc:
            raise WorkspaceFailed(f"cannot list the untracked files: {exc}") from exc
        return tuple(sorted(p for p in listed.stdout.decode().split("\0") if p))

    async def remove(self) -> CleanupRecord:
        """Remove the worktree and its folder; return (and keep) the record of the removal.

        Not by `git worktree remove`, which would read the tree's `.git`: the folder and the
        worktree's git dir are deleted, and `git worktree prune` forgets the worktree."""
        if self.cleanup is not None:
            return self.cleanup
        files, size = await anyio.to_thread.run_sync(tree_size, self.folder)
        async with self._cache._lock(self.mirror):
            admin = await anyio.to_thread.run_sync(_resolved_link, self.git.git_dir)
            if await anyio.Path(self.folder).exists():
                await anyio.to_thread.run_sync(_rmtree, self.folder)
            if admin is not None and admin.parent == self.mirror / "worktrees":
                await anyio.to_thread.run_sync(_rmtree, admin)
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


def _worktree_git_dir(mirror: Path, tree: Path) -> Path:
    """The git dir `git worktree add` made in `mirror` for `tree`: the one whose `gitdir`
    file names the tree's `.git` (read in the mirror, never in the tree)."""
    wanted = str(tree / ".git")
    for admin in sorted((mirror / "worktrees").iterdir()):
        with contextlib.suppress(OSError):
            if (admin / "gitdir").read_text().strip() == wanted:
                return admin
    raise OSError(f"git worktree add made no git dir for {tree}")


def _resolved_link(link: Path) -> Path | None:
    try:
        return link.parent / link.readlink()
    except OSError:
        return None


def _copy_if_present(source: Path, dest: Path) -> None:
    # With its mtime: git trusts an entry's stat data only when the file is older than the
    # index file, so a fresh mtime would hide a same-size change made in the same second.
    with contextlib.suppress(FileNotFoundError):
        shutil.copy2(source, dest)


def _rmtree(root: Path) -> None:
    # What cannot be removed stays, and the record says so (exists_after).
    shutil.rmtree(root, ignore_errors=True)


def _literal_pattern(path: str) -> str:
    """`path` as a gitignore pattern that matches it and nothing else."""
    return "".join("\\" + c if c in "*?[\\!#" else c for c in path)


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
