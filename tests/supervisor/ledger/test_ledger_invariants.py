"""`invariants.find_violations`: silent on a clean ledger, and names each kind of violation
when one is planted by hand with sqlite3 (what `tether-supervisor check` and the explorer rely
on). Every invariant has a plant here, and each plant trips exactly the invariants listed."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.conftest import Sim, make_spec
from tether.supervisor.ledger import Report
from tether.supervisor.ledger.checkpoints import checkpoint
from tether.supervisor.ledger.effects import report
from tether.supervisor.ledger.fencing import claim
from tether.supervisor.ledger.identity import create_task
from tether.supervisor.ledger.invariants import INVARIANTS, find_violations
from tether.supervisor.ledger.operator import approve
from tether.supervisor.ledger.reaper import expire
from tether.supervisor.ledger.repositories import add_repository
from tether.supervisor.ledger.verification import Evidence, Finding, Problem
from tether.wire import effect_key
from tether.wire.records import Checkpoint, CheckRun

pytestmark = pytest.mark.backends


@dataclass(frozen=True, kw_only=True)
class World:
    """A small clean ledger: every kind of row the invariants look at."""

    done: str  # SUCCEEDED; its step committed under its second fence, the first expired
    old_fence: int
    new_fence: int
    running: str  # RUNNING: step 0 committed, step 1 leased
    repo: str  # repository task SUCCEEDED with a candidate, its evidence and check run
    queued: str  # QUEUED, its step never leased
    retried: str  # RUNNING, its step expired twice and queued again
    retried_fences: tuple[int, int]


def queue(sim: Sim, key: str, steps: int = 1, **extra: object) -> str:
    spec = make_spec(key, steps, **extra)  # type: ignore[arg-type]
    task_id: str = sim.run(lambda tx: create_task(tx, spec)).task_id
    base = spec.base_sha
    sim.run(lambda tx: approve(tx, "acme", task_id, spec.plan_hash, base, base))
    return task_id


def lease(sim: Sim, pool: str = "default") -> tuple[str, int, str]:
    [got] = sim.run(lambda tx: claim(tx, "r1", pool, 1))
    return got.step_id, got.fence, got.payload_hash


def commit(sim: Sim, evidence: Evidence | None = None, **extra: object) -> int:
    step_id, fence, payload_hash = lease(sim)
    rep = Report(step_id=step_id, fence=fence, payload_hash=payload_hash, output="ok", **extra)  # type: ignore[arg-type]
    sim.run(lambda tx: report(tx, rep, None, evidence))
    return fence


def expire_all(sim: Sim) -> None:
    sim.clock.advance(31)
    sim.run(expire)


@pytest.fixture
def world(sim: Sim) -> World:
    done = queue(sim, "done")
    _, old_fence, _ = lease(sim)
    expire_all(sim)
    new_fence = commit(sim)
    retried = queue(sim, "retried", pool="slow")  # its own pool: claims elsewhere miss it
    _, first, _ = lease(sim, "slow")
    expire_all(sim)
    _, second, _ = lease(sim, "slow")
    expire_all(sim)
    running = queue(sim, "running", steps=2)
    commit(sim)
    step_id, fence, _ = lease(sim)
    cp = Checkpoint(fence=fence, turn=1, transcript="t" * 64)
    sim.run(lambda tx: checkpoint(tx, step_id, cp))
    sim.run(lambda tx: add_repository(tx, "acme", "repo", "/srv/git/repo.git"))
    repo = queue(sim, "repo", repository="repo", base_sha="b1", expected_checks=("tests",))
    run = CheckRun(log="d" * 64, exit_code=0, duration_s=1.0)
    commit(sim, Evidence(head_sha="b1"), candidate_sha="c1", checks={"tests": run})
    queued = queue(sim, "queued")
    states = dict(sim.execute("SELECT id, state FROM tasks").fetchall())
    assert states == {
        done: "SUCCEEDED",
        running: "RUNNING",
        repo: "SUCCEEDED",
        queued: "QUEUED",
        retried: "RUNNING",
    }
    attempts = sim.execute(
        "SELECT s.task_id, a.fence, a.state FROM attempts a JOIN steps s ON s.id = a.step_id"
        " ORDER BY a.fence"
    ).fetchall()
    assert [tuple(a) for a in attempts] == [
        (done, old_fence, "expired"),
        (done, new_fence, "committed"),
        (retried, first, "expired"),
        (retried, second, "expired"),
        (running, new_fence + 3, "committed"),
        (running, new_fence + 4, "leased"),
        (repo, new_fence + 5, "committed"),
    ]
    return World(
        done=done,
        old_fence=old_fence,
        new_fence=new_fence,
        running=running,
        repo=repo,
        queued=queued,
        retried=retried,
        retried_fences=(first, second),
    )


def names(db: Sim) -> set[str]:
    return {v.split(":", 1)[0] for v in find_violations(db.reads)}


def test_a_clean_ledger_has_no_violation(sim: Sim, world: World) -> None:
    assert find_violations(sim.reads) == []
    assert sim.execute("SELECT COUNT(*) FROM effects").fetchone()[0] == 3


Plant = Callable[[Sim, World], None]


def two_effects_for_one_step(db: Sim, w: World) -> None:
    db.execute(
        "INSERT INTO effects SELECT ?, step_id, task_id, fence, payload_hash, output_json,"
        " usage_json, candidate_sha, created_at FROM effects WHERE task_id = ?",
        ("e" * 64, w.done),
    )


def effect_for_an_uncommitted_step(db: Sim, w: World) -> None:
    step = db.execute("SELECT * FROM steps WHERE task_id = ?", (w.queued,)).fetchone()
    db.execute(
        "INSERT INTO effects VALUES (?, ?, ?, 0, ?, '\"x\"', '{}', NULL, 0)",
        (effect_key(step["id"], step["payload_hash"]), step["id"], w.queued, step["payload_hash"]),
    )


def terminal_then_later_state(db: Sim, w: World) -> None:
    db.execute(
        "INSERT INTO events (task_id, kind, state, data_json, at) VALUES (?, 'state', 'RUNNING',"
        " '{}', 0)",
        (w.done,),
    )
    db.execute("UPDATE tasks SET state = 'RUNNING' WHERE id = ?", (w.done,))


def duplicate_idempotency_key(db: Sim, w: World) -> None:
    db.execute("DROP INDEX tasks_idempotency")
    if db.on_postgresql:
        columns = [
            r[0]
            for r in db.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'tasks'"
                " AND table_schema = current_schema() ORDER BY ordinal_position"
            )
        ]
    else:
        columns = [r["name"] for r in db.execute("PRAGMA table_info(tasks)")]
    copied = ", ".join(
        {"id": "'dup'", "created_order": "created_order + 1000"}.get(c, c) for c in columns
    )
    db.execute(f"INSERT INTO tasks SELECT {copied} FROM tasks WHERE id = ?", (w.queued,))


def stale_commit(db: Sim, w: World) -> None:
    """The effect is credited to the older, fenced-out attempt."""
    db.execute("UPDATE effects SET fence = ? WHERE task_id = ?", (w.old_fence, w.done))
    db.execute("UPDATE attempts SET state = 'committed' WHERE fence = ?", (w.old_fence,))
    db.execute("UPDATE attempts SET state = 'expired' WHERE fence = ?", (w.new_fence,))


def committed_without_effect(db: Sim, w: World) -> None:
    db.execute("DELETE FROM effects WHERE task_id = ?", (w.done,))


def effect_not_matching_intent(db: Sim, w: World) -> None:
    db.execute("UPDATE steps SET payload_hash = ? WHERE task_id = ?", ("f" * 64, w.done))


def two_live_leases(db: Sim, w: World) -> None:
    step = db.execute(
        "SELECT * FROM steps WHERE task_id = ? AND state = 'leased'", (w.running,)
    ).fetchone()
    if db.on_postgresql:
        fence = db.execute("SELECT nextval('fences')").fetchone()[0]
    else:
        db.execute("UPDATE counters SET value = value + 1 WHERE name = 'fence'")
        fence = db.execute("SELECT value FROM counters").fetchone()[0]
    db.execute(
        "INSERT INTO attempts (step_id, attempt, fence, runner_id, state, granted_at)"
        " VALUES (?, ?, ?, 'r9', 'leased', 0)",
        (step["id"], step["attempt"] + 1, fence),
    )


def a_lease_left_live_on_a_cancelled_step(db: Sim, w: World) -> None:
    """What a cancel that forgot to end the attempt in flight would leave."""
    db.execute(
        "UPDATE steps SET state = 'cancelled' WHERE task_id = ? AND state = 'leased'", (w.running,)
    )


def a_leased_step_without_its_lease(db: Sim, w: World) -> None:
    db.execute(
        "UPDATE attempts SET state = 'expired' WHERE state = 'leased' AND step_id IN"
        " (SELECT id FROM steps WHERE task_id = ?)",
        (w.running,),
    )


def fences_not_increasing(db: Sim, w: World) -> None:
    first, second = w.retried_fences
    db.execute("UPDATE attempts SET fence = -1 WHERE fence = ?", (first,))
    db.execute("UPDATE attempts SET fence = ? WHERE fence = ?", (first, second))
    db.execute("UPDATE attempts SET fence = ? WHERE fence = -1", (second,))


def counter_behind(db: Sim, w: World) -> None:
    if db.on_postgresql:
        db.execute("SELECT setval('fences', 1)")
    else:
        db.execute("UPDATE counters SET value = 1 WHERE name = 'fence'")


def success_with_an_uncommitted_step(db: Sim, w: World) -> None:
    db.execute("DELETE FROM effects WHERE task_id = ?", (w.done,))
    db.execute("UPDATE steps SET state = 'queued' WHERE task_id = ?", (w.done,))


def success_without_evidence(db: Sim, w: World) -> None:
    db.execute(
        "DELETE FROM check_runs WHERE step_id IN (SELECT id FROM steps WHERE task_id = ?)",
        (w.repo,),
    )


def success_without_its_verifier(db: Sim, w: World) -> None:
    db.execute("UPDATE tasks SET verify_pool = 'acme/verify' WHERE id = ?", (w.repo,))


def success_with_a_failed_check(db: Sim, w: World) -> None:
    db.execute(
        "UPDATE check_runs SET exit_code = 1 WHERE step_id IN (SELECT id FROM steps"
        " WHERE task_id = ?)",
        (w.repo,),
    )


def success_with_a_problem_in_the_evidence(db: Sim, w: World) -> None:
    problem = Problem(code=Finding.PATH_NOT_ALLOWED, detail="README.md")
    found = Evidence(head_sha="b1", problems=(problem,))
    db.execute(
        "UPDATE steps SET evidence_json = ? WHERE task_id = ?",
        (json.dumps(found.as_dict()), w.repo),
    )


def success_without_a_candidate(db: Sim, w: World) -> None:
    db.execute("UPDATE steps SET candidate_sha = NULL WHERE task_id = ?", (w.repo,))


def a_checkpoint_of_no_attempt(db: Sim, w: World) -> None:
    db.execute("UPDATE checkpoints SET fence = 0")


def success_after_the_base_moved(db: Sim, w: World) -> None:
    top = db.execute("SELECT MAX(seq) FROM events").fetchone()[0]
    # PostgreSQL's seq is an identity: an explicit one is inserted, never updated
    given = " OVERRIDING SYSTEM VALUE" if db.on_postgresql else ""
    db.execute(
        f"INSERT INTO events (seq, task_id, kind, state, data_json, at){given}"
        " SELECT ?, task_id, kind, state, data_json, at FROM events"
        " WHERE task_id = ? AND state = 'SUCCEEDED'",
        (top + 2, w.repo),
    )
    db.execute(
        "DELETE FROM events WHERE task_id = ? AND state = 'SUCCEEDED' AND seq <= ?", (w.repo, top)
    )
    db.execute(
        f"INSERT INTO events (seq, task_id, kind, state, data_json, at){given}"
        " VALUES (?, ?, 'base_changed', 'RUNNING', '{\"head_sha\": \"b2\"}', 0)",
        (top + 1, w.repo),
    )


def state_not_the_journal_s(db: Sim, w: World) -> None:
    db.execute("UPDATE tasks SET state = 'CANCELLED' WHERE id = ?", (w.queued,))


def a_task_without_steps_or_journal(db: Sim, w: World) -> None:
    db.execute(
        "INSERT INTO tasks (id, tenant, idempotency_key, state, plan_hash, plan_json,"
        " created_order, created_at) VALUES ('forged', 'acme', 'forged', 'SUCCEEDED', 'h',"
        " '{}', 999999, 0)"
    )


def effect_key_not_identity(db: Sim, w: World) -> None:
    db.execute("UPDATE effects SET effect_key = ? WHERE task_id = ?", ("0" * 64, w.done))


def outbox_row(db: Sim, step_id: str, state: str, keyed: int = 1) -> None:
    """An effect's outbox row planted by hand (docs/design.md, Effects)."""
    task_id = step_id.rsplit(".", 1)[0]
    db.execute(
        "INSERT INTO outbox (step_id, task_id, kind, effect_key, keyed, request_json, digest,"
        " state, deadline_s, not_before, openings, created_at)"
        " VALUES (?, ?, 'http', 'k', ?, '{}', 'd', ?, 300, 0, 1, 0)",
        (step_id, task_id, keyed, state),
    )


