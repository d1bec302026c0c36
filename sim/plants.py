"""Planted bugs: each one swaps a single ledger function for a broken copy while a run lasts,
to prove the explorer catches the check's absence (`chaos explore --plant NAME`).

The ledger knows nothing of them, but it declares where they may go: each rule module lists in
`SEAMS` the names its rules call through the module's globals, and `planted` swaps only a
declared name, putting the original back when the run ends, whatever happens. A plant whose
name is not a declared seam, or that no longer finds its attribute, raises instead of silently
planting nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from tether.supervisor.ledger import (
    Report,
    checkpoints,
    effects,
    identity,
    lifecycle,
    outbox_rows,
    queries,
    steps,
    transitions,
    verification,
)
from tether.supervisor.ledger.errors import NotFound
from tether.supervisor.ledger.identity import Created, TaskSpec
from tether.supervisor.ledger.records import DeliveryRow, HeldStep, StepColumns, StepWithTask
from tether.supervisor.ledger.states import TERMINAL, TaskState
from tether.supervisor.ledger.tx import Tx, TypedReads
from tether.supervisor.ledger.verification import Problem
from tether.wire import effect_key


def results_skip_the_fence(tx: Tx, step: StepColumns, fence: int) -> None:
    """stale-fence: a result is taken whatever fence it carries."""


def effects_keyed_by_attempt(tx: Tx, step: HeldStep, rep: Report) -> str | None:
    """double-effect: every commit gets a fresh key, so a replay commits a second effect."""
    return effect_key(rep.step_id, tx.new_id())


_require_allowed = transitions.require_allowed


def ended_tasks_move_on(task_id: str, current: TaskState, target: TaskState) -> None:
    """terminal-overwrite: an ended task may change state again."""
    if current not in TERMINAL:
        _require_allowed(task_id, current, target)


def keys_never_repeat(tx: Tx, spec: TaskSpec) -> Created | None:
    """key-reuse: an idempotency key is never looked up, so a retry creates a second task."""
    return None


def success_needs_no_evidence(tx: Tx, task_id: str) -> str | None:
    """unverified-success: every task whose steps are committed succeeds."""
    return None


def leases_never_lapse(step: StepColumns, now: float) -> bool:
    """lapsed-lease: a lease past its deadline is current until the reaper ends it."""
    return False


def evidence_ignored(evidence_json: str | None) -> list[Problem]:
    """evidence-ignored: verification reads no problem in any step's evidence, so a forged
    candidate or log passes as long as the checks' exit codes say 0."""
    return []


def checkpoints_skip_the_fence(tx: Tx, step: StepColumns, fence: int) -> None:
    """stale-checkpoint: a checkpoint is taken whatever fence it carries, lapsed or fenced
    out, as long as the step is leased to someone."""


def sends_never_recorded(attempts: list[DeliveryRow]) -> bool:
    """double-send: the dispatcher ignores the recorded send. An attempt begun and never
    answered no longer counts as maybe sent, so an unkeyed effect whose dispatcher died
    mid-send goes back to `open` (not `uncertain`) and is sent again under the same gate
    opening. (`outbox_rows.maybe_sent` is the one check between a recorded send and a second
    one: a lapsed hold alone changes nothing for a keyed receiver, which dedups by key.)"""
    return False


_make_due = lifecycle.make_due


def gates_open_themselves(tx: Tx, step: StepWithTask) -> None:
    """ungated: an unkeyed effect skips its gate: it becomes due already opened, for its
    own digest, as if an operator had opened it (so the ledger's own rows look consistent;
    only the operator's absence shows)."""
    _make_due(tx, step)
    opened = (
        "UPDATE outbox SET state = 'open', openings = openings + 1, gate_digest = digest,"
        " deadline_at = ? + deadline_s, not_before = ? WHERE step_id = ? AND state = 'gated'"
    )
    if tx.sql is queries.load("postgresql"):  # a plant is no named query: raw SQL, by hand
        opened = queries.to_pyformat(opened)
    tx.db.execute(opened, (tx.now, tx.now, step.id))


def leases_held_by_any_token(
    s: TypedReads, step_id: str, fence: int, token_id: str | None, pool: str | None = None
) -> HeldStep:
    """lease-takeover: a result is taken from any runner token of the pool that names the
    fence, not only from the token the attempt was granted to."""
    step = s.one_as(HeldStep, "held_step_with_task", fence=fence, step_id=step_id)
    if step is None or (pool is not None and step.pool != pool) or step.held_fence is None:
        raise NotFound(f"no step {step_id}")
    return step


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plant:
    """`replacement` stands in for `module.name`; `drop_index` is dropped from the ledger file
    too, when the schema would otherwise enforce what the plant switches off."""

    module: ModuleType
    name: str
    replacement: Callable[..., Any]
    drop_index: str | None = None


PLANTS: dict[str, Plant] = {
    "stale-fence": Plant(
        module=effects, name="require_current", replacement=results_skip_the_fence
    ),
    "double-effect": Plant(
        module=effects, name="effect_identity", replacement=effects_keyed_by_attempt
    ),
    "terminal-overwrite": Plant(
        module=transitions, name="require_allowed", replacement=ended_tasks_move_on
    ),
    "key-reuse": Plant(
        module=identity,
        name="existing_task",
        replacement=keys_never_repeat,
        drop_index="tasks_idempotency",
    ),
    "unverified-success": Plant(
        module=lifecycle, name="verify", replacement=success_needs_no_evidence
    ),
    "lapsed-lease": Plant(module=steps, name="lapsed", replacement=leases_never_lapse),
    "evidence-ignored": Plant(
        module=verification, name="problems_of", replacement=evidence_ignored
    ),
    "stale-checkpoint": Plant(
        module=checkpoints, name="require_current", replacement=checkpoints_skip_the_fence
    ),
    "double-send": Plant(module=outbox_rows, name="maybe_sent", replacement=sends_never_recorded),
    "ungated": Plant(module=lifecycle, name="make_due", replacement=gates_open_themselves),
    "lease-takeover": Plant(module=effects, name="held_step", replacement=leases_held_by_any_token),
}


def plant_named(name: str | None) -> Plant | None:
    if name is None:
        return None
    plant = PLANTS.get(name)
    if plant is None:
        raise ValueError(f"unknown planted bug {name!r}; known: {', '.join(sorted(PLANTS))}")
    return plant


@contextlib.contextmanager
def planted(name: str | None) -> Iterator[Plant | None]:
    """Swap in the plant called `name` (None: none) until the block ends."""
    plant = plant_named(name)
    if plant is None:
        yield None
        return
    if plant.name not in getattr(plant.module, "SEAMS", frozenset()):
        raise ValueError(f"{plant.module.__name__}.{plant.name} is not a seam its module declares")
    original = getattr(plant.module, plant.name)  # AttributeError: the plant lost its target
    setattr(plant.module, plant.name, plant.replacement)
    try:
        yield plant
    finally:
        setattr(plant.module, plant.name, original)
