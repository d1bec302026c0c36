"""The runner's exceptions, grouped by what the runner does about them.

    RunnerError
    ├── LeaseLost                 the step is no longer ours: drop it at once, report nothing
    ├── StepFailure               the step ends here on this runner: release the lease
    │   ├── StepRejected          it cannot succeed as given (model 400, bad payload):
    │   │                         release `invalid`, not retryable, the task fails
    │   ├── StepUnsupported       this runner cannot run it (unknown kind, hash mismatch):
    │   │                         release `invalid`, retryable, counted toward max_attempts
    │   ├── OperatorProblem       a missing or rejected model key, an exhausted quota, a wrong
    │   │                         model URL, no working sandbox for an agent step's commands:
    │   │                         release `operator` (not counted), pause claiming
    │   ├── BudgetExhausted       the tenant's token budget is spent (a renew said so):
    │   │                         release `operator` (not counted); the task waits for more
    │   ├── Preempted             the cloud reclaims the server (runner.preemption): release
    │   │                         `preempted` (not counted); another runner resumes it
    │   ├── ArtifactRefused       the artifact store refused an upload (too large, digest
    │   │                         mismatch) or has no such digest for this runner: release
    │   │                         `invalid`, not retryable (another runner would hear the same)
    │   └── TransientFailure      the model stayed unavailable within the step's deadline:
    │       │                     release `transient`, retryable, counted
    │       └── ArtifactCorrupt   a downloaded artifact's bytes do not hash to its digest
    └── SupervisorError           talking to the supervisor went wrong
        ├── SupervisorUnreachable transport error or 5xx: back off and try again (with
        │                         several supervisors, the next one first: runner.failover)
        ├── TokenRejected         401/403: the runner token is wrong or revoked; stop claiming
        ├── SupervisorRefused     any other 4xx: the runner sent something the supervisor
        │                         will never accept (a bug or a version skew)
        └── NotASupervisor        the URL replies, but not as a tether supervisor (the model
                                  server, a URL ending in /v1): stop at start, never ready

The docstring of each class is its default message.
"""

from __future__ import annotations

import enum

from tether.wire import ReleaseReason


class RunnerError(Exception):
    """The runner hit a problem."""

    def __init__(self, detail: str | None = None) -> None:
        self.detail = detail or (self.__doc__ or type(self).__name__).strip()
        super().__init__(self.detail)


class LostBecause(enum.StrEnum):
    """Why a lease is no longer ours."""

    STALE_FENCE = "stale_fence"
    PAYLOAD_DRIFT = "payload_drift"
    TERMINAL = "terminal"
    NOT_FOUND = "not_found"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    TOKEN_REJECTED = "token_rejected"  # noqa: S105 (a reason, not a secret)


class LeaseLost(RunnerError):
    """The lease is no longer ours; the step is dropped and nothing is reported."""

    def __init__(self, because: LostBecause, detail: str | None = None) -> None:
        self.because = because
        super().__init__(detail or f"lease lost: {because}")


class StepFailure(RunnerError):
    """The step cannot finish on this runner."""

    reason: ReleaseReason = ReleaseReason.TRANSIENT
    retryable: bool = True


class StepRejected(StepFailure):
    """The step's payload cannot succeed; retrying it would fail the same way."""

    reason = ReleaseReason.INVALID
    retryable = False


class StepUnsupported(StepFailure):
    """This runner cannot run the step; another runner might."""

    reason = ReleaseReason.INVALID
    retryable = True


class OperatorProblem(StepFailure):
    """Only an operator can fix this: the model provider refused us, or no sandbox works for
    an agent step's commands (runner.agent.sandbox_policy)."""

    reason = ReleaseReason.OPERATOR
    retryable = True

    def __init__(self, detail: str | None = None, *, action: str, about_key: bool = False) -> None:
        self.action = action
        self.about_key = about_key  # the key itself is wrong or missing: name its file
        super().__init__(detail)


class BudgetExhausted(StepFailure):
    """The tenant's token budget is spent; the step waits in the queue until it is raised."""

    reason = ReleaseReason.OPERATOR
    retryable = True


class Preempted(StepFailure):
    """The cloud reclaims this server; the step goes on elsewhere from its last checkpoint."""

    reason = ReleaseReason.PREEMPTED
    retryable = True


class ArtifactRefused(StepRejected):
    """The artifact store refused the request; sending the same again would fail the same way."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        self.status = status
        self.code = code
        super().__init__(detail)


class TransientFailure(StepFailure):
    """The model stayed unavailable within the step's deadline."""

    reason = ReleaseReason.TRANSIENT
    retryable = True

    def __init__(self, detail: str | None = None, *, retry_after_s: float | None = None) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(detail)


class ArtifactCorrupt(TransientFailure):
    """A downloaded artifact's bytes do not hash to its digest; nothing was written."""


class SupervisorError(RunnerError):
    """The supervisor call failed."""


class SupervisorUnreachable(SupervisorError):
    """The supervisor gave no useful reply (connection error, timeout or 5xx)."""


class TokenRejected(SupervisorError):
    """The supervisor refused the runner token (401/403): it is wrong or was revoked."""


class SupervisorRefused(SupervisorError):
    """The supervisor refused the request as malformed."""

    def __init__(self, status: int, code: str, detail: str, *, request: str = "") -> None:
        self.status = status
        self.code = code
        said = f"{status} {code}: {detail}"
        super().__init__(f"{request} answered {said}" if request else said)


class NotASupervisor(SupervisorError):
    """The supervisor URL replies, but not as a tether supervisor."""
