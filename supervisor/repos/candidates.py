"""Bringing a candidate into this supervisor's mirror from its bundle in the artifact store:
the one way a candidate gets there, whether for the evidence check of a report or for a
`git.push` of a task another supervisor verified (several supervisors on one PostgreSQL
ledger share the artifacts, not the mirrors)."""

from __future__ import annotations

import structlog

from tether.git import redact
from tether.supervisor.artifacts.port import Artifacts
from tether.supervisor.ledger import LedgerStore
from tether.supervisor.repos.mirror import MirrorError, Mirrors

log = structlog.get_logger("tether.supervisor")


async def import_candidate(
    mirrors: Mirrors,
    artifacts: Artifacts,
    url: str,
    bundle: str,
    task_id: str,
    step_id: str,
    fence: int,
) -> str:
    """Import the bundle `bundle` as the attempt's candidate into the mirror of `url`; answer
    the SHA it carries (`Mirrors.import_bundle`). `FileNotFoundError` when the store holds no
    such bytes; `BundleRefused`, `RemoteFailed` as the mirror raises them."""
    async with artifacts.local_file(bundle) as path:
        return await mirrors.import_bundle(url, path, task_id, step_id, fence)


class SharedCandidates:
    """Candidates a task's steps reported, found through the ledger and imported from their
    bundles: what a `git.push` taken by this supervisor's dispatcher needs when another
    supervisor verified the task, and what a mirror made anew gets back (`restore`). `ledger`
    is given once it is open: the effect kinds (and with them this) are assembled before the
    ledger, whose configuration names them."""

    def __init__(self, artifacts: Artifacts) -> None:
        self.artifacts = artifacts
        self.ledger: LedgerStore | None = None

    async def restore(self, mirrors: Mirrors, url: str) -> int:
        """Import into the mirror of `url` (just made: new, or anew after damage) every
        candidate the ledger holds committed for it, from its bundle; answer how many. One
        that cannot be imported now is logged and left: a report or a `git.push` that needs
        it imports it then."""
        if self.ledger is None:
            return 0
        restored = 0
        for c in await self.ledger.committed_candidates(url):
            try:
                await import_candidate(
                    mirrors, self.artifacts, url, c.bundle, c.task_id, c.step_id, c.fence
                )
            except (FileNotFoundError, MirrorError) as exc:
                log.warning(
                    "a committed candidate could not be brought back into its mirror",
                    repository=redact(url),
                    task_id=c.task_id,
                    step_id=c.step_id,
                    candidate=c.sha,
                    error=str(exc),
                )
            else:
                restored += 1
        if restored:
            log.info(
                "candidates brought back into a new mirror", repository=redact(url), count=restored
            )
        return restored

    async def bring(self, mirrors: Mirrors, url: str, task_id: str, sha: str) -> str | None:
        """Import candidate `sha` of task `task_id` into the mirror of `url` from the bundle of
        the latest step that reported it; None when done, else why it could not be."""
        if self.ledger is None:
            return "the ledger is not open"
        task = await self.ledger.task(task_id)
        reported = [
            (s, s.bundle, s.fence)
            for s in task.steps
            if s.candidate_sha == sha and s.bundle and s.fence is not None
        ]
        if not reported:
            return f"no step of task {task_id} reported {sha} with a bundle"
        step, bundle, fence = reported[-1]
        try:
            imported = await import_candidate(
                mirrors, self.artifacts, url, bundle, task_id, step.id, fence
            )
        except FileNotFoundError:
            return f"the bundle {bundle} is not in the artifact store"
        if imported != sha:
            return f"the bundle {bundle} carries {imported}, not {sha}"
        return None
