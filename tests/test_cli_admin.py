"""`tether-supervisor` on the ledger file (docs/design.md, Command line and settings), in process: tokens, check, backup, budget,
`--help` on every command, and one clear line on stderr for every bad usage."""

from __future__ import annotations

import os
import re
import sqlite3
import stat
from pathlib import Path

import anyio
import pytest

from supervisor import admin
from supervisor.cli import main
from supervisor.ledger import effects, fencing, identity, operator
from supervisor.ledger.tokens import hash_secret

from .conftest import ApiHarness, Sim, make_spec, raw_db, report_for

TOKEN_LINE = re.compile(
    r"(?P<id>[0-9a-f]{12}) (?P<scope>\S+) (?P<role>operator|runner)"
    r" \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ(?P<revoked> revoked)?"
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`main(argv)`: its exit code, stdout and stderr."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def one_line(text: str) -> str:
    assert text.endswith("\n"), repr(text)
    assert text.count("\n") == 1, repr(text)
    return text.strip()


# -- token create | list | revoke --------------------------------------------------------------


def test_token_create_prints_the_token_alone(
    capsys: pytest.CaptureFixture[str], ledger_path: Path
) -> None:
    code, out, err = run(capsys, "token", "create", "--db", str(ledger_path), "--tenant", "acme",
                         "--role", "operator")  # fmt: skip
    assert code == 0
    secret = one_line(out)
    assert re.fullmatch(r"tether_[A-Za-z0-9_-]{20,}", secret)
    assert err == ""
    db = raw_db(ledger_path)
    try:
        row = db.execute("SELECT scope, role, secret_hash FROM tokens").fetchone()
    finally:
        db.close()
    assert tuple(row) == ("acme", "operator", hash_secret(secret))  # stored hashed, never plain


def test_token_list_shows_one_line_per_token_and_never_a_secret(
    capsys: pytest.CaptureFixture[str], ledger_path: Path
) -> None:
    db = str(ledger_path)
    secrets = []
    for tenant, role in [("acme", "operator"), ("pool-a", "runner")]:
        code, out, _ = run(
            capsys, "token", "create", "--db", db, "--tenant", tenant, "--role", role
        )
        assert code == 0
        secrets.append(out.strip())
    code, out, err = run(capsys, "token", "list", "--db", db)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2
    matches = [TOKEN_LINE.fullmatch(line) for line in lines]
    assert all(matches), lines
    assert [(m["scope"], m["role"], m["revoked"]) for m in matches if m] == [
        ("acme", "operator", None),
        ("pool-a", "runner", None),
    ]
    for secret in secrets:
        assert secret not in out + err
        assert secret.removeprefix("tether_")[:12] not in out + err

    runner_id = matches[1]["id"] if matches[1] else ""
    code, out, err = run(capsys, "token", "revoke", "--db", db, runner_id)
    assert code == 0
    assert out == ""
    assert runner_id in one_line(err)
    code, out, _ = run(capsys, "token", "list", "--db", db)
    assert [line.endswith(" revoked") for line in out.splitlines()] == [False, True]


def test_token_revoke_of_an_unknown_id_fails_with_one_line(
    capsys: pytest.CaptureFixture[str], ledger_path: Path
) -> None:
    admin.create_token(ledger_path, "acme", "operator")
    code, out, err = run(capsys, "token", "revoke", "--db", str(ledger_path), "0123456789ab")
    assert code == 1
    assert out == ""
    assert "0123456789ab" in one_line(err)


def test_token_list_on_a_missing_file_fails_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "token", "list", "--db", str(tmp_path / "none.db"))
    assert code == 1
    assert out == ""
    assert "no ledger file" in one_line(err)
    assert not (tmp_path / "none.db").exists()


# -- check -------------------------------------------------------------------------------------


def committed_task(sim: Sim) -> str:
    """A one-step task run to success on the ledger file; answer its step id."""
    spec = make_spec("k1", 1)
    created = sim.run(lambda tx: identity.create_task(tx, spec))
    sim.run(lambda tx: operator.approve(tx, "acme", created.task_id, spec.plan_hash, None))
    [lease] = sim.run(lambda tx: fencing.claim(tx, "r1", "default", 1))
    sim.run(lambda tx: effects.report(tx, report_for(lease)))
    return str(lease.step_id)


def test_check_passes_a_clean_ledger(
    capsys: pytest.CaptureFixture[str], sim: Sim, ledger_path: Path
) -> None:
    committed_task(sim)
    code, out, err = run(capsys, "check", "--db", str(ledger_path))
    assert code == 0, out + err
    assert one_line(out).startswith("ok")


