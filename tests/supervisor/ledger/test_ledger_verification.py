"""Repository-bound tasks (docs/design.md, Approval, Verification, Repositories and
candidates): creation against a repository the tenant added, approval against the head the
supervisor read, leases carrying what the approval bound, and verification that judges the
evidence the adapters hand the ledger, each refusal by its `Finding` name."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import pytest

from tests.conftest import make_spec, queued_task, report_for
from tests.plain import plain
from tether.supervisor.ledger import (
    IdempotencyConflict,
    InvalidRequest,
    Lease,
    NotFound,
    SqliteLedger,
    StaleBase,
    StaleFence,
    StepSpec,
    TerminalState,
)
from tether.supervisor.ledger.repositories import add_repository
from tether.supervisor.ledger.store import LedgerStore
from tether.supervisor.ledger.verification import Evidence, Finding, Problem
from tether.wire import ErrorCode, Outcome
from tether.wire.records import CheckRun, CheckSpec

pytestmark = pytest.mark.backends

CHECKS = ("tests", "lint")
URL = "/srv/git/repo.git"
BASE = "base1"
AT_BASE = Evidence(head_sha=BASE)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def check_specs(names: tuple[str, ...] = CHECKS) -> tuple[CheckSpec, ...]:
    return tuple(CheckSpec(name=n, command=f"make {n}") for n in names)


async def add_repo(ledger: LedgerStore, name: str = "repo", tenant: str = "acme") -> None:
    await ledger.write(lambda tx: add_repository(tx, tenant, name, URL))


async def repo_task(
    ledger: SqliteLedger,
    key: str = "k1",
    steps: int = 1,
    checks: tuple[str, ...] = CHECKS,
    **extra: Any,
) -> str:
    """Add the repository, then create and approve a task bound to it at `BASE`."""
    await add_repo(ledger)
    spec = make_spec(
        key, steps, repository="repo", base_sha=BASE, checks=check_specs(checks), **extra
    )
    task_id = (await ledger.create_task(spec)).task_id
    await ledger.approve("acme", task_id, spec.plan_hash, BASE, BASE)
    return task_id


def ran(sha: str = "cand1", checks: tuple[str, ...] = CHECKS, exit_code: int = 0) -> dict[str, Any]:
    """A result's fields for a candidate, its bundle and a run of each of `checks` there."""
    return {
        "candidate_sha": sha,
        "bundle": digest(f"bundle {sha}"),
        "checks": {
            c: CheckRun(log=digest(f"{c} at {sha}"), exit_code=exit_code, duration_s=0.5)
            for c in checks
        },
    }


async def claim_one(ledger: SqliteLedger) -> Lease:
    [lease] = await ledger.claim("r1", "default", 1, 0, kinds=("chat", "agent"))
    return lease


async def run_step(
    ledger: SqliteLedger, evidence: Evidence = AT_BASE, **fields: Any
) -> tuple[Lease, Outcome]:
    lease = await claim_one(ledger)
    return lease, await ledger.report(report_for(lease, **fields), evidence=evidence)


# -- verification ---------------------------------------------------------------------------


async def test_a_candidate_with_passing_checks_and_clean_evidence_succeeds(
    ledger: SqliteLedger,
) -> None:
    task_id = await repo_task(ledger)
    await run_step(ledger, **ran())
    view = plain(await ledger.task(task_id))
    assert (view["state"], view["reason"]) == ("SUCCEEDED", None)
    [step] = view["steps"]
    assert step["candidate_sha"] == "cand1"
    assert step["bundle"] == digest("bundle cand1")
    assert [(c["name"], c["exit_code"]) for c in step["checks"]] == [("lint", 0), ("tests", 0)]
    assert step["checks"][1]["log"] == digest("tests at cand1")
    assert (step["problems"], view["findings"]) == ([], [])
    assert await ledger.violations() == []


