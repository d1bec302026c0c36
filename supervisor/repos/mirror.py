"""The supervisor's own mirror of each repository it knows: where it reads a remote's head,
imports the candidates runners send as bundles, and checks a candidate against what the
approval bound (docs/design.md, Repositories and candidates).

    <mirror_dir>/<sha256(url)[:24]>.git         a bare mirror per repository URL
      refs/heads/*, refs/tags/*                 as last fetched from the remote
      refs/tether/<task_id>/<step_id>/<fence>   one candidate per attempt, never moved

These are slow I/O: the ledger's adapters call them (never a ledger rule) and hand the ledger
what they found.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import anyio

from tether.git import GitError, git, redact

SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# What a fetch updates. Never `+refs/*:refs/*` (a `--mirror` clone's): with `--prune` it would
# delete the refs/tether/ candidates, which the remote does not have.
_FETCH_REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
_NEUTRAL_CWD = Path("/")  # ls-remote needs no repository; "/" is never one we mean


class MirrorError(Exception):
    """The mirror could not do what was asked. The tree, by what the caller should do:

        MirrorError
        ├── RemoteFailed      git could not read the remote: retry later, or fix its URL
        ├── NoSuchHead        the remote has no such branch (or no HEAD: it is empty)
        ├── BundleRefused     the bundle is not imported; do not retry it as is
        │   └── RefTaken      the attempt's ref already names another commit
        └── PushRejected      the remote refused to move the branch (`reason` says why)

    Messages name URLs with their user and password masked."""


class RemoteFailed(MirrorError):
    """git could not read the remote (unreachable, no access, or not a repository)."""


class NoSuchHead(MirrorError):
    """The remote has no such branch, or no HEAD."""


class BundleRefused(MirrorError):
    """The bundle cannot be imported as an attempt's candidate."""


class RefTaken(BundleRefused):
    """The attempt's candidate ref already names another commit; it is never moved."""


class PushRejected(MirrorError):
    """The remote refused the branch update: `reason` is `stale` (the branch is not at the
    value the lease expected), `non-fast-forward`, or `rejected` (anything else: a hook, a
    protected branch)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class RefusalCode(enum.StrEnum):
    """Why a candidate fails the evidence check; each is its own reason in the task."""

    UNKNOWN_CANDIDATE = "unknown_candidate"  # no such commit in the mirror
    NOT_DESCENDANT = "not_descendant"  # the approved base is not its ancestor
    PATH_NOT_ALLOWED = "path_not_allowed"  # it changes a file outside allowed_paths


@dataclasses.dataclass(frozen=True, kw_only=True)
class Refusal:
    code: RefusalCode
    detail: str
    paths: tuple[str, ...] = ()  # for PATH_NOT_ALLOWED: the files outside allowed_paths


def candidate_ref(task_id: str, step_id: str, fence: int) -> str:
    """The ref an attempt's candidate is imported under."""
    return f"refs/tether/{task_id}/{step_id}/{fence}"


async def ls_remote(url: str, *, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every ref the remote at `url` advertises, with its SHA (empty for an empty repository).
    `env` is added to git's environment (a push credential's helper)."""
    try:
        done = await git("ls-remote", "--", url, cwd=_NEUTRAL_CWD, env=env)
    except GitError as exc:
        raise RemoteFailed(f"cannot read {redact(url)}: {exc.reason}") from exc
    refs: dict[str, str] = {}
    for line in done.text.splitlines():
        sha, _, name = line.partition("\t")
        if SHA.fullmatch(sha) and name:
            refs[name] = sha
    return refs


async def remote_head(url: str, branch: str | None = None) -> str:
    """The SHA the remote's HEAD, or its branch `branch`, names now."""
    if branch is not None and (not branch.strip() or branch.startswith("-") or " " in branch):
        raise NoSuchHead(f"{branch!r} is not a branch name")
    wanted = "HEAD" if branch is None else f"refs/heads/{branch.removeprefix('refs/heads/')}"
    refs = await ls_remote(url)
    if wanted not in refs:
        raise NoSuchHead(f"{redact(url)} has no {wanted}")
    return refs[wanted]


