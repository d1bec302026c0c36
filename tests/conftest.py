"""Shared fixtures: a fresh ledger per test, driven by a clock the test controls.

The ledger's rule tests run on SQLite and on PostgreSQL: a module marked
`pytestmark = pytest.mark.backends` has each test that takes `backend` (through `ledger`,
`ledger_db` or `sim`) run once per storage, with ids `sqlite` / `postgresql`; a test about
the SQLite file itself is marked `sqlite_only("why")` and runs on SQLite alone. Elsewhere
`backend` is SQLite. On PostgreSQL the ledger is the session's one database, emptied before
each test (tests/pgledger.py).
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.pgledger import (  # noqa: F401 - pg_ledger_database is a fixture
    BACKENDS,
    ledger_db_at,
    pg_ledger_database,
    records,
    rows,
)
from tests.pgledger import Backend as BackendName
from tether.supervisor.ledger import (
    LedgerConfig,
    Report,
    SqliteLedger,
    StepSpec,
    TaskSpec,
    Tx,
    queries,
)
from tether.supervisor.ledger.backend_protocol import Backend, WriteConnection
from tether.supervisor.ledger.backends import SQLITE, SqliteBackend
from tether.supervisor.ledger.batch import RuleOutcome, Transactions
from tether.supervisor.ledger.queries import to_pyformat
from tether.supervisor.ledger.schema import open_ledger_file
from tether.supervisor.ledger.store import LedgerStore
from tether.supervisor.ledger.store import open_ledger as open_ledger_at
from tether.supervisor.ledger.tx import ReadSession


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "backends: run this module's ledger tests on SQLite and on PostgreSQL"
    )
    config.addinivalue_line(
        "markers", "sqlite_only(why): a test about the SQLite file itself, in a `backends` module"
    )


# `make test` runs the suite on three pytest-xdist workers (`-n 3 --dist loadgroup`).
# The tests of one group below run on one worker, one after another:
# - "limits": tests/runner/agent/test_agent_limits.py, whose commands storm, balloon and spin
#   into their limits in cgroups of the host's one hierarchy, and sweep it;
# - "drills": the heaviest real-process drills, each a stream of work on several processes
#   while supervisors are SIGKILLed or their disk loses power, timing leases and recoveries on
#   the machine's two cores, and the benchmark's smoke run, which loads both cores itself.
# Every other test, the other real-process tests (marked `slow`) and the explorer's four
# shares among them, runs on whichever worker is free.
GROUPS = {
    "test_agent_limits.py": "limits",
    "test_bench_smoke.py": "drills",
    "test_chaos_supervisor_kill.py": "drills",
    "test_effects_supervisor_kill.py": "drills",
    "test_pg_supervisor_kill.py": "drills",
    "test_power_loss.py": "drills",
}


# The longest single tests, longest first (seconds on two loaded workers): collected ahead of
# the rest, so that under xdist they start first, right after the two groups above, and the
# run ends on short tests instead of waiting for one long one.
FIRST = (
    "tests/sim/test_explorer_cli.py::test_ci_explores_ten_thousand_schedules",  # 4 x 62
    "tests/supervisor/ledger/test_hypothesis_ledger.py",  # 53 and 38 with CI=true
    "tests/sim/test_explorer_pg.py::test_schedules_on_postgresql_find_no_violation",  # 43
    "tests/packaging/test_python_floor.py::test_the_agent_demo_runs",  # 25
    "tests/examples/test_demo_agent.py::test_demo_agent_prints",  # 11-27 each, the demos
    "tests/examples/test_demo_effects.py::test_demo_effects_prints",
    "tests/examples/test_demo.py::test_demo_prints",
    "tests/sim/test_explorer_scenarios.py::test_every_hazard_is_reachable",  # 17
    "tests/sim/test_explorer_cli.py::test_planted_bug_is_caught",  # 5-15 each
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests FIRST names ahead of the others, in its order; the rest as collected."""
    items.sort(key=lambda item: first_rank(item.nodeid))