def delivered_without_an_effect(db: Sim, w: World) -> None:
    outbox_row(db, f"{w.queued}.0", "delivered")


def unkeyed_sent_twice_under_one_opening(db: Sim, w: World) -> None:
    outbox_row(db, f"{w.queued}.0", "uncertain", keyed=0)
    for attempt in (1, 2):
        db.execute(
            "INSERT INTO deliveries (step_id, attempt, opening, holder, started_at, sent)"
            " VALUES (?, ?, 1, 'd1', 0, 1)",
            (f"{w.queued}.0", attempt),
        )


def held_effect_of_a_cancelled_task_never_begun(db: Sim, w: World) -> None:
    db.execute("UPDATE tasks SET state = 'CANCELLED' WHERE id = ?", (w.queued,))
    db.execute(
        "INSERT INTO events (task_id, kind, state, data_json, at)"
        " VALUES (?, 'state', 'CANCELLED', '{}', 0)",
        (w.queued,),
    )
    outbox_row(db, f"{w.queued}.0", "sending")


def withdrawn_after_an_attempt_that_may_have_sent(db: Sim, w: World) -> None:
    outbox_row(db, f"{w.queued}.0", "withdrawn")
    db.execute(
        "INSERT INTO deliveries (step_id, attempt, opening, holder, started_at)"
        " VALUES (?, 1, 0, 'd1', 0)",
        (f"{w.queued}.0",),
    )


