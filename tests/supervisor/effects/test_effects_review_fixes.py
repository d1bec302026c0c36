"""Effects after review (docs/design.md, Effects): what an ending task does to an effect that
may have been sent, outputs that would build a credential placeholder or choose a URL's host,
a task's own push seen by a head read, effect steps sharing a name, an unkeyed answer that
arrives after its hold lapsed, and the operator's `no` on an ended task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.agent_repos import add_commit, make_origin, sh
from tests.conftest import FakeClock, count, raw_db, report_for
from tests.effects_fakes import Scripted
from tests.plain import plain
from tests.supervisor.effects.test_effects_dispatcher import due_deploy
from tests.supervisor.ledger.test_ledger_outbox import (
    approved,
    bound,
    http,
    outbox,
    run_chat,
    spec_with,
    step_of,
)
from tests.supervisor.ledger.test_ledger_verification import check_specs, ran
from tether.supervisor.effects.credentials import Credentials
from tether.supervisor.effects.dispatcher import Dispatcher
from tether.supervisor.effects.git_push import GitPushDeliverer
from tether.supervisor.effects.registry import EffectKinds
from tether.supervisor.ledger import InvalidRequest, SqliteLedger
from tether.supervisor.ledger.errors import EffectNotGated, EffectNotHeld
from tether.supervisor.ledger.outbox import Delivered, OutboxState, Unanswered
from tether.supervisor.ledger.repositories import add_repository
from tether.supervisor.ledger.verification import Evidence
from tether.supervisor.repos.mirror import Mirrors


def events(path: Path, kind: str) -> list[dict[str, Any]]:
    db = raw_db(path)
    try:
        rows = db.execute("SELECT data_json FROM events WHERE kind = ? ORDER BY seq", (kind,))
        return [json.loads(r["data_json"]) for r in rows]
    finally:
        db.close()


async def uncertain_deploy(ledger: SqliteLedger) -> tuple[str, str]:
    """A task whose keyed `deploy` was sent, went unanswered, and was given up at its deadline:
    its task id and effect id."""
    task_id = await approved(ledger, spec_with(("deploy", "http", http())))
    [out] = await ledger.take_effects("d1", 8)
    n = await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    await ledger.record_attempt(out.effect_id, n, "d1", Unanswered(detail="503", sent=True))
    await ledger.give_up(out.effect_id, "d1", "300 s passed")
    return task_id, out.effect_id


# -- 1. an ending task never calls an effect that may have been sent `withdrawn` --------------


async def test_a_keyed_effect_released_mid_send_then_cancelled_is_uncertain(
    ledger: SqliteLedger, ledger_path: Path
) -> None:
    task_id = await approved(ledger, spec_with(("deploy", "http", http())))
    [out] = await ledger.take_effects("d1", 8)
    await ledger.begin_attempt(out.effect_id, "d1", out.digest)  # the request leaves the box
    await ledger.release_effect(out.effect_id, "d1")  # shutdown cancels it mid-flight
    assert outbox(ledger_path, out.effect_id)["state"] == OutboxState.DUE
    await ledger.cancel("acme", task_id, "stop")
    assert outbox(ledger_path, out.effect_id)["state"] == OutboxState.UNCERTAIN
    view = plain(await ledger.task(task_id))
    assert view["state"] == "CANCELLED"
    assert (await step_of(ledger, task_id, "deploy"))["state"] == "due"  # not "cancelled"
    assert await ledger.violations() == []
    assert await ledger.take_effects("d2", 8) == []  # never sent again by itself
    # The operator's word settles it; `no` on an ended task withdraws it, and says who said so.
    await ledger.resolve_effect("acme", task_id, "deploy", False, "alice")
    assert outbox(ledger_path, out.effect_id)["state"] == OutboxState.WITHDRAWN
    [withdrawn] = events(ledger_path, "effect_withdrawn")
    assert withdrawn["why"] == "an operator (alice) said it did not happen"
    assert withdrawn["by"] == "alice"
    assert await ledger.violations() == []


async def test_a_real_dispatcher_shut_down_mid_send_then_a_cancel_leaves_it_uncertain(
    ledger: SqliteLedger, ledger_path: Path, clock: FakeClock
) -> None:
    hang = anyio.Event()
    script = Scripted([Delivered(status=201, detail="applied")], hang=hang)  # applies, hangs
    task_id = await due_deploy(ledger)
    d = Dispatcher(
        ledger, EffectKinds([script]), Credentials(None), hold_s=60, clock=clock, poll_s=0.05
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(d.run)
            while not script.calls:  # noqa: ASYNC110 (the dispatcher's own task)
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()  # SIGTERM: the effect is handed back
    await ledger.cancel("acme", task_id, "stop")
    assert outbox(ledger_path, f"{task_id}.1")["state"] == OutboxState.UNCERTAIN
    view = plain(await ledger.task(task_id))
    assert "uncertain" in json.dumps(view["steps"][1]["effect"])
    assert await ledger.violations() == []


async def test_a_failed_task_s_keyed_effect_that_may_have_sent_is_uncertain(
    ledger: SqliteLedger, ledger_path: Path
) -> None:
    task_id = await bound(ledger, ("code", "chat", {}), ("deploy", "http", http()))
    await run_chat(ledger, "patched", **ran("cand1"))
    [out] = await ledger.take_effects("d1", 8)
    await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    await ledger.release_effect(out.effect_id, "d1")
    await ledger.set_repository_head("acme", "repo", "someone-else")  # fails it stale_base
    assert plain(await ledger.task(task_id))["state"] == "FAILED"
    assert outbox(ledger_path, out.effect_id)["state"] == OutboxState.UNCERTAIN
    assert await ledger.violations() == []


async def test_an_effect_an_operator_said_did_not_happen_is_withdrawn_by_a_cancel(
    ledger: SqliteLedger, ledger_path: Path
) -> None:
    task_id = await approved(ledger, spec_with(("notify", "http", http(keyed=False))))
    digest = (await step_of(ledger, task_id, "notify"))["effect"]["digest"]
    await ledger.open_gate("acme", task_id, "notify", digest, "alice")
    [out] = await ledger.take_effects("d1", 8)
    n = await ledger.begin_attempt(out.effect_id, "d1", digest)
    await ledger.record_attempt(out.effect_id, n, "d1", Unanswered(detail="timeout", sent=True))
    await ledger.resolve_effect("acme", task_id, "notify", False, "alice")  # back to its gate
    await ledger.cancel("acme", task_id, "stop")
    assert outbox(ledger_path, out.effect_id)["state"] == OutboxState.WITHDRAWN
    assert await ledger.violations() == []


async def test_a_keyed_effect_unanswered_after_a_send_at_its_deadline_is_uncertain(
    ledger: SqliteLedger, ledger_path: Path
) -> None:
    task_id, effect_id = await uncertain_deploy(ledger)
    assert outbox(ledger_path, effect_id)["state"] == OutboxState.UNCERTAIN
    assert plain(await ledger.task(task_id))["waiting_for"]["reason"] == "uncertain"
    await ledger.resolve_effect("acme", task_id, "deploy", True, "alice")
    assert plain(await ledger.task(task_id))["state"] == "SUCCEEDED"
    assert await ledger.violations() == []


# -- 2. outputs never build a credential placeholder ------------------------------------------


async def test_two_outputs_building_a_credential_placeholder_fail_the_effect_unsent(
    ledger: SqliteLedger, ledger_path: Path
) -> None:
    payload = {
        "url": "https://hook.example/x",
        "headers": {"X-Note": "{{ steps.a.output }}{{ steps.b.output }}"},
    }
    task_id = await approved(
        ledger, spec_with(("a", "chat", {}), ("b", "chat", {}), ("deploy", "http", payload))
    )
    await run_chat(ledger, "{")
    await run_chat(ledger, "{ credential.deploy_token }}")
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert view["reason"].startswith("effect_render_failed: payload.headers.X-Note: ")
    assert count(ledger_path, "outbox") == 0
    assert await ledger.take_effects("d1", 8) == []


# -- 3. a task's own push is no moved base ----------------------------------------------------


async def test_a_runner_step_after_a_push_is_refused_at_create(ledger: SqliteLedger) -> None:
    await ledger.write(lambda tx: add_repository(tx, "acme", "repo", "/srv/git/repo.git"))
    spec = spec_with(
        ("code", "chat", {}),
        ("push", "git.push", {"branch": "main"}),
        ("more", "chat", {}),
        repository="repo",
        base_sha="base1",
        checks=check_specs(),
    )
    with pytest.raises(InvalidRequest, match=r"'plan\.steps\[2\]'.*after the git\.push step"):
        await ledger.create_task(spec)
    assert plain(await ledger.list_tasks("acme", None, None, 10))["tasks"] == []


async def test_a_head_report_of_the_task_s_own_push_does_not_fail_it(
    ledger: SqliteLedger, ledger_path: Path
) -> None:
    task_id = await bound(
        ledger,
        ("code", "chat", {}),
        ("push", "git.push", {"branch": "main"}),
        ("deploy", "http", http()),
    )
    await run_chat(ledger, "patched", **ran("cand1"))
    [push] = await ledger.take_effects("d1", 8)
    n = await ledger.begin_attempt(push.effect_id, "d1", push.digest)
    await ledger.record_attempt(push.effect_id, n, "d1", Delivered(status=None, detail="moved"))
    await ledger.set_repository_head("acme", "repo", "cand1")  # the forge's push webhook
    view = plain(await ledger.task(task_id))
    assert (view["state"], view["reason"]) == ("RUNNING", None)
    assert events(ledger_path, "base_changed")[-1]["head_sha"] == "cand1"  # still recorded
    assert outbox(ledger_path, f"{task_id}.2")["state"] == OutboxState.DUE
    # Another head is a moved base still.
    await ledger.set_repository_head("acme", "repo", "theirs")
    assert plain(await ledger.task(task_id))["reason"].startswith("stale_base: ")


@pytest.fixture
async def origin(tmp_path: Path) -> tuple[Path, str, str, Mirrors]:
    """A bare repository at `base`, and the supervisor's mirror holding `candidate` on it."""
    seed, base = make_origin(tmp_path / "seed")
    bare = tmp_path / "origin.git"
    sh("git", "clone", "--quiet", "--bare", str(seed), str(bare), cwd=tmp_path)
    runner = tmp_path / "runner"
    sh("git", "clone", "--quiet", str(bare), str(runner), cwd=tmp_path)
    candidate = add_commit(runner, "src/app.py", "def answer():\n    return 42\n")
    bundle = tmp_path / "c.bundle"
    sh("git", "bundle", "create", "--quiet", str(bundle), "HEAD", f"^{base}", cwd=runner)
    mirrors = Mirrors(tmp_path / "mirrors")
    assert await mirrors.import_bundle(str(bare), bundle, "t1", "s1", 1) == candidate
    return bare, base, candidate, mirrors


