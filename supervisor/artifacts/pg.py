"""The artifact store's bytes in the ledger's PostgreSQL database (migration 0009,
`artifact_chunks`), so that every supervisor on one database reads what any of them stored:
a report's bundle and logs uploaded to A are evidence on B, and a runner that failed over
fetches its checkpoint's bundle from B.

An upload is written as it arrives, in chunks of `CHUNK_BYTES`, inside one transaction and
under a placeholder name (`upload:<random>`); only when its bytes hash to the digest are the
chunks renamed to it and committed, so a refused or cut-short upload leaves nothing and a
large one is never held whole in memory. Reads take a pooled connection per chunk: a slow
client holds no connection between chunks, and committed chunks never change.

The statements are named queries in `sql/artifacts.postgresql.sql`, parsed by the ledger's
loader functions but kept out of its folder: a SQLite ledger never runs them.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Final

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from supervisor.artifacts.store import (
    DigestMismatch,
    Held,
    InvalidDigest,
    TooLarge,
    check_digest,
)
from supervisor.ledger import pg_schema, queries
from supervisor.ledger.errors import StorageError

CHUNK_BYTES: Final = 1024 * 1024
CONNECTIONS: Final = 4  # uploads and reads in flight at once; more wait up to WAIT_S
WAIT_S: Final = 10.0
PLACEHOLDER: Final = "upload:"


def _load() -> Mapping[str, str]:
    source = resources.files("supervisor.artifacts").joinpath("sql", "artifacts.postgresql.sql")
    found = queries.parse(source.read_text(encoding="utf-8"), source.name)
    return {name: queries.to_pyformat(text) for name, _, text in found}


Q: Final = _load()


class PgUpload:
    """Bytes being written into the database; see `PgArtifactStore.receiving`."""

    def __init__(self, store: PgArtifactStore, conn: psycopg.AsyncConnection[Any]) -> None:
        self._store = store
        self._conn = conn
        self._name = PLACEHOLDER + secrets.token_hex(16)
        self._hash = hashlib.sha256()
        self._buffer = bytearray()
        self._chunks = 0
        self.size = 0
        self.kept = False  # whether `commit` named the chunks: the transaction then commits

    async def write(self, chunk: bytes) -> None:
        """Take the next bytes; raises `TooLarge` once they pass the store's limit."""
        self.size += len(chunk)
        if self.size > self._store.max_bytes:
            raise TooLarge(f"the artifact exceeds {self._store.max_bytes} bytes")
        self._buffer += chunk
        while len(self._buffer) >= CHUNK_BYTES:
            piece = bytes(self._buffer[:CHUNK_BYTES])
            del self._buffer[:CHUNK_BYTES]
            await self._put(piece)

    async def _put(self, piece: bytes) -> None:
        await anyio.to_thread.run_sync(self._hash.update, piece)
        await _storage(
            self._conn.execute(Q["put_artifact_chunk"], (self._name, self._chunks, piece))
        )
        self._chunks += 1

    async def commit(self, digest: str) -> bool:
        """Keep the bytes as `digest`; returns False when the store already held them.

        Raises `DigestMismatch` (and keeps nothing) when the bytes are not `digest`'s."""
        if self._buffer or self._chunks == 0:  # the tail, or an empty artifact's one chunk
            await self._put(bytes(self._buffer))
            self._buffer.clear()
        found = self._hash.hexdigest()
        if found != digest:
            raise DigestMismatch(f"the bytes' sha256 is {found}, not {digest}")
        if await self._store._stored(self._conn, digest):
            return False
        try:
            await _storage(self._conn.execute(Q["name_artifact_chunks"], (digest, self._name)))
        except psycopg.errors.UniqueViolation:  # another upload of these bytes committed first
            return False
        self.kept = True
        return True


class PgArtifactStore:
    """The chunks in the database at `url`, at most `max_bytes` per artifact; `root` is this
    box's folder for the copies git reads (`local_file`)."""

    def __init__(self, url: str, root: Path, max_bytes: int) -> None:
        self.url = url
        self.root = root
        self.max_bytes = max_bytes
        self._pool = AsyncConnectionPool(
            url, min_size=0, max_size=CONNECTIONS, timeout=WAIT_S, open=False,
            kwargs={"autocommit": True, "connect_timeout": pg_schema.CONNECT_TIMEOUT_S},
            check=AsyncConnectionPool.check_connection, name="tether-artifacts",
        )  # fmt: skip

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
        """An upload in one transaction: committed when `commit` kept the bytes, else rolled
        back (a refusal, a client gone, a cancellation)."""
        async with self._connection() as conn:
            upload = PgUpload(self, conn)
            async with conn.transaction():
                yield upload
                if not upload.kept:  # refused, or the bytes were stored already
                    raise psycopg.Rollback

    async def _stored(self, conn: psycopg.AsyncConnection[Any], digest: str) -> bool:
        cursor = await _storage(conn.execute(Q["artifact_stored"], (digest,)))
        row = await cursor.fetchone()
        return bool(row and row[0])

    async def _one(self, query: str, params: tuple[Any, ...]) -> Any:
        async with self._connection() as conn:
            cursor = await _storage(conn.execute(Q[query], params, binary=True))
            row = await cursor.fetchone()
        return None if row is None else row[0]

    async def size_of(self, digest: str) -> int | None:
        try:
            check_digest(digest)
        except InvalidDigest:
            return None
        size = await self._one("artifact_size", (digest,))
        return None if size is None else int(size)

    async def chunks(self, digest: str) -> AsyncIterator[bytes]:
        try:
            check_digest(digest)
        except InvalidDigest:
            return
        n = 0
        while (data := await self._one("artifact_chunk", (digest, n))) is not None:
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
