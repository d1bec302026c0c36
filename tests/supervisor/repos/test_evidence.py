"""What the supervisor observes about a repository-bound step's report (docs/design.md,
Repositories and candidates): `tether.supervisor.repos.evidence.gather` against real git
repositories, a real artifact store and the ledger's upload records. Each forged report yields
its named finding; a remote that cannot be read stops the report instead."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.agent_repos import make_origin, sh
from tests.conftest import ApiHarness, FakeClock, open_api
from tests.supervisor.repos.test_repos_mirror import Origin, rev
from tether.supervisor.artifacts import ArtifactStore
from tether.supervisor.ledger.repositories import Binding
from tether.supervisor.ledger.verification import Evidence, Finding
from tether.supervisor.repos import Mirrors, candidate_ref
from tether.supervisor.repos.evidence import RepositoryUnavailable, gather
from tether.wire.records import CheckRun, Result

TASK, STEP = "task1", "task1.0"
FIXED = {"src/app.py": "def answer():\n    return 42\n"}
LOG = b"1 passed in 0.01s\n"


@pytest.fixture
def origin(tmp_path: Path) -> Origin:
    seed, base = make_origin(tmp_path / "seed")
    bare = tmp_path / "origin.git"
    sh("git", "clone", "--quiet", "--bare", str(seed), str(bare), cwd=tmp_path)
    work = tmp_path / "work"
    sh("git", "clone", "--quiet", str(bare), str(work), cwd=tmp_path)
    return Origin(url=str(bare), work=work, base=base, root=tmp_path)


@pytest.fixture
async def api(tmp_path: Path, clock: FakeClock) -> AsyncIterator[ApiHarness]:
    async with open_api(tmp_path / "api.db", clock, synchronous="OFF") as harness:
        yield harness


def binding(origin: Origin, **changes: object) -> Binding:
    fields: dict[str, object] = {
        "task_id": TASK,
        "tenant": "acme",
        "pool": "default",
        "repository": "app",
        "url": origin.url,
        "approved_base": origin.base,
        "allowed_paths": ("src/",),
        "expected_checks": ("tests",),
    }
    return Binding(**(fields | changes))  # type: ignore[arg-type]


async def upload(api: ApiHarness, data: bytes, who: str = "runner") -> str:
    digest = hashlib.sha256(data).hexdigest()
    response: httpx.Response = await api.client.put(
        f"/v1/artifacts/{digest}", headers=api.auth(who), content=data
    )
    assert response.status_code == 200, response.text
    return digest


def candidate(origin: Origin, label: str, changes: dict[str, str]) -> tuple[bytes, str]:
    """A runner's bundle of `changes` on the base, and the candidate SHA it carries."""
    path = origin.candidate(label, changes)
    return path.read_bytes(), rev(origin.root / f"runner-{label}", "HEAD")


def report(fence: int = 1, **fields: object) -> Result:
    return Result(fence=fence, payload_hash="h", output="done", **fields)  # type: ignore[arg-type]


async def observe(api: ApiHarness, origin: Origin, rep: Result, **changes: object) -> Evidence:
    store: ArtifactStore = api.app.state.artifacts
    mirrors: Mirrors = api.app.state.mirrors
    return await gather(
        mirrors,
        store,
        api.app.state.ledger,
        binding(origin, **changes),
        rep,
        step_id=STEP,
        fence=rep.fence,
        pool="default",
    )


def codes(evidence: Evidence) -> list[Finding]:
    return [p.code for p in evidence.problems]


async def test_a_good_candidate_has_no_finding_and_its_own_ref(
    api: ApiHarness, origin: Origin
) -> None:
    data, sha = candidate(origin, "a", FIXED)
    bundle = await upload(api, data)
    log = await upload(api, LOG)
    checks = {"tests": CheckRun(log=log, exit_code=0, duration_s=0.5)}
    rep = report(candidate_sha=sha, bundle=bundle, checks=checks)
    evidence = await observe(api, origin, rep)
    assert evidence == Evidence(head_sha=origin.base, problems=())
    mirror = api.app.state.mirrors.path(origin.url)
    assert rev(mirror, candidate_ref(TASK, STEP, 1)) == sha


async def test_a_report_without_a_candidate_still_reads_the_head(
    api: ApiHarness, origin: Origin
) -> None:
    moved = origin.push("README.md", "# moved\n")
    assert await observe(api, origin, report()) == Evidence(head_sha=moved, problems=())


async def test_a_candidate_without_a_bundle_is_unknown(api: ApiHarness, origin: Origin) -> None:
    evidence = await observe(api, origin, report(candidate_sha="c" * 40))
    assert codes(evidence) == [Finding.UNKNOWN_CANDIDATE]
    assert "without a bundle" in evidence.problems[0].detail


async def test_a_bundle_whose_head_is_not_the_candidate_is_unknown(
    api: ApiHarness, origin: Origin
) -> None:
    data, sha = candidate(origin, "a", FIXED)
    evidence = await observe(
        api, origin, report(candidate_sha="d" * 40, bundle=await upload(api, data))
    )
    assert codes(evidence) == [Finding.UNKNOWN_CANDIDATE]
    assert sha in evidence.problems[0].detail


