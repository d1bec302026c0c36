"""The wire contract's records: each survives the codec unchanged, a bad message is refused with
the code the API answers, and both sides speak through the very same classes."""

from __future__ import annotations

import msgspec
import pytest

from tests.conftest import ApiHarness
from tether.wire import ERRORS, ErrorCode, Outcome, ReleaseReason, RunnerAction, runner_action
from tether.wire import records as m
from tether.wire.codec import BadMessage, decode, encode, encode_strict

LEASE = m.Lease(
    step_id="t.1",
    task_id="t",
    name="draft",
    kind="chat",
    attempt=2,
    fence=7,
    payload={"messages": [{"role": "user", "content": "héllo"}]},
    payload_hash="a" * 64,
    ttl_s=30.0,
    renew_every_s=5.0,
    outputs=(m.EarlierOutput(step_id="t.0", name="outline", output={"text": "x", "n": [1, 2.5]}),),
)
RESULT = m.Result(
    fence=7,
    payload_hash="a" * 64,
    output={"text": "done", "none": None},
    usage={"total_tokens": 12},
    candidate_sha="c" * 40,
    artifacts={"tests": "d" * 64},
)

REPO_LEASE = msgspec.structs.replace(
    LEASE,
    kind="agent",
    repository=m.LeaseRepository(
        name="app",
        url="/srv/git/app.git",
        base_sha="b" * 40,
        start_sha="c" * 40,
        start_bundle="e" * 64,
        allowed_paths=("src/",),
        checks=(m.CheckSpec(name="tests", command="python -m pytest -q"),),
    ),
    resume=m.ResumePoint(
        turn=3,
        fence=6,
        transcript="f" * 64,
        bundle="0" * 64,
        sha="1" * 40,
        usage={"total_tokens": 900},
    ),
)
AGENT_RESULT = msgspec.structs.replace(
    RESULT,
    bundle="2" * 64,
    checks={"tests": m.CheckRun(log="3" * 64, exit_code=0, duration_s=1.25)},
)

CHAT_MESSAGE = {"role": "user", "content": "hello"}

