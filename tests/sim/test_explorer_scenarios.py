"""The adversarial histories as named scenarios on the explorer's world, the explorer's checks
failing when a ledger check is planted, and the pieces of the explorer that decide replay."""

from __future__ import annotations

import re

import pytest

from tether.sim import hazards
from tether.sim.harness import Workspace, scratch_root
from tether.sim.observer import Consumer, Observer
from tether.sim.repos import FORGERIES
from tether.sim.scenarios import SCENARIOS, played
from tether.sim.schedule import FaultPlan, run_schedule
from tether.sim.seeds import parse_seed, schedule_seed
from tether.wire.records import Event, Report


def rejections(world: object) -> list[tuple[str, int | None]]:
    rows = world.h.query("SELECT code, fence FROM rejections ORDER BY id")  # type: ignore[attr-defined]
    return [(r["code"], r["fence"]) for r in rows]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_has_no_violation_and_ends(name: str) -> None:
    with played(name) as world:
        assert world.violations == []
        states = world.observer.states
        assert states, world.trace
        assert all(s in {"SUCCEEDED", "FAILED", "CANCELLED"} for s in states.values())
        # one logical execution per order
        orders = len(world.operator.orders)
        assert world.h.query("SELECT COUNT(*) FROM tasks")[0][0] == orders


@pytest.mark.parametrize(
    ("variant", "winner", "effects"),
    [("cancel-first", "CANCELLED", 1), ("report-first", "SUCCEEDED", 2), ("crash", "SUCCEEDED", 2)],
)
def test_cancel_between_verification_and_commit(variant: str, winner: str, effects: int) -> None:
    with played(f"cancel-vs-commit/{variant}") as world:
        [(task_id, state)] = world.observer.states.items()
        assert state == winner
        assert world.observer.first_terminal == {task_id: winner}
        assert world.h.query("SELECT COUNT(*) FROM effects")[0][0] == effects
        # The loser is a rejected attempt, never a state.
        assert [code for code, _ in rejections(world)] == ["terminal"]
        terminal_events = world.h.query(
            "SELECT state FROM events WHERE kind = 'state' AND state IN"
            " ('SUCCEEDED', 'FAILED', 'CANCELLED')"
        )
        assert [r[0] for r in terminal_events] == [winner]


def test_renew_after_fenced_out_is_refused() -> None:
    with played("fenced-renew") as world:
        refused = rejections(world)
        # its report, its renew, then the checkpoint of the turn it finished while paused
        assert refused == [("stale_fence", 1)] * 3
        assert any("renew T1.0 fence 1 -> refused stale_fence" in line for line in world.trace)
        assert any(
            "checkpoint T1.0 fence 1 turn 1 sha - tokens 10 -> refused stale_fence" in line
            for line in world.trace
        )
        assert world.h.query("SELECT COUNT(*) FROM checkpoints")[0][0] == 0
        fences = [r[0] for r in world.h.query("SELECT fence FROM effects ORDER BY created_at")]
        assert 1 not in fences
        assert world.observer.states == {"T1": "SUCCEEDED"}


def test_consumer_replaying_old_seqs_after_success_keeps_its_view() -> None:
    with played("consumer-replay") as world:
        consumer = world.consumers["T1"]
        assert consumer.state == "SUCCEEDED"
        assert any("old events (seq > 0) again; view stays SUCCEEDED" in x for x in world.trace)


def test_consumer_model_ignores_old_seqs_and_reports_regressions() -> None:
    def events(*seq_states: tuple[int, str]) -> list[Event]:
        at = "1970-01-01T00:00:00.000Z"
        return [
            Event(seq=seq, task_id="T1", kind="state", state=state, data=None, at=at)
            for seq, state in seq_states
        ]

    consumer = Consumer("T1")
    assert consumer.apply(events((1, "PLANNED"), (5, "SUCCEEDED"))) == []
    assert consumer.apply(events((3, "RUNNING"), (5, "RUNNING"))) == []
    assert (consumer.state, consumer.last_seq) == ("SUCCEEDED", 5)
    # A journal that moved on from a terminal state is what the consumer must report.
    [problem] = consumer.apply(events((6, "RUNNING")))
    assert "moved from SUCCEEDED to RUNNING" in problem


