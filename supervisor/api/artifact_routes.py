"""Artifact routes (docs/design.md, Artifacts): upload bytes under their sha256, read them back.

A digest is visible to an operator only if it was uploaded for the operator's tenant: by a
token of that tenant, or by a runner for a lease of that tenant's task (`?step_id=&fence=`, the
lease it holds); to a runner token, only if a runner of its own pool uploaded it (the bundles
and checkpoints its pool's runners resume from); to anyone else it is `not_found`, like another
tenant's task. An upload always sends the bytes, even when the store holds them already:
knowing a digest is not enough to be allowed to read it. Each pool's runners, and each tenant's
operators, keep at most `artifact_quota_bytes` (413 `quota_exceeded`). The bytes are read and
written through `artifacts.port.Artifacts`: files on this box, or the PostgreSQL ledger's
database that every supervisor on it shares.
"""

from __future__ import annotations

import structlog
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tether.supervisor.api.errors import ApiError
from tether.supervisor.api.operation import Call
from tether.supervisor.artifacts import DigestMismatch, InvalidDigest, TooLarge, check_digest
from tether.supervisor.artifacts.collector import DigestLocks
from tether.supervisor.artifacts.port import Artifacts
from tether.supervisor.ledger import LedgerStore, Principal, Role
from tether.supervisor.ledger.artifacts import ArtifactOwner, quota_problem
from tether.supervisor.ledger.errors import QuotaExceeded
from tether.wire import ErrorCode
from tether.wire.records import ArtifactStored

log = structlog.get_logger("tether.api")


def _digest(request: Request) -> str:
    digest: str = request.path_params["digest"]
    try:
        check_digest(digest)
    except InvalidDigest as exc:
        raise ApiError(ErrorCode.INVALID_FIELD, f"path: {exc}") from None
    return digest


def _too_large(limit: int) -> ApiError:
    return ApiError(
        ErrorCode.BODY_TOO_LARGE, f"the artifact exceeds {limit} bytes (artifact_max_bytes)"
    )


FENCE_MAX = 2**63 - 1  # the ledger's integers


def _lease(request: Request, who: Principal) -> tuple[str, int] | None:
    """The lease a runner names for its upload (`?step_id=...&fence=...`), if it names one."""
    step_id = request.query_params.get("step_id")
    fence = request.query_params.get("fence")
    if step_id is None and fence is None:
        return None
    if who.role is not Role.RUNNER:
        raise ApiError(ErrorCode.INVALID_FIELD, "query: only a runner's upload names a lease")
    if not step_id or fence is None or not (fence.isascii() and fence.isdigit()):
        raise ApiError(
            ErrorCode.INVALID_FIELD, "query: a lease is named by `step_id` and `fence` (a number)"
        )
    if int(fence) > FENCE_MAX:
        raise ApiError(ErrorCode.INVALID_FIELD, f"query: `fence` is at most {FENCE_MAX}")
    return step_id, int(fence)


def _quota_error(refusal: Exception) -> ApiError:
    return ApiError(ErrorCode.QUOTA_EXCEEDED, str(refusal))


async def put_artifact(call: Call[None]) -> ArtifactStored:
    request, who = call.request, call.who
    digest = _digest(request)
    lease = _lease(request, who)
    store: Artifacts = request.app.state.artifacts
    ledger: LedgerStore = request.app.state.ledger
    quota: int = request.app.state.settings.artifact_quota_bytes
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise ApiError(ErrorCode.BAD_REQUEST, "Content-Length is not a number")
        if int(declared) > store.max_bytes:
            raise _too_large(store.max_bytes)
    upload_for = await ledger.artifact_upload(who, lease)
    kept = await ledger.artifact_bytes_kept(who, digest)
    refusal = quota_problem(kept, int(declared or 0), who, quota)
    if refusal is not None:
        raise _quota_error(refusal)
    locks: DigestLocks = request.app.state.artifact_locks
    async with store.receiving() as upload:
        try:
            async for chunk in request.stream():
                await upload.write(chunk)
            created = await upload.commit(digest)
        except TooLarge:
            raise _too_large(store.max_bytes) from None
        except DigestMismatch as exc:
            raise ApiError(ErrorCode.DIGEST_MISMATCH, str(exc)) from None
        async with locks.hold(digest):  # against the collector (artifacts/collector.py)
            try:
                await ledger.record_artifact(digest, upload.size, who, upload_for, quota)
            except QuotaExceeded as exc:
                if created and not await ledger.artifact_owned(digest):
                    await store.remove(digest)  # a refused upload keeps nothing
                raise _quota_error(exc) from None
            if not created and await store.size_of(digest) is None:
                created = await upload.commit(digest)  # the collector removed them meanwhile
    if created:
        log.info(
            "artifact stored",
            digest=digest,
            size=upload.size,
            role=who.role.value,
            scope=who.scope,
            tenant=upload_for.tenant or None,
            token_id=who.token_id,
        )
    return ArtifactStored(digest=digest, size=upload.size, created=created)


def visible_to(tenant: str, owner: ArtifactOwner) -> bool:
    """Whether `tenant`'s operators may read what `owner` uploaded: what it was uploaded for."""
    return owner.tenant == tenant


def readable_by(who: Principal, owner: ArtifactOwner) -> bool:
    """Whether `who` may read what `owner` uploaded: a runner its own pool's runners'
    uploads, an operator what `visible_to` its tenant."""
    if who.role is Role.RUNNER:
        return owner.role is Role.RUNNER and owner.scope == who.scope
    return visible_to(who.scope, owner)


async def get_artifact(call: Call[None]) -> Response:
    request, who = call.request, call.who
    digest = _digest(request)
    ledger: LedgerStore = request.app.state.ledger
    owners = await ledger.artifact_owners(digest)
    if not any(readable_by(who, owner) for owner in owners) and not (
        who.role is Role.RUNNER and await ledger.verifies_bundle(digest, who.scope)
    ):
        raise ApiError(ErrorCode.NOT_FOUND, f"no artifact {digest}")
    store: Artifacts = request.app.state.artifacts
    size = await store.size_of(digest)
    if size is None:
        log.error("artifact bytes missing", digest=digest)
        raise ApiError(ErrorCode.NOT_FOUND, f"artifact {digest}'s bytes are missing from the store")
    return StreamingResponse(
        store.chunks(digest),
        media_type="application/octet-stream",
        headers={"content-length": str(size)},
    )
