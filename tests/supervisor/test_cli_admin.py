"""`tether-supervisor` on the ledger file (docs/design.md, Command line and settings), in
process: init, tokens, check, backup, budget, `--help` on every command, and one clear line on
stderr for every bad usage."""

from __future__ import annotations

import os
import re
import sqlite3
import stat
from pathlib import Path

import anyio
import pytest

from tests.conftest import ApiHarness, Sim, make_spec, raw_db, report_for
from tether.supervisor import admin
from tether.supervisor.cli import main
from tether.supervisor.ledger import effects, fencing, identity, operator
from tether.supervisor.ledger.tokens import hash_secret

TOKEN_LINE = re.compile(
    r"(?P<id>[0-9a-f]{12}) (?P<scope>\S+) (?P<role>operator|runner)"
    r" \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ(?P<revoked> revoked)?"
    r" name=(?P<name>\S+) last_used=(?P<last_used>never|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"
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
    code, out, err = run(
        capsys,
        "token",
        "create",
        "--init",
        "--db",
        str(ledger_path),
        "--tenant",
        "acme",
        "--role",
        "operator",
    )
    assert code == 0
    secret = one_line(out)
    assert re.fullmatch(r"tether_[A-Za-z0-9_-]{20,}", secret)
    db = raw_db(ledger_path)
    try:
        row = db.execute("SELECT id, scope, role, secret_hash, name FROM tokens").fetchone()
    finally:
        db.close()
    assert tuple(row)[1:] == ("acme", "operator", hash_secret(secret), None)  # hashed, no name
    assert one_line(err) == f"created token {row['id']} in a new ledger {ledger_path}"
    assert secret not in err


def test_token_create_with_a_name_prints_its_id_and_list_shows_name_and_last_use(
    capsys: pytest.CaptureFixture[str], ledger_path: Path
) -> None:
    """Finding 4: a token can be told apart by its name and its id, which `create` prints on
    stderr (the secret alone stays on stdout), and `list` shows with its last use."""
    db = str(ledger_path)
    admin.create_token(ledger_path, "acme", "operator", init=True)
    code, out, err = run(
        capsys,
        "token",
        "create",
        "--db",
        db,
        "--tenant",
        "default",
        "--role",
        "runner",
        "--name",
        "box-17",
    )
    assert code == 0
    secret = one_line(out)
    created = re.fullmatch(r"created token (?P<id>[0-9a-f]{12}) name=box-17", one_line(err))
    assert created, err
    raw = raw_db(ledger_path)
    try:
        raw.execute("UPDATE tokens SET last_used_at = 1700000000 WHERE id = ?", (created["id"],))
    finally:
        raw.close()
    code, out, err = run(capsys, "token", "list", "--db", db)
    assert (code, err) == (0, "")
    matches = [TOKEN_LINE.fullmatch(line) for line in out.splitlines()]
    assert all(matches), out
    assert [(m["scope"], m["name"], m["last_used"]) for m in matches if m] == [
        ("acme", "-", "never"),
        ("default", "box-17", "2023-11-14T22:13:20Z"),
    ]
    assert matches[1]
    assert matches[1]["id"] == created["id"]
    assert secret not in out


def test_token_list_shows_one_line_per_token_and_never_a_secret(
    capsys: pytest.CaptureFixture[str], ledger_path: Path
) -> None:
    db = str(ledger_path)
    assert run(capsys, "init", "--db", db)[0] == 0
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
    # The first fields as they always were: `ID TENANT ROLE CREATED [revoked]`.
    assert [line.split()[4] == "revoked" for line in out.splitlines()] == [False, True]


def token_rows(path: Path) -> list[tuple[str | None, bool]]:
    """Each token's name and whether it is revoked, in creation order."""
    db = raw_db(path)
    try:
        rows = db.execute("SELECT name, revoked_at FROM tokens ORDER BY created_at, rowid")
        return [(r["name"], r["revoked_at"] is not None) for r in rows]
    finally:
        db.close()


def test_token_revoke_takes_a_name(capsys: pytest.CaptureFixture[str], ledger_path: Path) -> None:
    """Finding 4: with ten runner tokens in a pool, the one on a compromised box is revoked by
    its name; its name is then free for the box's next token, which the name then finds."""
    db = str(ledger_path)
    first = admin.create_token(ledger_path, "default", "runner", name="box-16", init=True)
    box = admin.create_token(ledger_path, "default", "runner", name="box-17")
    code, out, err = run(capsys, "token", "revoke", "--db", db, "box-17")
    assert (code, out) == (0, "")
    assert one_line(err) == f"revoked token {box.id} name=box-17"
    assert token_rows(ledger_path) == [("box-16", False), ("box-17", True)]
    assert run(capsys, "token", "revoke", "--db", db, "box-17")[0] == 0  # again: no change
    assert token_rows(ledger_path) == [("box-16", False), ("box-17", True)]

    again = admin.create_token(ledger_path, "default", "runner", name="box-17")
    assert run(capsys, "token", "revoke", "--db", db, "box-17")[0] == 0
    assert token_rows(ledger_path) == [("box-16", False), ("box-17", True), ("box-17", True)]
    assert again.id != box.id != first.id
    code, out, err = run(capsys, "token", "revoke", "--db", db, "box-99")
    assert (code, out) == (1, "")
    assert "box-99" in one_line(err)


def test_a_token_name_is_unique_among_live_tokens(
    capsys: pytest.CaptureFixture[str], ledger_path: Path
) -> None:
    db = str(ledger_path)
    held = admin.create_token(ledger_path, "default", "runner", name="box-17", init=True)
    code, out, err = run(
        capsys,
        "token",
        "create",
        "--db",
        db,
        "--tenant",
        "acme",
        "--role",
        "operator",
        "--name",
        "box-17",
    )
    assert (code, out) == (1, "")
    assert held.id in one_line(err)
    assert token_rows(ledger_path) == [("box-17", False)]


@pytest.mark.parametrize("name", ["two words", "a=b", "", "-lead", "0123456789ab", "x" * 201])
def test_token_names_that_would_break_a_listing_are_refused(
    capsys: pytest.CaptureFixture[str], ledger_path: Path, name: str
) -> None:
    admin.init_ledger(ledger_path)
    code, out, err = run(
        capsys,
        "token",
        "create",
        "--db",
        str(ledger_path),
        "--tenant",
        "acme",
        "--role",
        "operator",
        f"--name={name}",
    )
    assert (code, out) == (1, "")
    assert "token name" in one_line(err)
    assert token_rows(ledger_path) == []


def test_token_revoke_of_an_unknown_id_fails_with_one_line(
    capsys: pytest.CaptureFixture[str], ledger_path: Path
) -> None:
    admin.create_token(ledger_path, "acme", "operator", init=True)
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


# -- no ledger by accident ---------------------------------------------------------------------


def test_token_create_on_a_mistyped_path_is_refused_and_creates_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Finding 7: `token create --db <typo>` made a new, empty ledger and printed a token for
    it. Without `--init` it is one line and exit 1; no file appears."""
    admin.create_token(tmp_path / "tether.db", "acme", "operator", init=True)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run(
        capsys,
        "token",
        "create",
        "--db",
        str(tmp_path / "tehter.db"),
        "--tenant",
        "default",
        "--role",
        "runner",
    )
    assert (code, out) == (1, "")
    assert f"no ledger file at {tmp_path / 'tehter.db'}" in one_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_init_then_token_create_works(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "tether.db"
    code, out, err = run(capsys, "init", "--db", str(path))
    assert (code, out) == (0, "")
    assert one_line(err) == f"created ledger {path}"
    assert token_rows(path) == []  # a ledger: its tables are there, empty
    code, out, err = run(
        capsys, "token", "create", "--db", str(path), "--tenant", "acme", "--role", "operator"
    )
    assert code == 0
    assert one_line(out).startswith("tether_")
    assert "new ledger" not in one_line(err)
    code, out, err = run(capsys, "init", "--db", str(path))  # twice, as a script may
    assert (code, out) == (0, "")
    assert "exists" in one_line(err)
    assert token_rows(path) == [(None, False)]


def test_init_refuses_a_file_that_is_not_a_ledger(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database, " * 100)
    code, out, err = run(capsys, "init", "--db", str(notes))
    assert (code, out) == (1, "")
    assert str(notes) in one_line(err)
    assert notes.read_text() == "not a database, " * 100


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
    admin.create_token(ledger_path, "acme", "operator", init=True)
    db = str(ledger_path)
    assert run(capsys, "budget", "--db", db, "--tenant", "acme", "--tokens", "5000")[0] == 0
    assert budget_of(ledger_path, "acme") == 5000
    assert run(capsys, "budget", "--db", db, "--tenant", "acme", "--tokens", "none")[0] == 0
    assert budget_of(ledger_path, "acme") is None


@pytest.mark.parametrize("tokens", ["-5", "lots", "1.5", "", "²", "9" * 30])
def test_budget_refuses_what_is_not_a_whole_number(
    capsys: pytest.CaptureFixture[str], ledger_path: Path, tokens: str
) -> None:
    admin.create_token(ledger_path, "acme", "operator", init=True)
    code, out, err = run(
        capsys, "budget", "--db", str(ledger_path), "--tenant", "acme", "--tokens", tokens
    )
    assert code != 0
    assert out == ""
    assert "--tokens" in one_line(err)
    assert budget_of(ledger_path, "acme") == "no row"


def test_budget_on_a_missing_ledger_creates_none(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    typo = tmp_path / "tehter.db"
    code, out, err = run(capsys, "budget", "--db", str(typo), "--tenant", "acme", "--tokens", "5")
    assert (code, out) == (1, "")
    assert "no ledger file" in one_line(err)
    assert not typo.exists()


def test_budget_show_prints_spent_budget_and_left(
    capsys: pytest.CaptureFixture[str], sim: Sim, ledger_path: Path
) -> None:
    """Finding 8: a tenant's budget and what it has spent could be set but not read."""
    db = str(ledger_path)
    show = ["budget", "--db", db, "--tenant", "acme", "--show"]
    admin.create_token(ledger_path, "acme", "operator")  # known by its token, nothing spent
    assert run(capsys, *show) == (0, "tenant=acme spent=0 budget=unlimited left=unlimited\n", "")
    committed_task(sim)  # its step reports 3 tokens
    assert run(capsys, *show)[1] == "tenant=acme spent=3 budget=unlimited left=unlimited\n"
    assert run(capsys, "budget", "--db", db, "--tenant", "acme", "--tokens", "10")[0] == 0
    assert run(capsys, *show)[1] == "tenant=acme spent=3 budget=10 left=7\n"
    assert run(capsys, "budget", "--db", db, "--tenant", "acme", "--tokens", "2")[0] == 0
    assert run(capsys, *show)[1] == "tenant=acme spent=3 budget=2 left=0\n"


def test_budget_show_of_a_tenant_the_ledger_does_not_know_fails(
    capsys: pytest.CaptureFixture[str], ledger_path: Path
) -> None:
    admin.create_token(ledger_path, "acme", "operator", init=True)
    code, out, err = run(capsys, "budget", "--db", str(ledger_path), "--tenant", "acmee", "--show")
    assert (code, out) == (1, "")
    assert "no tenant 'acmee'" in one_line(err)
    assert budget_of(ledger_path, "acmee") == "no row"


def test_a_refused_first_token_leaves_no_ledger_behind(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fresh = tmp_path / "fresh.db"
    code, _out, err = run(
        capsys,
        "token",
        "create",
        "--init",
        "--db",
        str(fresh),
        "--tenant",
        "two words",
        "--role",
        "operator",
    )
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
        admin.create_token(ledger, "acme", "operator", init=True)
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
    from tether.supervisor import cli

    def cut_short(_args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "_admin", cut_short)
    assert main(["token", "list", "--db", "x.db"]) == 1  # not an exception
    assert "Traceback" not in capfd.readouterr().err


# -- --help and bad usage ----------------------------------------------------------------------

COMMANDS = [
    [],
    ["serve"],
    ["init"],
    ["token"],
    ["token", "create"],
    ["token", "list"],
    ["token", "revoke"],
    ["check"],
    ["backup"],
    ["budget"],
    ["task"],
    ["task", "submit"],
    ["task", "approve"],
    ["task", "cancel"],
    ["task", "show"],
    ["task", "watch"],
    ["chaos"],
    ["chaos", "explore"],
]


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
    ["budget", "--db", "{db}", "--tenant", "acme", "--show", "--tokens", "5"],
    ["init"],
    ["token", "create", "--db", "{db}", "--tenant", "acme", "--role", "operator"],
    ["budget", "--db", "{db}", "--tenant", "acme", "--show"],
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