@pytest.mark.parametrize("when", ["before", "after"])
def test_crash_around_the_key_insert_returns_the_existing_task(when: str) -> None:
    with played(f"crash-around-key/{when}") as world:
        tasks = world.h.query("SELECT id FROM tasks")
        assert len(tasks) == 1
        assert world.operator.orders[0].task_id == tasks[0][0]
        answers = [
            line.split("-> ", 1)[1].split(";")[0].removesuffix(" (answer lost)")
            for line in world.trace
            if "operator create" in line and "->" in line
        ]
        task_id = tasks[0][0]
        # "before": the first try left nothing; "after": its answer was lost. Then two retries.
        tries = 2 if when == "before" else 3
        assert answers == [f"{task_id} new"] + [f"{task_id} existing"] * (tries - 1)


@pytest.mark.parametrize(
    ("name", "plant", "finding"),
    [
        ("fenced-renew", "stale-fence", "no-stale-commit"),
        ("crash-around-key/after", "key-reuse", "key-uniqueness"),
        ("cancel-vs-commit/report-first", "terminal-overwrite", "terminal"),
        ("consumer-replay", "double-effect", "effect-key-is-identity"),
        ("forged/path_not_allowed", "evidence-ignored", "success-is-verified"),
        ("stale-checkpoint", "stale-checkpoint", "stale-checkpoint"),
        ("lease-takeover", "lease-takeover", "lease-holder"),
    ],
)
def test_a_planted_bug_turns_its_history_into_a_violation(
    name: str, plant: str, finding: str
) -> None:
    with played(name, plant=plant) as world:
        assert any(finding in v for v in world.violations), world.violations
        assert any(line.split(" ", 2)[2].startswith("VIOLATION") for line in world.trace)


def test_every_hazard_is_reachable_from_random_schedules() -> None:
    """The fault plan arms each adversarial history somewhere in the first few hundred
    schedules, and each one plays there (crash-mid-batch, the rarest, first at 623 since the
    runners' eager grants and batched renewals joined the schedules)."""
    played_names = {
        "cancel": "cancel-vs-commit",
        "r": "fenced-renew",
        "consumer": "consumer-replay",
        "supervisor": "crash-around-key",
        "base": "base-moves",
        "late": "late-push",
        "checkpoint": "stale-checkpoint",
        **{name: name for name in ("crash-before-send", "crash-after-send", "crash-mid-batch")},
        "cancel-vs-delivery": "cancel-vs-delivery",
        "lease-takeover": "lease-takeover",
    }
    seen: set[str] = set()
    with scratch_root() as root, Workspace(root) as workspace:
        for index in range(700):
            result = run_schedule(schedule_seed(2024, index), workspace)
            assert result.violations == []
            for line in result.trace:
                if " hazard: " in line:
                    first = line.split(" hazard: ", 1)[1].split(" ", 1)[0]
                    seen.add(played_names.get(first, played_names["r"]))
            if seen == set(hazards.HAZARDS):
                break
    assert seen == set(hazards.HAZARDS)


def test_schedule_seeds_replay_and_differ() -> None:
    assert schedule_seed(42, 0) == 42  # --schedules 1 --seed X runs the schedule whose seed is X
    seeds = [schedule_seed(42, i) for i in range(1000)]
    assert len(set(seeds)) == 1000
    assert all(0 <= s < 2**63 for s in seeds)
    assert parse_seed("0x10") == 16
    with pytest.raises(ValueError, match="integer"):
        parse_seed("banana")
    with pytest.raises(ValueError, match="seed must be in"):
        parse_seed(str(2**63))


