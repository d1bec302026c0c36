"""Copying a SQLite ledger into an empty PostgreSQL one (`tether-supervisor migrate`).

The target is migrated to this code's schema first (a new database gets its tables), then
must hold no row and the same schema version as the source. Every table is copied in
foreign-key order, in one transaction on the target that locks its tables, from one read
transaction on the source. SQLite's counter row 'fence' becomes the sequence `fences`; the
identities (events.seq and the other AUTOINCREMENT keys) are set past the copied values, so
fences and event numbers continue above the source's. The artifact store's files (`artifacts/`
beside the ledger file, or the folder given) become the rows of `artifact_chunks`, where a
PostgreSQL ledger keeps artifacts, in the same transaction, a chunk at a time.
"""

from __future__ import annotations

import dataclasses
import re
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tether.supervisor.artifacts.pg import (
    CHUNK_BYTES,  # an artifact's chunks, as its store writes them
)
from tether.supervisor.ledger import pg_schema, schema
from tether.supervisor.ledger.errors import StorageError

# Rows of these (table, key column, key) are not copied: they live elsewhere in PostgreSQL.
NOT_COPIED = {("counters", "name", "fence")}  # the sequence `fences`
# Rows a supervisor writes by merely running on the target (the reaper's stamp 'alive'): not
# data, so they leave it empty; the source's take their place.
RUNNING_STAMPS = sql.SQL("DELETE FROM counters WHERE name = 'alive'")
_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True)
class CopyReport:
    source: Path
    target: str  # without its password
    version: int
    rows: Mapping[str, int]  # table -> rows copied, in the order copied
    fence: int  # the last fence the source issued: the target's next one is above it
    artifacts: int = 0  # artifact files copied into `artifact_chunks`
    artifact_bytes: int = 0

    def summary(self) -> str:
        """One line for the operator."""
        counts = ", ".join(f"{self.rows.get(t, 0)} {t}" for t in ("tasks", "steps", "events"))
        return (
            f"copied {self.source} to {self.target} (schema version {self.version}):"
            f" {sum(self.rows.values())} rows in {len(self.rows)} tables ({counts});"
            f" fences continue above {self.fence};"
            f" {self.artifacts} artifacts ({self.artifact_bytes} bytes)"
        )


def copy_ledger(source: Path, target_url: str, artifacts: Path | None = None) -> CopyReport:
    """Copy the ledger file `source` into the empty PostgreSQL ledger at `target_url`, with the
    artifact files under `artifacts` (by default `artifacts/` beside `source`, the setting
    `artifact_dir`'s default; none when that folder does not exist)."""
    target = pg_schema.redact(target_url)
    folder = source.parent / "artifacts" if artifacts is None else artifacts
    if not source.is_file():
        raise StorageError(f"no ledger file at {source}")
    try:
        lite = schema.connect(source, readonly=True)
    except sqlite3.Error as exc:
        raise StorageError(f"cannot open ledger file {source}: {exc}") from exc
    try:
        schema.check_integrity(lite)
        with pg_schema.connect(target_url) as pg:
            version = pg_schema.migrate(pg)
            lite.execute("BEGIN")  # one snapshot of the source, whoever else writes it
            try:
                return _copy(lite, pg, source, target, version, folder)
            finally:
                lite.execute("ROLLBACK")
    except sqlite3.Error as exc:
        raise StorageError(f"cannot read ledger file {source}: {exc}") from exc
    except OSError as exc:
        raise StorageError(f"cannot read the artifact files under {folder}: {exc}") from exc
    except psycopg.Error as exc:
        raise StorageError(
            f"cannot copy into {target}: {pg_schema.one_line(exc, target_url)}"
        ) from exc
    finally:
        lite.close()


def _copy(
    lite: sqlite3.Connection,
    pg: psycopg.Connection[pg_schema.PgRow],
    source: Path,
    target: str,
    version: int,
    artifacts: Path,
) -> CopyReport:
    source_version = int(lite.execute("PRAGMA user_version").fetchone()[0])
    if source_version == 0:
        raise StorageError(f"{source} is not a tether ledger (it has no schema version)")
    if source_version != version:
        raise StorageError(
            f"{source} is at schema version {source_version} and {target} at {version}:"
            f" start this tether's supervisor on {source} once to bring it to {version}"
            if source_version < version
            else f"{source} is at schema version {source_version}, newer than this tether"
            f" ({version})"
        )
    columns = _columns_alike(lite, pg, source, target)
    order = _foreign_key_order(lite, list(columns))
    rows: dict[str, int] = {}
    with pg.transaction():
        pg.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.SQL(", ").join(sql.Identifier(t) for t in order)
            )
        )
        pg.execute(RUNNING_STAMPS)
        holding = [t for t in order if _has_rows(pg, t)]
        if holding:
            raise StorageError(
                f"{target} is not an empty ledger ({', '.join(holding)} hold rows):"
                " copy into a new database"
            )
        for table in order:
            rows[table] = _copy_table(lite, pg, table, columns[table])
        _continue_identities(lite, pg)
        fence = _continue_fences(lite, pg)
        files, size = _copy_artifacts(pg, artifacts)
    return CopyReport(
        source=source,
        target=target,
        version=version,
        rows=rows,
        fence=fence,
        artifacts=files,
        artifact_bytes=size,
    )