def effect_step_leased_to_a_runner(db: Sim, w: World) -> None:
    outbox_row(db, f"{w.running}.1", "sending")


# plant -> every invariant it must trip (the first is the one it is about)
PLANTS: dict[str, tuple[Plant, set[str]]] = {
    "one-effect-per-step": (two_effects_for_one_step, {"effect-key-is-identity"}),
    "effect-has-commit": (effect_for_an_uncommitted_step, {"no-stale-commit"}),
    "terminal-is-final": (terminal_then_later_state, set()),
    # the hand-copied duplicate has no steps and no journal of its own, so those trip too
    "idempotency-key-unique": (
        duplicate_idempotency_key,
        {"task-has-steps", "task-state-is-last-event"},
    ),
    "no-stale-commit": (stale_commit, set()),
    "committed-has-effect": (committed_without_effect, set()),
    "effect-matches-intent": (effect_not_matching_intent, set()),
    # the second live attempt is not under the step's fence
    "one-live-lease-per-step": (two_live_leases, {"live-lease-is-the-steps"}),
    "live-lease-is-the-steps": (a_lease_left_live_on_a_cancelled_step, set()),
    "leased-step-has-its-lease": (a_leased_step_without_its_lease, set()),
    "fences-increase": (fences_not_increasing, set()),
    "fence-counter-ahead": (counter_behind, set()),
    "success-is-complete": (success_with_an_uncommitted_step, set()),
    "success-is-verified": (success_without_evidence, set()),
    "success-verified-by-another": (success_without_its_verifier, set()),
    "checkpoint-of-an-attempt": (a_checkpoint_of_no_attempt, set()),
    "success-on-approved-base": (success_after_the_base_moved, set()),
    "task-state-is-last-event": (state_not_the_journal_s, set()),
    "task-has-steps": (a_task_without_steps_or_journal, {"task-state-is-last-event"}),
    "effect-key-is-identity": (effect_key_not_identity, set()),
    "delivered-effect-has-one-effect": (delivered_without_an_effect, set()),
    "unkeyed-sent-once-per-opening": (unkeyed_sent_twice_under_one_opening, set()),
    "no-idle-sending-of-ended-task": (held_effect_of_a_cancelled_task_never_begun, set()),
    "withdrawn-effect-sent-nothing": (withdrawn_after_an_attempt_that_may_have_sent, set()),
    "effect-step-never-leased": (effect_step_leased_to_a_runner, set()),
}


