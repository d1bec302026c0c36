"""Effect steps on the ledger's side (docs/design.md, Effects): the outbox row written when an
effect becomes due, the dispatcher's port driven by hand as a dispatcher would drive it, gates
and uncertain effects, cancel, and the invariants `tether-supervisor check` adds for them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import FakeClock, count, ledger_records, report_for
from tests.plain import plain
from tests.supervisor.ledger.test_ledger_verification import BASE, URL, check_specs, ran
from tether.supervisor.ledger import InvalidRequest, SqliteLedger, StepSpec, TaskSpec
from tether.supervisor.ledger.errors import EffectNotGated, EffectNotHeld, GateMismatch
from tether.supervisor.ledger.outbox import Delivered, OutboxState, Unanswered, Undeliverable
from tether.supervisor.ledger.repositories import add_repository
from tether.supervisor.ledger.store import LedgerStore
from tether.supervisor.ledger.verification import Evidence
from tether.wire import content_hash, effect_key

pytestmark = pytest.mark.backends

HOOK = "https://deploy.example/hook"


def http(keyed: bool = True, **extra: Any) -> dict[str, Any]:
    return {"url": HOOK, "keyed": keyed, "deadline_s": 300, **extra}


def spec_with(*steps: tuple[str, str, Any], key: str = "k1", **extra: Any) -> TaskSpec:
    return TaskSpec(
        tenant="acme",
        idempotency_key=key,
        steps=tuple(StepSpec(name=n, kind=k, payload=p) for n, k, p in steps),
        **extra,
    )


async def approved(ledger: SqliteLedger, spec: TaskSpec, base: str | None = None) -> str:
    task_id = (await ledger.create_task(spec)).task_id
    await ledger.approve("acme", task_id, spec.plan_hash, base, base)
    return task_id


async def run_chat(ledger: SqliteLedger, output: Any, **fields: Any) -> None:
    [lease] = await ledger.claim("r1", "default", 1, 0, kinds=("chat",))
    await ledger.report(report_for(lease, output=output, **fields), **fields_evidence(fields))


def fields_evidence(fields: dict[str, Any]) -> dict[str, Any]:
    return {"evidence": Evidence(head_sha=BASE)} if "candidate_sha" in fields else {}


def outbox(ledger: LedgerStore, step_id: str) -> dict[str, Any]:
    found = ledger_records(ledger, "SELECT * FROM outbox WHERE step_id = ?", (step_id,))
    return found[0] if found else {}


async def step_of(ledger: SqliteLedger, task_id: str, name: str) -> dict[str, Any]:
    view = plain(await ledger.task(task_id))
    found: dict[str, Any] = next(s for s in view["steps"] if s["name"] == name)
    return found


# -- due: the outbox row and its rendered request ---------------------------------------------


async def test_an_effect_becomes_due_with_its_rendered_request_in_the_same_write(
    ledger: SqliteLedger,
) -> None:
    body = {"version": "{{ steps.build.output.version }}", "note": "v{{ steps.build.output.n }}"}
    spec = spec_with(
        ("build", "chat", {"cmd": "build"}),
        ("deploy", "http", http(body=body, headers={"X-Ver": "{{ steps.build.output.n }}"})),
    )
    task_id = await approved(ledger, spec)
    assert outbox(ledger, f"{task_id}.1") == {}
    await run_chat(ledger, {"version": {"tag": "1.2"}, "n": 7})
    row = outbox(ledger, f"{task_id}.1")
    request = {
        "method": "POST",
        "url": HOOK,
        "headers": {"X-Ver": "7"},
        "body": {"version": {"tag": "1.2"}, "note": "v7"},
    }
    assert row["state"] == OutboxState.DUE
    assert json.loads(row["request_json"]) == request
    assert row["digest"] == content_hash(request)
    step = await step_of(ledger, task_id, "deploy")
    assert step["state"] == "due"
    assert row["effect_key"] == effect_key(f"{task_id}.1", step["payload_hash"])
    [out] = await ledger.take_effects("d1", 8)
    assert out.request == request
    assert (out.keyed, out.kind, out.tenant) == (True, "http", "acme")


async def test_an_effect_step_is_never_granted_to_a_runner(ledger: SqliteLedger) -> None:
    task_id = await approved(ledger, spec_with(("deploy", "http", http())))
    assert await ledger.claim("r1", "default", 4, 0, kinds=("http", "git.push", "chat")) == []
    assert count(ledger, "attempts") == 0
    assert plain(await ledger.task(task_id))["state"] == "RUNNING"
    assert outbox(ledger, f"{task_id}.0")["state"] == OutboxState.DUE


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (http(body="{{ steps.later.output }}"), "'later', which is not an earlier step"),
        (http(body="{{ steps.nobody.output.x }}"), "'nobody', which is not an earlier step"),
        (http(body="{{ steps.first.outpt }}"), "malformed placeholder"),
        (http(headers={"A": "{{ credential.bad/name }}"}), "credential name 'bad/name'"),
        (http(body="{{ credential.token }}"), "only in header values"),
    ],
)
async def test_a_plan_with_a_bad_placeholder_is_refused_at_create(
    ledger: SqliteLedger, payload: dict[str, Any], words: str
) -> None:
    spec = spec_with(
        ("first", "chat", {}),
        ("effect", "http", payload),
        ("later", "chat", {}),
    )
    with pytest.raises(InvalidRequest, match=words):
        await ledger.create_task(spec)
    assert count(ledger, "tasks") == 0


async def test_a_path_missing_at_due_time_fails_the_step_and_sends_nothing(
    ledger: SqliteLedger,
) -> None:
    spec = spec_with(
        ("build", "chat", {}), ("deploy", "http", http(body="{{ steps.build.output.missing }}"))
    )
    task_id = await approved(ledger, spec)
    await run_chat(ledger, {"version": 1})
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert view["reason"].startswith("effect_render_failed: ")
    assert "'missing'" in view["reason"]
    assert count(ledger, "outbox") == 0
    assert await ledger.take_effects("d1", 8) == []


async def test_a_push_is_refused_at_create_for_a_task_without_a_repository(
    ledger: SqliteLedger,
) -> None:
    with pytest.raises(InvalidRequest, match="only a task bound to a repository can push"):
        await ledger.create_task(spec_with(("push", "git.push", {"branch": "main"})))


# -- repository-bound tasks -------------------------------------------------------------------


async def bound(ledger: SqliteLedger, *steps: tuple[str, str, Any]) -> str:
    await ledger.write(lambda tx: add_repository(tx, "acme", "repo", URL))
    spec = spec_with(*steps, repository="repo", base_sha=BASE, checks=check_specs())
    return await approved(ledger, spec, BASE)


async def test_a_push_renders_the_candidate_and_the_approved_base(ledger: SqliteLedger) -> None:
    task_id = await bound(
        ledger, ("code", "chat", {}), ("push", "git.push", {"branch": "main", "credential": "k"})
    )
    await run_chat(ledger, "patched", **ran("cand1"))
    [out] = await ledger.take_effects("d1", 8)
    assert out.request == {
        "url": URL,
        "branch": "main",
        "expected": BASE,
        "candidate": "cand1",
        "credential": "k",
    }
    attempt = await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    await ledger.record_attempt(
        out.effect_id, attempt, "d1", Delivered(status=None, detail="pushed", replayed=True)
    )
    view = plain(await ledger.task(task_id))
    assert view["state"] == "SUCCEEDED"
    assert (await step_of(ledger, task_id, "push"))["output"]["replayed"] is True
    assert await ledger.violations() == []


async def test_evidence_that_fails_verification_never_makes_the_effect_due(
    ledger: SqliteLedger,
) -> None:
    task_id = await bound(ledger, ("code", "chat", {}), ("push", "git.push", {"branch": "main"}))
    await run_chat(ledger, "patched", **ran("cand1", exit_code=1))
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert view["reason"].startswith("check_failed: ")
    assert count(ledger, "outbox") == 0


async def test_a_push_with_no_candidate_fails_no_candidate(ledger: SqliteLedger) -> None:
    await ledger.write(lambda tx: add_repository(tx, "acme", "repo", URL))
    spec = spec_with(("push", "git.push", {"branch": "main"}), repository="repo", base_sha=BASE)
    task_id = await approved(ledger, spec, BASE)
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert view["reason"].startswith("no_candidate: ")


# -- the dispatcher's port --------------------------------------------------------------------


async def test_a_keyed_effect_delivered_commits_its_step_and_the_task_advances(
    ledger: SqliteLedger,
) -> None:
    task_id = await approved(ledger, spec_with(("deploy", "http", http()), ("after", "chat", {})))
    [out] = await ledger.take_effects("d1", 8)
    assert await ledger.take_effects("d2", 8) == []  # held
    one = await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    await ledger.record_attempt(out.effect_id, one, "d1", Unanswered(detail="503", sent=True))
    two = await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    assert (one, two) == (1, 2)
    await ledger.record_attempt(out.effect_id, two, "d1", Delivered(status=200, detail="ok"))
    step = await step_of(ledger, task_id, "deploy")
    assert step["state"] == "committed"
    assert step["effect"]["state"] == "delivered"
    assert [d["attempt"] for d in step["effect"]["deliveries"]] == [1, 2]
    assert count(ledger, "effects", "step_id = ?", (out.effect_id,)) == 1
    assert (await step_of(ledger, task_id, "after"))["state"] == "queued"
    assert await ledger.violations() == []


async def test_a_refused_answer_fails_the_step_and_the_task_with_its_code(
    ledger: SqliteLedger,
) -> None:
    task_id = await approved(ledger, spec_with(("deploy", "http", http())))
    [out] = await ledger.take_effects("d1", 8)
    attempt = await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    answer = Undeliverable(status=403, detail="forbidden", code="receiver_refused")
    await ledger.record_attempt(out.effect_id, attempt, "d1", answer)
    view = plain(await ledger.task(task_id))
    assert (view["state"], view["reason"]) == ("FAILED", "receiver_refused: forbidden")
    assert (await step_of(ledger, task_id, "deploy"))["state"] == "failed"


async def test_a_keyed_hold_that_lapses_is_taken_again_with_the_same_key(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    await approved(ledger, spec_with(("deploy", "http", http())))
    [out] = await ledger.take_effects("d1", 8)
    await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    clock.advance(61)  # the holder vanished: its hold lapses
    [again] = await ledger.take_effects("d2", 8)
    assert (again.effect_id, again.effect_key, again.digest) == (
        out.effect_id,
        out.effect_key,
        out.digest,
    )
    with pytest.raises(EffectNotHeld):
        await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    assert await ledger.begin_attempt(out.effect_id, "d2", out.digest) == 2


async def test_an_answer_from_a_holder_that_lost_the_effect_is_refused_and_changes_nothing(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    task_id = await approved(ledger, spec_with(("deploy", "http", http())))
    [out] = await ledger.take_effects("d1", 8)
    attempt = await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    clock.advance(61)
    await ledger.take_effects("d2", 8)
    with pytest.raises(EffectNotHeld):
        await ledger.record_attempt(out.effect_id, attempt, "d1", Delivered(status=200, detail=""))
    assert (await step_of(ledger, task_id, "deploy"))["state"] == "due"
    assert count(ledger, "effects") == 0


async def test_a_digest_other_than_the_request_s_is_refused(ledger: SqliteLedger) -> None:
    await approved(ledger, spec_with(("deploy", "http", http())))
    [out] = await ledger.take_effects("d1", 8)
    with pytest.raises(GateMismatch):
        await ledger.begin_attempt(out.effect_id, "d1", "0" * 64)


async def test_a_keyed_effect_past_its_deadline_fails_delivery_deadline(
    ledger: SqliteLedger,
) -> None:
    task_id = await approved(ledger, spec_with(("deploy", "http", http())))
    [out] = await ledger.take_effects("d1", 8)
    attempt = await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    await ledger.record_attempt(out.effect_id, attempt, "d1", Unanswered(detail="x", sent=False))
    await ledger.give_up(out.effect_id, "d1", "300 s passed")
    view = plain(await ledger.task(task_id))
    assert (view["state"], view["reason"]) == ("FAILED", "delivery_deadline: 300 s passed")


async def test_release_puts_a_keyed_effect_back_to_due(ledger: SqliteLedger) -> None:
    await approved(ledger, spec_with(("deploy", "http", http())))
    [out] = await ledger.take_effects("d1", 8)
    await ledger.release_effect(out.effect_id, "d1")
    assert outbox(ledger, out.effect_id)["state"] == OutboxState.DUE
    assert [o.effect_id for o in await ledger.take_effects("d2", 8)] == [out.effect_id]


# -- gates and uncertain effects --------------------------------------------------------------


async def gated_effect(ledger: SqliteLedger) -> tuple[str, str]:
    task_id = await approved(ledger, spec_with(("deploy", "http", http(keyed=False))))
    row = await step_of(ledger, task_id, "deploy")
    return task_id, row["effect"]["digest"]


async def test_an_unkeyed_effect_waits_for_its_gate_and_the_gate_binds_the_digest(
    ledger: SqliteLedger,
) -> None:
    task_id, digest = await gated_effect(ledger)
    view = plain(await ledger.task(task_id))
    assert view["waiting_for"] == {"reason": "gate", "step": "deploy", "digest": digest}
    assert await ledger.take_effects("d1", 8) == []
    before = outbox(ledger, f"{task_id}.0")
    with pytest.raises(GateMismatch):
        await ledger.open_gate("acme", task_id, "deploy", "f" * 64, "alice")
    assert outbox(ledger, f"{task_id}.0") == before
    await ledger.open_gate("acme", task_id, "deploy", digest, "alice")
    with pytest.raises(EffectNotGated):
        await ledger.open_gate("acme", task_id, "deploy", digest, "alice")
    [out] = await ledger.take_effects("d1", 8)
    attempt = await ledger.begin_attempt(out.effect_id, "d1", digest)
    await ledger.record_attempt(out.effect_id, attempt, "d1", Delivered(status=201, detail=""))
    view = plain(await ledger.task(task_id))
    assert view["state"] == "SUCCEEDED"
    effect = view["steps"][0]["effect"]
    assert (effect["gate"]["opened_by"], effect["keyed"]) == ("alice", False)


async def test_a_gate_opening_allows_one_send(ledger: SqliteLedger) -> None:
    task_id, digest = await gated_effect(ledger)
    await ledger.open_gate("acme", task_id, "deploy", digest, "alice")
    [out] = await ledger.take_effects("d1", 8)
    attempt = await ledger.begin_attempt(out.effect_id, "d1", digest)
    # Certainly not sent (connection refused): the same opening may try again.
    await ledger.record_attempt(out.effect_id, attempt, "d1", Unanswered(detail="", sent=False))
    attempt = await ledger.begin_attempt(out.effect_id, "d1", digest)
    await ledger.record_attempt(out.effect_id, attempt, "d1", Unanswered(detail="", sent=True))
    assert (await step_of(ledger, task_id, "deploy"))["effect"]["state"] == "uncertain"
    with pytest.raises(EffectNotHeld):
        await ledger.begin_attempt(out.effect_id, "d1", digest)
    assert plain(await ledger.task(task_id))["waiting_for"]["reason"] == "uncertain"


async def test_an_unkeyed_holder_that_vanishes_after_beginning_leaves_it_uncertain(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    task_id, digest = await gated_effect(ledger)
    await ledger.open_gate("acme", task_id, "deploy", digest, "alice")
    [out] = await ledger.take_effects("d1", 8)
    await ledger.begin_attempt(out.effect_id, "d1", digest)
    clock.advance(61)
    assert await ledger.take_effects("d2", 8) == []  # never re-sent by itself
    assert (await step_of(ledger, task_id, "deploy"))["effect"]["state"] == "uncertain"


async def test_happened_no_reopens_the_gate_once_and_yes_records_it_done(
    ledger: SqliteLedger,
) -> None:
    task_id, digest = await gated_effect(ledger)
    for _ in range(2):
        await ledger.open_gate("acme", task_id, "deploy", digest, "alice")
        [out] = await ledger.take_effects("d1", 8)
        attempt = await ledger.begin_attempt(out.effect_id, "d1", digest)
        await ledger.record_attempt(out.effect_id, attempt, "d1", Unanswered(detail="", sent=True))
        if _ == 0:
            await ledger.resolve_effect("acme", task_id, "deploy", False, "bob")
            assert outbox(ledger, out.effect_id)["state"] == OutboxState.GATED
    with pytest.raises(EffectNotGated, match="already re-opened once"):
        await ledger.resolve_effect("acme", task_id, "deploy", False, "bob")
    await ledger.resolve_effect("acme", task_id, "deploy", True, "bob")
    view = plain(await ledger.task(task_id))
    assert view["state"] == "SUCCEEDED"
    effect = view["steps"][0]["effect"]
    assert (effect["resolved"]["by"], effect["resolved"]["happened"]) == ("bob", True)
    assert count(ledger, "effects") == 1
    record = plain(await ledger.review(task_id))
    [marked] = record["effects"]["value"]
    assert (marked["keyed"], marked["resolved"]["by"]) == (False, "bob")
    assert await ledger.violations() == []


# -- cancel -----------------------------------------------------------------------------------


async def test_cancel_before_the_send_withdraws_the_effect(ledger: SqliteLedger) -> None:
    task_id = await approved(ledger, spec_with(("deploy", "http", http())))
    await ledger.cancel("acme", task_id, "changed my mind")
    assert outbox(ledger, f"{task_id}.0")["state"] == OutboxState.WITHDRAWN
    assert await ledger.take_effects("d1", 8) == []
    assert (await step_of(ledger, task_id, "deploy"))["state"] in ("cancelled", "skipped")


async def test_cancel_while_sending_ends_the_task_and_the_delivery_is_still_recorded(
    ledger: SqliteLedger,
) -> None:
    task_id = await approved(ledger, spec_with(("deploy", "http", http()), ("b", "chat", {})))
    [out] = await ledger.take_effects("d1", 8)
    attempt = await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    await ledger.cancel("acme", task_id, "stop")
    await ledger.record_attempt(out.effect_id, attempt, "d1", Delivered(status=200, detail="ok"))
    view = plain(await ledger.task(task_id))
    assert view["state"] == "CANCELLED"
    assert view["steps"][0]["state"] == "committed"
    assert view["steps"][0]["effect"]["state"] == "delivered"
    assert view["steps"][1]["state"] == "skipped"
    assert await ledger.violations() == []


async def test_a_cancelled_task_s_held_effect_is_not_attempted_again(ledger: SqliteLedger) -> None:
    task_id = await approved(ledger, spec_with(("deploy", "http", http())))
    [out] = await ledger.take_effects("d1", 8)
    attempt = await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    await ledger.record_attempt(out.effect_id, attempt, "d1", Unanswered(detail="", sent=True))
    await ledger.cancel("acme", task_id, "stop")
    with pytest.raises(EffectNotHeld):
        await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    # It may have been sent: the operator is asked, the task stays CANCELLED.
    assert outbox(ledger, out.effect_id)["state"] == OutboxState.UNCERTAIN
    assert await ledger.violations() == []


async def test_cancel_after_take_but_before_any_attempt_withdraws_it(ledger: SqliteLedger) -> None:
    task_id = await approved(ledger, spec_with(("deploy", "http", http())))
    [out] = await ledger.take_effects("d1", 8)
    await ledger.cancel("acme", task_id, "stop")
    with pytest.raises(EffectNotHeld):
        await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    assert outbox(ledger, out.effect_id)["state"] == OutboxState.WITHDRAWN
    assert count(ledger, "deliveries") == 0
    assert await ledger.violations() == []