FROM_THE_EVIDENCE = [
    Finding.UNKNOWN_CANDIDATE,
    Finding.NOT_DESCENDANT,
    Finding.PATH_NOT_ALLOWED,
    Finding.BUNDLE_REFUSED,
    Finding.MISSING_ARTIFACT,
    Finding.ARTIFACT_MISMATCH,
    Finding.ENTRY_NOT_ALLOWED,
    Finding.MODE_CHANGED,
]


@pytest.mark.parametrize("code", FROM_THE_EVIDENCE, ids=str)
async def test_a_problem_the_evidence_found_fails_the_task_by_its_name(
    ledger: SqliteLedger, code: Finding
) -> None:
    task_id = await repo_task(ledger)
    problem = Problem(code=code, detail="what the adapter saw")
    await run_step(ledger, Evidence(head_sha=BASE, problems=(problem,)), **ran())
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert view["reason"] == f"{code}: what the adapter saw"
    assert view["steps"][0]["problems"] == [{"code": code.value, "detail": "what the adapter saw"}]
    assert view["findings"] == [{"code": code.value, "detail": "what the adapter saw"}]
    record = plain(await ledger.review(task_id))
    assert f"{code}: what the adapter saw" in record["unresolved_questions"]["value"]
    assert await ledger.violations() == []


async def test_no_candidate_fails_no_candidate(ledger: SqliteLedger) -> None:
    task_id = await repo_task(ledger)
    await run_step(ledger)
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert view["reason"] == "no_candidate: no step reported a candidate"


async def test_a_check_without_a_run_fails_missing_check(ledger: SqliteLedger) -> None:
    task_id = await repo_task(ledger)
    await run_step(ledger, **ran(checks=("tests",)))
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert view["reason"] == "missing_check: no run of check 'lint' at cand1"


async def test_runs_at_an_earlier_candidate_do_not_verify_the_final_one(
    ledger: SqliteLedger,
) -> None:
    task_id = await repo_task(ledger, steps=2)
    await run_step(ledger, **ran("cand1"))
    await run_step(ledger, candidate_sha="cand2", bundle=digest("bundle cand2"))
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert [f["code"] for f in view["findings"]] == ["missing_check", "missing_check"]
    assert view["reason"] == "missing_check: no run of check 'tests' at cand2"


async def test_a_check_that_exited_non_zero_fails_check_failed(ledger: SqliteLedger) -> None:
    task_id = await repo_task(ledger, checks=("tests",))
    await run_step(ledger, **ran(checks=("tests",), exit_code=1))
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    log = digest("tests at cand1")
    assert view["reason"] == f"check_failed: check 'tests' exited 1 at cand1 (log {log})"


async def test_expected_checks_without_commands_are_reported_by_the_step_kind(
    ledger: SqliteLedger,
) -> None:
    await add_repo(ledger)
    spec = make_spec(repository="repo", base_sha=BASE, expected_checks=("deploy",))
    task_id = (await ledger.create_task(spec)).task_id
    await ledger.approve("acme", task_id, spec.plan_hash, BASE, BASE)
    lease = await claim_one(ledger)
    assert lease.repository is not None
    assert lease.repository.checks == ()
    await ledger.report(report_for(lease, **ran(checks=("deploy",))), evidence=AT_BASE)
    assert plain(await ledger.task(task_id))["state"] == "SUCCEEDED"


async def test_a_head_off_the_base_at_a_commit_commits_the_step_and_fails_stale_base(
    ledger: SqliteLedger,
) -> None:
    task_id = await repo_task(ledger, steps=2)
    _, outcome = await run_step(ledger, Evidence(head_sha="base2"), **ran())
    assert outcome is Outcome.APPLIED
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert view["reason"] == "stale_base: approved base1, repository repo is at base2"
    assert [s["state"] for s in view["steps"]] == ["committed", "skipped"]
    assert await ledger.claim("r1", "default", 1, 0) == []  # no step runs on a moved base
    assert await ledger.violations() == []