@contextlib.contextmanager
def undone(sim: Sim) -> Iterator[None]:
    """On PostgreSQL, a plant's writes (a dropped index too) in a transaction rolled back
    after: the session shares the database."""
    if not sim.on_postgresql:
        yield
        return
    sim.execute("BEGIN")
    try:
        yield
    finally:
        sim.execute("ROLLBACK")


def test_every_invariant_has_a_plant() -> None:
    assert set(PLANTS) == set(INVARIANTS)


@pytest.mark.parametrize("name", list(PLANTS))
def test_a_planted_violation_is_named(sim: Sim, world: World, name: str) -> None:
    plant, collateral = PLANTS[name]
    with undone(sim):
        plant(sim, world)
        assert names(sim) == {name} | collateral
        # each has a description
        assert all(v.split(": ", 1)[1] for v in find_violations(sim.reads))


def test_an_operator_s_no_excuses_the_attempts_before_it(sim: Sim, world: World) -> None:
    withdrawn_after_an_attempt_that_may_have_sent(sim, world)
    sim.execute("UPDATE outbox SET settled_attempts = 1")
    assert names(sim) == set()


def test_a_head_at_the_task_s_own_pushed_candidate_is_no_moved_base(sim: Sim, world: World) -> None:
    success_after_the_base_moved(sim, world)
    sim.execute("UPDATE tasks SET pushed_sha = 'b2' WHERE id = ?", (world.repo,))
    assert names(sim) == set()


@pytest.mark.parametrize(
    "plant",
    [
        success_with_a_failed_check,
        success_with_a_problem_in_the_evidence,
        success_without_a_candidate,
    ],
)
def test_each_hole_in_a_success_s_evidence_is_named(sim: Sim, world: World, plant: Plant) -> None:
    plant(sim, world)
    assert names(sim) == {"success-is-verified"}