RECORDS: list[m.Record] = [
    m.ClaimRequest(runner_id="r1", capacity=4, wait_s=2.5, kinds=("chat", "deploy")),
    LEASE,
    m.ClaimAnswer(leases=(LEASE, LEASE)),
    REPO_LEASE,
    AGENT_RESULT,
    AGENT_RESULT.for_step("t.1"),
    m.Checkpoint(
        fence=7,
        turn=2,
        transcript="4" * 64,
        bundle="5" * 64,
        sha="6" * 40,
        usage={"total_tokens": 40},
        step_usage={"total_tokens": 940},
    ),
    m.Checkpoint(fence=7, turn=1, transcript="4" * 64),
    m.Checkpointed(turn=2),
    m.LogLines(
        lines=(
            m.LogLine(
                step_id="t.1",
                fence=7,
                level="info",
                event="checkpoint",
                fields={"turn": 1, "wip": None},
            ),
            m.LogLine(step_id="t.1", fence=7, level="warning", event="model call failed"),
        )
    ),
    m.LogLinesKept(kept=2, refused=1, over_limit=0),
    m.TaskLogs(
        entries=(
            m.TaskLogEntry(
                source="journal",
                seq=3,
                at="2026-01-02T03:04:05.678Z",
                level="info",
                event="step_leased",
                state="RUNNING",
                step_id="t.1",
                fence=7,
            ),
            m.TaskLogEntry(
                source="runner",
                seq=3,
                line=9,
                at="2026-01-02T03:04:05.900Z",
                level="info",
                event="step leased",
                step_id="t.1",
                attempt=1,
                fence=7,
                runner_id="runner-a",
                fields={"kind": "chat"},
            ),
        ),
        next_seq=3,
        next_line=9,
    ),
    m.RenewRequest(fence=7),
    m.Renewals(leases=(m.LeaseRef(step_id="t.1", fence=7), m.LeaseRef(step_id="u.1", fence=9))),
    m.RenewalsAnswer(
        leases=(
            m.RenewalItem(
                step_id="t.1",
                ttl_s=30.0,
                renew_every_s=5.0,
                cancelled=False,
                budget_exhausted=False,
            ),
            m.RenewalItem(step_id="u.1", status=409, error="stale_fence", detail="fenced out"),
        )
    ),
    m.LeaseRef(step_id="t.1", fence=7),
    m.RenewalItem(step_id="t.1", status=404, error="not_found", detail="no step"),
    m.WantLeases(runner_id="r1", leases=3, kinds=("chat", "agent")),
    msgspec.structs.replace(RESULT, want=m.WantLeases(runner_id="r1", leases=2)),
    m.ResultAnswer(outcome=Outcome.APPLIED, leases=(LEASE,)),
    m.Renewal(ttl_s=30.0, renew_every_s=5.0, cancelled=False),
    m.Renewal(ttl_s=30.0, renew_every_s=5.0, cancelled=False, budget_exhausted=True),
    m.RunnerIdentity(pool="default", token_id="3f2a9c1b7d4e"),
    m.ReleaseRequest(fence=7, reason=ReleaseReason.OPERATOR, retryable=True, detail="no key"),
    m.ReleaseRequest(
        fence=7, reason=ReleaseReason.SHUTDOWN, retryable=True, usage={"total_tokens": 5}
    ),
    m.Released(),
    RESULT,
    m.Result(fence=0, payload_hash="h", output=None),
    RESULT.for_step("t.1"),
    m.Results(results=(RESULT.for_step("t.1"), RESULT.for_step("u.0"))),
    m.ResultAnswer(outcome=Outcome.REPLAYED),
    m.ResultsAnswer(
        results=(
            m.ItemAnswer(step_id="t.1", outcome=Outcome.APPLIED),
            m.ItemAnswer(step_id="u.0", status=409, error="stale_fence", detail="fence 3"),
        )
    ),
    m.ErrorBody(error="not_found", detail="no step t.9"),
    m.TaskCreate(
        idempotency_key="k",
        plan=m.Plan(
            steps=(
                m.PlanStep(name="a", kind="chat", payload={"messages": [CHAT_MESSAGE]}),
                m.PlanStep(name="b", kind="deploy", payload=[1]),
            )
        ),
        repository="repo",
        base_sha="b" * 40,
        allowed_paths=("src/",),
        expected_checks=("tests",),
        checks={"tests": "python -m pytest -q"},
        owner="ops",
        pool="gpu",
        verify=m.VerifySpec(pool="gpu/verify"),
    ),
    m.Approval(plan_hash="p" * 64, base_sha=None),
    m.CandidateDiffView(
        task_id="t",
        step="fix",
        base_sha="a" * 40,
        candidate_sha="c" * 40,
        branch="tether/t",
        files=(
            m.FileChangeView(path="src/calc.py", added=1, removed=1),
            m.FileChangeView(path="logo.png"),
        ),
        patch="@@ -1 +1 @@\n-a - b\n+a + b\n",
        truncated=False,
    ),
    m.Cancel(reason="not needed"),
    m.ReviewDecision(decision="accept", note="fine"),
    m.RepositoryHead(sha="e" * 40),
    m.Budget(tenant="acme", spent=12, budget=None, left=None),
    m.TaskDetail(
        id="t",
        tenant="acme",
        idempotency_key="k",
        state="QUEUED",
        plan_hash="p" * 64,
        base_sha=None,
        repository=None,
        pool="gpu",
        seq=3,
        created_at="1970-01-01T00:00:01.500Z",
        waiting_for=m.WaitingFor(reason="runner", pool="gpu", kind="chat", pool_last_seen_s=4.0),
        plan=m.PlanView(
            hash="p" * 64,
            steps=(
                m.PlanStepView(
                    name="draft",
                    kind="chat",
                    payload_hash="h" * 64,
                    payload={"messages": [{"role": "user", "content": "hi"}]},
                ),
            ),
            allowed_paths=("src/",),
            checks=(m.CheckSpec(name="tests", command="pytest -q"),),
        ),
        steps=(
            m.StepDetail(
                id="t.0",
                name="draft",
                kind="chat",
                state="queued",
                payload_hash="h" * 64,
                effect_key=None,
                fence=7,
                output=None,
                candidate_sha=None,
                attempts=(
                    m.AttemptView(
                        attempt=1,
                        fence=7,
                        runner_id="r1",
                        state="expired",
                        granted_at="1970-01-01T00:00:01.000Z",
                        ended_at="1970-01-01T00:00:31.000Z",
                        usage={"total_tokens": 9},
                    ),
                ),
            ),
            m.StepDetail(
                id="t.1",
                name="fix",
                kind="agent",
                state="committed",
                payload_hash="i" * 64,
                effect_key="f" * 64,
                fence=8,
                candidate_sha="c" * 40,
                bundle="b" * 64,
                checks=(m.CheckRunView(name="tests", log="d" * 64, exit_code=1, duration_s=0.5),),
                problems=(m.ProblemView(code="check_failed", detail="tests exited 1"),),
                checkpoint=m.CheckpointView(turn=2, fence=8),
            ),
            m.StepDetail(
                id="t.2",
                name="deploy",
                kind="http",
                state="committed",
                payload_hash="j" * 64,
                effect_key="k" * 64,
                fence=9,
                candidate_sha=None,
                effect=m.EffectView(
                    kind="http",
                    keyed=False,
                    state="delivered",
                    digest="e" * 64,
                    key="k" * 64,
                    request={
                        "method": "POST",
                        "url": "https://x.example/",
                        "headers": {"A": "{{ credential.tok }}"},
                        "body": {"n": 1},
                    },
                    deliveries=(
                        m.DeliveryView(
                            attempt=1,
                            started_at="1970-01-01T00:00:01.000Z",
                            answer="unanswered",
                            sent=True,
                            opening=1,
                        ),
                    ),
                    gate=m.GateView(
                        opened_by="op-1", opened_at="1970-01-01T00:00:00.500Z", digest="e" * 64
                    ),
                    resolved=m.ResolvedView(
                        by="op-1", at="1970-01-01T00:00:09.000Z", happened=True
                    ),
                ),
            ),
        ),
        budget=m.Budget(tenant="acme", spent=9, budget=10, left=1),
        findings=(m.ProblemView(code="check_failed", detail="tests exited 1"),),
        rejections=(m.Rejection(step_id="t.0", fence=6, code="stale_fence", detail="old"),),
    ),
    m.TaskPage(
        tasks=(
            m.TaskSummary(
                id="t",
                tenant="acme",
                idempotency_key="k",
                state="PLANNED",
                plan_hash="p" * 64,
                base_sha="b" * 40,
                repository="calc",
                pool="gpu",
                seq=1,
                created_at="1970-01-01T00:00:01.500Z",
                waiting_for=m.WaitingFor(reason="approval"),
                steps_committed=0,
                steps_total=2,
            ),
        ),
        next="41",
    ),
    m.Events(
        events=(
            m.Event(
                seq=1,
                task_id="t",
                kind="state",
                state="PLANNED",
                data={"n": 1},
                at="1970-01-01T00:00:01.500Z",
            ),
        ),
    ),
    m.PoolsAnswer(
        pools=(
            m.PoolStatus(
                pool="gpu",
                queued=2,
                in_flight=1,
                oldest_queued_s=12.5,
                runners=(m.RunnerSeen(runner_id="box-1", kinds=("chat",), last_seen_s=2.0),),
            ),
        )
    ),
    m.ArtifactStored(digest="d" * 64, size=12, created=False),
    m.GateOpen(digest="e" * 64),
    m.EffectHappened(happened=False),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_survives_the_codec(record: m.Record) -> None:
    assert decode(encode(record), type(record)) == record


def test_every_message_class_has_a_round_trip_above() -> None:
    classes = {
        c
        for c in vars(m).values()
        if isinstance(c, type) and issubclass(c, m.Record) and c is not m.Record
    }
    inside_others = {m.EarlierOutput, m.Plan, m.PlanStep, m.ItemAnswer}
    inside_others |= {m.WaitingFor, m.StepDetail, m.AttemptView, m.TaskSummary, m.PoolStatus}
    inside_others |= {m.TaskHeader, m.Rejection, m.Event}
    inside_others |= {m.RunnerSeen, m.LeaseRepository, m.CheckSpec, m.ResumePoint, m.CheckRun}
    inside_others |= {
        m.CheckRunView,
        m.ProblemView,
        m.CheckpointView,
        m.PlanView,
        m.PlanStepView,
        m.FileChangeView,
    }
    inside_others |= {m.EffectView, m.DeliveryView, m.GateView, m.ResolvedView}
    inside_others |= {m.LogLine, m.TaskLogEntry}
    inside_others |= {m.VerifySpec}
    missing = classes - {type(r) for r in RECORDS} - inside_others
    assert not missing


def test_a_result_leaves_out_what_it_does_not_carry() -> None:
    """As before the records: no `candidate_sha` nor `artifacts` unless the step made them."""
    wire = msgspec.json.decode(encode(m.Result(fence=1, payload_hash="h", output="x")))
    assert wire == {"fence": 1, "payload_hash": "h", "output": "x"}


def refused(raw: bytes, into: type[m.Record]) -> BadMessage:
    with pytest.raises(BadMessage) as caught:
        decode(raw, into)
    return caught.value


@pytest.mark.parametrize(
    ("raw", "into", "code", "words"),
    [
        (b"", m.RenewRequest, ErrorCode.MALFORMED_JSON, "empty"),
        (b"{oops", m.RenewRequest, ErrorCode.MALFORMED_JSON, "not valid JSON"),
        (b"[1]", m.RenewRequest, ErrorCode.MALFORMED_JSON, "JSON object"),
        (b'{"fence": NaN}', m.RenewRequest, ErrorCode.MALFORMED_JSON, "not valid JSON"),
        # Not JSON canonical hashing could take, though the unknown field would be dropped.
        (b'{"pad": 1e999}', m.RenewRequest, ErrorCode.MALFORMED_JSON, "not valid JSON"),
        (b'{"fence": true}', m.RenewRequest, ErrorCode.INVALID_FIELD, "'fence'"),
        (b'{"fence": -1}', m.RenewRequest, ErrorCode.INVALID_FIELD, "'fence'"),
        (b'{"fence": 4611686018427387905}', m.RenewRequest, ErrorCode.INVALID_FIELD, "'fence'"),
        (b"{}", m.RenewRequest, ErrorCode.INVALID_FIELD, "'fence' is required"),
        (
            b'{"runner_id": "", "capacity": 1}',
            m.ClaimRequest,
            ErrorCode.INVALID_FIELD,
            "'runner_id'",
        ),
        (
            b'{"runner_id": "r", "capacity": 257}',
            m.ClaimRequest,
            ErrorCode.INVALID_FIELD,
            "'capacity'",
        ),
        (
            b'{"fence": 1, "reason": "bored", "retryable": true}',
            m.ReleaseRequest,
            ErrorCode.INVALID_FIELD,
            "'reason'",
        ),
        (
            b'{"fence": 1, "payload_hash": "h", "output": 1, "usage": {"total_tokens": -1}}',
            m.Result,
            ErrorCode.INVALID_FIELD,
            "'usage[...]': expected `int` >= 0",
        ),
        (
            b'{"results": [{"step_id": "s", "fence": 1, "payload_hash": "h"}]}',
            m.Results,
            ErrorCode.INVALID_FIELD,
            "'results[0].output' is required",
        ),
        (b'{"results": []}', m.Results, ErrorCode.INVALID_FIELD, "'results'"),
        (
            b'{"idempotency_key": "k", "plan": {"steps": [{"name": "a", "kind": "c"}]}}',
            m.TaskCreate,
            ErrorCode.INVALID_FIELD,
            "'plan.steps[0].payload' is required",
        ),
        (
            b'{"idempotency_key": "k", "plan": {"steps": [{"name": "a", "kind": "chat",'
            b' "payload": {"messages": [{"role": "user", "content": "x"}]}}]},'
            b' "verify": {"pool": "p", "when": "always"}}',
            m.TaskCreate,
            ErrorCode.INVALID_FIELD,
            "'verify'",
        ),
        (
            b'{"idempotency_key": "k", "plan": {"steps": [{"name": "a", "kind": "chat",'
            b' "payload": {"messages": [{"role": "user", "content": "x"}]}}]}, "verify": {}}',
            m.TaskCreate,
            ErrorCode.INVALID_FIELD,
            "'verify.pool' is required",
        ),
        (
            b'{"idempotency_key": "k", "plan": {"steps": [{"name": "a", "kind": "verify",'
            b' "payload": {}}]}}',
            m.TaskCreate,
            ErrorCode.INVALID_FIELD,
            "the supervisor's own step",
        ),
        (
            b'{"runner_id": "r", "capacity": 1, "kinds": []}',
            m.ClaimRequest,
            ErrorCode.INVALID_FIELD,
            "'kinds'",
        ),
        (
            b'{"runner_id": "r", "capacity": 1, "kinds": [""]}',
            m.ClaimRequest,
            ErrorCode.INVALID_FIELD,
            "'kinds[0]'",
        ),
    ],
)
def test_a_bad_message_is_refused_with_the_apis_code(
    raw: bytes, into: type[m.Record], code: ErrorCode, words: str
) -> None:
    error = refused(raw, into)
    assert error.code is code
    assert words in error.detail


@pytest.mark.parametrize(
    "raw",
    [
        b'{"leases": [{"step_id": "s"}]}',
        b'{"leases": [{"step_id": "s", "task_id": "t", "name": "n", "kind": "k", "attempt": 1,'
        b' "fence": 1, "payload": 1, "payload_hash": "h", "ttl_s": 3, "renew_every_s": 0}]}',
        b'{"leases": [{"step_id": "s", "task_id": "t", "name": "n", "kind": "k", "attempt": 1,'
        b' "fence": 1, "payload": 1, "payload_hash": "h", "ttl_s": 3, "renew_every_s": 4}]}',
    ],
)
def test_a_lease_a_runner_could_not_keep_is_refused(raw: bytes) -> None:
    assert refused(raw, m.ClaimAnswer).code is ErrorCode.INVALID_FIELD


def test_a_result_json_cannot_hold_is_refused_not_changed() -> None:
    with pytest.raises(ValueError, match="NaN"):
        encode_strict(m.Result(fence=1, payload_hash="h", output={"x": [float("nan")]}))
    with pytest.raises(UnicodeEncodeError):
        encode_strict(m.Result(fence=1, payload_hash="h", output="\ud800"))
    assert encode_strict(RESULT) == encode(RESULT)


def test_every_error_code_has_one_status_and_one_runner_action() -> None:
    assert set(ERRORS) == set(ErrorCode)
    assert runner_action(409, "stale_fence") is RunnerAction.DROP
    assert runner_action(409, "plan_mismatch") is RunnerAction.REFUSED
    # An answer that is not the supervisor's is read by its status.
    assert runner_action(502, "bad gateway") is RunnerAction.RETRY
    assert runner_action(429, "unknown") is RunnerAction.RETRY
    assert runner_action(409, "not_found") is RunnerAction.REFUSED


def test_the_runner_and_the_supervisor_use_the_same_classes() -> None:
    """Identity, not lookalikes: one definition of each message on both sides."""
    import tether.runner.lease
    import tether.runner.supervisor_client as client
    import tether.supervisor.api.errors as api_errors
    import tether.supervisor.api.runner_routes as routes
    from tether.supervisor import ledger
    from tether.supervisor.ledger import effects, fencing
    from tether.supervisor.usecases import reports

    assert ledger.Report is effects.Report is reports.Report is m.Report
    assert ledger.Renewal is fencing.Renewal is client.Renewal is m.Renewal
    assert ledger.Lease is fencing.Lease is m.Lease
    assert issubclass(tether.runner.lease.Lease, m.Lease)
    assert tether.runner.lease.EarlierOutput is m.EarlierOutput
    assert client.ResultReport is m.Result
    assert routes.Result is m.Result
    assert api_errors.ERRORS is ERRORS


async def test_the_runner_reads_what_the_supervisor_writes(api: ApiHarness) -> None:
    """A claim answer, as the supervisor's API writes it, reads into the runner's records."""
    task = await api.queued("contract")
    ask = m.ClaimRequest(runner_id="r1", capacity=1)
    answer = await api.client.post(
        "/v1/leases/claim",
        headers={**api.runner, "Content-Type": "application/json"},
        content=encode(ask),
    )
    assert answer.status_code == 200, answer.text
    [lease] = decode(answer.content, m.ClaimAnswer).leases
    assert (lease.task_id, lease.attempt, lease.outputs) == (task["id"], 1, ())
    renewed = await api.client.post(
        f"/v1/leases/{lease.step_id}/renew",
        headers=api.runner,
        content=encode(m.RenewRequest(fence=lease.fence)),
    )
    assert decode(renewed.content, m.Renewal).cancelled is False
