"""What the supervisor observes about one report of a repository-bound step, for the ledger to
judge (docs/design.md, Repositories and candidates): the repository's head, the candidate's
bundle imported into the mirror and checked against the approval, and each check log's bytes.

Slow I/O, run by the result route before the ledger's rule and never inside it: git through
the mirror's subprocesses, hashing on a worker thread. A finding is data handed to the rule
(`Evidence.problems`), not a refusal: the ledger records the report either way and decides
what the findings do to the task. Only a remote that cannot be read stops the report
(`RepositoryUnavailable`): nothing is recorded and the runner retries.
"""

from __future__ import annotations

from tether.supervisor.artifacts import Held
from tether.supervisor.artifacts.port import Artifacts
from tether.supervisor.ledger import LedgerStore, Role
from tether.supervisor.ledger.repositories import Binding
from tether.supervisor.ledger.verification import Evidence, Finding, Problem
from tether.supervisor.repos.candidates import import_candidate
from tether.supervisor.repos.mirror import (
    BundleRefused,
    MirrorDamaged,
    Mirrors,
    NoSuchHead,
    RemoteFailed,
)
from tether.wire.records import Result


class RepositoryUnavailable(Exception):
    """The repository's remote cannot be read now; nothing was recorded, try again later."""

    def __init__(self, repository: str, reason: str) -> None:
        self.repository = repository
        self.detail = f"repository {repository!r} cannot be read now: {reason}"
        super().__init__(self.detail)


async def read_head(mirrors: Mirrors, binding: Binding) -> str:
    """The SHA the repository's remote HEAD names now (`git ls-remote`)."""
    try:
        return await mirrors.head(binding.url)
    except (RemoteFailed, NoSuchHead) as exc:
        raise RepositoryUnavailable(binding.repository, str(exc)) from exc


class PoolArtifacts:
    """The artifact store as one pool's runners may name it in a report: a digest counts
    only when a runner of `pool` uploaded it and its bytes still hash to it."""

    def __init__(self, store: Artifacts, ledger: LedgerStore, pool: str) -> None:
        self.store = store
        self.ledger = ledger
        self.pool = pool

    async def problem(self, digest: str, what: str) -> Problem | None:
        """None when `digest` (named as `what`) is the pool's and intact, else the finding."""
        owners = await self.ledger.artifact_owners(digest)
        if not any(o.role is Role.RUNNER and o.scope == self.pool for o in owners):
            return Problem(
                code=Finding.MISSING_ARTIFACT,
                detail=f"{what} {digest} was not uploaded by a runner of pool {self.pool!r}",
            )
        held = await self.store.held(digest)
        if held is Held.MISSING:
            return Problem(
                code=Finding.MISSING_ARTIFACT,
                detail=f"{what} {digest}: its bytes are not in the artifact store",
            )
        if held is Held.CHANGED:
            return Problem(
                code=Finding.ARTIFACT_MISMATCH,
                detail=f"{what} {digest}: the stored bytes no longer hash to it",
            )
        return None


async def gather(
    mirrors: Mirrors,
    store: Artifacts,
    ledger: LedgerStore,
    binding: Binding,
    rep: Result,
    *,
    step_id: str,
    fence: int,
    pool: str,
) -> Evidence:
    """The evidence about `rep`, the report of step `step_id` under `fence` by a runner of
    `pool`. Raises `RepositoryUnavailable` when the remote cannot be read."""
    artifacts = PoolArtifacts(store, ledger, pool)
    problems: list[Problem] = []
    # A verifier reports the candidate it was handed, not one of its own: nothing to import.
    if rep.candidate_sha is not None and binding.verifies is None:
        problems += await _candidate(
            mirrors, artifacts, binding, rep.candidate_sha, rep.bundle, step_id, fence
        )
    for name, run in rep.checks.items():
        found = await artifacts.problem(run.log, f"check {name!r}'s log")
        if found is not None:
            problems.append(found)
    # Read last, so the head the ledger compares with the approved base is as fresh as it
    # can be when the rule runs.
    head = await read_head(mirrors, binding)
    return Evidence(head_sha=head, problems=tuple(problems))


async def _candidate(
    mirrors: Mirrors,
    artifacts: PoolArtifacts,
    binding: Binding,
    sha: str,
    bundle: str | None,
    step_id: str,
    fence: int,
) -> list[Problem]:
    """The findings against candidate `sha`: its bundle, its import under the attempt's own
    ref, and the mirror's check against the approved base and allowed paths."""
    if bundle is None:
        return [
            Problem(
                code=Finding.UNKNOWN_CANDIDATE,
                detail=f"candidate {sha} came without a bundle: the supervisor cannot read it",
            )
        ]
    missing = await artifacts.problem(bundle, "the candidate's bundle")
    if missing is not None:
        return [missing]
    try:
        imported = await import_candidate(
            mirrors, artifacts.store, binding.url, bundle, binding.task_id, step_id, fence
        )
    except FileNotFoundError:  # removed since `problem` read it (by hand, from the folder)
        return [Problem(code=Finding.MISSING_ARTIFACT, detail=f"bundle {bundle} is gone")]
    except (RemoteFailed, MirrorDamaged) as exc:  # the remote or our mirror, not the bundle
        raise RepositoryUnavailable(binding.repository, str(exc)) from exc
    except BundleRefused as exc:
        return [Problem(code=Finding.BUNDLE_REFUSED, detail=str(exc))]
    if imported != sha:
        return [
            Problem(
                code=Finding.UNKNOWN_CANDIDATE,
                detail=f"the bundle's head is {imported}, not the candidate {sha}",
            )
        ]
    if binding.approved_base is None:  # a leased step's task is approved; kept for the types
        return [Problem(code=Finding.NOT_DESCENDANT, detail="the task has no approved base")]
    refusals = await mirrors.check_candidate(
        binding.url, binding.approved_base, sha, binding.allowed_paths, binding.allowed_entries
    )
    return [Problem(code=Finding(r.code.value), detail=r.detail) for r in refusals]
