"""`tether-supervisor repo add|list|remove` (docs/design.md, Repositories and candidates): a
repository is added only once git can read its URL, a refused one changes nothing, and no
password ever reaches the ledger or a message."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.agent_repos import make_origin
from tests.conftest import count, make_spec
from tests.supervisor.test_cli_admin import one_line, run
from tether.supervisor import admin
from tether.supervisor.ledger import identity, operator, repositories
from tether.supervisor.ledger.errors import InvalidRequest

LIST_LINE = re.compile(r"(\S+) (\S+) (\S+) \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    admin.init_ledger(path)
    return path


@pytest.fixture
def origin(tmp_path: Path) -> tuple[Path, str]:
    return make_origin(tmp_path / "origin")


def listed(capsys: pytest.CaptureFixture[str], db: Path) -> list[tuple[str, ...]]:
    code, out, err = run(capsys, "repo", "list", "--db", str(db))
    assert (code, err) == (0, "")
    rows = []
    for line in out.splitlines():
        match = LIST_LINE.fullmatch(line)
        assert match, line
        rows.append(match.groups())
    return rows


def test_add_list_remove(
    capsys: pytest.CaptureFixture[str], db: Path, origin: tuple[Path, str]
) -> None:
    path, head = origin
    code, out, err = run(
        capsys, "repo", "add", "app", "--url", str(path), "--tenant", "acme", "--db", str(db)
    )
    assert (code, out) == (0, "")
    assert one_line(err) == f"added repository app of tenant acme, HEAD {head}"
    code, _, err = run(
        capsys,
        "repo",
        "add",
        "docs",
        "--url",
        f"file://{path}",
        "--tenant",
        "beta",
        "--db",
        str(db),
    )
    assert code == 0
    assert listed(capsys, db) == [("acme", "app", str(path)), ("beta", "docs", f"file://{path}")]

    code, out, err = run(capsys, "repo", "remove", "app", "--tenant", "acme", "--db", str(db))
    assert (code, out) == (0, "")
    assert one_line(err) == "removed repository app of tenant acme"
    assert listed(capsys, db) == [("beta", "docs", f"file://{path}")]
    code, _, err = run(capsys, "repo", "remove", "app", "--tenant", "acme", "--db", str(db))
    assert code == 1
    assert "has no repository 'app'" in one_line(err)


def test_adding_again_with_the_same_url_changes_nothing_and_another_url_is_refused(
    capsys: pytest.CaptureFixture[str], db: Path, origin: tuple[Path, str], tmp_path: Path
) -> None:
    path, _ = origin
    other, _ = make_origin(tmp_path / "other")
    args = ("repo", "add", "app", "--tenant", "acme", "--db", str(db))
    assert run(capsys, *args, "--url", str(path))[0] == 0
    code, _, err = run(capsys, *args, "--url", str(path))
    assert code == 0
    assert one_line(err).startswith("already known: repository app of tenant acme")
    code, _, err = run(capsys, *args, "--url", str(other))
    assert code == 1
    assert "remove it first" in one_line(err)
    assert listed(capsys, db) == [("acme", "app", str(path))]


def test_a_relative_path_is_stored_absolute(
    capsys: pytest.CaptureFixture[str],
    db: Path,
    origin: tuple[Path, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, _ = origin
    monkeypatch.chdir(path.parent)
    code, _, _ = run(
        capsys, "repo", "add", "app", "--url", path.name, "--tenant", "acme", "--db", str(db)
    )
    assert code == 0
    assert listed(capsys, db) == [("acme", "app", str(path.resolve()))]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("{tmp}/not-a-repository", "does not appear to be a git repository"),
        ("file://{tmp}/not-a-repository", "cannot read file://"),
        ("relative/path/nowhere", "must be absolute"),
        ("ext::sh -c touch% {tmp}/pwned", "printable characters, no spaces"),
        ("ext::sh", "must not name a git transport"),
        ("--upload-pack=touch", "must not start with '-'"),
        ("ftp://example.org/x.git", "scheme is one of"),
    ],
)
def test_a_url_git_cannot_read_is_refused_with_one_line_and_nothing_stored(
    capsys: pytest.CaptureFixture[str], db: Path, tmp_path: Path, url: str, says: str
) -> None:
    filled = url.format(tmp=tmp_path)
    code, out, err = run(
        capsys, "repo", "add", "app", f"--url={filled}", "--tenant", "acme", "--db", str(db)
    )
    assert (code, out) == (1, "")
    assert says in one_line(err)
    assert count(db, "repository_remotes") == 0
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "url",
    [
        "https://alice:s3cret-pw@example.org/app.git",
        "https://s3cret-pw@example.org/app.git",  # a token given as the user
        "ssh://alice:s3cret-pw@example.org/app.git",
        "alice:s3cret-pw@example.org:app.git",
    ],
)
def test_a_url_holding_a_secret_is_refused_without_printing_it(
    capsys: pytest.CaptureFixture[str], db: Path, url: str
) -> None:
    code, out, err = run(
        capsys, "repo", "add", "app", "--url", url, "--tenant", "acme", "--db", str(db)
    )
    assert code == 1
    assert "must not hold a password" in one_line(err)
    assert "s3cret-pw" not in out + err
    assert count(db, "repository_remotes") == 0


def test_an_unreachable_remote_is_named_with_its_credentials_masked(
    capsys: pytest.CaptureFixture[str], db: Path
) -> None:
    """The password check is the ledger's; a user that reaches git is masked in its message."""
    url = "ssh://deploy-user@127.0.0.1:1/app.git"
    code, _, err = run(
        capsys, "repo", "add", "app", "--url", url, "--tenant", "acme", "--db", str(db)
    )
    assert code == 1
    line = one_line(err)
    assert "cannot read ssh://***@127.0.0.1:1/app.git" in line
    assert "deploy-user" not in line


