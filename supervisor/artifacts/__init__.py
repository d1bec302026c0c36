"""The content-addressed artifact store on the owned box (docs/design.md, Artifacts)."""

from tether.supervisor.artifacts.store import (
    ArtifactError,
    ArtifactStore,
    DigestMismatch,
    Held,
    InvalidDigest,
    TooLarge,
    check_digest,
)

__all__ = [
    "ArtifactError",
    "ArtifactStore",
    "DigestMismatch",
    "Held",
    "InvalidDigest",
    "TooLarge",
    "check_digest",
]
