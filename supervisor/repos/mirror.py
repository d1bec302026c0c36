"""The supervisor's own mirror of each repository it knows: where it reads a remote's head,
imports the candidates runners send as bundles, and checks a candidate against what the
approval bound (docs/design.md, Repositories and candidates).

    <mirror_dir>/<sha256(url)[:24]>.git         a bare mirror per repository URL
      refs/heads/*, refs/tags/*                 as last fetched from the remote
      refs/tether/<task_id>/<step_id>/<fence>   one candidate per attempt, never moved

These are slow I/O: the ledger's adapters call them (never a ledger rule) and hand the ledger
what they found.

A mirror survives a power cut (docs/design.md, Power loss and the disk): it is built in a scratch
folder, synced whole and renamed into place; every git command that writes to it runs with
git's own fsync settings (`HARDENED`: objects, their indexes and refs, on git 2.36 and later;
older git ignores `core.fsync`) and is followed by a sync of the folders it wrote names into,
which git never syncs, and of the files it added (new packs, the candidate's ref), whatever the
git version. Fetches keep what they receive as a pack (`transfer.unpackLimit=1`), never as
loose objects, so those folders are few. An import returns, and so the ledger records a
verified candidate, only once its ref is durable.

The first use of a mirror by a process checks it (`_damage`): one that is no repository any
more (an empty `HEAD` or `config`, a broken ref, a ref naming a missing object) is moved aside
(`<name>.git.damaged-<time>`), logged at warning with both paths, and made anew; a new mirror
then gets the ledger's committed candidates back from their bundles (`on_new_mirror`).
"""

from __future__ import annotations

import dataclasses
import enum
import glob
import hashlib
import os
import re
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

import anyio
import structlog

from tether.git import GitError, GitOutput, git, redact
from tether.supervisor import durable
from tether.supervisor.repos import entries

log = structlog.get_logger("tether.supervisor")

SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# What a fetch updates. Never `+refs/*:refs/*` (a `--mirror` clone's): with `--prune` it would
# delete the refs/tether/ candidates, which the remote does not have.
_FETCH_REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
_NEUTRAL_CWD = Path("/")  # ls-remote needs no repository; "/" is never one we mean
# Every git command on a mirror: objects, their indexes and refs synced before git renames them
# into place (git 2.36's `core.fsync`; `reference` is not in its default), with fsync itself;
# received objects kept as one pack, never loose; an automatic gc in the foreground, inside the
# command and so before the folders are synced after it, never detached past it.
HARDENED = (
    "-c",
    "core.fsync=objects,derived-metadata,reference",
    "-c",
    "core.fsyncMethod=fsync",
    "-c",
    "transfer.unpackLimit=1",
    "-c",
    "gc.autoDetach=false",
)