def test_bad_names_are_refused_before_git_runs(
    capsys: pytest.CaptureFixture[str], db: Path, origin: tuple[Path, str]
) -> None:
    path, _ = origin
    for name, tenant in (("a b", "acme"), ("../x", "acme"), ("app", "acme/pool")):
        code, _, err = run(
            capsys, "repo", "add", name, "--url", str(path), "--tenant", tenant, "--db", str(db)
        )
        assert code == 1, name
        assert "not allowed" in one_line(err) or "has no '/'" in err
    assert count(db, "repository_remotes") == 0


def test_repo_commands_refuse_a_missing_ledger(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, origin: tuple[Path, str]
) -> None:
    missing = tmp_path / "missing.db"
    for argv in (
        ("repo", "add", "app", "--url", str(origin[0]), "--tenant", "acme"),
        ("repo", "list"),
        ("repo", "remove", "app", "--tenant", "acme"),
    ):
        code, _, err = run(capsys, *argv, "--db", str(missing))
        assert code == 1
        assert one_line(err).endswith(f"no ledger file at {missing}")
    assert not missing.exists()


def test_remove_is_refused_while_a_task_that_has_not_ended_names_it(
    db: Path, origin: tuple[Path, str]
) -> None:
    path, head = origin
    admin.add_repository(db, "acme", "app", str(path))
    spec = make_spec("k1", repository="app", base_sha=head)
    with admin.ledger_file(db) as conn:
        created = admin.run_rule(conn, lambda tx: identity.create_task(tx, spec))
    with pytest.raises(admin.AdminError, match=f"named by task {created.task_id}"):
        admin.remove_repository(db, "acme", "app")
    with admin.ledger_file(db) as conn:
        admin.run_rule(conn, lambda tx: operator.cancel(tx, "acme", created.task_id, "done"))
    assert admin.remove_repository(db, "acme", "app").url == str(path)
    assert count(db, "repository_remotes") == 0


def test_the_reported_heads_table_is_left_alone(db: Path, origin: tuple[Path, str]) -> None:
    """`repo add` records where a repository is read from; the head a forge reports
    (`PUT /v1/repositories/{name}/head`) is kept apart, as before."""
    path, head = origin
    with admin.ledger_file(db) as conn:
        admin.run_rule(conn, lambda tx: operator.set_repository_head(tx, "acme", "app", head))
    admin.add_repository(db, "acme", "app", str(path))
    admin.remove_repository(db, "acme", "app")
    assert count(db, "repositories", "name = 'app' AND head_sha = ?", (head,)) == 1


@pytest.mark.parametrize(
    "url",
    [
        "/srv/git/app.git",
        "file:///srv/git/app.git",
        "ssh://git@example.org/app.git",
        "git@example.org:team/app.git",
        "https://example.org/team/app.git",
        "git://example.org/app.git",
    ],
)
def test_the_url_forms_git_reads_are_accepted(url: str) -> None:
    assert repositories.check_url(url) == url


@pytest.mark.parametrize("url", ["", "app.git", "./app", "fd::3", "https://x@y/z", "a\nb"])
def test_other_url_forms_are_refused(url: str) -> None:
    with pytest.raises(InvalidRequest):
        repositories.check_url(url)


@pytest.mark.parametrize(
    "command", [["repo"], ["repo", "add"], ["repo", "list"], ["repo", "remove"]]
)
def test_every_repo_command_answers_help(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    code, out, err = run(capsys, *command, "--help")
    assert (code, err) == (0, "")
    assert out.startswith(f"usage: tether-supervisor {' '.join(command)}")


def test_setup_commands_are_stored_listed_replaced_and_checked(
    capsys: pytest.CaptureFixture[str], db: Path, origin: tuple[Path, str]
) -> None:
    path, head = origin
    args = ("repo", "add", "app", "--url", str(path), "--tenant", "acme", "--db", str(db))
    code, _, err = run(capsys, *args, "--setup", "uv sync --frozen", "--setup", "make deps")
    assert code == 0
    assert one_line(err) == f"added repository app of tenant acme, HEAD {head}, setup: 2 command(s)"
    code, out, _ = run(capsys, "repo", "list", "--db", str(db))
    assert out.rstrip().endswith(' setup=["uv sync --frozen", "make deps"]'), out
    # Added again without --setup: unchanged; with it: replaced.
    assert run(capsys, *args)[0] == 0
    assert setup_of(db) == ("uv sync --frozen", "make deps")
    assert run(capsys, *args, "--setup", "pip install -e .")[0] == 0
    assert setup_of(db) == ("pip install -e .",)
    # A command line that cannot be split is refused in one line, and nothing changes.
    code, _, err = run(capsys, *args, "--setup", "echo 'unclosed")
    assert code == 1
    assert "setup command 1: " in one_line(err)
    assert setup_of(db) == ("pip install -e .",)


def setup_of(db: Path) -> tuple[str, ...]:
    with admin.ledger_reads(db) as reads:
        held = repositories.find_repository(reads, "acme", "app")
    assert held is not None
    return held.setup
