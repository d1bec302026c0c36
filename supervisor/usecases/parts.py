"""The parts of the running supervisor a runner's request acts through."""

from __future__ import annotations

import dataclasses

from tether.supervisor.artifacts.port import Artifacts
from tether.supervisor.ledger import LedgerStore
from tether.supervisor.repos import Mirrors
from tether.supervisor.usecases.unbound import UnboundSteps


@dataclasses.dataclass(frozen=True, slots=True)
class Parts:
    """The ledger, the repositories' mirrors, the artifact store and the steps this process
    granted unbound (`UnboundSteps`)."""

    ledger: LedgerStore
    mirrors: Mirrors
    artifacts: Artifacts
    unbound: UnboundSteps
