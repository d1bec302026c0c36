"""Checkpoints: an `agent` step's state after each completed turn, kept under the attempt's
fence so a replayed attempt resumes there instead of paying for those turns again
(docs/design.md, Checkpoints).

A checkpoint is a write like a result: refused as `stale_fence`, and recorded, unless its fence
is the step's current one and the step is leased. The step keeps only its latest one; a turn
never goes back. The attempt's usage is charged by delta like a result's (`steps.charge`).
The next grant of the step carries it as `Lease.resume` (`fencing.resume_point`).
"""

from __future__ import annotations

from typing import Final

from tether.supervisor.ledger.decisions import Decision
from tether.supervisor.ledger.errors import InvalidRequest, StaleFence
from tether.supervisor.ledger.records import TurnHeld
from tether.supervisor.ledger.states import StepState
from tether.supervisor.ledger.steps import about_step, charge, held_step, require_current
from tether.supervisor.ledger.tx import Tx, dumps
from tether.wire.records import Checkpoint, Checkpointed

# The names a planted bug of the schedule explorer may swap while a run lasts
# (`tether.sim.plants`): the rules here call each through this module's globals.
SEAMS: Final = frozenset({"require_current"})


def checkpoint(
    tx: Tx, step_id: str, cp: Checkpoint, pool: str | None = None, *, token_id: str | None = None
) -> Checkpointed:
    """Accept `cp` as the step's latest checkpoint, from the token holding the lease
    (`held_step`), and answer the turn it resumes after.

    The same turn again under the same fence is the same answer and changes nothing; a turn
    below the one held is refused (`InvalidRequest`), as is a bundle without its commit.
    """
    tx.request = "checkpoint"
    step = held_step(tx, step_id, cp.fence, token_id, pool)
    spent = charge(tx, step, cp.fence, cp.usage)
    require_current(tx, step, cp.fence)
    if step.state != StepState.LEASED:
        raise StaleFence(f"step {step_id} is {step.state}; the lease is over").about(
            task_id=step.task_id, step_id=step_id, fence=cp.fence
        )
    if (cp.bundle is None) != (cp.sha is None):
        raise InvalidRequest("a checkpoint names its bundle and the commit `sha` in it together")
    held = tx.one_as(TurnHeld, "checkpoint_held", step_id=step_id)
    if held is not None:
        if held.fence == cp.fence and held.turn == cp.turn:
            return Checkpointed(turn=cp.turn)
        if cp.turn < held.turn:
            raise InvalidRequest(
                f"step {step_id} is checkpointed after turn {held.turn}; turn {cp.turn}"
                " would go back"
            )
    tx.run(
        "save_checkpoint",
        step_id=step_id,
        fence=cp.fence,
        turn=cp.turn,
        transcript=cp.transcript,
        bundle=cp.bundle,
        sha=cp.sha,
        step_usage_json=dumps(dict(cp.step_usage)),
        now=tx.now,
    )
    tx.note(Decision.CHECKPOINTED, **about_step(tx, step), turn=cp.turn, tokens=spent)
    return Checkpointed(turn=cp.turn)
