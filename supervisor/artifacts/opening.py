"""The artifact store a supervisor serves, chosen by its ledger: files under `artifact_dir` for a
SQLite ledger, the ledger's own database for a PostgreSQL one (every supervisor on it then
reads every artifact)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio

from tether.supervisor.artifacts.port import Artifacts
from tether.supervisor.artifacts.store import ArtifactStore
from tether.supervisor.ledger.backends import is_postgres
from tether.supervisor.settings import SupervisorSettings


@contextlib.asynccontextmanager
async def open_artifacts(settings: SupervisorSettings) -> AsyncIterator[Artifacts]:
    """The store for `settings.db`, open for the block."""
    if is_postgres(settings.db):
        from tether.supervisor.artifacts.pg import PgArtifactStore  # psycopg: the postgresql extra

        assert isinstance(settings.db, str)
        shared = PgArtifactStore(settings.db, settings.artifact_root, settings.artifact_max_bytes)
        await shared.open()
        try:
            yield shared
        finally:
            await shared.close()
        return
    files = ArtifactStore(settings.artifact_root, settings.artifact_max_bytes)
    await anyio.to_thread.run_sync(files.open)
    yield files
