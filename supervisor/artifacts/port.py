"""What the API, the evidence check and the mirrors need of an artifact store, whichever keeps
the bytes: files on this box (`store.ArtifactStore`, a SQLite ledger) or the ledger's
PostgreSQL database (`pg.PgArtifactStore`, shared by every supervisor on it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

from tether.supervisor.artifacts.store import Held


class Receiving(Protocol):
    """An upload in progress: nothing of it is kept unless `commit` keeps it."""

    size: int

    async def write(self, chunk: bytes) -> None:
        """Take the next bytes; raises `TooLarge` once they pass the store's limit."""
        ...

    async def commit(self, digest: str) -> bool:
        """Keep the bytes as `digest`; False when the store held them already. Raises
        `DigestMismatch` (keeping nothing) when they are not `digest`'s."""
        ...


class Artifacts(Protocol):
    """Content-addressed bytes of at most `max_bytes` each, named by their sha256."""

    @property
    def max_bytes(self) -> int: ...

    def receiving(self) -> AbstractAsyncContextManager[Receiving]:
        """An upload; whatever it did not commit is gone when the block ends."""
        ...

    async def held(self, digest: str) -> Held:
        """Nothing, bytes that hash to `digest`, or bytes that no longer do. Reads them all."""
        ...

    async def size_of(self, digest: str) -> int | None:
        """How many bytes the store holds under `digest`; None when it holds none."""
        ...

    def chunks(self, digest: str) -> AsyncIterator[bytes]:
        """`digest`'s bytes in order, a chunk (at most about 1 MiB) at a time; nothing at all
        when the store holds none."""
        ...

    async def remove(self, digest: str) -> bool:
        """Remove `digest`'s bytes (the collector's, once no owner row names it); False when
        the store held none."""
        ...

    def local_file(self, digest: str) -> AbstractAsyncContextManager[Path]:
        """A file on this box holding `digest`'s bytes for the block (git reads bundles from
        files); `FileNotFoundError` when the store holds none."""
        ...
