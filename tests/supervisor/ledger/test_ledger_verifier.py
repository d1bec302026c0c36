"""A verifier re-runs a task's checks (docs/design.md, Verification): with a verifier pool the
candidate's checks are run again by a runner of that pool, whose token made no part of the
candidate, before any effect falls due and before the task may succeed; a disagreement fails
the task `check_disputed`, naming both runners' tokens. Without one, the checks are only
`attested by runner <token>`."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import count, report_for
from tests.plain import plain
from tests.supervisor.ledger.test_ledger_outbox import approved, spec_with
from tests.supervisor.ledger.test_ledger_verification import (
    BASE,
    CHECKS,
    add_repo,
    check_specs,
    digest,
    ran,
)
from tether.supervisor.ledger import InvalidRequest, Lease, SqliteLedger, TaskSpec
from tether.supervisor.ledger.errors import NotFound
from tether.supervisor.ledger.verification import Evidence
from tether.wire import Outcome
from tether.wire.records import CheckRun

pytestmark = pytest.mark.backends

VERIFY_POOL = "acme/verify"
AGENT_KINDS = ("chat", "agent")
MAKER, CHECKER = "tok-maker", "tok-checker"
PUSH = ("push", "git.push", {"branch": "main"})


def verified_spec(*steps: tuple[str, str, Any], **extra: Any) -> TaskSpec:
    extra.setdefault("verify", VERIFY_POOL)
    extra.setdefault("checks", check_specs())
    return spec_with(*steps, repository="repo", base_sha=BASE, **extra)


async def verified_task(ledger: SqliteLedger, *steps: tuple[str, str, Any], **extra: Any) -> str:
    await add_repo(ledger)
    return await approved(ledger, verified_spec(*steps, **extra), BASE)


async def make_candidate(ledger: SqliteLedger, exit_code: int = 0) -> Lease:
    """The making runner (token MAKER, pool default) reports candidate `cand1` whose checks
    exited `exit_code`."""
    [lease] = await ledger.claim("maker", "default", 1, 0, token_id=MAKER, kinds=AGENT_KINDS)
    fields = ran("cand1", exit_code=exit_code)
    await ledger.report(
        report_for(lease, **fields), evidence=Evidence(head_sha=BASE), token_id=MAKER
    )
    return lease


async def claim_verify(ledger: SqliteLedger, token_id: str = CHECKER) -> list[Lease]:
    return await ledger.claim(
        "checker", VERIFY_POOL, 1, 0, token_id=token_id, kinds=("verify", *AGENT_KINDS)
    )


def verifier_report(lease: Lease, exit_code: int, sha: str = "cand1") -> Any:
    checks = {
        c: CheckRun(log=digest(f"verifier {c} at {sha}"), exit_code=exit_code, duration_s=1.0)
        for c in CHECKS
    }
    return report_for(lease, output={"checks": "ran"}, candidate_sha=sha, checks=checks)


async def test_the_verify_step_goes_to_the_verifier_pool_only_and_holds_the_task(
    ledger: SqliteLedger,
) -> None:
    task_id = await verified_task(ledger, ("code", "chat", {}), PUSH)
    await make_candidate(ledger)
    view = plain(await ledger.task(task_id))
    assert view["state"] == "RUNNING"
    assert view["verify_pool"] == VERIFY_POOL
    verify = view["steps"][-1]
    assert (verify["kind"], verify["state"]) == ("verify", "queued")
    assert count(ledger, "outbox") == 0  # the push is not due before a verifier agreed
    # Not to the making pool, not to a claim without a token, not to the making token.
    assert await ledger.claim("maker", "default", 4, 0, token_id=MAKER, kinds=("verify",)) == []
    assert await ledger.claim("anon", VERIFY_POOL, 4, 0, kinds=("verify",)) == []
    assert await claim_verify(ledger, token_id=MAKER) == []
    [lease] = await claim_verify(ledger)
    assert lease.kind == "verify"
    assert lease.payload == {"candidate_sha": "cand1", "bundle": digest("bundle cand1")}
    assert lease.repository is not None
    assert (lease.repository.start_sha, lease.repository.start_bundle) == (
        "cand1",
        digest("bundle cand1"),
    )
    assert [c.name for c in lease.repository.checks] == list(CHECKS)
    assert lease.outputs == ()
    # Its step is the verifier pool's: the making pool cannot see it.
    with pytest.raises(NotFound):
        await ledger.renew(lease.step_id, lease.fence, "default", token_id=CHECKER)


async def test_a_verifier_that_agrees_lets_the_effect_fall_due_and_the_task_succeed(
    ledger: SqliteLedger,
) -> None:
    task_id = await verified_task(ledger, ("code", "chat", {}), PUSH)
    await make_candidate(ledger)
    assert "attested by runner tok-maker" in plain(await ledger.task(task_id))["checks_standing"]
    [lease] = await claim_verify(ledger)
    outcome = await ledger.report(
        verifier_report(lease, 0), VERIFY_POOL, Evidence(head_sha=BASE), token_id=CHECKER
    )
    assert outcome is Outcome.APPLIED
    [out] = await ledger.take_effects("d1", 8)
    assert out.request["candidate"] == "cand1"
    view = plain(await ledger.task(task_id))
    assert view["checks_standing"] == (
        f"verified by runner {CHECKER} of pool {VERIFY_POOL!r}; attested by runner {MAKER}"
    )
    assert await ledger.violations() == []


async def test_a_verifier_that_disagrees_fails_the_task_check_disputed_naming_both_tokens(
    ledger: SqliteLedger,
) -> None:
    task_id = await verified_task(ledger, ("code", "chat", {}), PUSH)
    await make_candidate(ledger, exit_code=0)  # the maker says its checks passed
    [lease] = await claim_verify(ledger)
    await ledger.report(
        verifier_report(lease, 1), VERIFY_POOL, Evidence(head_sha=BASE), token_id=CHECKER
    )
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert view["reason"].startswith("check_disputed: ")
    assert MAKER in view["reason"]
    assert CHECKER in view["reason"]
    assert view["checks_standing"].startswith("disputed: check_disputed: ")
    assert count(ledger, "outbox") == 0  # the push never fell due
    review = plain(await ledger.review(task_id))
    assert review["verdict"]["acceptable"] is False
    assert review["checks"]["value"].startswith("disputed: ")
    assert await ledger.violations() == []


async def test_a_verifier_guards_the_end_of_a_task_without_effects(ledger: SqliteLedger) -> None:
    task_id = await verified_task(ledger, ("code", "chat", {}))
    await make_candidate(ledger)
    assert plain(await ledger.task(task_id))["state"] == "RUNNING"
    [lease] = await claim_verify(ledger)
    await ledger.report(
        verifier_report(lease, 0), VERIFY_POOL, Evidence(head_sha=BASE), token_id=CHECKER
    )
    assert plain(await ledger.task(task_id))["state"] == "SUCCEEDED"


async def test_a_candidate_failing_its_own_checks_fails_without_asking_a_verifier(
    ledger: SqliteLedger,
) -> None:
    task_id = await verified_task(ledger, ("code", "chat", {}))
    await make_candidate(ledger, exit_code=1)
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert view["reason"].startswith("check_failed: ")
    assert [s["kind"] for s in view["steps"]] == ["chat"]


async def test_a_verify_report_for_another_candidate_is_refused(ledger: SqliteLedger) -> None:
    task_id = await verified_task(ledger, ("code", "chat", {}))
    await make_candidate(ledger)
    [lease] = await claim_verify(ledger)
    with pytest.raises(InvalidRequest, match="must name that candidate_sha"):
        await ledger.report(
            verifier_report(lease, 0, sha="other"),
            VERIFY_POOL,
            Evidence(head_sha=BASE),
            token_id=CHECKER,
        )
    assert plain(await ledger.task(task_id))["state"] == "RUNNING"


async def test_without_a_verifier_the_checks_are_attested_by_the_runner(
    ledger: SqliteLedger,
) -> None:
    task_id = await verified_task(ledger, ("code", "chat", {}), verify=None)
    await make_candidate(ledger)
    view = plain(await ledger.task(task_id))
    assert view["state"] == "SUCCEEDED"
    assert view["checks_standing"] == f"attested by runner {MAKER}"
    assert plain(await ledger.review(task_id))["checks"]["value"] == f"attested by runner {MAKER}"


async def test_a_tenant_default_verifier_applies_to_tasks_with_checks(
    ledger: SqliteLedger,
) -> None:
    await ledger.set_verify_pool("acme", VERIFY_POOL)
    task_id = await verified_task(ledger, ("code", "chat", {}), verify=None)
    assert plain(await ledger.task(task_id))["verify_pool"] == VERIFY_POOL
    unverified = (await ledger.create_task(spec_with(("c", "chat", {}), key="plain"))).task_id
    assert plain(await ledger.task(unverified))["verify_pool"] is None


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"verify": "default"}, "the task's own pool"),
        ({"verify": "bad pool!"}, "'verify.pool'"),
        ({"verify": VERIFY_POOL, "checks": ()}, "name them in 'checks'"),
    ],
)
async def test_a_verifier_that_cannot_verify_is_refused_at_create(
    ledger: SqliteLedger, extra: dict[str, Any], words: str
) -> None:
    await add_repo(ledger)
    with pytest.raises(InvalidRequest, match=words):
        await ledger.create_task(verified_spec(("code", "chat", {}), **extra))
    assert count(ledger, "tasks") == 0


def test_the_verifier_is_bound_into_the_plan_hash() -> None:
    with_verifier = verified_spec(("code", "chat", {}))
    without = verified_spec(("code", "chat", {}), verify=None)
    other = verified_spec(("code", "chat", {}), verify="acme/other")
    assert len({with_verifier.plan_hash, without.plan_hash, other.plan_hash}) == 3


async def test_the_verifier_is_handed_the_setup_the_making_step_ran(ledger: SqliteLedger) -> None:
    await verified_task(ledger, ("code", "chat", {"setup": ["uv sync --frozen"]}))
    await make_candidate(ledger)
    [lease] = await claim_verify(ledger)
    assert lease.payload["setup"] == ["uv sync --frozen"]
