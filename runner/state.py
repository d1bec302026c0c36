"""The runner daemon's state: where it is in its life, whether the supervisor answers, and what
holds its claiming back (docs/design.md, The runner).

One frozen value, `RunnerState`; the daemon holds exactly one and changes it only through the
transitions below, each returning the state after it. Nothing here does I/O or reads a clock:
the daemon logs, notifies systemd and cancels what a transition calls for.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from tether.runner.preemption.notice import Notice


class RunnerPhase(enum.StrEnum):
    """Where the daemon is in its life. It moves forward only: SERVING, then PREEMPTED (the
    cloud reclaims the server), then STOPPING (shutdown asked), either of the last two
    possibly skipped."""

    SERVING = "serving"
    PREEMPTED = "preempted"
    STOPPING = "stopping"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Preemption:
    notice: Notice
    cancel_at: float  # when, on the runner's clock, work still going is cancelled


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pause:
    until: float  # on the runner's clock
    why: str


NEVER_PAUSED = Pause(until=-math.inf, why="")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerState:
    """The daemon's state. `preemption` stays once STOPPING, so a lease that comes after the
    notice is still released without work; `pause` stays once over, for the line saying
    claiming resumed."""

    phase: RunnerPhase = RunnerPhase.SERVING
    preemption: Preemption | None = None
    exit_code: int = 0
    answered: bool = False  # the supervisor has answered once: READY=1 was sent
    down_since: float | None = None  # the supervisor is unreachable since then
    pool: str | None = None  # known once the supervisor said whose token this is
    token_stale: bool = False  # the token was refused: read it again before claiming
    pause: Pause = NEVER_PAUSED
    next_pause_s: float  # the next pause for an operator problem or a refused token
    resuming: bool = False  # a pause was waited out and no claim has come back since
    claim_asks: int = 0  # slots the claim on its way asks for

    # ---- what the state says --------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self.phase is RunnerPhase.STOPPING

    def paused(self, now: float) -> bool:
        return now < self.pause.until

    def takes_leases(self, now: float) -> bool:
        """Whether the runner may be given leases now: serving, not paused, its token not
        refused and its pool known."""
        return (
            self.phase is RunnerPhase.SERVING
            and not self.paused(now)
            and not self.token_stale
            and self.pool is not None
        )

    def describe(self, now: float) -> str:
        """The state as systemd's STATUS says it, the most pressing first."""
        if self.phase is RunnerPhase.STOPPING:
            return "stopping"
        if self.preemption is not None:
            return f"preempted ({self.preemption.notice.provider}): claiming nothing more"
        if self.down_since is not None:
            return "supervisor unreachable"
        if self.paused(now):
            return f"paused: {self.pause.why}"
        return "claiming"

    # ---- the daemon's life ------------------------------------------------------------------

    def stop(self) -> RunnerState:
        """Shutdown asked: claim nothing more; a preemption heard before is kept."""
        return dataclasses.replace(self, phase=RunnerPhase.STOPPING)

    def force_stop(self, exit_code: int) -> RunnerState:
        return dataclasses.replace(self, phase=RunnerPhase.STOPPING, exit_code=exit_code)

    def cannot_start(self, exit_code: int) -> RunnerState:
        """The daemon ends with `exit_code` without being asked to stop."""
        return dataclasses.replace(self, exit_code=exit_code)

    def preempt(self, notice: Notice, cancel_at: float) -> RunnerState:
        """From SERVING: the cloud reclaims the server."""
        return dataclasses.replace(
            self,
            phase=RunnerPhase.PREEMPTED,
            preemption=Preemption(notice=notice, cancel_at=cancel_at),
        )

    # ---- the supervisor ---------------------------------------------------------------------

    def supervisor_answered(self) -> RunnerState:
        return dataclasses.replace(self, answered=True)

    def link_down(self, now: float) -> RunnerState:
        return dataclasses.replace(self, down_since=now)

    def link_up(self) -> RunnerState:
        return dataclasses.replace(self, down_since=None)

    def introduced(self, pool: str) -> RunnerState:
        return dataclasses.replace(self, pool=pool)

    def token_refused(self) -> RunnerState:
        return dataclasses.replace(self, token_stale=True)

    def token_read_again(self, *, replaced: bool) -> RunnerState:
        """The token file was read again; a new token may serve another pool, so the
        supervisor is asked again whose it is."""
        return dataclasses.replace(self, token_stale=False, pool=None if replaced else self.pool)

    # ---- claiming and its pauses ------------------------------------------------------------

    def claiming(self, slots: int) -> RunnerState:
        """A claim for `slots` leases is on its way (0: none is)."""
        return dataclasses.replace(self, claim_asks=slots)

    def paused_until(self, until: float, why: str) -> RunnerState:
        return dataclasses.replace(self, pause=Pause(until=until, why=why))

    def pause_grown(self, pause_max_s: float) -> RunnerState:
        """The next pause for an operator problem or a refused token: twice this one's."""
        return dataclasses.replace(self, next_pause_s=min(2 * self.next_pause_s, pause_max_s))

    def pause_reset(self, pause_initial_s: float) -> RunnerState:
        """A step was reported: the next such pause is the first one's length again."""
        return dataclasses.replace(self, next_pause_s=pause_initial_s)

    def pause_waited_out(self) -> RunnerState:
        return dataclasses.replace(self, resuming=True)

    def claim_answered(self) -> RunnerState:
        """A claim came back: claiming has resumed, if it was paused."""
        return dataclasses.replace(self, resuming=False)
