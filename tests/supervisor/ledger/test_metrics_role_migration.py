"""Migration 0016 (the `metrics` token role) on a SQLite ledger that already holds tokens and
status-page sessions referencing them: every row stays, the foreign keys hold, and a metrics
token can then be made."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tether.supervisor.ledger import schema


def test_tokens_and_their_sessions_survive_the_metrics_role(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
    db.execute("PRAGMA foreign_keys = ON")
    before = [(v, script) for v, script in schema.migrations() if v < 16]
    for version, script in before:
        db.execute("BEGIN IMMEDIATE")
        for statement in schema._statements(script):
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {version}")
        db.execute("COMMIT")
    db.execute(
        "INSERT INTO tokens (id, scope, role, secret_hash, created_at, name, last_used_at)"
        " VALUES ('t1', 'acme', 'operator', 'h1', 1.0, 'alice', 2.0)"
    )
    db.execute("INSERT INTO ui_sessions VALUES ('s1', 't1', 1.0, 100.0, NULL)")
    tokens = db.execute("SELECT * FROM tokens").fetchall()

    assert schema.migrate(db) == schema.migrations()[-1][0]
    assert db.execute("SELECT * FROM tokens").fetchall() == tokens
    assert db.execute("SELECT token_id FROM ui_sessions").fetchall() == [("t1",)]
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []
    db.execute(
        "INSERT INTO tokens (id, scope, role, secret_hash, created_at)"
        " VALUES ('t2', 'scraper', 'metrics', 'h2', 3.0)"
    )
    assert db.execute("SELECT name FROM sqlite_master WHERE name LIKE 'tokens%'").fetchall() == [
        ("tokens",)
    ]