def first_rank(nodeid: str) -> int:
    """The place in FIRST of the entry `nodeid` begins with; past its end if none."""
    return next((i for i, head in enumerate(FIRST) if nodeid.startswith(head)), len(FIRST))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` by GROUPS, by file name. xdist's own reads `xdist_group` marks
    through a node id suffix that pytest 9.2 no longer takes (`Node.nodeid` is now made from
    `_id`), so with it every test was spread, grouped or not."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return GroupScheduling(config, log)


def xdist_scope(nodeid: str) -> str:
    """The work unit of a test: its file's group in GROUPS, else the test alone."""
    return GROUPS.get(nodeid.split("::", 1)[0].rsplit("/", 1)[-1], nodeid)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`backend` per storage in modules marked `backends`, but for `sqlite_only` tests."""
    if "backend" not in metafunc.fixturenames:
        return
    if metafunc.definition.get_closest_marker("backends") is None:
        return
    if metafunc.definition.get_closest_marker("sqlite_only") is not None:
        return
    metafunc.parametrize("backend", BACKENDS, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> BackendName:
    """The storage this test's ledger is on (see the module)."""
    name: BackendName = getattr(request, "param", "sqlite")
    return name


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """`configure_logging` points the root logger at this test's captured stdout; put back
    what was there, so that later tests never write to a closed capture."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@dataclasses.dataclass
class FakeClock:
    """The supervisor's clock, advanced by hand."""

    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def ledger_db(
    backend: BackendName, ledger_path: Path, request: pytest.FixtureRequest
) -> Path | str:
    """Where this test's ledger is: `ledger_path` on SQLite, an emptied database's URL on
    PostgreSQL."""
    return ledger_db_at(backend, ledger_path, request)


@pytest.fixture
async def ledger(ledger_db: Path | str, clock: FakeClock) -> AsyncIterator[SqliteLedger]:
    """The store on `ledger_db`: a `SqliteLedger`, or on PostgreSQL a `LedgerStore` (typed as
    the former for the tests' sake: the same methods, but `path`)."""
    async with open_ledger_at(
        ledger_db, clock=clock, config=LedgerConfig(lease_ttl_s=30, accept_window_s=10)
    ) as opened:
        yield opened  # type: ignore[misc]


def make_spec(key: str = "k1", steps: int = 1, tenant: str = "acme", **extra: Any) -> TaskSpec:
    return TaskSpec(
        tenant=tenant,
        idempotency_key=key,
        steps=tuple(
            StepSpec(name=f"s{i}", kind="chat", payload={"cmd": "apply-patch", "rev": i})
            for i in range(steps)
        ),
        **extra,
    )


async def queued_task(ledger: LedgerStore, key: str = "k1", steps: int = 1, **extra: Any) -> str:
    """Create and approve a task; answer its id."""
    spec = make_spec(key, steps, **extra)
    created = await ledger.create_task(spec)
    await ledger.approve(spec.tenant, created.task_id, spec.plan_hash, extra.get("base_sha"))
    return created.task_id


# -- helpers for the ledger unit tests (tests/test_ledger_*.py) -------------------------------


LEDGER_CONFIG = LedgerConfig(lease_ttl_s=30, accept_window_s=10)


def open_ledger(db: Path | str, clock: FakeClock, **kwargs: Any) -> Any:
    """The store on `db` (a file or a URL) with the `ledger` fixture's settings, for tests that
    reopen a ledger."""
    kwargs.setdefault("config", LEDGER_CONFIG)
    return open_ledger_at(db, clock=clock, **kwargs)


def report_for(lease: Any, output: Any = "done", **extra: Any) -> Report:
    """The result a well-behaved runner sends for `lease`."""
    extra.setdefault("usage", {"total_tokens": 3})
    return Report(
        step_id=lease.step_id,
        fence=lease.fence,
        payload_hash=lease.payload_hash,
        output=output,
        **extra,
    )


def raw_db(path: Path) -> sqlite3.Connection:
    """A plain connection to a ledger file, for reading or planting rows by hand."""
    db = sqlite3.connect(str(path), isolation_level=None)
    db.row_factory = sqlite3.Row
    return db


def count(
    db: Path | str | LedgerStore, table: str, where: str = "1=1", params: tuple[Any, ...] = ()
) -> int:
    """Rows of `table` matching `where` in a ledger: a file, a URL (`ledger_db`) or an open
    store's."""
    [(n,)] = rows(where_is(db), f"SELECT COUNT(*) FROM {table} WHERE {where}", params)
    return int(n)


def ledger_rows(
    db: Path | str | LedgerStore, statement: str, params: Sequence[Any] = ()
) -> list[tuple[Any, ...]]:
    """Run a test's own SQL (`?` placeholders) on a ledger, whichever storage: its rows."""
    return rows(where_is(db), statement, params)


def ledger_records(
    db: Path | str | LedgerStore, statement: str, params: Sequence[Any] = ()
) -> list[dict[str, Any]]:
    """`ledger_rows`, each a dict by column name."""
    return records(where_is(db), statement, params)


def where_is(db: Path | str | LedgerStore) -> Path | str:
    """The file or URL of a ledger, given an open store or either of those."""
    if not isinstance(db, LedgerStore):
        return db
    backend = db.backend
    if isinstance(backend, SqliteBackend):
        return backend.path
    url: str = getattr(backend, "url")  # noqa: B009 - PostgresBackend, imported only for it
    return url


@dataclasses.dataclass
class Sim:
    """Ledger rules run straight through `Transactions` on one connection, as the schedule
    explorer runs them: no writer thread, a deterministic clock and ids. `db` is the ledger's
    connection (sqlite3's, or psycopg's wrapped); a test's own SQL goes through `execute`."""

    db: WriteConnection
    clock: FakeClock
    config: LedgerConfig = LEDGER_CONFIG
    ids: int = 0
    backend: Backend = SQLITE

    def new_id(self) -> str:
        self.ids += 1
        return f"t{self.ids}"

    @property
    def transactions(self) -> Transactions:
        return Transactions(
            db=self.db,
            config=self.config,
            clock=self.clock,
            new_id=self.new_id,
            backend=self.backend,
        )

    @property
    def reads(self) -> ReadSession:
        """The ledger's named read queries in this connection's dialect."""
        return ReadSession(self.db, self.transactions.tx().sql)

    @property
    def on_postgresql(self) -> bool:
        return self.backend.dialect == "postgresql"

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """A test's own SQL (`?` placeholders) on the ledger's connection; its cursor."""
        if self.on_postgresql:
            sql = to_pyformat(sql)
        return self.db.execute(sql, params)

    def batch(self, *rules: Callable[[Tx], Any]) -> list[RuleOutcome]:
        return self.transactions.run(rules).outcomes

    def run(self, rule: Callable[[Tx], Any]) -> Any:
        """One rule in its own batch: its value, or its error raised."""
        return self.transactions.one(rule)


def own_sql(tx: Tx, sql: str) -> str:
    """A test's own SQL (`?` placeholders) in `tx`'s dialect, for `tx.db.execute` in a rule."""
    return to_pyformat(sql) if tx.sql is queries.load("postgresql") else sql


@pytest.fixture
def sim(ledger_db: Path | str, clock: FakeClock) -> Iterator[Sim]:
    if isinstance(ledger_db, Path):
        db = open_ledger_file(ledger_db, synchronous="OFF")
        try:
            yield Sim(db=db, clock=clock)
        finally:
            db.close()
        return
    from tether.supervisor.ledger.postgres import PostgresBackend

    pg = PostgresBackend(ledger_db)
    conn = pg.open_writer()
    try:
        yield Sim(db=conn, clock=clock, backend=pg)
    finally:
        pg.close_writer(conn)


# -- the HTTP API in process (tests/test_api_*.py; any test that needs a real supervisor app) --

import contextlib  # noqa: E402 - this section is appended; the imports above belong to others

API_TENANT = "acme"
API_RIVAL = "rival"
API_POOL = "default"


@dataclasses.dataclass
class ApiHarness:
    """A supervisor app on its own ledger file with its lifespan entered, reached through
    `httpx.ASGITransport`. Tokens were made on the file beforehand, as the CLI makes them:
    `operator` acts for tenant acme, `rival` for another tenant, `runner` for the default pool,
    `intruder` is a second runner token of that pool (a lease belongs to the token that claimed
    it), `stranger` a runner token of another pool, `metrics` the scraper's token for
    `/metrics`. Each is a ready `Authorization` header."""

    app: Any
    client: Any  # httpx.AsyncClient
    path: Path
    clock: FakeClock
    secrets: dict[str, str]

    def auth(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets[name]}"}

    @property
    def operator(self) -> dict[str, str]:
        return self.auth("operator")

    @property
    def runner(self) -> dict[str, str]:
        return self.auth("runner")

    async def create(self, key: str = "k1", steps: int = 1, **extra: Any) -> dict[str, Any]:
        """Create a task over HTTP (201 or 200); answer its view."""
        response = await self.client.post(
            "/v1/tasks", headers=self.operator, json=task_body(key, steps, **extra)
        )
        assert response.status_code in (200, 201), response.text
        task: dict[str, Any] = response.json()
        return task

    async def queued(self, key: str = "k1", steps: int = 1, **extra: Any) -> dict[str, Any]:
        """Create and approve a task over HTTP; answer its view (QUEUED)."""
        task = await self.create(key, steps, **extra)
        response = await self.client.post(
            f"/v1/tasks/{task['id']}/approve",
            headers=self.operator,
            json={"plan_hash": task["plan_hash"], "base_sha": extra.get("base_sha")},
        )
        assert response.status_code == 200, response.text
        approved: dict[str, Any] = response.json()
        return approved

    async def claim(self, capacity: int = 1, runner_id: str = "r1") -> list[dict[str, Any]]:
        response = await self.client.post(
            "/v1/leases/claim",
            headers=self.runner,
            json={"runner_id": runner_id, "capacity": capacity, "wait_s": 0},
        )
        if response.status_code == 204:
            return []
        assert response.status_code == 200, response.text
        leases: list[dict[str, Any]] = response.json()["leases"]
        return leases

    async def report(self, lease: dict[str, Any], output: Any = "done", **extra: Any) -> Any:
        body = {
            "fence": lease["fence"],
            "payload_hash": lease["payload_hash"],
            "output": output,
            "usage": {"total_tokens": 3},
            **extra,
        }
        return await self.client.post(
            f"/v1/steps/{lease['step_id']}/result", headers=self.runner, json=body
        )


def chat_payload(text: str) -> dict[str, Any]:
    """A `chat` payload of one user message, as the supervisor accepts it at submit."""
    return {"messages": [{"role": "user", "content": text}]}


def task_body(key: str = "k1", steps: int = 1, **extra: Any) -> dict[str, Any]:
    """A `POST /v1/tasks` body of `steps` chat steps."""
    plan = {
        "steps": [
            {"name": f"s{i}", "kind": "chat", "payload": chat_payload(f"apply patch {i}")}
            for i in range(steps)
        ]
    }
    return {"idempotency_key": key, "plan": plan, **extra}


@contextlib.asynccontextmanager
async def open_api(path: Path, clock: FakeClock, **settings: Any) -> AsyncIterator[ApiHarness]:
    """`ApiHarness` on `path`; `settings` override `SupervisorSettings` fields."""
    import httpx

    from tether.supervisor import admin
    from tether.supervisor.api import create_app
    from tether.supervisor.settings import SupervisorSettings

    secrets = {
        name: admin.create_token(path, scope, role, init=True).secret
        for name, scope, role in [
            ("operator", API_TENANT, "operator"),
            ("rival", API_RIVAL, "operator"),
            ("runner", API_POOL, "runner"),
            ("intruder", API_POOL, "runner"),
            ("stranger", "elsewhere", "runner"),
            ("metrics", "prometheus", "metrics"),
        ]
    }
    app = create_app(SupervisorSettings(db=path, **settings), clock=clock, reaper=False)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://supervisor.test") as client,
    ):
        yield ApiHarness(app=app, client=client, path=path, clock=clock, secrets=secrets)


@pytest.fixture
async def api(tmp_path: Path, clock: FakeClock) -> AsyncIterator[ApiHarness]:
    async with open_api(tmp_path / "api.db", clock, synchronous="OFF") as harness:
        yield harness


LAST_USE = ("tokens", "last_used_at")


def ledger_snapshot(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, to show that a refused request wrote nothing. A token's last
    use is left out: it is written when the token authenticates, whatever the request then
    asks (tests/supervisor/ledger/test_token_use.py); so are the status page's sessions (who
    signed in)."""
    db = raw_db(path)
    try:
        tables = [
            r[0]
            for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if r[0] != "ui_sessions"
        ]
        return {
            t: [
                tuple(v for k, v in zip(r.keys(), r, strict=True) if (t, k) != LAST_USE)
                for r in db.execute(f"SELECT * FROM {t} ORDER BY 1")
            ]
            for t in tables
        }
    finally:
        db.close()


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    """The response is the wire's error: this status, exactly `{"error", "detail"}`, this code
    and a detail that says something."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = response.json()
    assert set(body) == {"error", "detail"}, body
    assert body["error"] == code, body
    assert isinstance(body["detail"], str), body
    assert body["detail"].strip(), body
    return body
