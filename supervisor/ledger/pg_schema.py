"""Opening a PostgreSQL ledger: the connection, its row class, numbered migrations.

The migrations are `sql/migrations/postgresql/NNNN_*.sql`, each SQLite migration translated
file by file (not one squashed schema), so version N holds the same tables, columns, keys and
indexes on both backends; a sequence `fences` replaces SQLite's `counters` row 'fence'. The
version applied is the one row of `schema_version`. Each migration runs in its own
transaction under `pg_advisory_xact_lock`, so supervisors starting at once apply it once.
A database newer than this code is refused with `SchemaTooNew`.

Errors are the ledger's `StorageError`, one line, naming the URL without its password.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import RowMaker

from tether.supervisor.ledger.errors import SchemaTooNew, StorageError
from tether.supervisor.ledger.schema import migrations

SCHEMES = ("postgresql", "postgres")
CONNECT_TIMEOUT_S = 10
# TCP liveness on every ledger connection (the writer, the reads, the listener): a server gone
# silent (a failover that black-holes its old address) is noticed in about 30 s, where the
# operating system's defaults take 2 h of idle or 15 min of retransmits. libpq's parameters;
# the URL's own of these names win.
LIVENESS: Mapping[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 10,  # seconds idle before the first probe
    "keepalives_interval": 5,  # seconds between probes
    "keepalives_count": 3,  # probes unanswered before the connection is dead
    "tcp_user_timeout": 30_000,  # milliseconds sent data may stay unacknowledged
}
# The advisory lock migrations take: any constant both sides agree on ("tether" in ASCII).
MIGRATION_LOCK = 0x746574686572


class PgRow(Sequence[Any]):
    """A result row read like `sqlite3.Row`: `row["col"]`, `row[0]`, `row.keys()`, iteration
    over the values. A name lookup ignores case and takes the first column of that name."""

    __slots__ = ("_index", "_names", "_values")

    def __init__(self, names: tuple[str, ...], index: Mapping[str, int], values: Sequence[Any]):
        self._names = names
        self._index = index
        self._values = tuple(values)

    @overload
    def __getitem__(self, key: int | str) -> Any: ...
    @overload
    def __getitem__(self, key: slice) -> tuple[Any, ...]: ...
    def __getitem__(self, key: int | str | slice) -> Any:
        if isinstance(key, str):
            try:
                return self._values[self._index[key.lower()]]
            except KeyError:
                raise IndexError(f"no such column: {key}") from None
        return self._values[key]

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PgRow):
            return NotImplemented
        return self._names == other._names and self._values == other._values

    def __hash__(self) -> int:
        return hash((self._names, self._values))

    def __repr__(self) -> str:
        return f"PgRow({dict(zip(self._names, self._values, strict=True))!r})"

    def keys(self) -> list[str]:
        return list(self._names)


# Column names and their index by the raw names of a result: as many as the ledger has
# distinct SELECT lists, a few hundred at most.
_COLUMNS: dict[tuple[bytes | None, ...], tuple[tuple[str, ...], dict[str, int]]] = {}


def pg_row(cursor: psycopg.Cursor[Any]) -> RowMaker[PgRow]:
    """psycopg's row factory for `PgRow`. The names come from the raw result, looked up once
    per distinct column list: `cursor.description` builds a Column object per column on each
    result, 6-16 us a statement against 0.7 us, and the writer runs ~28 statements a step."""
    result = cursor.pgresult
    raw = () if result is None else tuple(result.fname(i) for i in range(result.nfields))
    known = _COLUMNS.get(raw)
    if known is None:
        names = tuple((name or b"").decode() for name in raw)
        index: dict[str, int] = {}
        for i, name in enumerate(names):
            index.setdefault(name.lower(), i)
        known = _COLUMNS[raw] = (names, index)
    names, index = known

    def make(values: Sequence[Any]) -> PgRow:
        return PgRow(names, index, values)

    return make


def redact(url: str) -> str:
    """`url` without its password (in the user part or a `password=` parameter), for messages."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            user, host = netloc.rsplit("@", 1)
            netloc = user.split(":", 1)[0] + "@" + host
        query = urlencode(
            [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)], safe="*"
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "<a database URL that cannot be read>"


def _password(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        in_user = parts.password
    except ValueError:
        return None
    return in_user or dict(parse_qsl(parts.query)).get("password") or None


def one_line(exc: BaseException, url: str) -> str:
    """The driver's message as one line, with the URL's password (if any) blanked out."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    secret = _password(url)
    return text.replace(secret, "***") if secret else text


def scheme(url: str) -> str:
    """The URL's scheme, lower case; empty for what is no URL."""
    try:
        return urlsplit(url).scheme.lower()
    except ValueError:
        return ""


def liveness(url: str) -> dict[str, Any]:
    """The `LIVENESS` parameters `url` does not set itself, to pass with it to psycopg."""
    try:
        given = conninfo_to_dict(url)
    except (psycopg.Error, ValueError):  # connecting will say what is wrong with it
        given = {}
    return {name: value for name, value in LIVENESS.items() if name not in given}


def connect(url: str) -> psycopg.Connection[PgRow]:
    """A connection to the ledger database at `url` (`postgresql://...`), in autocommit mode:
    transactions are begun explicitly (`with conn.transaction()`). Rows are `PgRow`s."""
    if scheme(url) not in SCHEMES:
        raise StorageError(f"not a PostgreSQL URL: {redact(url)!r} (expected postgresql://...)")
    try:
        return psycopg.connect(
            url,
            autocommit=True,
            row_factory=pg_row,
            connect_timeout=CONNECT_TIMEOUT_S,
            **liveness(url),
        )
    except (psycopg.Error, ValueError) as exc:  # ValueError: psycopg could not parse the URL
        raise StorageError(f"cannot connect to {redact(url)}: {one_line(exc, url)}") from exc


def describe(conn: psycopg.Connection[Any]) -> str:
    """The URL of the database `conn` is connected to, without a password."""
    info = conn.info
    if info.host.startswith("/"):  # a Unix socket's folder
        return f"postgresql://{info.user}@/{info.dbname}?host={info.host}&port={info.port}"
    return f"postgresql://{info.user}@{info.host}:{info.port}/{info.dbname}"


def schema_version(conn: psycopg.Connection[PgRow]) -> int:
    """The version the database holds; 0 when it was never migrated."""
    found = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
    if found is None or not found[0]:
        return 0
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    return 0 if row is None else int(row[0])


def newest_version() -> int:
    known = migrations("postgresql")
    return known[-1][0] if known else 0


def migrate(conn: psycopg.Connection[PgRow]) -> int:
    """Apply every migration above the database's version; return the version reached."""
    url = describe(conn)
    try:
        while True:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_version ("
                    " only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),"
                    " version bigint NOT NULL)"
                )
                current = schema_version(conn)
                pending = [(v, s) for v, s in migrations("postgresql") if v > current]
                if current > newest_version():
                    raise SchemaTooNew(
                        f"ledger schema version {current} is newer than this tether"
                        f" ({newest_version()})"
                    )
                if not pending:
                    return current
                version, script = pending[0]
                conn.execute(script.encode("utf-8"))  # bytes: no placeholders in a migration
                conn.execute(
                    "INSERT INTO schema_version (version) VALUES (%s)"
                    " ON CONFLICT (only_row) DO UPDATE SET version = excluded.version",
                    (version,),
                )
    except psycopg.Error as exc:
        raise StorageError(
            f"cannot migrate the ledger database {redact(url)}: {one_line(exc, url)}"
        ) from exc
