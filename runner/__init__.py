"""tether runner: the light daemon on a borrowed server.

It claims fenced leases from the supervisor, runs each step (a `chat` call to an
OpenAI-compatible model, or a kind a deployment registers), renews its leases by fence while
it works, and reports the result. It keeps nothing that matters: a step it loses is replayed
elsewhere with the same step id. Run-time dependencies: anyio, httpx, structlog, tenacity,
and sniffio, which httpcore looks for on every request (see pyproject.toml).
"""

from tether.runner.daemon import Runner
from tether.runner.kinds.base import StepContext, StepKind, StepOutput
from tether.runner.kinds.registry import KindRegistry
from tether.runner.settings import RunnerSettings

__all__ = ["KindRegistry", "Runner", "RunnerSettings", "StepContext", "StepKind", "StepOutput"]
