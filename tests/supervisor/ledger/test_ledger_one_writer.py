"""One writer per ledger file, and the commands that only read it (docs/design.md, Power loss
and the disk): a second `serve` on a SQLite ledger is refused with the holder's pid and host
while the first runs, and starts once it has exited (SIGKILL included: the kernel frees the
lock); `migrate` refuses a file that is being served; `check`, `backup`, `token list`, `repo
list` and `budget --show` read a copy on a read-only disk.

The read-only disk is a read-only bind mount in a mount namespace of its own (`unshare`, root
only), the one way here to make a folder that root cannot write."""

from __future__ import annotations

import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.supervisor.test_cli_serve import START_TIMEOUT_S, clean_env, free_port, program, stop
from tether.supervisor import writer_lock

pytestmark = pytest.mark.slow


def admin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*program(), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )


def start_serve(db: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [*program(), "serve", "--db", str(db), "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(),
        )


def wait_up(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    with httpx.Client(trust_env=False, timeout=2.0) as http:
        for _ in range(int(START_TIMEOUT_S / 0.1)):
            assert proc.poll() is None, log.read_text()
            try:
                if http.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    pytest.fail(f"serve did not answer within {START_TIMEOUT_S} s:\n{log.read_text()}")


def refused_line(db: Path, tmp_path: Path) -> str:
    """A second `serve` on `db`: it must exit 1 at once; its one line on stderr."""
    done = subprocess.run(
        [*program(), "serve", "--db", str(db), "--port", str(free_port())],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("tether-supervisor:")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_second_serve_is_refused_while_the_first_runs_and_allowed_after_it_exits(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ledger.db"
    assert admin("init", "--db", str(db)).returncode == 0
    port = free_port()
    first = start_serve(db, port, tmp_path / "first.log")
    try:
        wait_up(first, port, tmp_path / "first.log")
        line = refused_line(db, tmp_path)
        assert f"pid {first.pid} on host {socket.gethostname()}" in line, line
        assert f"ledger {db} is served by another supervisor" in line, line
        assert first.poll() is None  # the refused one changed nothing for the first
        copied = admin("migrate", "--from", str(db), "--to", "postgresql://127.0.0.1:1/none")
        assert copied.returncode == 1
        assert f"ledger {db} is served by another supervisor" in copied.stderr, copied.stderr
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0

        second = start_serve(db, port, tmp_path / "second.log")
        try:
            wait_up(second, port, tmp_path / "second.log")
            assert f"pid {second.pid}" in refused_line(db, tmp_path)
            second.kill()  # SIGKILL: no cleanup runs, the kernel frees the lock
            second.wait(timeout=30)
        finally:
            stop(second)
        assert writer_lock.lock_path(db).exists()  # left behind, and no obstacle
        third = start_serve(db, port, tmp_path / "third.log")
        try:
            wait_up(third, port, tmp_path / "third.log")
        finally:
            stop(third)
    finally:
        stop(first)


def read_only_mount(folder: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """Run `command` where `folder` is mounted read-only (root cannot write it either)."""
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, str(folder), *command],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )


@pytest.fixture
def read_only_disk(tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed: no read-only mount to test on")
    probe = tmp_path / "probe"
    probe.mkdir()
    done = read_only_mount(probe, "sh", "-c", "! touch probe/x 2>/dev/null")
    if done.returncode != 0:
        pytest.skip(f"cannot make a read-only mount here (needs root): {done.stderr.strip()}")


def test_check_and_backup_read_a_copy_on_a_read_only_disk(
    tmp_path: Path, read_only_disk: None
) -> None:
    db = tmp_path / "ledger.db"
    made = admin("token", "create", "--init", "--db", str(db), "--tenant", "t", "--role", "runner")
    assert made.returncode == 0, made.stderr
    assert admin("budget", "--db", str(db), "--tenant", "t", "--tokens", "100").returncode == 0
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(db, copy / "ledger.db")  # a file copied while no supervisor ran: no -wal

    # A copy taken while the ledger was open (its -wal and -shm files beside it) reads too.
    live = tmp_path / "live"
    live.mkdir()
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("UPDATE tokens SET name = 'live' WHERE 1")  # a commit only the -wal holds
        for name in ("ledger.db", "ledger.db-wal", "ledger.db-shm"):
            shutil.copy(tmp_path / name, live / name)
    finally:
        writer.close()
    out = tmp_path / "out"
    out.mkdir()
    for folder in (copy, live):
        checked = read_only_mount(folder, *program(), "check", "--db", str(folder / "ledger.db"))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "passes integrity and every ledger invariant" in checked.stdout
        backup = out / f"{folder.name}.db"
        done = read_only_mount(
            folder, *program(), "backup", "--db", str(folder / "ledger.db"), str(backup)
        )
        assert done.returncode == 0, done.stderr
        with sqlite3.connect(f"file:{backup}?mode=ro", uri=True) as copied:
            names = {n for (n,) in copied.execute("SELECT name FROM tokens")}
        assert names == ({"live"} if folder is live else {None})
    for listing in (["token", "list"], ["repo", "list"], ["budget", "--show", "--tenant", "t"]):
        done = read_only_mount(copy, *program(), *listing, "--db", str(copy / "ledger.db"))
        assert done.returncode == 0, f"{listing}: {done.stderr}"
    assert sorted(p.name for p in copy.iterdir()) == ["ledger.db"]  # nothing written beside it

    # Commits in a -wal file that its -shm file would index, on a read-only disk: refused.
    (live / "ledger.db-shm").unlink()
    refused = read_only_mount(live, *program(), "check", "--db", str(live / "ledger.db"))
    assert refused.returncode == 1
    assert "no ledger.db-shm, on a read-only folder" in refused.stdout, refused.stdout