def test_one_seed_is_one_schedule() -> None:
    with scratch_root() as root, Workspace(root) as workspace:
        first = run_schedule(7, workspace)
        again = run_schedule(7, workspace)
        other = run_schedule(8, workspace)
    assert first.trace == again.trace
    assert first.digest == again.digest
    assert first.digest != other.digest


def test_fault_plans_vary() -> None:
    from random import Random

    plans = [FaultPlan.draw(Random(i)) for i in range(200)]
    assert len({p.describe() for p in plans}) > 150
    assert any(p.hazards for p in plans)
    assert any(not p.hazards for p in plans)


def test_an_explorer_error_is_reported_like_a_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    from tether.sim import schedule

    def broken(*_: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(schedule, "step", broken)
    with scratch_root() as root, Workspace(root) as workspace:
        result = run_schedule(11, workspace)
    assert result.violations == ["explorer error: RuntimeError: boom"]
    assert result.trace[-1].endswith("explorer error: RuntimeError: boom")
    assert result.snapshot[0].startswith("fence counter")


def reason(world: object) -> str:
    [row] = world.h.query("SELECT reason FROM tasks")  # type: ignore[attr-defined]
    return str(row[0])


@pytest.mark.parametrize("code", [c.value for c in FORGERIES])
def test_each_forged_result_fails_the_task_with_its_own_name(code: str) -> None:
    with played(f"forged/{code}") as world:
        assert world.violations == []
        assert world.observer.states == {"T1": "FAILED"}
        assert reason(world).startswith(f"{code}: "), reason(world)
        assert code in world.observer.expected_end["T1"].codes  # the observer expected it


@pytest.mark.parametrize("when", ["webhook", "no-webhook", "during-step"])
def test_a_base_moved_after_approval_fails_the_task_stale(when: str) -> None:
    with played(f"base-moves/{when}") as world:
        assert world.observer.states == {"T1": "FAILED"}
        assert reason(world) == "stale_base: approved sha0, repository repo0 is at sha1"
        leased = world.h.query("SELECT COUNT(*) FROM attempts WHERE step_id = 'T1.1'")[0][0]
        effects = world.h.query("SELECT COUNT(*) FROM effects WHERE step_id = 'T1.1'")[0][0]
        if when == "webhook":  # the supervisor knew before the next claim: nothing granted
            assert (leased, effects) == (0, 0)
        else:  # the report's own evidence showed it: recorded once, and the task failed
            assert (leased, effects) == (1, 1)
            assert any("report T1.1" in x and "head sha1 -> applied" in x for x in world.trace)


def test_a_fenced_out_attempt_pushing_late_makes_only_its_own_ref() -> None:
    with played("late-push/own-ref") as world:
        assert world.violations == []
        assert world.repos.refs == {
            "refs/tether/T1/T1.0/1": "c1late",  # a's, pushed after b committed
            "refs/tether/T1/T1.0/2": "c2",  # b's, the committed candidate, unmoved
            "refs/tether/T1/T1.1/3": "c3",
        }
        assert ("stale_fence", 1) in rejections(world)
        assert world.observer.states == {"T1": "SUCCEEDED"}


def test_a_late_push_naming_the_committed_fence_cannot_move_its_ref() -> None:
    with played("late-push/taken") as world:
        assert world.violations == []
        assert world.repos.refs["refs/tether/T1/T1.0/2"] == "c2"
        [late] = [x for x in world.trace if "report T1.0 fence 2 payload" in x and "late" in x]
        # fence 2 was granted to r1's token: to r0 it is a lease it never held
        assert "problems bundle_refused -> refused not_found" in late
        assert world.h.query("SELECT candidate_sha FROM steps WHERE id = 'T1.0'")[0][0] == "c2"


def test_a_stale_checkpoint_is_refused_and_the_next_attempt_resumes_from_the_last_good_one() -> (
    None
):
    with played("stale-checkpoint") as world:
        assert world.violations == []
        refused = [x for x in world.trace if "checkpoint T1.0 fence 1" in x and "refused" in x]
        assert len(refused) == 2  # lapsed, then fenced out
        assert any("T1.0 a2 f2 resume t2 f1" in x for x in world.trace)
        [row] = world.h.query("SELECT fence, turn FROM checkpoints WHERE step_id = 'T1.0'")
        assert tuple(row) == (2, 3)
        assert world.observer.states == {"T1": "SUCCEEDED"}
        # every turn's tokens counted once: a's two accepted turns, b's one turn and result
        [used] = world.h.query("SELECT tokens_used FROM tenants WHERE name = 'acme'")
        assert used[0] >= 20 + 20


def test_a_lease_taken_over_by_another_token_is_refused_and_its_holder_commits() -> None:
    """The intruder (the pool's other token, fence known) renews, checkpoints, reports and
    releases runner r0's lease: all refused `not_found`; r0's own report commits."""
    with played("lease-takeover") as world:
        assert world.violations == []
        moves = [x for x in world.trace if "deliver m" in x and " intruder " in x]
        assert [x.split(" intruder ", 1)[1].split(" ", 1)[0] for x in moves] == [
            "renew",
            "checkpoint",
            "report",
            "release",
        ]
        assert all(x.endswith("-> refused not_found") for x in moves), moves
        [row] = world.h.query("SELECT fence, output_json FROM steps WHERE id = 'T1.0'")
        assert row["fence"] == 1
        assert "intruder" not in row["output_json"]
        [attempt] = world.h.query("SELECT token_id, state FROM attempts WHERE fence = 1")
        assert tuple(attempt) == ("token-a", "committed")
        assert world.h.query("SELECT COUNT(*) FROM checkpoints")[0][0] == 0
        assert world.observer.states == {"T1": "SUCCEEDED"}


def test_random_schedules_drive_eager_grants_and_batched_renewals() -> None:
    """Issue 17: the runners' reports ask for the next leases and their renewals go together;
    random schedules reach a grant that hands leases out, one that grants nothing, a results
    request carrying two reports and a renewals request carrying two leases, all checked."""
    seen: set[str] = set()
    wanted = {"grant", "no grant", "two results", "two renewals"}
    with scratch_root() as root, Workspace(root) as workspace:
        for index in range(200):
            result = run_schedule(schedule_seed(2024, index), workspace)
            assert result.violations == []
            for line in result.trace:
                if " eager grant " in line and " (in results m" in line:
                    seen.add("no grant" if line.endswith("-> nothing") else "grant")
            text = "\n".join(result.trace)
            for kind, name in (("results", "two results"), ("renewals", "two renewals")):
                ids = re.findall(rf"\(in {kind} m(\d+)\)(?! \(duplicate\))", text)
                if any(ids.count(i) >= 2 + (kind == "results") for i in set(ids)):
                    seen.add(name)
            if seen == wanted:
                break
    assert seen == wanted


def test_the_observer_flags_an_eager_grant_no_result_allows() -> None:
    from tether.sim.schedule import CONFIG
    from tether.wire.records import Lease

    observer = Observer(CONFIG)
    lease = Lease(
        step_id="T1.1",
        task_id="T1",
        name="s1",
        kind="chat",
        attempt=1,
        fence=2,
        payload={},
        payload_hash="h",
        ttl_s=30.0,
        renew_every_s=10.0,
    )
    observer.eager_granted("r0", [("T1.0", 1)], 1, [lease])
    assert any("none of which is committed" in v for v in observer.violations)
    observer.violations.clear()
    observer.applied["T1.0"] = Report(step_id="T1.0", fence=1, payload_hash="h", output={})
    observer.eager_granted("r0", [("T1.0", 1), ("T1.2", 3)], 2, [lease, lease])
    assert any("allows 1" in v for v in observer.violations), observer.violations
    assert any("one step twice" in v for v in observer.violations), observer.violations
    observer.violations.clear()
    observer.eager_granted("r0", [("T1.0", 1)], 1, [lease])
    assert observer.violations == []
