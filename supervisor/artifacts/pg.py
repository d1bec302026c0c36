"""The artifact store's bytes in the ledger's PostgreSQL database (migration 0009,
`artifact_chunks`), so that every supervisor on one database reads what any of them stored:
a report's bundle and logs uploaded to A are evidence on B, and a runner that failed over
fetches its checkpoint's bundle from B.

An upload is received into a temporary file on this box, hashed as it arrives, exactly as the
file store receives one (`store.Spool`): a slow or stalled client holds no connection and no
transaction, only a file. Once its bytes hash to the digest the file is copied into chunks of
`CHUNK_BYTES` in one short transaction, so a refused or cut-short upload leaves nothing in the
database and a large one is never held whole in memory. Reads take a pooled connection per
chunk: a slow reader holds none between chunks, and committed chunks never change.

The statements are named queries in `sql/artifacts.postgresql.sql`, parsed by the ledger's
loader functions but kept out of its folder: a SQLite ledger never runs them.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Final

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from tether.supervisor.artifacts.store import (
    Held,
    InvalidDigest,
    Spool,
    check_digest,
    temporary_file,
)
from tether.supervisor.ledger import pg_schema, queries
from tether.supervisor.ledger.errors import StorageError

CHUNK_BYTES: Final = 1024 * 1024
CONNECTIONS: Final = 4  # reads and uploads' copies at once; more wait up to WAIT_S
WAIT_S: Final = 10.0


def _load() -> Mapping[str, str]:
    folder = resources.files("tether.supervisor.artifacts")
    source = folder.joinpath("sql", "artifacts.postgresql.sql")
    found = queries.parse(source.read_text(encoding="utf-8"), source.name)
    for name, _, text in found:
        queries.params_of(text, source.name, name)  # named parameters only, as the ledger's
    return {name: queries.to_pyformat(text) for name, _, text in found}


Q: Final = _load()


class PgUpload(Spool):
    """An upload on its way to the database; see `PgArtifactStore.receiving`."""

    def __init__(self, store: PgArtifactStore, fd: int, temp: Path) -> None:
        super().__init__(store.max_bytes, fd, temp)
        self._store = store

    async def commit(self, digest: str) -> bool:
        """Keep the bytes as `digest`; returns False when the store already held them.

        Raises `DigestMismatch` (and keeps nothing) when the bytes are not `digest`'s."""
        await self.verify(digest)
        return await self._store._copy_in(self, digest)

    def chunk(self, n: int) -> bytes:
        """The `n`th chunk of the received bytes (blocking: a file read)."""
        return self.read_at(n * CHUNK_BYTES, CHUNK_BYTES)


class PgArtifactStore:
    """The chunks in the database at `url`, at most `max_bytes` per artifact; `root` is this
    box's folder for the copies git reads (`local_file`)."""

    def __init__(self, url: str, root: Path, max_bytes: int) -> None:
        self.url = url
        self.root = root
        self.max_bytes = max_bytes
        self._pool = AsyncConnectionPool(
            url,
            min_size=0,
            max_size=CONNECTIONS,
            timeout=WAIT_S,
            open=False,
            kwargs={
                "autocommit": True,
                "connect_timeout": pg_schema.CONNECT_TIMEOUT_S,
                **pg_schema.liveness(url),
            },
            check=AsyncConnectionPool.check_connection,
            name="tether-artifacts",
        )

    @property
    def _temp_dir(self) -> Path:
        return self.root / "tmp"

    async def open(self) -> None:
        """Open the pool; create this box's folder for copies, emptied of a crash's."""

        def folders() -> None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

        await anyio.to_thread.run_sync(folders)
        await self._pool.open()

    async def close(self) -> None:
        await self._pool.close()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        try:
            async with self._pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise StorageError(
                f"the artifact store got no connection to {pg_schema.redact(self.url)}"
                f" within {WAIT_S:.0f} s"
            ) from exc

    @contextlib.asynccontextmanager
    async def receiving(self) -> AsyncIterator[PgUpload]:
        """An upload into a temporary file, copied into the database by `commit`; the file is
        removed when the block ends."""
        async with temporary_file(self._temp_dir) as (fd, temp):
            yield PgUpload(self, fd, temp)

    async def _copy_in(self, upload: PgUpload, digest: str) -> bool:
        """Write `upload`'s checked bytes as `digest`'s chunks in one transaction; False when
        the store held them already (or another upload of them committed first)."""
        count = max(1, -(-upload.size // CHUNK_BYTES))  # an empty artifact is one empty chunk
        try:
            async with self._connection() as conn, conn.transaction():
                if await self._stored(conn, digest):
                    return False
                for n in range(count):
                    piece = await anyio.to_thread.run_sync(upload.chunk, n)
                    await _storage(
                        conn.execute(
                            Q["put_artifact_chunk"], {"digest": digest, "n": n, "data": piece}
                        )
                    )
        except psycopg.errors.UniqueViolation:  # waited for a concurrent upload's commit
            return False
        return True

    async def _stored(self, conn: psycopg.AsyncConnection[Any], digest: str) -> bool:
        cursor = await _storage(conn.execute(Q["artifact_stored"], {"digest": digest}))
        row = await cursor.fetchone()
        return bool(row and row[0])

    async def _one(self, query: str, params: Mapping[str, Any]) -> Any:
        async with self._connection() as conn:
            cursor = await _storage(conn.execute(Q[query], params, binary=True))
            row = await cursor.fetchone()
        return None if row is None else row[0]

    async def size_of(self, digest: str) -> int | None:
        try:
            check_digest(digest)
        except InvalidDigest:
            return None
        size = await self._one("artifact_size", {"digest": digest})
        return None if size is None else int(size)

    async def chunks(self, digest: str) -> AsyncIterator[bytes]:
        try:
            check_digest(digest)
        except InvalidDigest:
            return
        n = 0
        while (data := await self._one("artifact_chunk", {"digest": digest, "n": n})) is not None:
            yield bytes(data)
            n += 1

    async def held(self, digest: str) -> Held:
        hasher = hashlib.sha256()
        seen = False
        async for chunk in self.chunks(digest):
            seen = True
            await anyio.to_thread.run_sync(hasher.update, chunk)
        if not seen:
            return Held.MISSING
        return Held.INTACT if hasher.hexdigest() == digest else Held.CHANGED

    async def remove(self, digest: str) -> bool:
        """Remove `digest`'s chunks (the collector's), unless an owner row names it again by
        now; False when none were removed."""
        check_digest(digest)
        async with self._connection() as conn:
            cursor = await _storage(conn.execute(Q["remove_unowned_artifact"], {"digest": digest}))
        return bool(cursor.rowcount)

    @contextlib.asynccontextmanager
    async def local_file(self, digest: str) -> AsyncIterator[Path]:
        """A copy named `digest` in a private folder of this box's, removed when the block
        ends."""
        check_digest(digest)
        folder = Path(await anyio.to_thread.run_sync(lambda: tempfile.mkdtemp(dir=self._temp_dir)))
        path = folder / digest
        try:
            wrote = False
            async with await anyio.open_file(path, "wb") as file:
                async for chunk in self.chunks(digest):
                    await file.write(chunk)
                    wrote = True
            if not wrote:
                raise FileNotFoundError(f"artifact {digest}'s bytes are not in the store")
            yield path
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(lambda: shutil.rmtree(folder, ignore_errors=True))


async def _storage(pending: Any) -> Any:
    """Await a statement; the server or the connection failing is the ledger's StorageError
    (503), a statement's mistake stays a bug."""
    try:
        return await pending
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise StorageError(f"the artifact store could not reach its database: {exc}") from exc