async def test_a_repository_step_s_result_needs_evidence(ledger: SqliteLedger) -> None:
    task_id = await repo_task(ledger)
    lease = await claim_one(ledger)
    with pytest.raises(InvalidRequest, match="evidence"):
        await ledger.report(report_for(lease, **ran()))
    assert plain(await ledger.task(task_id))["steps"][0]["state"] == "leased"
    assert await ledger.report(report_for(lease, **ran()), evidence=AT_BASE) is Outcome.APPLIED


@pytest.mark.parametrize(
    "fields",
    [
        {"checks": ran()["checks"]},
        {"bundle": digest("b")},
        {"artifacts": {"coverage": digest("c")}},
    ],
    ids=["checks", "bundle", "artifacts"],
)
async def test_runs_bundles_and_artifacts_must_name_their_candidate(
    ledger: SqliteLedger, fields: dict[str, Any]
) -> None:
    task_id = await repo_task(ledger)
    lease = await claim_one(ledger)
    with pytest.raises(InvalidRequest, match="candidate_sha"):
        await ledger.report(report_for(lease, **fields), evidence=AT_BASE)
    assert plain(await ledger.task(task_id))["steps"][0]["state"] == "leased"


async def test_a_task_without_a_repository_verifies_as_before(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    lease = await claim_one(ledger)
    fields = {"candidate_sha": "c1", "artifacts": {"notes": digest("n")}}
    await ledger.report(report_for(lease, **fields))
    view = plain(await ledger.task(task_id))
    assert (view["state"], view["findings"]) == ("SUCCEEDED", [])
    assert lease.repository is None


# -- the review record ----------------------------------------------------------------------


async def test_the_review_record_shows_runs_removal_records_and_problems(
    ledger: SqliteLedger,
) -> None:
    task_id = await repo_task(ledger)
    cleanup = {
        "path": "/var/cache/tether/w/1",
        "bytes_removed": 2048,
        "files_removed": 3,
        "exists_after": False,
        "listed_after": False,
        "gone": True,
    }
    problem = Problem(code=Finding.PATH_NOT_ALLOWED, detail="README.md is outside src/")
    fields = ran(checks=("tests",))
    await run_step(
        ledger, Evidence(head_sha=BASE, problems=(problem,)), output={"cleanup": cleanup}, **fields
    )
    record = plain(await ledger.review(task_id))
    assert record["observed_checks"] == {
        "kind": "observation",
        "value": {"tests": {"log": digest("tests at cand1"), "exit_code": 0}, "lint": None},
    }
    proof = record["cleanup_proof"]["value"]
    assert proof["removed"] == [
        {
            "step_id": f"{task_id}.0",
            "path": "/var/cache/tether/w/1",
            "bytes_removed": 2048,
            "files_removed": 3,
            "gone": True,
        },
    ]
    assert proof["live_leases"] == 0
    assert record["unresolved_questions"]["value"] == [
        "path_not_allowed: README.md is outside src/",
        "missing_check: no run of check 'lint' at cand1",
    ]


# -- approval against the head --------------------------------------------------------------


async def approvable(ledger: SqliteLedger, key: str = "k1") -> tuple[str, str]:
    await add_repo(ledger)
    spec = make_spec(key, repository="repo", base_sha=BASE)
    return (await ledger.create_task(spec)).task_id, spec.plan_hash


async def test_approving_a_base_that_is_not_the_head_is_refused_stale_base(
    ledger: SqliteLedger,
) -> None:
    task_id, plan_hash = await approvable(ledger)
    before = plain(await ledger.task(task_id))
    with pytest.raises(StaleBase, match="base2") as refused:
        await ledger.approve("acme", task_id, plan_hash, BASE, "base2")
    assert refused.value.code is ErrorCode.STALE_BASE
    assert plain(await ledger.task(task_id)) == before
    assert before["state"] == "PLANNED"
    await ledger.approve("acme", task_id, plan_hash, "base2", "base2")
    assert plain(await ledger.task(task_id))["state"] == "QUEUED"


async def test_approving_a_repository_task_needs_the_head_read(ledger: SqliteLedger) -> None:
    task_id, plan_hash = await approvable(ledger)
    with pytest.raises(InvalidRequest, match="head"):
        await ledger.approve("acme", task_id, plan_hash, BASE)
    assert plain(await ledger.task(task_id))["state"] == "PLANNED"


async def test_a_repeated_approval_is_done_whatever_the_head_now(ledger: SqliteLedger) -> None:
    task_id, plan_hash = await approvable(ledger)
    await ledger.approve("acme", task_id, plan_hash, BASE, BASE)
    before = plain(await ledger.events(task_id, None, 0, 0))
    await ledger.approve("acme", task_id, plan_hash, BASE, BASE)
    assert plain(await ledger.events(task_id, None, 0, 0)) == before


# -- the webhook ------------------------------------------------------------------------------


async def test_a_moved_head_fails_the_approved_tasks_of_the_repository_at_once(
    ledger: SqliteLedger,
) -> None:
    running = await repo_task(ledger, "running", steps=2)
    lease = await claim_one(ledger)
    planned, _ = await approvable(ledger, "planned")
    await add_repo(ledger, "other")
    other_spec = make_spec("other", repository="other", base_sha=BASE)
    other = (await ledger.create_task(other_spec)).task_id
    await ledger.approve("acme", other, other_spec.plan_hash, BASE, BASE)
    await ledger.set_repository_head("acme", "repo", "base2")
    view = plain(await ledger.task(running))
    assert view["state"] == "FAILED"
    assert view["reason"] == "stale_base: approved base1, repository repo is at base2"
    assert view["steps"][0]["attempts"][0]["state"] == "failed"
    with pytest.raises(StaleFence):  # the runner learns at its next renew
        await ledger.renew(lease.step_id, lease.fence)
    with pytest.raises(TerminalState):  # or at its result
        await ledger.report(report_for(lease, **ran()), evidence=AT_BASE)
    assert plain(await ledger.task(planned))["state"] == "PLANNED"  # not approved: nothing bound
    assert plain(await ledger.task(other))["state"] == "QUEUED"
    events = plain(await ledger.events(planned, None, 0, 0))
    assert [e["data"] for e in events if e["kind"] == "base_changed"] == [{"head_sha": "base2"}]
    assert await ledger.violations() == []


async def test_a_head_reported_at_the_approved_base_fails_nothing(ledger: SqliteLedger) -> None:
    task_id = await repo_task(ledger)
    await ledger.set_repository_head("acme", "repo", BASE)
    await ledger.set_repository_head("globex", "repo", "elsewhere")  # another tenant's repo
    await run_step(ledger, **ran())
    assert plain(await ledger.task(task_id))["state"] == "SUCCEEDED"


# -- leases carry what the approval bound --------------------------------------------------


async def test_each_step_starts_at_the_latest_earlier_candidate(ledger: SqliteLedger) -> None:
    await repo_task(ledger, steps=3, allowed_paths=("src/", "tests/"))
    first, _ = await run_step(ledger, **ran("cand1", checks=()))
    second, _ = await run_step(ledger)  # a step without a candidate
    third = await claim_one(ledger)
    bound = [lease.repository for lease in (first, second, third)]
    assert all(r is not None for r in bound)
    assert [(r.start_sha, r.start_bundle) for r in bound if r] == [
        (BASE, None),
        ("cand1", digest("bundle cand1")),
        ("cand1", digest("bundle cand1")),
    ]
    assert first.repository is not None
    assert (first.repository.name, first.repository.url, first.repository.base_sha) == (
        "repo",
        URL,
        BASE,
    )
    assert first.repository.allowed_paths == ("src/", "tests/")
    assert first.repository.checks == check_specs()


# -- creation -------------------------------------------------------------------------------


async def test_the_checks_names_are_the_expected_checks(ledger: SqliteLedger) -> None:
    task_id = await repo_task(ledger, checks=("tests", "lint"))
    assert plain(await ledger.review(task_id))["expected_checks"]["value"] == ["tests", "lint"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"expected_checks": ("tests",)}, "same checks"),
        ({"checks": check_specs(("tests", "tests"))}, "more than once"),
        ({"repository": None, "base_sha": None}, "repository"),
        ({"repository": "unknown"}, "tether-supervisor repo add unknown"),
        ({"checks": (CheckSpec(name="tests", command=" "),)}, "command line"),
    ],
    ids=["expected-differs", "twice", "no-repository", "unknown-repository", "no-command"],
)
async def test_checks_and_repositories_that_cannot_be_bound_are_refused(
    ledger: SqliteLedger, extra: dict[str, Any], message: str
) -> None:
    await add_repo(ledger)
    fields = {"repository": "repo", "base_sha": BASE, "checks": check_specs(), **extra}
    with pytest.raises(InvalidRequest, match=message):
        await ledger.create_task(make_spec(**fields))
    assert (await ledger.queue_depth()) == {}