async def test_a_bundle_another_pool_uploaded_is_missing(api: ApiHarness, origin: Origin) -> None:
    data, sha = candidate(origin, "a", FIXED)
    bundle = await upload(api, data, who="stranger")  # a runner of pool `elsewhere`
    evidence = await observe(api, origin, report(candidate_sha=sha, bundle=bundle))
    assert codes(evidence) == [Finding.MISSING_ARTIFACT]
    assert "pool 'default'" in evidence.problems[0].detail
    # Nothing was imported: the mirror has no ref for the attempt.
    mirror = api.app.state.mirrors.path(origin.url)
    assert not (mirror / candidate_ref(TASK, STEP, 1)).exists()


async def test_a_bundle_whose_stored_bytes_changed_is_a_mismatch(
    api: ApiHarness, origin: Origin
) -> None:
    data, sha = candidate(origin, "a", FIXED)
    bundle = await upload(api, data)
    path = api.app.state.artifacts.path_of(bundle)
    path.chmod(0o600)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    evidence = await observe(api, origin, report(candidate_sha=sha, bundle=bundle))
    assert codes(evidence) == [Finding.ARTIFACT_MISMATCH]
    path.unlink()
    evidence = await observe(api, origin, report(candidate_sha=sha, bundle=bundle))
    assert codes(evidence) == [Finding.MISSING_ARTIFACT]


async def test_bytes_that_are_not_a_bundle_are_refused(api: ApiHarness, origin: Origin) -> None:
    bundle = await upload(api, b"not a git bundle\n")
    evidence = await observe(api, origin, report(candidate_sha="c" * 40, bundle=bundle))
    assert codes(evidence) == [Finding.BUNDLE_REFUSED]


async def test_a_candidate_touching_a_path_outside_allowed_paths(
    api: ApiHarness, origin: Origin
) -> None:
    data, sha = candidate(origin, "a", {"tests/test_app.py": "def test_answer():\n    pass\n"})
    evidence = await observe(api, origin, report(candidate_sha=sha, bundle=await upload(api, data)))
    assert codes(evidence) == [Finding.PATH_NOT_ALLOWED]
    assert "tests/test_app.py" in evidence.problems[0].detail


async def test_a_candidate_that_does_not_descend_from_the_approved_base(
    api: ApiHarness, origin: Origin
) -> None:
    """The approval bound a later commit; the runner's candidate was built on the old one."""
    later = origin.push("src/extra.py", "x = 1\n")
    data, sha = candidate(origin, "a", FIXED)  # on origin.base, not on `later`
    rep = report(candidate_sha=sha, bundle=await upload(api, data))
    evidence = await observe(api, origin, rep, approved_base=later)
    assert Finding.NOT_DESCENDANT in codes(evidence)
    assert evidence.head_sha == later


async def test_the_same_attempt_cannot_name_another_commit(api: ApiHarness, origin: Origin) -> None:
    """One ref per attempt, never moved: a second bundle under the same fence is refused,
    under another fence it gets its own ref and leaves the first as it was."""
    first, first_sha = candidate(origin, "a", FIXED)
    late, late_sha = candidate(origin, "b", {"src/app.py": "def answer():\n    return 43\n"})
    ok = await observe(
        api, origin, report(candidate_sha=first_sha, bundle=await upload(api, first))
    )
    assert ok.problems == ()
    late_bundle = await upload(api, late)
    again = await observe(api, origin, report(candidate_sha=late_sha, bundle=late_bundle))
    assert codes(again) == [Finding.BUNDLE_REFUSED]
    other = await observe(api, origin, report(2, candidate_sha=late_sha, bundle=late_bundle))
    assert other.problems == ()
    mirror = api.app.state.mirrors.path(origin.url)
    assert rev(mirror, candidate_ref(TASK, STEP, 1)) == first_sha
    assert rev(mirror, candidate_ref(TASK, STEP, 2)) == late_sha


async def test_check_logs_must_be_the_pools_and_intact(api: ApiHarness, origin: Origin) -> None:
    ours = await upload(api, LOG)
    theirs = await upload(api, b"elsewhere's log\n", who="stranger")
    changed = await upload(api, b"a log that will change\n")
    path = api.app.state.artifacts.path_of(changed)
    path.chmod(0o600)
    path.write_bytes(b"a log that did change\n")
    checks = {
        "lint": CheckRun(log=ours, exit_code=0, duration_s=0.1),
        "tests": CheckRun(log=theirs, exit_code=0, duration_s=0.1),
        "types": CheckRun(log=changed, exit_code=1, duration_s=0.1),
        "docs": CheckRun(log="e" * 64, exit_code=0, duration_s=0.1),
    }
    evidence = await observe(api, origin, report(checks=checks))
    found = {p.detail.split("'")[1]: p.code for p in evidence.problems}
    assert found == {
        "tests": Finding.MISSING_ARTIFACT,
        "types": Finding.ARTIFACT_MISMATCH,
        "docs": Finding.MISSING_ARTIFACT,
    }


async def test_an_unreadable_remote_is_unavailable_not_a_finding(
    api: ApiHarness, origin: Origin, tmp_path: Path
) -> None:
    with pytest.raises(RepositoryUnavailable) as caught:
        await observe(api, origin, report(), url=str(tmp_path / "gone.git"))
    assert caught.value.repository == "app"
    assert "repository 'app' cannot be read now" in caught.value.detail