def test_check_finds_two_effects_for_one_step(
    capsys: pytest.CaptureFixture[str], sim: Sim, ledger_path: Path
) -> None:
    step_id = committed_task(sim)
    db = raw_db(ledger_path)
    try:  # a second effect for the committed step, under another key: written by hand
        db.execute(
            "INSERT INTO effects (effect_key, step_id, task_id, fence, payload_hash, output_json,"
            " usage_json, candidate_sha, created_at) SELECT 'planted-' || effect_key, step_id,"
            " task_id, fence, payload_hash, output_json, usage_json, candidate_sha, created_at"
            " FROM effects WHERE step_id = ?",
            (step_id,),
        )
    finally:
        db.close()
    code, out, _ = run(capsys, "check", "--db", str(ledger_path))
    assert code == 1
    assert f"one-effect-per-step: step {step_id} has 2 effects" in out.splitlines()


def test_check_fails_a_file_that_is_not_a_ledger(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 500)
    code, out, _ = run(capsys, "check", "--db", str(garbage))
    assert code == 1
    assert out.startswith("integrity: ")


def test_check_of_a_missing_file_fails_and_creates_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "check", "--db", str(tmp_path / "none.db"))
    assert code == 1
    assert "no ledger file" in one_line(err)
    assert list(tmp_path.iterdir()) == []


# -- backup ------------------------------------------------------------------------------------


def tasks_of(path: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(str(path))
    try:
        return [tuple(r) for r in db.execute("SELECT id, state FROM tasks ORDER BY id")]
    finally:
        db.close()


def test_backup_is_a_sound_copy_with_the_same_tasks(
    capsys: pytest.CaptureFixture[str], sim: Sim, ledger_path: Path, tmp_path: Path
) -> None:
    committed_task(sim)
    sim.run(lambda tx: identity.create_task(tx, make_spec("k2", 2)))
    dest = tmp_path / "copy.db"
    code, out, err = run(capsys, "backup", "--db", str(ledger_path), str(dest))
    assert code == 0, err
    assert out == ""
    assert str(dest) in one_line(err)
    assert len(tasks_of(dest)) == 2
    assert tasks_of(dest) == tasks_of(ledger_path)
    assert run(capsys, "check", "--db", str(dest))[0] == 0


async def test_backup_is_online_beside_a_running_supervisor(
    api: ApiHarness, tmp_path: Path
) -> None:
    """Tasks written a moment ago live in the WAL of a file the supervisor holds open; the copy
    must have them all the same."""
    created = [(await api.create(f"k{i}"))["id"] for i in range(3)]
    dest = tmp_path / "online.db"
    await anyio.to_thread.run_sync(admin.backup, api.path, dest)
    assert sorted(task_id for task_id, _ in tasks_of(dest)) == sorted(created)
    assert admin.check(dest) == []


def test_backup_refuses_an_existing_destination(
    capsys: pytest.CaptureFixture[str], sim: Sim, ledger_path: Path, tmp_path: Path
) -> None:
    committed_task(sim)
    dest = tmp_path / "precious.db"
    dest.write_bytes(b"an older backup")
    code, out, err = run(capsys, "backup", "--db", str(ledger_path), str(dest))
    assert code == 1
    assert out == ""
    assert "exists" in one_line(err)
    assert dest.read_bytes() == b"an older backup"


def test_backup_into_a_missing_directory_fails_with_one_line(
    capsys: pytest.CaptureFixture[str], sim: Sim, ledger_path: Path, tmp_path: Path
) -> None:
    committed_task(sim)
    code, _, err = run(capsys, "backup", "--db", str(ledger_path), str(tmp_path / "no" / "x.db"))
    assert code == 1
    assert "cannot write" in one_line(err)


def test_backup_of_a_damaged_file_fails_and_leaves_no_copy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 500)
    dest = tmp_path / "copy.db"
    code, _, err = run(capsys, "backup", "--db", str(garbage), str(dest))
    assert code == 1
    one_line(err)
    assert not dest.exists()


# -- budget ------------------------------------------------------------------------------------


def budget_of(path: Path, tenant: str) -> object:
    db = raw_db(path)
    try:
        row = db.execute("SELECT token_budget FROM tenants WHERE name = ?", (tenant,)).fetchone()
    finally:
        db.close()
    return "no row" if row is None else row[0]


def test_budget_sets_and_clears_a_tenants_budget(
    capsys: pytest.CaptureFixture[str], ledger_path: Path
) -> None:
    admin.create_token(ledger_path, "acme", "operator")
    db = str(ledger_path)
    assert run(capsys, "budget", "--db", db, "--tenant", "acme", "--tokens", "5000")[0] == 0
    assert budget_of(ledger_path, "acme") == 5000
    assert run(capsys, "budget", "--db", db, "--tenant", "acme", "--tokens", "none")[0] == 0
    assert budget_of(ledger_path, "acme") is None


@pytest.mark.parametrize("tokens", ["-5", "lots", "1.5", "", "²", "9" * 30])
def test_budget_refuses_what_is_not_a_whole_number(
    capsys: pytest.CaptureFixture[str], ledger_path: Path, tokens: str
) -> None:
    admin.create_token(ledger_path, "acme", "operator")
    code, out, err = run(capsys, "budget", "--db", str(ledger_path), "--tenant", "acme",
                         "--tokens", tokens)  # fmt: skip
    assert code != 0
    assert out == ""
    assert "--tokens" in one_line(err)
    assert budget_of(ledger_path, "acme") == "no row"