async def test_push_then_deploy_with_a_webhook_between_succeeds_on_a_real_repository(
    ledger: SqliteLedger, ledger_path: Path, origin: tuple[Path, str, str, Mirrors]
) -> None:
    bare, base, candidate, mirrors = origin
    await ledger.write(lambda tx: add_repository(tx, "acme", "repo", str(bare)))
    spec = spec_with(
        ("code", "chat", {}),
        ("push", "git.push", {"branch": "main"}),
        ("deploy", "http", http()),
        repository="repo",
        base_sha=base,
        checks=check_specs(),
    )
    task_id = await approved(ledger, spec, base)
    [lease] = await ledger.claim("r1", "default", 1, 0, kinds=("chat",))
    await ledger.report(
        report_for(lease, output="patched", **ran(candidate)), evidence=Evidence(head_sha=base)
    )
    [push] = await ledger.take_effects("d1", 8)
    n = await ledger.begin_attempt(push.effect_id, "d1", push.digest)
    answer = await GitPushDeliverer(mirrors).deliver(push, Credentials(None))
    assert isinstance(answer, Delivered)
    head = sh("git", "rev-parse", "refs/heads/main", cwd=bare).strip()
    assert head == candidate
    # The forge's webhook arrives before the dispatcher has recorded the push.
    await ledger.set_repository_head("acme", "repo", head)
    await ledger.record_attempt(push.effect_id, n, "d1", answer)
    [deploy] = await ledger.take_effects("d1", 8)
    m = await ledger.begin_attempt(deploy.effect_id, "d1", deploy.digest)
    await ledger.record_attempt(deploy.effect_id, m, "d1", Delivered(status=201, detail="ok"))
    view = plain(await ledger.task(task_id))
    assert (view["state"], view["reason"]) == ("SUCCEEDED", None)
    assert await ledger.violations() == []
    record = plain(await ledger.review(task_id, "acme"))
    assert record["repository_head"]["value"] == candidate


