"""Opening a ledger file: pragmas, the integrity check, numbered migrations.

Migrations are the files `sql/migrations/sqlite/NNNN_*.sql`, applied in order inside one
transaction each; the number applied is kept in `PRAGMA user_version`. A file newer than this
code is refused. `sql/migrations/postgresql/` holds the same numbered versions for PostgreSQL
(applied by `pg_schema.py`): version N means the same tables on both backends.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from importlib import resources
from pathlib import Path

from tether.supervisor import durable
from tether.supervisor.ledger.errors import IntegrityCheckFailed, SchemaTooNew, StorageError
from tether.supervisor.ledger.queries import Dialect

SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")


@functools.cache
def migrations(dialect: Dialect = "sqlite") -> tuple[tuple[int, str], ...]:
    """(version, script) of each of `dialect`'s migrations, oldest first."""
    folder = resources.files("tether.supervisor.ledger").joinpath("sql", "migrations", dialect)
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return tuple((int(f.name.split("_", 1)[0]), f.read_text(encoding="utf-8")) for f in files)


def connect(
    path: Path | str, *, synchronous: str = "FULL", readonly: bool = False
) -> sqlite3.Connection:
    """A connection in autocommit mode: transactions are begun explicitly (`BEGIN IMMEDIATE`).
    A `readonly` one opens the file read-only (`_open_read_only`): it never writes it."""
    if synchronous.upper() not in SYNCHRONOUS_MODES:
        raise ValueError(f"synchronous must be one of {SYNCHRONOUS_MODES}")
    if readonly:
        db = _open_read_only(Path(path))
    else:
        db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30.0)
    db.row_factory = sqlite3.Row
    try:
        if readonly:
            db.execute("PRAGMA query_only = ON")
        else:
            db.execute("PRAGMA journal_mode = WAL")  # the first read: a non-database fails here
        db.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        db.execute("PRAGMA foreign_keys = ON")
        db.execute("PRAGMA busy_timeout = 30000")
        # A statement with RETURNING inside a savepoint (every event a rule appends) spills
        # to a temporary file by default: a claim cost 0.18-0.21 ms CPU that way, 0.11 ms
        # with temporary tables in memory (bench.claimcost at 10,000 queued).
        db.execute("PRAGMA temp_store = MEMORY")
    except BaseException:
        db.close()
        raise
    return db


def _open_read_only(path: Path) -> sqlite3.Connection:
    """`path` opened read-only (`mode=ro`), so that `check` and `backup` also read a copy on a
    read-only disk. A WAL-mode file read that way needs its `-shm` file, or a folder to make
    one in; without either, and with no `-wal` file (whose commits only the `-shm` file
    indexes), nothing can be writing it and SQLite may take it as `immutable`. A `-wal` file
    without its `-shm` on a read-only folder cannot be read safely: refused, saying so."""
    uri = path.absolute().as_uri()
    try:
        db = sqlite3.connect(
            f"{uri}?mode=ro", uri=True, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        try:
            db.execute("PRAGMA journal_mode")  # the first read: a non-database fails here
        except BaseException:
            db.close()
            raise
    except sqlite3.OperationalError as exc:
        if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_CANTOPEN or not path.exists():
            raise
        if os.access(path.absolute().parent, os.W_OK):
            raise
        wal = Path(f"{path}-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise sqlite3.OperationalError(
                f"{path} has commits in {wal.name} but no {path.name}-shm, on a read-only"
                f" folder: copy {path.name}-shm beside it too, or make the copy with"
                " `tether-supervisor backup`"
            ) from exc
        db = sqlite3.connect(
            f"{uri}?mode=ro&immutable=1", uri=True, isolation_level=None, check_same_thread=False
        )
        db.execute("PRAGMA journal_mode")
    return db


def integrity_problems(db: sqlite3.Connection) -> list[str]:
    rows = [r[0] for r in db.execute("PRAGMA integrity_check").fetchall()]
    problems = [] if rows == ["ok"] else rows
    problems += [
        f"foreign key: {r[0]} row {r[1]} -> {r[2]}"
        for r in db.execute("PRAGMA foreign_key_check").fetchall()
    ]
    return problems


def check_integrity(db: sqlite3.Connection) -> None:
    problems = integrity_problems(db)
    if problems:
        # One line for the operator: integrity_check's own rows may span several lines.
        summary = "; ".join(" ".join(p.split()) for p in problems[:3])
        raise IntegrityCheckFailed(f"PRAGMA integrity_check failed: {summary}")


def newest_migration() -> int:
    """The schema version this tether migrates a ledger file to."""
    known = migrations()
    return known[-1][0] if known else 0


def migrate(db: sqlite3.Connection) -> int:
    """Apply every migration above the file's `user_version`; return the version reached."""
    current = int(db.execute("PRAGMA user_version").fetchone()[0])
    known = migrations()
    newest = newest_migration()
    if current > newest:
        raise SchemaTooNew(f"ledger schema version {current} is newer than this tether ({newest})")
    for version, script in known:
        if version <= current:
            continue
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _statements(script):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {version}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        current = version
    return current


def _statements(script: str) -> list[str]:
    """Split a migration into statements (executescript would commit on its own)."""
    out: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        if line.lstrip().startswith("--"):
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            out.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        out.append(buffer.strip())
    return out


def _is_damage(exc: sqlite3.Error) -> bool:
    """SQLITE_CORRUPT (any extended code) or SQLITE_NOTADB: the file itself is damaged."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _is_read_only(exc: sqlite3.Error) -> bool:
    """SQLITE_READONLY (any extended code): the file, or its folder, cannot be written."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_READONLY


def open_ledger_file(path: Path | str, *, synchronous: str = "FULL") -> sqlite3.Connection:
    """Open, check integrity, migrate. Raises `IntegrityCheckFailed` on a damaged file, including
    one so damaged that SQLite raises instead of reporting (a garbage header: "file is not a
    database"; a garbage b-tree page: "malformed"), and `StorageError` when the file cannot be
    used for another SQLite reason, so callers see the ledger's errors, never the driver's."""
    db: sqlite3.Connection | None = None
    if not Path(path).exists():
        # A new ledger holds payloads and token hashes: readable by its owner only, whatever
        # the umask (SQLite gives its -wal and -shm files the same mode). Its name is synced
        # into its folder before anything is recorded in it: SQLite syncs its own files, and
        # the folder only when it makes a -wal file (docs/design.md, Power loss and the disk).
        Path(path).touch(mode=0o600)
        durable.sync_folder(Path(path).absolute().parent)
    try:
        db = connect(path, synchronous=synchronous)
        check_integrity(db)
        migrate(db)
    except sqlite3.Error as exc:
        if db is not None:
            db.close()
        one_line = str(exc).replace("\n", " ")
        if _is_damage(exc):
            raise IntegrityCheckFailed(f"ledger file {path} is damaged: {one_line}") from exc
        if _is_read_only(exc):
            raise StorageError(
                f"cannot open ledger file {path}: the ledger file is not writable by this user"
                f" (uid {os.getuid()}): run as its owner, or give this user write access to it"
                f" and its folder ({one_line})"
            ) from exc
        raise StorageError(f"cannot open ledger file {path}: {one_line}") from exc
    except UnicodeDecodeError as exc:  # SQLite's own message quoted bytes of a damaged schema
        if db is not None:
            db.close()
        raise IntegrityCheckFailed(f"ledger file {path} is damaged: {exc}") from exc
    except BaseException:
        if db is not None:
            db.close()
        raise
    return db
