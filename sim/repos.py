"""The repositories as the supervisor's adapters see them, modelled: each one's head (which the
operator may push at any moment), the commits runners make, the artifact store, and the
supervisor's mirror with its candidate refs `refs/tether/<task>/<step>/<fence>`, each created
only where none exists.

`Repos.gather` restates the result route's observation of one report (supervisor/repos/
evidence.py) over this model, so the ledger's rules get the evidence the real adapters would
hand them: the head as the report arrives, and a named problem for every forgery a runner made.
`Repos.work` is what a runner's attempt leaves behind: a candidate commit, its bundle and its
check logs, honest or forged in one named way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tether.supervisor.ledger.verification import Evidence, Finding, Problem
from tether.wire.records import CheckRun, LeaseRepository

BASE = "sha0"  # every repository's head when a schedule starts
ALLOWED = "src/"  # where an honest attempt writes
OUTSIDE = "secrets/"  # where a forged one writes
# The forgeries a runner may make, each found by the adapters under its own name.
FORGERIES = (
    Finding.UNKNOWN_CANDIDATE,
    Finding.NOT_DESCENDANT,
    Finding.PATH_NOT_ALLOWED,
    Finding.BUNDLE_REFUSED,
    Finding.MISSING_ARTIFACT,
    Finding.ARTIFACT_MISMATCH,
    Finding.CHECK_FAILED,
    Finding.MISSING_CHECK,
)


def candidate_ref(step_id: str, fence: int) -> str:
    """The mirror's ref for one attempt's candidate (`Mirrors.import_bundle`)."""
    task_id = step_id.rsplit(".", 1)[0]
    return f"refs/tether/{task_id}/{step_id}/{fence}"


@dataclasses.dataclass(frozen=True)
class Commit:
    parent: str | None  # None: a root, descending from nothing the mirror knows
    path: str  # the one path it changes


@dataclasses.dataclass(frozen=True)
class Bundle:
    prerequisite: str | None  # the commit the bundle starts from; None: a full history
    head: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Work:
    """What one attempt produced, for its report: candidate, bundle digest, check runs."""

    candidate: str | None
    bundle: str | None
    checks: dict[str, CheckRun]


class Repos:
    def __init__(self) -> None:
        self.heads: dict[tuple[str, str], str] = {}
        self.commits: dict[str, Commit] = {}  # every commit any runner made
        self.bundles: dict[str, Bundle] = {}  # digest -> what the uploaded bundle holds
        self.store: dict[str, bool] = {}  # digest -> its bytes still hash to it
        self.mirror: set[str] = {BASE}  # commits the supervisor's mirror holds
        self.refs: dict[str, str] = {}
        self.ref_log: list[str] = []  # each import's outcome, for the trace

    # -- the remote ---------------------------------------------------------------------------

    def head(self, tenant: str, repository: str) -> str:
        """The repository's head now, as `git ls-remote` reads it."""
        return self.heads.get((tenant, repository), BASE)

    def push(self, tenant: str, repository: str, sha: str) -> None:
        self.heads[(tenant, repository)] = sha
        self.mirror.add(sha)  # fetchable from the remote from now on

    # -- a runner's attempt -------------------------------------------------------------------

    def work(
        self,
        step_id: str,
        fence: int,
        repository: LeaseRepository | None,
        checks: Sequence[str],
        forgery: Finding | None = None,
        *,
        sha: str | None = None,
    ) -> Work:
        """The candidate commit, its bundle and its check logs of the attempt under `fence`,
        made honestly or with `forgery`. `sha` names the candidate (default `c<fence>`)."""
        start = repository.start_sha if repository is not None else BASE
        sha = sha or f"c{fence}"
        bundle: str | None = f"b{sha}"
        parent: str | None = start
        path = ALLOWED
        prerequisite: str | None = start
        head = sha
        if forgery is Finding.NOT_DESCENDANT:
            parent = prerequisite = None  # an unrelated history, bundled whole
        elif forgery is Finding.PATH_NOT_ALLOWED:
            path = OUTSIDE
        elif forgery is Finding.BUNDLE_REFUSED:
            prerequisite = f"gone{fence}"  # a base the mirror cannot fetch
        self.commits[sha] = Commit(parent=parent, path=path)
        runs = {name: CheckRun(log=f"d{sha}{name}", exit_code=0, duration_s=1.0) for name in checks}
        for run in runs.values():
            self.store[run.log] = True
        if forgery is Finding.UNKNOWN_CANDIDATE:
            if fence % 2:
                bundle = None  # a candidate the supervisor cannot read
            else:
                head = f"{sha}x"  # the bundle holds another commit
                self.commits[head] = Commit(parent=start, path=ALLOWED)
        if bundle is not None:
            self.bundles[bundle] = Bundle(prerequisite=prerequisite, head=head)
            self.store[bundle] = True
        named = sorted(runs)
        if forgery is Finding.MISSING_ARTIFACT:
            digest = runs[named[0]].log if named else bundle
            if digest is not None:
                del self.store[digest]
        elif forgery is Finding.ARTIFACT_MISMATCH and named:
            self.store[runs[named[0]].log] = False
        elif forgery is Finding.CHECK_FAILED and named:
            runs[named[0]] = CheckRun(log=runs[named[0]].log, exit_code=1, duration_s=1.0)
        elif forgery is Finding.MISSING_CHECK and named:
            del runs[named[0]]
        return Work(candidate=sha, bundle=bundle, checks=runs)

    # -- the supervisor's adapters ------------------------------------------------------------

    def gather(
        self,
        *,
        tenant: str,
        repository: str,
        approved_base: str | None,
        step_id: str,
        fence: int,
        candidate: str | None,
        bundle: str | None,
        checks: Mapping[str, CheckRun],
    ) -> Evidence:
        """What the result route observes about one report as it arrives (`evidence.gather`):
        the candidate's bundle imported under the attempt's own ref and checked, each check
        log's bytes, and the head, read last."""
        problems: list[Problem] = []
        if candidate is not None:
            problems += self._candidate(approved_base, step_id, fence, candidate, bundle)
        for name, run in sorted(checks.items()):
            found = self._artifact(run.log, f"check {name!r}'s log")
            if found is not None:
                problems.append(found)
        return Evidence(head_sha=self.head(tenant, repository), problems=tuple(problems))

    def _artifact(self, digest: str, what: str) -> Problem | None:
        intact = self.store.get(digest)
        if intact is None:
            return Problem(code=Finding.MISSING_ARTIFACT, detail=f"{what} {digest} is not stored")
        if not intact:
            return Problem(code=Finding.ARTIFACT_MISMATCH, detail=f"{what} {digest} changed")
        return None

    def _candidate(
        self, base: str | None, step_id: str, fence: int, sha: str, digest: str | None
    ) -> list[Problem]:
        if digest is None:
            return [Problem(code=Finding.UNKNOWN_CANDIDATE, detail=f"{sha} came without a bundle")]
        missing = self._artifact(digest, "the candidate's bundle")
        if missing is not None:
            return [missing]
        refused, imported = self.import_bundle(step_id, fence, digest)
        if refused is not None:
            return [refused]
        if imported != sha:
            return [
                Problem(
                    code=Finding.UNKNOWN_CANDIDATE,
                    detail=f"the bundle's head is {imported}, not the candidate {sha}",
                )
            ]
        return self.check_candidate(base, sha)

    def import_bundle(self, step_id: str, fence: int, digest: str) -> tuple[Problem | None, str]:
        """Verify the bundle against the mirror and create the attempt's ref at its head, only
        where no ref is; the same head again is fine, another one is refused (`RefTaken`)."""
        bundle = self.bundles[digest]
        ref = candidate_ref(step_id, fence)
        if bundle.prerequisite is not None and bundle.prerequisite not in self.mirror:
            self.ref_log.append(f"{ref} refused: {bundle.prerequisite} unknown")
            why = f"bundle {digest} does not verify: {bundle.prerequisite} is unknown"
            return Problem(code=Finding.BUNDLE_REFUSED, detail=why), bundle.head
        held = self.refs.get(ref)
        if held is None:
            self.refs[ref] = bundle.head
            self.mirror.add(bundle.head)
            self.ref_log.append(f"{ref} created at {bundle.head}")
        elif held != bundle.head:
            self.ref_log.append(f"{ref} holds {held}; {bundle.head} refused")
            why = f"{ref} already names {held}, not {bundle.head}"
            return Problem(code=Finding.BUNDLE_REFUSED, detail=why), bundle.head
        return None, bundle.head

    def check_candidate(self, base: str | None, sha: str) -> list[Problem]:
        """`Mirrors.check_candidate`: the candidate descends from the approved base and every
        commit since changes only allowed paths."""
        paths: set[str] = set()
        at: str | None = sha
        while at != base:
            commit = self.commits.get(at) if at is not None else None
            if commit is None:
                detail = f"{sha} does not descend from the approved base {base}"
                return [Problem(code=Finding.NOT_DESCENDANT, detail=detail)]
            paths.add(commit.path)
            at = commit.parent
        outside = sorted(p for p in paths if not p.startswith(ALLOWED))
        if outside:
            detail = f"{sha} changes {', '.join(outside)} outside the allowed paths"
            return [Problem(code=Finding.PATH_NOT_ALLOWED, detail=detail)]
        return []
