"""The artifact store's bytes on the owned box (docs/design.md, Artifacts): one file per sha256
digest under `artifact_dir`, written atomically and never overwritten.

An upload streams into a temporary file in `artifact_dir/tmp` while it is hashed; it becomes
`artifact_dir/sha256/<2 hex>/<digest>` only once its size and digest are right, through a hard
link that fails if the file exists (so a second upload of the same bytes leaves the first in
place). Who may read a digest is the ledger's business (`supervisor/ledger/artifacts.py`).

Errors:

    ArtifactError
    ├── InvalidDigest   the name is not 64 lowercase hex characters
    ├── TooLarge        the bytes pass `max_bytes`
    └── DigestMismatch  the bytes' sha256 is not the digest they were sent as
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import anyio

from tether.supervisor import durable

_DIGEST = re.compile(r"[0-9a-f]{64}")
# Received bytes are written and hashed in steps of this size, each on a worker thread.
FLUSH_BYTES = 1024 * 1024
READ_BYTES = 1024 * 1024


class Held(enum.Enum):
    """What the store holds under a digest (`ArtifactStore.examine`)."""

    MISSING = "missing"  # no file
    INTACT = "intact"  # a file whose bytes hash to the digest
    CHANGED = "changed"  # a file whose bytes no longer do


class ArtifactError(Exception):
    """An upload the store refuses; nothing was stored."""


class InvalidDigest(ArtifactError):
    """An artifact is named by its sha256: 64 lowercase hex characters."""


class TooLarge(ArtifactError):
    """The artifact is larger than the store accepts."""


class DigestMismatch(ArtifactError):
    """The bytes' sha256 is not the digest they were sent as."""


def check_digest(digest: str) -> str:
    """`digest` itself if it names an artifact; raises `InvalidDigest` otherwise."""
    if not _DIGEST.fullmatch(digest):
        raise InvalidDigest(f"{digest[:80]!r} is not a sha256 digest (64 lowercase hex)")
    return digest


class Spool:
    """Bytes being received into a temporary file on this box, hashed as they arrive and
    refused past `max_bytes`: what an upload to either store is until its digest is checked."""

    def __init__(self, max_bytes: int, fd: int, temp: Path) -> None:
        self._max_bytes = max_bytes
        self._fd = fd
        self.temp = temp
        self._hash = hashlib.sha256()
        self._pending: list[bytes] = []
        self._pending_size = 0
        self.size = 0

    async def write(self, chunk: bytes) -> None:
        """Take the next bytes; raises `TooLarge` once they pass the store's limit."""
        self.size += len(chunk)
        if self.size > self._max_bytes:
            raise TooLarge(f"the artifact exceeds {self._max_bytes} bytes")
        self._pending.append(chunk)
        self._pending_size += len(chunk)
        if self._pending_size >= FLUSH_BYTES:
            await self._flush()

    async def _flush(self) -> None:
        data = b"".join(self._pending)
        self._pending, self._pending_size = [], 0
        await anyio.to_thread.run_sync(self._write_and_hash, data)

    def _write_and_hash(self, data: bytes) -> None:
        self._hash.update(data)  # hashlib lets go of the GIL on buffers this large
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    async def verify(self, digest: str) -> None:
        """Write out what is pending; raises `DigestMismatch` unless the bytes are `digest`'s."""
        await self._flush()
        found = self._hash.hexdigest()
        if found != digest:
            raise DigestMismatch(f"the bytes' sha256 is {found}, not {digest}")

    def read_at(self, offset: int, size: int) -> bytes:
        """Up to `size` of the received bytes from `offset` (after `verify`); blocking."""
        return os.pread(self._fd, size, offset)


class Upload(Spool):
    """An upload to the file store; see `ArtifactStore.receiving`."""

    def __init__(self, store: ArtifactStore, fd: int, temp: Path) -> None:
        super().__init__(store.max_bytes, fd, temp)
        self._store = store

    async def commit(self, digest: str) -> bool:
        """Keep the bytes as `digest`; returns False when the store already held them.

        Raises `DigestMismatch` (and keeps nothing) when the bytes are not `digest`'s.
        """
        await self.verify(digest)
        return await anyio.to_thread.run_sync(self._store._keep, self._fd, self.temp, digest)


