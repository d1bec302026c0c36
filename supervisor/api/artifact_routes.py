"""Artifact routes (docs/design.md, Artifacts): upload bytes under their sha256, read them back.

A digest is visible to a tenant only if a token of that tenant, or a runner token of a pool the
tenant may use, uploaded its bytes; to a runner token, only if a runner of its own pool did
(the bundles and checkpoints its pool's runners resume from); to anyone else it is
`not_found`, like another tenant's task. An upload always sends the bytes, even when the store
holds them already: knowing a digest is not enough to be allowed to read it. The bytes are read
and written through `artifacts.port.Artifacts`: files on this box, or the PostgreSQL ledger's
database that every supervisor on it shares.
"""

from __future__ import annotations

import structlog
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tether.supervisor.api.auth import may_use_pool, require
from tether.supervisor.api.errors import ApiError, record_response
from tether.supervisor.artifacts import DigestMismatch, InvalidDigest, TooLarge, check_digest
from tether.supervisor.artifacts.port import Artifacts
from tether.supervisor.ledger import Ledger, Principal, Role
from tether.supervisor.ledger.artifacts import ArtifactOwner
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


async def put_artifact(request: Request) -> Response:
    who = await require(request, Role.RUNNER, Role.OPERATOR)
    digest = _digest(request)
    store: Artifacts = request.app.state.artifacts
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise ApiError(ErrorCode.BAD_REQUEST, "Content-Length is not a number")
        if int(declared) > store.max_bytes:
            raise _too_large(store.max_bytes)
    async with store.receiving() as upload:
        try:
            async for chunk in request.stream():
                await upload.write(chunk)
            created = await upload.commit(digest)
        except TooLarge:
            raise _too_large(store.max_bytes) from None
        except DigestMismatch as exc:
            raise ApiError(ErrorCode.DIGEST_MISMATCH, str(exc)) from None
    ledger: Ledger = request.app.state.ledger
    await ledger.record_artifact(digest, upload.size, who)
    if created:
        log.info(
            "artifact stored", digest=digest, size=upload.size, role=who.role.value,
            scope=who.scope, token_id=who.token_id,
        )  # fmt: skip
    return record_response(ArtifactStored(digest=digest, size=upload.size, created=created))


def visible_to(tenant: str, owner: ArtifactOwner, shared: frozenset[str]) -> bool:
    """Whether `tenant` may read what `owner` uploaded: its own uploads, and its pools'."""
    if owner.role is Role.OPERATOR:
        return owner.scope == tenant
    return may_use_pool(tenant, owner.scope, shared)


def readable_by(who: Principal, owner: ArtifactOwner, shared: frozenset[str]) -> bool:
    """Whether `who` may read what `owner` uploaded: a runner its own pool's runners'
    uploads, an operator what `visible_to` its tenant."""
    if who.role is Role.RUNNER:
        return owner.role is Role.RUNNER and owner.scope == who.scope
    return visible_to(who.scope, owner, shared)


async def get_artifact(request: Request) -> Response:
    who: Principal = await require(request, Role.OPERATOR, Role.RUNNER)
    digest = _digest(request)
    ledger: Ledger = request.app.state.ledger
    shared: frozenset[str] = request.app.state.settings.shared_pool_names
    owners = await ledger.artifact_owners(digest)
    if not any(readable_by(who, owner, shared) for owner in owners):
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


ROUTES = [
    Route("/v1/artifacts/{digest}", put_artifact, methods=["PUT"]),
    Route("/v1/artifacts/{digest}", get_artifact, methods=["GET"]),
]
