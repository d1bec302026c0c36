"""A task's candidate as an operator takes it: the diff against the approved base (files with
their added and removed lines, the patch, bounded) and a bundle whose one head is the branch
`tether/<task_id>`, so `git fetch FILE tether/<task_id>` takes it into any clone that has the
base. Both read the supervisor's mirror, never the remote, and write nothing to the mirror:
the bundle's branch lives in a scratch repository that borrows the mirror's objects."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Final

from tether.git import GitError, git
from tether.supervisor.repos.mirror import HARDENED, SHA
from tether.wire.records import CandidateDiffView, FileChangeView, TaskDetail

# What the diff answer carries of the patch; the rest is cut and `truncated` says so.
PATCH_MAX_BYTES: Final = 512 * 1024


class CandidateError(Exception):
    """The task has no such candidate, or the mirror does not hold it; the message says
    which."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """Which commit of which step to show, against which base, in which mirror."""

    task_id: str
    step: str
    base_sha: str
    candidate_sha: str


@dataclasses.dataclass(frozen=True)
class FileChange:
    """One changed file: lines added and removed (None for a binary file)."""

    path: str
    added: int | None
    removed: int | None


@dataclasses.dataclass(frozen=True)
class CandidateDiff:
    candidate: Candidate
    files: tuple[FileChange, ...]
    patch: str
    truncated: bool

    def view(self) -> CandidateDiffView:
        """As the API answers it (and the CLI prints it, from the API or the ledger)."""
        c = self.candidate
        return CandidateDiffView(
            task_id=c.task_id,
            step=c.step,
            base_sha=c.base_sha,
            candidate_sha=c.candidate_sha,
            branch=branch_of(c.task_id),
            files=tuple(
                FileChangeView(path=f.path, added=f.added, removed=f.removed) for f in self.files
            ),
            patch=self.patch,
            truncated=self.truncated,
        )


def branch_of(task_id: str) -> str:
    """The branch a candidate's bundle names: `tether/<task_id>`."""
    return f"tether/{task_id}"


def pick(task: TaskDetail, step: str | None) -> Candidate:
    """The candidate of the step `step` names (its name, id or 0-based position), or of the
    last step that has one, against the task's approved base."""
    steps = task.steps
    if step is None:
        found = [s for s in steps if s.candidate_sha]
        if not found:
            raise CandidateError(f"task {task.id} has no candidate ({task.state})")
        chosen = found[-1]
    else:
        named = [s for s in steps if step in (s.name, s.id)]
        if not named and step.isdigit() and int(step) < len(steps):
            named = [steps[int(step)]]
        if not named:
            names = ", ".join(repr(s.name) for s in steps)
            raise CandidateError(f"task {task.id} has no step {step!r} (steps: {names})")
        chosen = named[0]
    if not chosen.candidate_sha:
        raise CandidateError(
            f"step {chosen.name!r} of task {task.id} has no candidate ({chosen.state})"
        )
    base = task.base_sha
    if not base or not SHA.fullmatch(base):
        raise CandidateError(f"task {task.id} has no approved base to compare with")
    return Candidate(
        task_id=task.id, step=chosen.name, base_sha=base, candidate_sha=chosen.candidate_sha
    )


async def _read(mirror: Path, *args: str) -> bytes:
    if not (mirror / "objects").is_dir():
        raise CandidateError(f"the supervisor has no mirror at {mirror}")
    try:
        done = await git(f"--git-dir={mirror}", *HARDENED, *args, cwd=mirror)
    except GitError as exc:
        raise CandidateError(f"git could not read the mirror: {exc.reason}") from None
    return done.stdout


async def _present(mirror: Path, candidate: Candidate) -> None:
    for sha in (candidate.base_sha, candidate.candidate_sha):
        try:
            await _read(mirror, "cat-file", "-e", f"{sha}^{{commit}}")
        except CandidateError:
            raise CandidateError(
                f"commit {sha} of task {candidate.task_id} is not in the supervisor's mirror"
            ) from None


async def diff(mirror: Path, candidate: Candidate) -> CandidateDiff:
    """The candidate against its base: each file's counts, and the patch up to
    `PATCH_MAX_BYTES` (the answer says when it was cut)."""
    await _present(mirror, candidate)
    span = (candidate.base_sha, candidate.candidate_sha)
    numstat = await _read(mirror, "diff", "--no-ext-diff", "--no-renames", "--numstat", "-z", *span)
    files = []
    for entry in numstat.split(b"\0"):
        added, _, rest = entry.partition(b"\t")
        removed, _, path = rest.partition(b"\t")
        if path:
            files.append(
                FileChange(
                    path=path.decode(errors="replace"),
                    added=int(added) if added.isdigit() else None,
                    removed=int(removed) if removed.isdigit() else None,
                )
            )
    patch = await _read(mirror, "diff", "--no-ext-diff", "--no-renames", "--no-color", *span)
    return CandidateDiff(
        candidate=candidate,
        files=tuple(files),
        patch=patch[:PATCH_MAX_BYTES].decode(errors="replace"),
        truncated=len(patch) > PATCH_MAX_BYTES,
    )


async def bundle(mirror: Path, candidate: Candidate) -> bytes:
    """A git bundle of `base..candidate` whose one head is `refs/heads/tether/<task_id>`:
    made in a scratch repository that borrows the mirror's objects (git alternates)."""
    await _present(mirror, candidate)
    ref = f"refs/heads/{branch_of(candidate.task_id)}"
    with tempfile.TemporaryDirectory(prefix="tether-bundle-") as scratch:
        work = Path(scratch) / "candidate.git"
        try:
            await git("init", "--quiet", "--bare", str(work), cwd=Path(scratch))
            (work / "objects" / "info" / "alternates").write_text(f"{mirror / 'objects'}\n")
            await git(f"--git-dir={work}", "update-ref", ref, candidate.candidate_sha, cwd=work)
            out = Path(scratch) / "candidate.bundle"
            span = (ref, f"^{candidate.base_sha}")
            await git(f"--git-dir={work}", "bundle", "create", "--quiet", str(out), *span, cwd=work)
        except GitError as exc:
            raise CandidateError(f"git could not write the bundle: {exc.reason}") from None
        return out.read_bytes()


@dataclasses.dataclass(frozen=True)
class Hunk:
    header: str
    lines: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FilePatch:
    path: str
    added: int | None
    removed: int | None
    hunks: tuple[Hunk, ...]


def by_file(found: CandidateDiff) -> list[FilePatch]:
    """The patch split per file and hunk, for the page: each file with its counts."""
    counts = {f.path: f for f in found.files}
    files: list[FilePatch] = []
    path: str | None = None
    hunks: list[Hunk] = []
    lines: list[str] = []
    header: str | None = None

    def close_hunk() -> None:
        if header is not None:
            hunks.append(Hunk(header=header, lines=tuple(lines)))

    def close_file() -> None:
        if path is not None:
            close_hunk()
            change = counts.get(path)
            files.append(
                FilePatch(
                    path=path,
                    added=change.added if change else None,
                    removed=change.removed if change else None,
                    hunks=tuple(hunks),
                )
            )

    for line in found.patch.splitlines():
        if line.startswith("diff --git "):
            close_file()
            path, hunks, lines, header = line.split(" b/", 1)[-1], [], [], None
        elif line.startswith("+++ b/"):
            path = line[len("+++ b/") :]
        elif line.startswith("@@"):
            close_hunk()
            header, lines = line, []
        elif header is not None:
            lines.append(line)
    close_file()
    return files
