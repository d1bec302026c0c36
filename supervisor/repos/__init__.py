"""The repositories the supervisor reads itself: remote heads, its own bare mirrors, the
candidates runners send as bundles, and the evidence check of a candidate (`mirror`).

Everything here is slow I/O run by the ledger's adapters, never inside a ledger rule."""

from tether.git import GitError, redact
from tether.supervisor.repos.mirror import (
    BundleRefused,
    MirrorDamaged,
    MirrorError,
    Mirrors,
    NoSuchHead,
    RefTaken,
    Refusal,
    RefusalCode,
    RemoteFailed,
    candidate_ref,
    ls_remote,
    path_allowed,
    remote_head,
)

__all__ = [
    "BundleRefused",
    "GitError",
    "MirrorDamaged",
    "MirrorError",
    "Mirrors",
    "NoSuchHead",
    "RefTaken",
    "Refusal",
    "RefusalCode",
    "RemoteFailed",
    "candidate_ref",
    "ls_remote",
    "path_allowed",
    "redact",
    "remote_head",
]
