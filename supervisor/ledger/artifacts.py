"""Who may read each stored artifact (docs/design.md, Artifacts): one row per digest and
uploader, an operator's tenant or a runner's pool. The bytes themselves are files kept by
`tether.supervisor.artifacts.store`; the ledger only records who uploaded them.
"""

from __future__ import annotations

import dataclasses

from tether.supervisor.ledger.tokens import Principal, Role
from tether.supervisor.ledger.tx import Statements, Tx


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArtifactOwner:
    """A role and scope that uploaded a digest's bytes, and when it first did."""

    digest: str
    role: Role
    scope: str
    size: int
    created_at: float


def record_upload(tx: Tx, digest: str, size: int, who: Principal) -> bool:
    """Record that `who` uploaded the bytes of `digest`; returns False when its role and scope
    had already uploaded them (the first upload's row is kept)."""
    changed = tx.run(
        "record_artifact_owner",
        (digest, who.role.value, who.scope, size, who.token_id, tx.now),
    )
    return changed == 1


def owners(s: Statements, digest: str) -> list[ArtifactOwner]:
    """Every role and scope that uploaded `digest`, oldest first."""
    rows = s.all("owners_of_artifact", (digest,))
    return [
        ArtifactOwner(
            digest=r["digest"], role=Role(r["role"]), scope=r["scope"], size=r["size"],
            created_at=r["created_at"],
        )
        for r in rows
    ]  # fmt: skip