def _columns_alike(
    lite: sqlite3.Connection, pg: psycopg.Connection[pg_schema.PgRow], source: Path, target: str
) -> dict[str, list[str]]:
    """Table -> its columns, the same on both sides (else the schemas are not one version)."""
    mine = {
        name: [c["name"] for c in lite.execute(f'PRAGMA table_info("{name}")')]
        for (name,) in lite.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        ).fetchall()
    }
    theirs: dict[str, list[str]] = {}
    for r in pg.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name <> 'schema_version'"
        " ORDER BY table_name, ordinal_position"
    ):
        theirs.setdefault(r["table_name"], []).append(r["column_name"])
    differ = sorted(t for t in mine.keys() | theirs.keys() if mine.get(t) != theirs.get(t))
    if differ:
        raise StorageError(
            f"{source} and {target} are at one schema version but their tables differ:"
            f" {', '.join(differ)}"
        )
    return mine


def _foreign_key_order(lite: sqlite3.Connection, tables: list[str]) -> list[str]:
    """`tables` with every table after the tables it refers to (by name among equals)."""
    refers = {
        t: {fk["table"] for fk in lite.execute(f'PRAGMA foreign_key_list("{t}")')} - {t}
        for t in tables
    }
    order: list[str] = []
    while len(order) < len(tables):
        ready = sorted(t for t in tables if t not in order and refers[t] <= set(order))
        if not ready:
            raise StorageError(f"the ledger's foreign keys form a cycle: {sorted(refers)}")
        order.extend(ready)
    return order


def _has_rows(pg: psycopg.Connection[pg_schema.PgRow], table: str) -> bool:
    query = sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(table))
    row = pg.execute(query).fetchone()
    return bool(row and row[0])


def _copy_table(
    lite: sqlite3.Connection,
    pg: psycopg.Connection[pg_schema.PgRow],
    table: str,
    columns: list[str],
) -> int:
    """COPY the table's rows over (an identity takes the copied value, as with `OVERRIDING
    SYSTEM VALUE`); answer how many."""
    names = ", ".join(f'"{c}"' for c in columns)
    skipped = [(column, key) for t, column, key in NOT_COPIED if t == table]
    where = " AND ".join(f'"{column}" IS NOT ?' for column, _ in skipped) or "1"
    copied = 0
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )
    with pg.cursor() as cursor, cursor.copy(statement) as copy:
        for row in lite.execute(
            f'SELECT {names} FROM "{table}" WHERE {where} ORDER BY rowid',
            [key for _, key in skipped],
        ):
            copy.write_row(tuple(row))
            copied += 1
    return copied


def _continue_identities(lite: sqlite3.Connection, pg: psycopg.Connection[pg_schema.PgRow]) -> None:
    """Set each identity past the highest value SQLite handed out (sqlite_sequence keeps it
    even when the row that had it is gone)."""
    handed_out: dict[str, int] = {}
    if lite.execute("SELECT 1 FROM sqlite_schema WHERE name = 'sqlite_sequence'").fetchone():
        handed_out = {
            r[0]: int(r[1]) for r in lite.execute("SELECT name, seq FROM sqlite_sequence")
        }
    identities = pg.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND is_identity = 'YES'"
    ).fetchall()
    for r in identities:
        table, column = r["table_name"], r["column_name"]
        top = lite.execute(f'SELECT MAX("{column}") FROM "{table}"').fetchone()[0] or 0
        top = max(top, handed_out.get(table, 0))
        if top > 0:
            pg.execute("SELECT setval(pg_get_serial_sequence(%s, %s), %s)", (table, column, top))


def _continue_fences(lite: sqlite3.Connection, pg: psycopg.Connection[pg_schema.PgRow]) -> int:
    """Set the sequence `fences` to the source's counter (or its highest fence, or the
    target's own, whichever is highest); answer it."""
    counter = lite.execute("SELECT value FROM counters WHERE name = 'fence'").fetchone()
    issued = lite.execute("SELECT MAX(fence) FROM attempts").fetchone()[0]
    there = _one(pg, "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM fences")
    fence = max(int(counter[0]) if counter else 0, int(issued or 0), int(there))
    if fence > 0:
        pg.execute("SELECT setval('fences', %s)", (fence,))
    return fence


def _copy_artifacts(pg: psycopg.Connection[pg_schema.PgRow], folder: Path) -> tuple[int, int]:
    """COPY each file `folder/sha256/<2 hex>/<digest>` into `artifact_chunks` as it is (one
    whose bytes changed on disk stays changed: the evidence check finds it so either way);
    answer how many files and bytes. Other files (an upload's temporary one) are left."""
    files = size = 0
    statement = "COPY artifact_chunks (digest, n, data) FROM STDIN (FORMAT BINARY)"
    with pg.cursor() as cursor, cursor.copy(statement) as copy:
        copy.set_types(["text", "int8", "bytea"])
        for path in sorted((folder / "sha256").glob("*/*")):
            digest = path.name
            if not (_DIGEST.fullmatch(digest) and path.parent.name == digest[:2]):
                continue
            with path.open("rb") as fh:
                n = 0
                while (data := fh.read(CHUNK_BYTES)) or n == 0:
                    copy.write_row((digest, n, data))
                    size += len(data)
                    n += 1
                    if not data:  # an empty artifact: its one empty chunk
                        break
            files += 1
    return files, size


def _one(pg: psycopg.Connection[pg_schema.PgRow], query: str) -> Any:
    row = pg.execute(query.encode()).fetchone()
    if row is None:
        raise StorageError(f"no answer to {query!r}")
    return row[0]
