"""Effects in the schedule explorer (docs/design.md, Effects): the dispatcher played step by
step through the outbox rules, the receivers it reaches, the hazards around a send, the new
invariants failing when they should, and the two planted bugs caught."""

from __future__ import annotations

import dataclasses
from random import Random

import pytest

from tether.sim.actors import make_orders
from tether.sim.observer import Observer
from tether.sim.receivers import Fault, Receivers
from tether.sim.repos import BASE, Repos
from tether.sim.scenarios import SCENARIOS, effect_order, played
from tether.sim.schedule import CONFIG
from tether.sim.world import World
from tether.supervisor.ledger.outbox import Delivered, Outgoing, Unanswered, Undeliverable

EFFECT_SCENARIOS = [name for name in SCENARIOS if name.startswith("effects/")]


def outgoing(
    effect_id: str = "T1.1", *, kind: str = "http", keyed: bool = True, **request: object
) -> Outgoing:
    return Outgoing(
        effect_id=effect_id,
        task_id=effect_id.split(".", maxsplit=1)[0],
        tenant="acme",
        kind=kind,
        effect_key=f"key-{effect_id}",
        keyed=keyed,
        request=dict(request),
        digest="d",
        deadline_at=0.0,
    )


def rows(world: World, sql: str) -> list[tuple[object, ...]]:
    return [tuple(r) for r in world.h.query(sql)]


def outbox_states(world: World) -> dict[str, str]:
    return {r[0]: r[1] for r in world.h.query("SELECT step_id, state FROM outbox")}


# -- the receivers ----------------------------------------------------------------------------


def test_a_keyed_receiver_applies_a_key_once_and_answers_a_repeat_with_its_first_answer() -> None:
    receivers = Receivers(Repos())
    out = outgoing()
    lost = receivers.receive(out, Fault.LOST)
    assert lost == Unanswered(detail="no answer", sent=True)
    again = receivers.receive(out, Fault.NONE)
    assert isinstance(again, Delivered)
    assert receivers.receive(out, Fault.NONE) == again
    assert receivers.applications == {"key-T1.1": 1}
    assert receivers.applied("http", True, "T1.1") == 1


def test_an_unkeyed_receiver_applies_every_request_and_nothing_it_never_got() -> None:
    receivers = Receivers(Repos())
    out = outgoing(keyed=False)
    assert receivers.receive(out, Fault.UNREACHABLE) == Unanswered(
        detail="connection refused", sent=False
    )
    busy = receivers.receive(out, Fault.BUSY)
    assert isinstance(busy, Unanswered)
    assert (busy.sent, busy.status) == (True, 503)
    assert isinstance(receivers.receive(out, Fault.REFUSE), Undeliverable)
    assert receivers.applied("http", False, "T1.1") == 0
    receivers.receive(out, Fault.NONE)
    receivers.receive(out, Fault.LOST)
    assert receivers.applied("http", False, "T1.1") == 2


def test_a_push_moves_the_branch_only_from_the_value_it_expects() -> None:
    repos = Repos()
    receivers = Receivers(repos)
    push = outgoing(
        kind="git.push", url="/srv/git/repo0.git", expected=BASE, candidate="c1", branch="main"
    )
    assert receivers.receive(push, Fault.LOST) == Unanswered(detail="no answer", sent=True)
    assert repos.head("acme", "repo0") == "c1"
    replay = receivers.receive(push, Fault.NONE)
    assert isinstance(replay, Delivered)
    assert replay.replayed
    repos.push("acme", "repo0", "elsewhere")
    moved = receivers.receive(push, Fault.NONE)
    assert isinstance(moved, Undeliverable)
    assert moved.code == "branch_moved"
    assert receivers.pushes == {"T1.1": 1}
    # An operator reverts the branch to the expected value: a retry moves it again, which
    # the lease cannot tell from a first push (kept apart from the supervisor's own repeats).
    repos.push("acme", "repo0", BASE)
    again = receivers.receive(push, Fault.NONE)
    assert isinstance(again, Delivered)
    assert (receivers.pushes, receivers.repushed) == ({"T1.1": 1}, {"T1.1": 1})
    assert repos.head("acme", "repo0") == "c1"


# -- the new invariants fail when they should ---------------------------------------------------


def test_an_unkeyed_send_without_an_opening_is_a_violation() -> None:
    observer = Observer(CONFIG)
    out = outgoing(keyed=False)
    observer.effect_sent(out, reached=False)  # never arrived: not a send
    assert observer.violations == []
    observer.gate_opened("T1.1", "d", "d")
    observer.effect_sent(out, reached=True)
    assert observer.violations == []
    observer.effect_sent(out, reached=True)
    assert observer.violations == [
        "unkeyed-needs-word: unkeyed effect T1.1 sent 2 times after 1 gate openings"
    ]


def test_a_keyed_effect_under_two_keys_or_missing_from_a_success_is_a_violation() -> None:
    observer = Observer(CONFIG)
    order = effect_order(0, "deploy")
    observer.specs["T1"] = order.spec
    receivers = Receivers(Repos())
    observer.first_terminal["T1"] = "SUCCEEDED"
    observer.effects_now(receivers)
    assert observer.violations == [
        "keyed-exactly-once: T1 SUCCEEDED; its keyed effect T1.1 (http) was applied 0 times"
    ]
    receivers.receive(outgoing("T1.1"), Fault.NONE)
    observer.violations.clear()
    observer.effects_now(receivers)
    assert observer.violations == []  # applied once: the success is whole
    receivers.receive(_rekeyed("T1.1"), Fault.NONE)
    observer.effects_now(receivers)
    assert "keyed-applied-once: effect T1.1 arrived under 2 keys" in observer.violations