def path_allowed(path: str, allowed_paths: Iterable[str]) -> bool:
    """Whether `path` (relative, as git names it) lies under one of `allowed_paths`, read as
    the runner reads them: directory prefixes, `""` or `.` the whole tree, an empty list
    nothing. An entry that climbs out of the tree allows nothing."""
    for entry in allowed_paths:
        parts = [p for p in entry.replace("\\", "/").split("/") if p not in ("", ".")]
        if ".." in parts or entry.startswith("/"):
            continue
        prefix = "/".join(parts)
        if not prefix or path == prefix or path.startswith(prefix + "/"):
            return True
    return False


class Mirrors:
    """The bare mirrors under one folder (`mirror_dir`). One supervisor process owns it;
    work on one mirror is serialised by a lock, and a candidate ref is created only where
    none exists, so even two processes cannot move one."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._locks: dict[Path, anyio.Lock] = {}

    def path(self, url: str) -> Path:
        name = hashlib.sha256(url.encode()).hexdigest()[:24]
        return self.root / f"{name}.git"

    async def head(self, url: str, branch: str | None = None) -> str:
        """The remote's current HEAD (or `branch`), read with `git ls-remote`."""
        return await remote_head(url, branch)

    async def fetch(self, url: str) -> Path:
        """Bring the mirror of `url` up to date with the remote's branches and tags (creating
        it if need be); return its path. Candidate refs are left as they are."""
        mirror = await self._ensure(url)
        async with self._lock(mirror):
            await self._fetch(mirror, url)
        return mirror

    async def import_bundle(
        self, url: str, bundle_path: Path, task_id: str, step_id: str, fence: int
    ) -> str:
        """Verify an attempt's bundle (base..candidate, one head) against the mirror, store
        its objects and create `candidate_ref(task_id, step_id, fence)` at its head; return
        the candidate SHA. The same bundle again returns the same SHA; another commit for a
        ref that exists is `RefTaken`."""
        if isinstance(fence, bool) or not isinstance(fence, int) or fence < 0:
            raise BundleRefused(f"fence must be a whole number, got {fence!r}")
        ref = candidate_ref(task_id, step_id, fence)
        valid = await git("check-ref-format", ref, cwd=_NEUTRAL_CWD, check=False)
        if valid.returncode != 0 or "/" in task_id or "/" in step_id:
            raise BundleRefused(f"task and step ids must be plain ref components: {ref!r}")
        bundle = str(await anyio.Path(bundle_path).resolve())
        mirror = await self._ensure(url)
        async with self._lock(mirror):
            if await self._verify(mirror, bundle) is not None:
                # Most often the mirror lacks the base the bundle starts from: fetch, once.
                await self._fetch(mirror, url)
                problem = await self._verify(mirror, bundle)
                if problem is not None:
                    raise BundleRefused(f"bundle {bundle_path.name} does not verify: {problem}")
            sha = await _single_head(mirror, bundle, bundle_path.name)
            existing = await _resolve(mirror, ref)
            if existing is not None:
                return _same_or_taken(ref, existing, sha)
            try:
                await git("bundle", "unbundle", bundle, cwd=mirror)
            except GitError as exc:
                why = f"bundle {bundle_path.name} cannot be unpacked: {exc.reason}"
                raise BundleRefused(why) from exc
            if not await _is_commit(mirror, sha):
                raise BundleRefused(f"bundle {bundle_path.name}'s head {sha} is not a commit")
            # The empty old value makes git create the ref only where there is none.
            created = await git("update-ref", ref, sha, "", cwd=mirror, check=False)
            if created.returncode != 0:
                existing = await _resolve(mirror, ref)
                if existing is None:
                    raise BundleRefused(f"cannot create {ref}: {created.stderr.decode().strip()}")
                return _same_or_taken(ref, existing, sha)
        return sha

    async def check_candidate(
        self, url: str, base_sha: str, candidate_sha: str, allowed_paths: Sequence[str]
    ) -> list[Refusal]:
        """Every reason the mirror of `url` gives to refuse `candidate_sha` as the work done on
        `base_sha` under `allowed_paths`; an empty list means the candidate passes."""
        mirror = self.path(url)
        known = (
            SHA.fullmatch(candidate_sha) is not None
            and await anyio.Path(mirror / "HEAD").exists()
            and await _is_commit(mirror, candidate_sha)
        )
        if not known:
            return [
                Refusal(
                    code=RefusalCode.UNKNOWN_CANDIDATE,
                    detail=f"candidate {candidate_sha!r} is not a commit in the mirror",
                )
            ]
        if not (SHA.fullmatch(base_sha) and await _is_commit(mirror, base_sha)):
            return [
                Refusal(
                    code=RefusalCode.NOT_DESCENDANT,
                    detail=f"base {base_sha!r} is not a commit in the mirror",
                )
            ]
        refusals: list[Refusal] = []
        ancestry = await git(
            "merge-base", "--is-ancestor", base_sha, candidate_sha, cwd=mirror, check=False
        )
        if ancestry.returncode not in (0, 1):
            raise GitError(("merge-base",), ancestry.returncode, ancestry.stderr.decode())
        if ancestry.returncode == 1:
            refusals.append(
                Refusal(
                    code=RefusalCode.NOT_DESCENDANT,
                    detail=f"candidate {candidate_sha} does not descend from base {base_sha}",
                )
            )
        diff = await git(
            "diff", "--name-only", "-z", "--no-renames", base_sha, candidate_sha, cwd=mirror
        )
        changed = [p for p in diff.stdout.decode(errors="replace").split("\0") if p]
        outside = tuple(p for p in changed if not path_allowed(p, allowed_paths))
        if outside:
            shown = ", ".join(outside[:10]) + (" ..." if len(outside) > 10 else "")
            refusals.append(
                Refusal(
                    code=RefusalCode.PATH_NOT_ALLOWED,
                    detail=f"{len(outside)} changed file(s) outside allowed_paths: {shown}",
                    paths=outside,
                )
            )
        return refusals

    async def branch_head(
        self, url: str, branch: str, *, env: Mapping[str, str] | None = None
    ) -> str | None:
        """The SHA the remote's `branch` names now, or None when it has no such branch."""
        refs = await ls_remote(url, env=env)
        return refs.get(f"refs/heads/{branch}")

    async def is_ancestor(self, url: str, ancestor: str, descendant: str) -> bool | None:
        """Whether `ancestor` is an ancestor of (or is) `descendant` in the mirror of `url`;
        None when either is not a commit there (or there is no mirror of `url` yet)."""
        mirror = self.path(url)
        if not await anyio.Path(mirror / "HEAD").exists():
            return None
        for sha in (ancestor, descendant):
            if not (SHA.fullmatch(sha) and await _is_commit(mirror, sha)):
                return None
        done = await git(
            "merge-base", "--is-ancestor", ancestor, descendant, cwd=mirror, check=False
        )
        if done.returncode not in (0, 1):
            raise GitError(("merge-base",), done.returncode, done.stderr.decode())
        return done.returncode == 0

    async def push(
        self,
        url: str,
        sha: str,
        branch: str,
        expected: str,
        *,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Move the remote's `branch` to `sha` (a commit in the mirror of `url`) only if it
        names `expected` now: `git push --force-with-lease=refs/heads/<branch>:<expected>`.
        The lease makes it a compare-and-swap; whether `sha` descends from `expected` is the
        caller's to check (`is_ancestor`). `PushRejected` when the remote refused,
        `RemoteFailed` when it could not be reached; `env` is added to git's environment."""
        ref = f"refs/heads/{branch}"
        valid = await git("check-ref-format", ref, cwd=_NEUTRAL_CWD, check=False)
        if valid.returncode != 0 or not SHA.fullmatch(sha) or not SHA.fullmatch(expected):
            raise PushRejected(f"cannot push {sha!r} to {ref!r} over {expected!r}", "rejected")
        mirror = self.path(url)
        done = await git(
            "push", "--porcelain", "--no-verify", f"--force-with-lease={ref}:{expected}",
            "--", url, f"{sha}:{ref}",
            cwd=mirror, env=env, check=False,
        )  # fmt: skip
        if done.returncode == 0:
            return
        refused = [line for line in done.text.splitlines() if line.startswith("!")]
        if not refused:
            reason = " ".join(redact(done.stderr.decode(errors="replace")).split())[-300:]
            raise RemoteFailed(f"cannot push to {redact(url)}: {reason}")
        said = redact(refused[0].split("\t")[-1])
        if "stale info" in said:
            raise PushRejected(f"{redact(url)} refused {ref}: {said}", "stale")
        if "non-fast-forward" in said or "fetch first" in said:
            raise PushRejected(f"{redact(url)} refused {ref}: {said}", "non-fast-forward")
        raise PushRejected(f"{redact(url)} refused {ref}: {said}", "rejected")

    def _lock(self, mirror: Path) -> anyio.Lock:
        return self._locks.setdefault(mirror, anyio.Lock())

    async def _ensure(self, url: str) -> Path:
        mirror = self.path(url)
        if await anyio.Path(mirror / "HEAD").exists():
            return mirror
        # Initialised beside its place and renamed in, so a crash never leaves half a mirror.
        partial = mirror.with_name(f"{mirror.name}.{secrets.token_hex(4)}.partial")
        await anyio.Path(self.root).mkdir(parents=True, exist_ok=True)
        await git("init", "--bare", "--quiet", str(partial), cwd=self.root)
        try:
            await anyio.Path(partial).rename(mirror)
        except OSError:  # another caller renamed its own in first: use that one
            if not await anyio.Path(mirror / "HEAD").exists():
                raise
        return mirror

    async def _fetch(self, mirror: Path, url: str) -> None:
        try:
            await git(
                "fetch", "--quiet", "--prune", "--no-tags", "--", url, *_FETCH_REFSPECS, cwd=mirror
            )
        except GitError as exc:
            raise RemoteFailed(f"cannot fetch {redact(url)}: {exc.reason}") from exc

    async def _verify(self, mirror: Path, bundle: str) -> str | None:
        """None when the bundle verifies against the mirror, else git's reason."""
        done = await git("bundle", "verify", "--quiet", bundle, cwd=mirror, check=False)
        if done.returncode == 0:
            return None
        return " ".join(redact(done.stderr.decode(errors="replace")).split())[-300:]


def _same_or_taken(ref: str, existing: str, sha: str) -> str:
    if existing != sha:
        raise RefTaken(f"{ref} already names {existing}; refusing to move it to {sha}")
    return sha


async def _single_head(mirror: Path, bundle: str, name: str) -> str:
    listed = await git("bundle", "list-heads", bundle, cwd=mirror)
    shas = {line.split(" ", 1)[0] for line in listed.text.splitlines() if line.strip()}
    if len(shas) != 1 or not SHA.fullmatch(next(iter(shas))):
        raise BundleRefused(f"bundle {name} must carry exactly one head, it has {len(shas)}")
    return shas.pop()


async def _resolve(mirror: Path, ref: str) -> str | None:
    done = await git("rev-parse", "--verify", "--quiet", ref, cwd=mirror, check=False)
    if done.returncode != 0:
        return None
    return done.text.strip() or None


async def _is_commit(mirror: Path, sha: str) -> bool:
    done = await git("cat-file", "-t", sha, cwd=mirror, check=False)
    return done.returncode == 0 and done.text.strip() == "commit"