async def test_expected_checks_naming_the_same_set_are_accepted(ledger: SqliteLedger) -> None:
    await add_repo(ledger)
    spec = make_spec(
        repository="repo", checks=check_specs(("tests", "lint")), expected_checks=("lint", "tests")
    )
    assert (await ledger.create_task(spec)).created


async def test_an_agent_step_of_a_repository_task_takes_the_task_s_allowed_paths(
    ledger: SqliteLedger,
) -> None:
    await add_repo(ledger)
    payload = {"messages": [{"role": "user", "content": "fix"}], "allowed_commands": []}
    step = StepSpec(name="fix", kind="agent", payload={**payload, "allowed_paths": ["src/"]})
    spec = dataclasses.replace(make_spec(repository="repo"), steps=(step,))
    with pytest.raises(InvalidRequest, match="allowed_paths"):
        await ledger.create_task(spec)
    fine = dataclasses.replace(spec, steps=(StepSpec(name="fix", kind="agent", payload=payload),))
    assert (await ledger.create_task(fine)).created


async def test_a_retried_create_must_repeat_the_checks(ledger: SqliteLedger) -> None:
    await add_repo(ledger)
    spec = make_spec(repository="repo", checks=check_specs())
    first = await ledger.create_task(spec)
    assert (await ledger.create_task(spec)).task_id == first.task_id
    commands = (CheckSpec(name="tests", command="pytest -x"), *check_specs(("lint",)))
    other = dataclasses.replace(spec, checks=commands)
    with pytest.raises(IdempotencyConflict):
        await ledger.create_task(other)