@contextlib.asynccontextmanager
async def temporary_file(folder: Path) -> AsyncIterator[tuple[int, Path]]:
    """A new file in `folder`, open for writing and reading: its descriptor and path, both
    gone when the block ends (a hard link made to it meanwhile stays)."""
    fd, name = await anyio.to_thread.run_sync(
        lambda: tempfile.mkstemp(dir=folder, prefix="upload-")
    )
    temp = Path(name)
    try:
        yield fd, temp
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_discard, fd, temp)


class ArtifactStore:
    """The files under `root`: at most `max_bytes` each."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    @property
    def _temp_dir(self) -> Path:
        return self.root / "tmp"

    def open(self) -> None:
        """Create the folders (each synced into its parent), and remove what uploads cut short
        by a crash left behind."""
        shutil.rmtree(self._temp_dir, ignore_errors=True)
        durable.made_folder(self._temp_dir, mode=0o700)
        durable.made_folder(self.root / "sha256", mode=0o700)

    def path_of(self, digest: str) -> Path:
        check_digest(digest)
        return self.root / "sha256" / digest[:2] / digest

    @contextlib.asynccontextmanager
    async def receiving(self) -> AsyncIterator[Upload]:
        """An upload into a temporary file, removed on leaving unless `commit` kept it."""
        async with temporary_file(self._temp_dir) as (fd, temp):
            yield Upload(self, fd, temp)

    def _keep(self, fd: int, temp: Path, digest: str) -> bool:
        os.fsync(fd)
        final = self.path_of(digest)
        durable.made_folder(final.parent, mode=0o700)
        try:
            os.link(temp, final)  # unlike rename, never replaces a file already there
        except FileExistsError:
            return False
        durable.sync_folder(final.parent)
        return True

    def artifact_bytes_present(self, digest: str) -> bool:
        """Whether the store holds `digest`'s file and its bytes still hash to `digest`.

        Reads the whole file: call it on a worker thread from async code.
        """
        return self.examine(digest) is Held.INTACT

    def examine(self, digest: str) -> Held:
        """What the store holds under `digest`: nothing, bytes that hash to it, or bytes that
        no longer do (changed on disk since they were stored).

        Reads the whole file: call it on a worker thread from async code.
        """
        try:
            path = self.path_of(digest)
        except InvalidDigest:
            return Held.MISSING
        hasher = hashlib.sha256()
        try:
            with path.open("rb") as fh:
                while chunk := fh.read(READ_BYTES):
                    hasher.update(chunk)
        except FileNotFoundError:
            return Held.MISSING
        return Held.INTACT if hasher.hexdigest() == digest else Held.CHANGED

    # -- the `port.Artifacts` side, for code that serves either store ---------------------------

    async def held(self, digest: str) -> Held:
        """`examine`, on a worker thread."""
        return await anyio.to_thread.run_sync(self.examine, digest)

    async def size_of(self, digest: str) -> int | None:
        try:
            return (await anyio.Path(self.path_of(digest)).stat()).st_size
        except (InvalidDigest, FileNotFoundError):
            return None

    async def chunks(self, digest: str) -> AsyncIterator[bytes]:
        try:
            file = await anyio.open_file(self.path_of(digest), "rb")
        except (InvalidDigest, FileNotFoundError):
            return
        async with file:
            while chunk := await file.read(READ_BYTES):
                yield chunk

    async def remove(self, digest: str) -> bool:
        """Remove `digest`'s file (the collector's, once no owner row names it); False when
        there was none."""
        return await anyio.to_thread.run_sync(self._remove, digest)

    def _remove(self, digest: str) -> bool:
        path = self.path_of(digest)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        durable.sync_folder(path.parent)
        return True

    @contextlib.asynccontextmanager
    async def local_file(self, digest: str) -> AsyncIterator[Path]:
        """The stored file itself."""
        path = self.path_of(digest)
        if not await anyio.Path(path).is_file():
            raise FileNotFoundError(f"artifact {digest}'s bytes are not in the store")
        yield path


def _discard(fd: int, temp: Path) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
    temp.unlink(missing_ok=True)