# -- 4. effect steps never share a name -------------------------------------------------------


@pytest.mark.parametrize(
    "steps",
    [
        (("notify", "http", http(keyed=False)), ("notify", "http", http(keyed=False))),
        (("notify", "chat", {}), ("notify", "http", http())),
    ],
)
async def test_an_effect_step_sharing_its_name_is_refused_at_create(
    ledger: SqliteLedger, steps: tuple[tuple[str, str, Any], ...]
) -> None:
    with pytest.raises(InvalidRequest, match=r"'notify' \(plan\.steps\[\d\]\) has the name of"):
        await ledger.create_task(spec_with(*steps))
    with pytest.raises(InvalidRequest) as refused:
        await ledger.create_task(spec_with(*steps))
    assert "plan.steps[0]" in str(refused.value)
    assert "plan.steps[1]" in str(refused.value)


# -- 5. an unkeyed answer after the hold lapsed is kept ---------------------------------------


async def test_an_unkeyed_answer_arriving_after_its_hold_lapsed_settles_it(
    ledger: SqliteLedger, ledger_path: Path, clock: FakeClock
) -> None:
    task_id = await approved(ledger, spec_with(("deploy", "http", http(keyed=False))))
    digest = (await step_of(ledger, task_id, "deploy"))["effect"]["digest"]
    await ledger.open_gate("acme", task_id, "deploy", digest, "alice")
    [out] = await ledger.take_effects("d1", 8)
    n = await ledger.begin_attempt(out.effect_id, "d1", digest)
    clock.advance(61)  # the write queue stalled: the hold lapsed mid-send
    await ledger.take_effects("d1", 8)
    assert outbox(ledger_path, out.effect_id)["state"] == OutboxState.UNCERTAIN
    with pytest.raises(EffectNotHeld):  # only the holder of that attempt may answer it
        await ledger.record_attempt(out.effect_id, n, "d2", Delivered(status=201, detail="ok"))
    await ledger.record_attempt(out.effect_id, n, "d1", Delivered(status=201, detail="ok"))
    assert outbox(ledger_path, out.effect_id)["state"] == OutboxState.DELIVERED
    assert plain(await ledger.task(task_id))["state"] == "SUCCEEDED"
    with pytest.raises(EffectNotHeld):  # once
        await ledger.record_attempt(out.effect_id, n, "d1", Delivered(status=201, detail="ok"))
    assert await ledger.violations() == []