class MirrorError(Exception):
    """The mirror could not do what was asked. The tree, by what the caller should do:

        MirrorError
        ├── RemoteFailed      git could not read the remote: retry later, or fix its URL
        ├── NoSuchHead        the remote has no such branch (or no HEAD: it is empty)
        ├── BundleRefused     the bundle is not imported; do not retry it as is
        │   └── RefTaken      the attempt's ref already names another commit
        ├── PushRejected      the remote refused to move the branch (`reason` says why)
        └── MirrorDamaged     the local mirror is damaged: it is made anew at its next use

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


class MirrorDamaged(MirrorError):
    """The supervisor's own mirror, not the remote, is what failed: the message names its
    folder. The next use checks it again and makes it anew."""


class RefusalCode(enum.StrEnum):
    """Why a candidate fails the evidence check; each is its own reason in the task."""

    UNKNOWN_CANDIDATE = "unknown_candidate"  # no such commit in the mirror
    NOT_DESCENDANT = "not_descendant"  # the approved base is not its ancestor
    PATH_NOT_ALLOWED = "path_not_allowed"  # it changes a file outside allowed_paths
    ENTRY_NOT_ALLOWED = "entry_not_allowed"  # it adds a kind of entry allowed_entries lacks
    MODE_CHANGED = "mode_changed"  # it changes a file's mode and may not


@dataclasses.dataclass(frozen=True, kw_only=True)
class Refusal:
    code: RefusalCode
    detail: str
    paths: tuple[str, ...] = ()  # for PATH_NOT_ALLOWED: the files outside allowed_paths


async def _entry_refusals(
    mirror: Path, base_sha: str, candidate_sha: str, allowed: Collection[str]
) -> list[Refusal]:
    """The candidate's changed entries judged by their modes (`entries.refusals`)."""
    raw = await _git(
        mirror, "diff-tree", "-r", "-z", "--raw", "--no-renames", base_sha, candidate_sha
    )
    changed = entries.parse_raw(raw.stdout)
    targets = {
        link.path: (await _git(mirror, "cat-file", "blob", link.new_sha)).stdout
        for link in entries.links_to_read(changed, allowed)
    }
    not_allowed, modes = entries.refusals(changed, allowed, targets)
    found = []
    if not_allowed:
        found.append(
            Refusal(
                code=RefusalCode.ENTRY_NOT_ALLOWED,
                detail=f"{len(not_allowed)} entr{'y' if len(not_allowed) == 1 else 'ies'} not"
                f" in allowed_entries {sorted(allowed)}: {entries.shown(not_allowed)}",
            )
        )
    if modes:
        found.append(
            Refusal(
                code=RefusalCode.MODE_CHANGED,
                detail=f'{len(modes)} mode change(s) without "executable" in allowed_entries:'
                f" {entries.shown(modes)}",
            )
        )
    return found


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
    none exists, so even two processes cannot move one. `on_new_mirror`, when set, is awaited
    with the URL of each mirror this process made (a new one, or one made anew after damage),
    outside its lock: what brings the ledger's committed candidates back into it."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._locks: dict[Path, anyio.Lock] = {}
        self._checked: set[Path] = set()
        self.on_new_mirror: Callable[[str], Awaitable[None]] | None = None

    def path(self, url: str) -> Path:
        name = hashlib.sha256(url.encode()).hexdigest()[:24]
        return self.root / f"{name}.git"

    async def head(self, url: str, branch: str | None = None) -> str:
        """The remote's current HEAD (or `branch`), read with `git ls-remote`."""
        return await remote_head(url, branch)

    async def open(self, url: str) -> Path:
        """The mirror of `url`, checked at its first use by this process: made if missing,
        moved aside and made anew if damaged (see the module docstring)."""
        return await self._ensure(url)

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
        the candidate SHA once that ref is durable. The same bundle again returns the same
        SHA; another commit for a ref that exists is `RefTaken`."""
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
                # Made by an earlier call, perhaps of a process that died before syncing it.
                await anyio.to_thread.run_sync(_harden, mirror, None, ref)
                return _same_or_taken(ref, existing, sha)
            try:
                await _write(mirror, "bundle", "unbundle", bundle)
            except GitError as exc:
                await self._blame_mirror(mirror, url, exc)
                why = f"bundle {bundle_path.name} cannot be unpacked: {exc.reason}"
                raise BundleRefused(why) from exc
            if not await _is_commit(mirror, sha):
                raise BundleRefused(f"bundle {bundle_path.name}'s head {sha} is not a commit")
            # The empty old value makes git create the ref only where there is none.
            created = await _write(mirror, "update-ref", ref, sha, "", ref=ref, check=False)
            if created.returncode != 0:
                existing = await _resolve(mirror, ref)
                if existing is None:
                    failed = GitError(("update-ref",), created.returncode, created.stderr.decode())
                    await self._blame_mirror(mirror, url, failed)
                    raise BundleRefused(f"cannot create {ref}: {failed.reason}")
                return _same_or_taken(ref, existing, sha)
        return sha

    async def check_candidate(
        self,
        url: str,
        base_sha: str,
        candidate_sha: str,
        allowed_paths: Sequence[str],
        allowed_entries: Collection[str] = ("file",),
    ) -> list[Refusal]:
        """Every reason the mirror of `url` gives to refuse `candidate_sha` as the work done on
        `base_sha` under `allowed_paths` and `allowed_entries` (`entries.py`); an empty list
        means the candidate passes."""
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
        ancestry = await _git(
            mirror, "merge-base", "--is-ancestor", base_sha, candidate_sha, check=False
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
        diff = await _git(
            mirror, "diff", "--name-only", "-z", "--no-renames", base_sha, candidate_sha
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
        return refusals + await _entry_refusals(mirror, base_sha, candidate_sha, allowed_entries)

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
        done = await _git(mirror, "merge-base", "--is-ancestor", ancestor, descendant, check=False)
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
        # A push to a URL (no remote configured) writes nothing to the mirror; `_write` would
        # sync what it did if it ever did (remote-tracking refs).
        done = await _write(
            mirror,
            "push",
            "--porcelain",
            "--no-verify",
            f"--force-with-lease={ref}:{expected}",
            "--",
            url,
            f"{sha}:{ref}",
            env=env,
            check=False,
        )
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
        made = False
        async with self._lock(mirror):
            if mirror not in self._checked:
                if await anyio.Path(mirror).exists():
                    damage = await _damage(mirror)
                    if damage is not None:
                        await self._move_aside(mirror, url, damage)
                if not await anyio.Path(mirror).exists():
                    await self._create(mirror)
                    made = True
                self._checked.add(mirror)
        if made and self.on_new_mirror is not None:
            await self.on_new_mirror(url)
        return mirror

    async def _create(self, mirror: Path) -> None:
        """Initialise a bare repository beside its place, sync it whole and rename it in, so
        that a crash or a power cut never leaves half a mirror (or an empty one's name)."""
        await anyio.to_thread.run_sync(durable.made_folder, self.root, 0o777)
        await anyio.to_thread.run_sync(_remove_partials, mirror)
        partial = mirror.with_name(f"{mirror.name}.{secrets.token_hex(4)}.partial")
        await git("init", "--bare", "--quiet", str(partial), cwd=self.root)
        await anyio.to_thread.run_sync(durable.sync_tree, partial)
        await anyio.Path(partial).rename(mirror)
        await anyio.to_thread.run_sync(durable.sync_folder, self.root)

    async def _move_aside(self, mirror: Path, url: str, damage: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = mirror.with_name(f"{mirror.name}.damaged-{stamp}-{secrets.token_hex(2)}")
        await anyio.Path(mirror).rename(aside)
        await anyio.to_thread.run_sync(durable.sync_folder, self.root)
        log.warning(
            "mirror damaged: moved aside and made anew from the remote and the bundles",
            mirror=str(mirror),
            moved_to=str(aside),
            repository=redact(url),
            damage=damage,
        )

    async def _blame_mirror(self, mirror: Path, url: str, exc: GitError) -> None:
        """Raise `MirrorDamaged` (and have the next use check the mirror again) when the
        mirror itself is why git failed; return when it is not."""
        damage = await _damage(mirror)
        if damage is None:
            return
        self._checked.discard(mirror)
        raise MirrorDamaged(
            f"the supervisor's mirror {mirror} of {redact(url)} is damaged ({damage}):"
            " it is made anew at its next use"
        ) from exc

    async def _fetch(self, mirror: Path, url: str) -> None:
        try:
            await _write(
                mirror, "fetch", "--quiet", "--prune", "--no-tags", "--", url, *_FETCH_REFSPECS
            )
        except GitError as exc:
            await self._blame_mirror(mirror, url, exc)
            raise RemoteFailed(f"cannot fetch {redact(url)}: {exc.reason}") from exc

    async def _verify(self, mirror: Path, bundle: str) -> str | None:
        """None when the bundle verifies against the mirror, else git's reason."""
        done = await _git(mirror, "bundle", "verify", "--quiet", bundle, check=False)
        if done.returncode == 0:
            return None
        return " ".join(redact(done.stderr.decode(errors="replace")).split())[-300:]


async def _git(
    mirror: Path, *args: str, env: Mapping[str, str] | None = None, check: bool = True
) -> GitOutput:
    """git on the mirror `mirror` itself (never a repository git would find above a damaged
    one), with `HARDENED`."""
    return await git(f"--git-dir={mirror}", *HARDENED, *args, cwd=mirror, env=env, check=check)


async def _write(
    mirror: Path,
    *args: str,
    ref: str | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> GitOutput:
    """A git command that writes to the mirror, then `_harden` of what it wrote (`ref`: the
    ref it made, when it made one)."""
    packs = await anyio.to_thread.run_sync(_pack_names, mirror)
    done = await _git(mirror, *args, env=env, check=check)
    await anyio.to_thread.run_sync(_harden, mirror, packs, ref)
    return done


def _remove_partials(mirror: Path) -> None:
    """Remove the half-made mirrors of `mirror` that a crash or a power cut left in the middle
    of `_create`: under the mirror's lock nothing else is making one."""
    for partial in mirror.parent.glob(f"{glob.escape(mirror.name)}.*.partial"):
        log.warning("mirror: removed a half-made mirror", partial=str(partial))
        shutil.rmtree(partial, ignore_errors=True)


def _pack_names(mirror: Path) -> frozenset[str]:
    try:
        return frozenset(os.listdir(mirror / "objects" / "pack"))
    except FileNotFoundError:
        return frozenset()


def _harden(mirror: Path, packs_before: frozenset[str] | None, ref: str | None) -> None:
    """Make durable what a git command wrote into `mirror`: the pack files that are new since
    `packs_before`, the ref `ref` and `packed-refs` (git syncs these itself from 2.36 on, with
    `HARDENED`), then every folder it may have put a name in, deepest first (git never syncs
    one). Blocking: run it on a worker thread."""
    packs = mirror / "objects" / "pack"
    files: list[Path] = []
    if packs_before is not None:
        files += [packs / n for n in sorted(set(_pack_names(mirror)) - packs_before)]
    files += [mirror / "packed-refs"] + ([mirror / ref] if ref else [])
    for path in files:
        try:
            durable.sync_file(path)
        except FileNotFoundError:  # a temporary git removed, or a ref packed by its gc
            continue
    folders: list[Path] = []
    if ref:
        at = (mirror / ref).parent
        while at != mirror / "refs" and at != at.parent:
            folders.append(at)
            at = at.parent
    for kind in ("heads", "tags"):
        folders += [Path(f) for f, _, _ in os.walk(mirror / "refs" / kind, topdown=False)]
    folders += [packs, mirror / "objects" / "info", mirror / "objects", mirror / "refs", mirror]
    durable.sync_folders(f for f in dict.fromkeys(folders) if f.is_dir())


async def _damage(mirror: Path) -> str | None:
    """None when `mirror` is a bare repository whose refs git reads and whose every ref names
    an object it holds, else what is wrong: the quick check of a mirror's first use."""
    for name in ("HEAD", "config"):
        try:
            size = (await anyio.Path(mirror / name).stat()).st_size
        except OSError:
            return f"it has no {name}"
        if size == 0:
            return f"its {name} is empty"
    done = await _git(
        mirror, "for-each-ref", "--format=%(objectname) %(objecttype) %(refname)", check=False
    )
    said = " ".join(redact(done.stderr.decode(errors="replace")).split())[-300:]
    if done.returncode != 0 or "broken ref" in said or "ignoring" in said:
        return f"git cannot read its refs: {said or f'exit code {done.returncode}'}"
    return None


def _same_or_taken(ref: str, existing: str, sha: str) -> str:
    if existing != sha:
        raise RefTaken(f"{ref} already names {existing}; refusing to move it to {sha}")
    return sha


async def _single_head(mirror: Path, bundle: str, name: str) -> str:
    listed = await _git(mirror, "bundle", "list-heads", bundle)
    shas = {line.split(" ", 1)[0] for line in listed.text.splitlines() if line.strip()}
    if len(shas) != 1 or not SHA.fullmatch(next(iter(shas))):
        raise BundleRefused(f"bundle {name} must carry exactly one head, it has {len(shas)}")
    return shas.pop()


async def _resolve(mirror: Path, ref: str) -> str | None:
    done = await _git(mirror, "rev-parse", "--verify", "--quiet", ref, check=False)
    if done.returncode != 0:
        return None
    return done.text.strip() or None


async def _is_commit(mirror: Path, sha: str) -> bool:
    done = await _git(mirror, "cat-file", "-t", sha, check=False)
    return done.returncode == 0 and done.text.strip() == "commit"