# -- bindings, for the adapters -------------------------------------------------------------


async def test_bindings_name_what_the_adapters_need(ledger: SqliteLedger) -> None:
    task_id = await repo_task(ledger, allowed_paths=("src/",))
    plain = await queued_task(ledger, "plain")
    bound = await ledger.binding_of_task("acme", task_id)
    assert bound is not None
    assert (bound.task_id, bound.tenant, bound.pool, bound.repository, bound.url) == (
        task_id,
        "acme",
        "default",
        "repo",
        URL,
    )
    assert (bound.approved_base, bound.allowed_paths, bound.expected_checks) == (
        BASE,
        ("src/",),
        CHECKS,
    )
    assert await ledger.binding_of_step(f"{task_id}.0", "default") == bound
    assert await ledger.binding_of_step(f"{task_id}.0", None) == bound
    assert await ledger.binding_of_task("acme", plain) is None
    with pytest.raises(NotFound):
        await ledger.binding_of_task("globex", task_id)
    with pytest.raises(NotFound):
        await ledger.binding_of_step(f"{task_id}.0", "other-pool")


async def test_a_binding_before_approval_has_no_base(ledger: SqliteLedger) -> None:
    task_id, _ = await approvable(ledger)
    bound = await ledger.binding_of_task("acme", task_id)
    assert bound is not None
    assert bound.approved_base is None
