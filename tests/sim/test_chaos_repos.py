"""The explorer's repository model restates the adapters' observation of a report
(supervisor/repos/evidence.py): one ref per attempt, created only where none is; a candidate
checked against the approved base cumulatively; each forgery found under its own name."""

from __future__ import annotations

import pytest

from tether.sim.repos import BASE, FORGERIES, Repos, candidate_ref
from tether.supervisor.ledger.verification import Evidence, Finding
from tether.wire.records import LeaseRepository


def bound(start: str = BASE) -> LeaseRepository:
    return LeaseRepository(
        name="repo0",
        url="/srv/git/repo0.git",
        base_sha=BASE,
        start_sha=start,
        allowed_paths=("src/",),
    )


def observe(repos: Repos, step_id: str, fence: int, forgery: Finding | None = None) -> Evidence:
    work = repos.work(step_id, fence, bound(), ["lint", "test"], forgery)
    return repos.gather(
        tenant="acme",
        repository="repo0",
        approved_base=BASE,
        step_id=step_id,
        fence=fence,
        candidate=work.candidate,
        bundle=work.bundle,
        checks=work.checks,
    )


def test_an_honest_attempt_is_clean_and_gets_its_own_ref() -> None:
    repos = Repos()
    assert observe(repos, "T1.0", 3) == Evidence(head_sha=BASE)
    assert repos.refs == {candidate_ref("T1.0", 3): "c3"} == {"refs/tether/T1/T1.0/3": "c3"}


@pytest.mark.parametrize("forgery", FORGERIES)
def test_each_forgery_is_found_under_its_own_name(forgery: Finding) -> None:
    evidence = observe(Repos(), "T1.0", 3, forgery)
    if forgery in (Finding.CHECK_FAILED, Finding.MISSING_CHECK):
        assert evidence.problems == ()  # the ledger's to find, from the check runs
    else:
        assert [p.code for p in evidence.problems] == [forgery]


def test_a_ref_is_created_only_where_none_is() -> None:
    repos = Repos()
    observe(repos, "T1.0", 3)
    assert observe(repos, "T1.0", 3).problems == ()  # the same bundle again: the same head
    # another commit for the committed attempt's ref is refused, and the ref does not move
    work = repos.work("T1.0", 3, bound(), [], sha="c9late")
    evidence = repos.gather(
        tenant="acme",
        repository="repo0",
        approved_base=BASE,
        step_id="T1.0",
        fence=3,
        candidate=work.candidate,
        bundle=work.bundle,
        checks={},
    )
    assert [p.code for p in evidence.problems] == [Finding.BUNDLE_REFUSED]
    assert repos.refs == {"refs/tether/T1/T1.0/3": "c3"}


def test_a_later_candidate_carries_an_earlier_steps_forgery() -> None:
    repos = Repos()
    observe(repos, "T1.0", 3, Finding.PATH_NOT_ALLOWED)
    work = repos.work("T1.1", 4, bound(start="c3"), [])
    assert [p.code for p in repos.check_candidate(BASE, work.candidate or "")] == [
        Finding.PATH_NOT_ALLOWED
    ]


def test_the_head_is_read_as_the_report_arrives() -> None:
    repos = Repos()
    work = repos.work("T1.0", 3, bound(), [])
    repos.push("acme", "repo0", "sha7")
    evidence = repos.gather(
        tenant="acme",
        repository="repo0",
        approved_base=BASE,
        step_id="T1.0",
        fence=3,
        candidate=work.candidate,
        bundle=work.bundle,
        checks={},
    )
    assert evidence == Evidence(head_sha="sha7")
    assert repos.head("globex", "repo0") == BASE  # another tenant's repository did not move