def test_budget_on_a_missing_ledger_creates_none(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    typo = tmp_path / "tehter.db"
    code, out, err = run(capsys, "budget", "--db", str(typo), "--tenant", "acme",
                         "--tokens", "5")  # fmt: skip
    assert (code, out) == (1, "")
    assert "no ledger file" in one_line(err)
    assert not typo.exists()


def test_a_refused_first_token_leaves_no_ledger_behind(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fresh = tmp_path / "fresh.db"
    code, _out, err = run(capsys, "token", "create", "--db", str(fresh), "--tenant", "two words",
                          "--role", "operator")  # fmt: skip
    assert code == 1
    assert "not allowed" in one_line(err)
    assert list(tmp_path.iterdir()) == []


def test_check_never_writes_the_file_it_inspects(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plain = tmp_path / "plain.db"
    db = sqlite3.connect(plain)  # a rollback-journal file, not a ledger
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    before = plain.read_bytes()
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (plain, empty):
        code, _out, _err = run(capsys, "check", "--db", str(path))
        assert code == 1
    assert plain.read_bytes() == before  # still not WAL: nothing was written
    assert empty.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "plain.db"]


def test_a_new_ledger_and_its_backups_are_readable_by_their_owner_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    old = os.umask(0o022)  # a shell's usual umask, outside systemd's UMask=0077
    try:
        ledger = tmp_path / "ledger.db"
        admin.create_token(ledger, "acme", "operator")
        copy = tmp_path / "backup.db"
        assert run(capsys, "backup", "--db", str(ledger), str(copy))[0] == 0
        missing_dir = tmp_path / "nope" / "b.db"
        code, _out, err = run(capsys, "backup", "--db", str(ledger), str(missing_dir))
    finally:
        os.umask(old)
    assert stat.S_IMODE(ledger.stat().st_mode) == 0o600
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert code == 1
    assert "cannot write" in one_line(err)


def test_a_reader_that_leaves_the_pipe_gets_no_traceback(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tether-supervisor task show ID | head`: head leaves, the next write fails."""
    from supervisor import cli

    def cut_short(_args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "_admin", cut_short)
    assert main(["token", "list", "--db", "x.db"]) == 1  # not an exception
    assert "Traceback" not in capfd.readouterr().err


# -- --help and bad usage ----------------------------------------------------------------------

COMMANDS = [
    [], ["serve"], ["token"], ["token", "create"], ["token", "list"], ["token", "revoke"],
    ["check"], ["backup"], ["budget"], ["task"], ["task", "submit"], ["task", "approve"],
    ["task", "cancel"], ["task", "show"], ["task", "watch"], ["chaos"], ["chaos", "explore"],
]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "top")
def test_every_command_answers_help(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    code, out, err = run(capsys, *command, "--help")
    assert code == 0
    assert out.startswith("usage: tether-supervisor")
    assert " ".join(["tether-supervisor", *command]) in out.splitlines()[0]
    assert err == ""


BAD_USAGE = [
    [],
    ["launch"],
    ["token"],
    ["token", "create", "--db", "{db}"],
    ["token", "create", "--db", "{db}", "--tenant", "acme", "--role", "admin"],
    ["token", "revoke", "--db", "{db}"],
    ["token", "list"],
    ["check"],
    ["check", "--db", "{db}", "extra"],
    ["backup", "--db", "{db}"],
    ["budget", "--db", "{db}", "--tenant", "acme"],
    ["serve", "--port", "http"],
    ["serve", "--db", "{db}", "--port", "0"],
    ["serve", "--db", "{db}", "--config", "{missing}"],
    ["serve", "--db", "{db}", "--bogus"],
    ["task"],
    ["task", "show", "--url", "http://127.0.0.1:9"],
    ["task", "approve", "--url", "http://127.0.0.1:9", "some-task"],
    ["task", "watch", "some-task"],
    ["task", "show", "--url", "http://127.0.0.1:9", "some-task"],  # no token file anywhere
    ["task", "show", "--url", "http://127.0.0.1:9", "--token-file", "{missing}", "some-task"],
]


@pytest.mark.parametrize("argv", BAD_USAGE, ids=lambda a: " ".join(a) or "nothing")
def test_bad_usage_exits_non_zero_with_one_clear_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    argv: list[str],
) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    for name in ("TETHER_CONFIG", "TETHER_DB", "TETHER_PORT"):
        monkeypatch.delenv(name, raising=False)
    db = tmp_path / "ledger.db"
    filled = [a.format(db=db, missing=tmp_path / "missing") for a in argv]
    code, out, err = run(capsys, *filled)
    assert code != 0
    assert out == ""
    line = one_line(err)
    assert line.startswith("tether-supervisor")
    assert ": error: " in line
    assert not db.exists()  # a refused command leaves no ledger file behind
