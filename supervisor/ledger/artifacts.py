"""Who may read each stored artifact, and how many bytes each uploader keeps (docs/design.md,
Artifacts): one row per digest, uploader (an operator's tenant or a runner's pool) and the
tenant it was uploaded for. The bytes themselves are kept by `tether.supervisor.artifacts`;
the ledger only records who uploaded them, for whom, and which rows nothing names any more.

A runner uploads for a lease it holds (`upload_tenant`): its row carries that task's tenant,
and only that tenant's operators read it; a runner's upload that names no lease has no tenant
('') and is read by its pool's runners alone. An operator's row carries its own tenant.
"""

from __future__ import annotations

import dataclasses

from tether.supervisor.ledger.errors import QuotaExceeded, StaleFence
from tether.supervisor.ledger.records import OwnerRow, OwnerSince
from tether.supervisor.ledger.states import StepState
from tether.supervisor.ledger.steps import held_step, lapsed
from tether.supervisor.ledger.tokens import Principal, Role
from tether.supervisor.ledger.tx import Statements, Tx, TypedReads

NO_TENANT = ""  # a runner's upload that named no lease


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArtifactOwner:
    """A role and scope that uploaded a digest's bytes for `tenant`, and when it first did."""

    digest: str
    role: Role
    scope: str
    tenant: str
    size: int
    created_at: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Upload:
    """Who an upload is recorded for: the tenant that may read it, and the step whose lease a
    runner uploaded it for (None for an operator's, or a runner's that named no lease)."""

    tenant: str
    step_id: str | None = None


def upload_tenant(
    s: TypedReads, who: Principal, lease: tuple[str, int] | None, now: float
) -> Upload:
    """What an upload by `who` is recorded for. A runner names the lease (step id, fence) it
    uploads for: `NotFound` unless the step is of its pool and that lease was granted to its
    token (`steps.held_step`, as for every rule about a lease), `StaleFence` unless the
    fence is the step's current one and the lease is live."""
    if who.role is Role.OPERATOR:
        return Upload(tenant=who.scope)
    if lease is None:
        return Upload(tenant=NO_TENANT)
    step_id, fence = lease
    step = held_step(s, step_id, fence, who.token_id, who.scope)
    if step.fence != fence or step.state != StepState.LEASED or lapsed(step, now):
        raise StaleFence(f"fence {fence} holds no live lease on step {step_id}")
    return Upload(tenant=step.tenant, step_id=step_id)


def bytes_kept(s: Statements, who: Principal, besides: str) -> int:
    """The bytes of the distinct digests `who`'s role and scope uploaded, but `besides`: what
    its quota counts before an upload of `besides` (the same bytes again count once)."""
    row = s.one("artifact_bytes_kept", role=who.role.value, scope=who.scope, besides=besides)
    return int(row["kept"]) if row is not None else 0


def quota_problem(kept: int, size: int, who: Principal, quota: int) -> QuotaExceeded | None:
    """The refusal when `size` more bytes than the `kept` would pass `quota`, else None."""
    if kept + size <= quota:
        return None
    return QuotaExceeded(
        f"{who.role.value} {who.scope!r} keeps {kept} artifact bytes; {size} more would pass"
        f" its quota of {quota} (artifact_quota_bytes)"
    )


def record_upload(
    tx: Tx, digest: str, size: int, who: Principal, upload: Upload, quota: int
) -> bool:
    """Record that `who` uploaded the bytes of `digest` for `upload.tenant`; returns False when
    that row was there already (the first upload's is kept). `QuotaExceeded`, recording
    nothing, when they would take its role and scope's bytes past `quota`."""
    refusal = quota_problem(bytes_kept(tx, who, digest), size, who, quota)
    if refusal is not None:
        raise refusal
    changed = tx.count(
        "record_artifact_owner",
        digest=digest,
        role=who.role.value,
        scope=who.scope,
        tenant=upload.tenant,
        step_id=upload.step_id,
        size=size,
        token_id=who.token_id,
        now=tx.now,
    )
    return changed == 1


def owners(s: TypedReads, digest: str) -> list[ArtifactOwner]:
    """Every role, scope and tenant that `digest` was uploaded by and for, oldest first."""
    rows = s.all_as(OwnerSince, "owners_of_artifact", digest=digest)
    return [
        ArtifactOwner(
            digest=r.digest,
            role=Role(r.role),
            scope=r.scope,
            tenant=r.tenant,
            size=r.size,
            created_at=r.created_at,
        )
        for r in rows
    ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Forgotten:
    """What one turn of the collector removed from the ledger: how many owner rows, and the
    digests no row names any more (their bytes may go) with their sizes."""

    rows: int
    digests: dict[str, int]


def forget_unreferenced(tx: Tx, uploaded_before: float, limit: int) -> Forgotten:
    """Remove up to `limit` owner rows older than `uploaded_before` whose digest no step names
    and whose step is not leased now; return them and the digests left with no row."""
    found = tx.all_as(
        OwnerRow, "unreferenced_artifact_owners", uploaded_before=uploaded_before, limit=limit
    )
    for r in found:
        tx.run(
            "forget_artifact_owner", digest=r.digest, role=r.role, scope=r.scope, tenant=r.tenant
        )
    orphaned = {
        r.digest: int(r.size) for r in found if tx.one("artifact_owned", digest=r.digest) is None
    }
    return Forgotten(rows=len(found), digests=orphaned)


def owned(s: Statements, digest: str) -> bool:
    """Whether any owner row names `digest`."""
    return s.one("artifact_owned", digest=digest) is not None


def verified_in_pool(s: Statements, digest: str, pool: str) -> bool:
    """Whether `digest` is the candidate's bundle of a verify step leased now to a runner of
    `pool` (docs/design.md, Verification): the verifier reads what another pool uploaded."""
    return s.one("bundle_verified_in_pool", bundle=digest, pool=pool) is not None