def _rekeyed(effect_id: str) -> Outgoing:
    return dataclasses.replace(outgoing(effect_id), effect_key="another-key")


def test_a_withdrawn_effect_its_receiver_applied_is_a_violation() -> None:
    observer = Observer(CONFIG)
    observer.specs["T1"] = effect_order(0, "deploy").spec
    receivers = Receivers(Repos())
    observer.withdrawn("T1.1", receivers)
    assert observer.violations == []
    receivers.receive(outgoing("T1.1"), Fault.NONE)
    observer.withdrawn("T1.1", receivers)
    assert observer.violations == ["withdrawn-unsent: effect T1.1 withdrawn; applied 1 times"]


# -- the hazards, on purpose ------------------------------------------------------------------


@pytest.mark.parametrize("name", EFFECT_SCENARIOS)
def test_effect_scenario_has_no_violation_and_ends(name: str) -> None:
    with played(name) as world:
        assert world.violations == [], world.trace
        assert set(world.observer.states.values()) <= {"SUCCEEDED", "CANCELLED"}
        assert any(" hazard: " in line or "sends" in line for line in world.trace)


def test_a_keyed_effect_sent_again_after_a_crash_is_applied_once() -> None:
    with played("effects/crash-after-send/keyed") as world:
        assert world.observer.states == {"T1": "SUCCEEDED"}
        assert list(world.receivers.applications.values()) == [1]
        attempts = rows(world, "SELECT attempt, holder, answer FROM deliveries ORDER BY attempt")
        assert [(a, answer) for a, _, answer in attempts] == [(1, None), (2, "delivered")]
        assert attempts[0][1] != attempts[1][1]  # the restarted supervisor's dispatcher
        assert outbox_states(world) == {"T1.1": "delivered"}


def test_an_unkeyed_effect_begun_before_a_crash_waits_for_the_operator() -> None:
    """Begun and never answered: maybe sent, so `uncertain`; the operator, who knows it did
    not arrive, says no; the gate is opened once more and it is sent once."""
    with played("effects/crash-before-send/unkeyed") as world:
        assert world.observer.states == {"T1": "SUCCEEDED"}
        assert world.receivers.unkeyed == {"T1.1": 1}
        assert (world.observer.openings, world.observer.sends) == ({"T1.1": 2}, {"T1.1": 1})
        decisions = [r[0] for r in world.h.query("SELECT action FROM effect_decisions")]
        assert decisions == ["open", "not_happened", "open"]


def test_an_unkeyed_effect_sent_before_a_crash_is_never_sent_again() -> None:
    with played("effects/crash-after-send/unkeyed") as world:
        assert world.observer.states == {"T1": "SUCCEEDED"}
        assert world.receivers.unkeyed == {"T1.1": 1}
        assert world.observer.sends == {"T1.1": 1}
        decisions = [r[0] for r in world.h.query("SELECT action FROM effect_decisions")]
        assert decisions == ["open", "happened"]
        assert any("effect_uncertain" in r[0] for r in world.h.query("SELECT kind FROM events"))


def test_a_crash_mid_batch_applies_every_effect_once() -> None:
    with played("effects/crash-mid-batch") as world:
        assert world.observer.states == {"T1": "SUCCEEDED", "T2": "SUCCEEDED"}
        assert sorted(world.receivers.applications.values()) == [1, 1]
        counts = rows(world, "SELECT COUNT(*) FROM deliveries GROUP BY step_id ORDER BY 1")
        assert counts == [(1,), (2,)]  # recorded first; sent, then again


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_cancel_racing_delivery_keeps_the_task_cancelled_and_the_effect_delivered(
    when: str,
) -> None:
    with played(f"effects/cancel-{when}-send") as world:
        assert world.observer.states == {"T1": "CANCELLED"}
        assert list(world.receivers.applications.values()) == [1]
        assert outbox_states(world) == {"T1.1": "delivered"}
        [[committed]] = rows(world, "SELECT state FROM steps WHERE id = 'T1.1'")
        assert committed == "committed"


def test_a_push_whose_answer_was_lost_finds_the_branch_moved_by_itself() -> None:
    with played("effects/push-answer-lost") as world:
        assert world.observer.states == {"T1": "SUCCEEDED"}
        assert world.receivers.pushes == {"T1.1": 1}
        assert world.repos.head("acme", "repo0") == world.observer.applied["T1.0"].candidate_sha
        assert any("(replayed)" in line and "record T1.1" in line for line in world.trace)


# -- planted bugs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "plant", "finding"),
    [
        ("effects/crash-after-send/unkeyed", "double-send", "unkeyed-sent-once-per-opening"),
        ("effects/crash-after-send/unkeyed", "ungated", "unkeyed-needs-word"),
    ],
)
def test_an_effect_plant_turns_its_history_into_a_violation(
    name: str, plant: str, finding: str
) -> None:
    with played(name, plant=plant) as world:
        assert any(v.startswith(f"{finding}:") for v in world.violations), world.violations


def test_plans_carry_every_kind_of_effect_step() -> None:
    kinds = set()
    for seed in range(40):
        for order in make_orders(Random(seed), 3):
            for step in order.spec.steps:
                keyed = not (isinstance(step.payload, dict) and step.payload.get("keyed") is False)
                kinds.add((step.kind, keyed))
    assert kinds == {("chat", True), ("http", True), ("http", False), ("git.push", True)}
