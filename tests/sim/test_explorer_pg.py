"""`chaos explore --db postgresql://...`: the schedule explorer on PostgreSQL. A couple of
hundred schedules without a violation, the same seed giving the same digest, planted bugs
caught there by the same invariants (the ledger's, run as PostgreSQL's named queries, and the
observer's) and replayed by the printed command, and the scratch databases dropped."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from typing import Any

import pytest

from tests import pgdb
from tests.sim.test_explorer_cli import CI_SEED, report_body, violation_lines
from tether.sim import explore as explore_module
from tether.sim import pgscratch
from tether.sim.explore import explore, main
from tether.sim.pgscratch import PgWorkspace, scratch_server
from tether.supervisor.ledger.pg_schema import connect

SCHEDULES = 200  # ~45 s with two processes on the 2-core machine


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A URL on the test server the explorer connects to (its scratch databases go beside)."""
    with pgdb.fresh_database() as url:
        yield url


def scratch_databases(url: str, prefix: str = "tether_chaos_") -> list[str]:
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (prefix,)
        ).fetchall()
    return sorted(row[0] for row in rows)


@pytest.mark.timeout(300)  # ~45 s alone; past 120 s beside the explorer's shares and a load
def test_schedules_on_postgresql_find_no_violation(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefixes: list[str] = []
    made = pgscratch.run_prefix

    def recorded() -> str:
        prefixes.append(made())
        return prefixes[-1]

    monkeypatch.setattr(pgscratch, "run_prefix", recorded)
    result = explore(schedules=SCHEDULES, seed=CI_SEED, jobs=2, db=server)
    assert result.found is None, result.found
    assert result.count == SCHEDULES
    # The workers' databases were dropped: this run's, by its prefix (other runs on the
    # server, another test's or another checkout's, come and go meanwhile).
    [prefix] = prefixes
    assert scratch_databases(server, prefix) == []


def test_same_seed_same_digest_on_postgresql_in_any_number_of_processes(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(explore_module, "CHUNK", 3)  # so that two processes share the run
    one = explore(schedules=6, seed=7, jobs=1, db=server)
    two = explore(schedules=6, seed=7, jobs=2, db=server)
    other = explore(schedules=6, seed=8, jobs=1, db=server)
    assert one.count == two.count == 6
    assert one.digest == two.digest != other.digest


@pytest.mark.parametrize(
    ("plant", "caught_by"),
    [
        ("key-reuse", "idempotency-key-unique"),  # the ledger's check; its index dropped too
        ("terminal-overwrite", "terminal-is-final"),
        ("double-effect", "effect-key-is-identity"),
        ("stale-checkpoint", "stale-checkpoint"),  # the observer's
    ],
)
def test_a_planted_bug_is_caught_on_postgresql_and_its_replay_reproduces_it(
    server: str, plant: str, caught_by: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["explore", "--schedules", "30", "--seed", "1", "--plant", plant, "--jobs", "1"]
    assert main([*argv, "--db", server]) == 1
    out = capsys.readouterr().out
    assert any(line.startswith(f"{caught_by}:") for line in violation_lines(out)), out
    assert "explorer error" not in out, out
    assert "rule crashed" not in out, out
    [replay] = re.findall(r"^replay: (.*)$", out, re.MULTILINE)
    words = shlex.split(replay)
    assert words[words.index("--db") + 1] == server
    assert main(words[2:]) == 1
    again = capsys.readouterr().out
    assert violation_lines(again) == violation_lines(out)
    assert report_body(again) == report_body(out)


def test_each_schedule_runs_on_a_postgresql_database_and_plays_the_seed_as_sqlite_does(
    server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same seed plays the same plan on either storage; with `--db` every schedule gets
    an emptied PostgreSQL database."""
    emptied: list[str] = []
    fresh = PgWorkspace.fresh

    def counted(self: PgWorkspace, drop_index: str | None = None) -> Any:
        emptied.append(self.url)
        return fresh(self, drop_index)

    monkeypatch.setattr(PgWorkspace, "fresh", counted)
    argv = ["explore", "--schedules", "2", "--seed", "1", "--trace", "--jobs", "1"]
    assert main([*argv, "--db", server]) == 0
    pg = capsys.readouterr().out
    assert len(emptied) == 2
    assert emptied[0].rsplit("/", 1)[1].startswith("tether_chaos_")
    assert main(argv) == 0
    lite = capsys.readouterr().out
    assert len(emptied) == 2  # SQLite's run touched no database
    assert pg.splitlines()[0].endswith(f"on {server}")

    def plans(out: str) -> list[str]:
        return [line.split(" ", 2)[2] for line in out.splitlines() if " plan: " in line]

    assert len(plans(pg)) == 2
    assert plans(pg) == plans(lite)


def test_a_dropped_index_is_made_again_for_the_next_schedule(server: str) -> None:
    def indexes(workspace: PgWorkspace, drop: str | None) -> set[str]:
        db = workspace.fresh(drop)
        rows = db.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'tasks'")
        names = {row[0] for row in rows.fetchall()}
        workspace.recycle(db)
        return names

    with scratch_server(server) as prefix:
        with PgWorkspace(server, prefix) as workspace:
            assert "tasks_idempotency" not in indexes(workspace, "tasks_idempotency")
            assert "tasks_idempotency" in indexes(workspace, None)
        assert scratch_databases(server, prefix)
    assert scratch_databases(server, prefix) == []


@pytest.mark.parametrize(
    ("db", "complaint"),
    [
        ("sqlite:///x.db", "expected a PostgreSQL URL"),
        ("postgresql://nobody:secret@127.0.0.1:1/none", "127.0.0.1:1"),
    ],
)
def test_a_bad_or_unreachable_db_exits_2_with_one_line(
    db: str, complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explore", "--schedules", "1", "--seed", "1", "--db", db]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert complaint in err, err
    assert "secret" not in err, err