async def test_a_late_unanswered_leaves_it_uncertain(
    ledger: SqliteLedger, ledger_path: Path, clock: FakeClock
) -> None:
    task_id = await approved(ledger, spec_with(("deploy", "http", http(keyed=False))))
    digest = (await step_of(ledger, task_id, "deploy"))["effect"]["digest"]
    await ledger.open_gate("acme", task_id, "deploy", digest, "alice")
    [out] = await ledger.take_effects("d1", 8)
    n = await ledger.begin_attempt(out.effect_id, "d1", digest)
    clock.advance(61)
    await ledger.take_effects("d1", 8)
    await ledger.record_attempt(out.effect_id, n, "d1", Unanswered(detail="timeout", sent=True))
    assert outbox(ledger_path, out.effect_id)["state"] == OutboxState.UNCERTAIN
    # An operator's word settles the attempt: its answer cannot come in after that.
    await ledger.resolve_effect("acme", task_id, "deploy", False, "alice")
    assert await ledger.violations() == []


# -- 6. a step's output never chooses the URL's host ------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://{{ steps.build.output.host }}/hook",
        "https://hooks.{{ steps.build.output }}/x",
        "{{ steps.build.output }}://hook.example/x",
        "https://hook.example{{ steps.build.output }}",
        "https://user@{{ steps.build.output }}",
    ],
)
async def test_a_placeholder_in_the_url_s_scheme_or_host_is_refused_at_create(
    ledger: SqliteLedger, url: str
) -> None:
    payload = {"url": url, "headers": {"Authorization": "Bearer {{ credential.deploy_token }}"}}
    with pytest.raises(InvalidRequest, match="choose where the request"):
        await ledger.create_task(spec_with(("build", "chat", {}), ("deploy", "http", payload)))
    with pytest.raises(InvalidRequest, match="choose where the request"):  # credentials or not
        await ledger.create_task(spec_with(("build", "chat", {}), ("deploy", "http", {"url": url})))


async def test_a_placeholder_in_the_url_s_path_and_query_is_filled(
    ledger: SqliteLedger, ledger_path: Path
) -> None:
    payload = {
        "url": "https://hook.example/v/{{ steps.build.output.v }}?n={{ steps.build.output.n }}"
    }
    task_id = await approved(ledger, spec_with(("build", "chat", {}), ("deploy", "http", payload)))
    await run_chat(ledger, {"v": "1.2", "n": 3})
    effect = (await step_of(ledger, task_id, "deploy"))["effect"]
    assert effect["request"]["url"] == "https://hook.example/v/1.2?n=3"


async def test_a_second_no_is_refused_and_a_keyed_no_on_a_live_task_fails_it(
    ledger: SqliteLedger, ledger_path: Path
) -> None:
    task_id, effect_id = await uncertain_deploy(ledger)
    await ledger.resolve_effect("acme", task_id, "deploy", False, "bob")
    view = plain(await ledger.task(task_id))
    assert (view["state"], view["reason"]) == (
        "FAILED",
        "delivery_deadline: an operator (bob) said it did not happen",
    )
    assert outbox(ledger_path, effect_id)["state"] == OutboxState.FAILED
    with pytest.raises(EffectNotGated):
        await ledger.resolve_effect("acme", task_id, "deploy", False, "bob")
    assert await ledger.violations() == []
