"""`tether-supervisor serve` as a real process on 127.0.0.1, and the operator's `task` commands
against it. Every process is bounded in time and killed in `finally`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent_repos import make_origin
from tether.supervisor import admin
from tether.supervisor.cli import main

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0


def program() -> list[str]:
    script = Path(sys.executable).with_name("tether-supervisor")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tether.supervisor.cli"]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without settings or credentials that would change what is tested."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TETHER_")
        and k not in {"CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET", "WATCHDOG_USEC"}
    }
    return {**env, **extra}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=STOP_TIMEOUT_S)


@contextlib.contextmanager
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket standing in for systemd: `serve` sends READY=1 once it listens."""
    folder = tempfile.mkdtemp(prefix="tether-")  # short: AF_UNIX paths are limited to 108 bytes
    path = os.path.join(folder, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(path)
        sock.settimeout(START_TIMEOUT_S)
        yield sock, path
    finally:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
            os.rmdir(folder)


def wait_ready(sock: socket.socket, proc: subprocess.Popen[bytes], log: Path) -> None:
    while True:
        try:
            message = sock.recv(4096).decode()
        except TimeoutError:
            stop(proc)
            raise AssertionError(f"serve never said READY=1:\n{log.read_text()}") from None
        if "READY=1" in message.splitlines():
            return


@contextlib.contextmanager
def serving(db: Path, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`serve` on a free port, once it says it is ready; killed on the way out."""
    port = free_port()
    with notify_socket() as (sock, address), log.open("wb") as out:
        proc = subprocess.Popen(
            [*program(), "serve", "--db", str(db), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(NOTIFY_SOCKET=address),
        )
        try:
            wait_ready(sock, proc, log)
            yield proc, f"http://127.0.0.1:{port}"
        finally:
            stop(proc)


# -- serve -------------------------------------------------------------------------------------


def test_serve_answers_healthz_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    """A runner's claim is always waiting on a live supervisor: SIGTERM answers it (204, no
    lease) instead of leaving it to uvicorn's graceful timeout and a 500."""
    db = tmp_path / "ledger.db"
    log = tmp_path / "serve.log"
    secret = admin.create_token(db, "default", "runner", init=True).secret
    runner = {"Authorization": f"Bearer {secret}"}
    claims: list[int] = []

    def long_claim(url: str) -> None:
        body = {"runner_id": "r1", "capacity": 1, "wait_s": 25}
        response = httpx.post(f"{url}/v1/leases/claim", headers=runner, json=body, timeout=30)
        claims.append(response.status_code)

    with serving(db, log) as (proc, url):
        assert httpx.get(f"{url}/healthz", timeout=5).json() == {"status": "ok"}
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
        claimer = threading.Thread(target=long_claim, args=(url,), daemon=True)
        claimer.start()
        claimer.join(timeout=0.5)  # proving an absence: the claim is waiting for work
        assert claimer.is_alive()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STOP_TIMEOUT_S) == 0
        claimer.join(timeout=STOP_TIMEOUT_S)
    assert claims == [204]
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert [e["event"] for e in lines if e["event"].startswith("supervisor st")] == [
        "supervisor starting",
        "supervisor stopping",
        "supervisor stopped",
    ]


def damage(path: Path) -> None:
    """A real ledger whose later pages are overwritten: SQLite opens it, the check fails."""
    admin.create_token(path, "acme", "operator", init=True)
    db = sqlite3.connect(str(path))
    with db:
        db.executemany(
            "INSERT INTO tokens (id, scope, role, secret_hash, created_at)"
            " VALUES (?, ?, 'operator', ?, 0)",
            [(f"id-{i}", f"tenant-{i}", f"hash-{i}") for i in range(300)],
        )
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = int(db.execute("PRAGMA page_size").fetchone()[0])
    db.close()
    data = bytearray(path.read_bytes())
    pages = len(data) // page
    for n in range(pages - 3, pages - 1):
        data[n * page + 100 : n * page + 400] = b"\x07" * 300
    path.write_bytes(bytes(data))
    assert admin.check(path), "the damage did not take"


@pytest.mark.parametrize("kind", ["garbage", "damaged_pages"])
def test_serve_refuses_a_corrupted_ledger_with_one_line(tmp_path: Path, kind: str) -> None:
    db = tmp_path / "ledger.db"
    if kind == "garbage":
        db.write_bytes(os.urandom(16 * 1024))
    else:
        damage(db)
    before = db.read_bytes()
    proc = subprocess.Popen(
        [*program(), "serve", "--db", str(db), "--port", str(free_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
    )
    try:
        _, err = proc.communicate(timeout=START_TIMEOUT_S)
    finally:
        stop(proc)
    assert proc.returncode == 1
    text = err.decode()
    assert text.count("\n") == 1, text
    assert text.startswith("tether-supervisor: error: ledger ")
    assert "refused" in text
    assert db.read_bytes() == before  # refusing to start does not touch the evidence


def test_serve_on_a_port_in_use_fails_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.Popen(
            [*program(), "serve", "--db", str(tmp_path / "ledger.db"), "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=clean_env(),
        )
        try:
            _, err = proc.communicate(timeout=START_TIMEOUT_S)
        finally:
            stop(proc)
    assert proc.returncode == 1
    text = err.decode()
    assert text.count("\n") == 1, text
    assert text.startswith(f"tether-supervisor: error: cannot listen on 127.0.0.1:{port}")


# -- task submit | approve | cancel | show | watch ----------------------------------------------


class Served:
    """A served ledger whose tenant acme has the repository `tether` (a real one, whose
    HEAD is `head`)."""

    def __init__(
        self, url: str, token_file: Path, runner_token: str, folder: Path, head: str
    ) -> None:
        self.url = url
        self.token_file = token_file
        self.runner = {"Authorization": f"Bearer {runner_token}"}
        self.folder = folder
        self.head = head
        self.files = 0

    def task_file(self, key: str, steps: int = 1, **extra: Any) -> Path:
        self.files += 1
        plan = {
            "steps": [
                {
                    "name": f"s{i}",
                    "kind": "chat",
                    "payload": {"messages": [{"role": "user", "content": f"step {i}"}]},
                }
                for i in range(steps)
            ]
        }
        path = self.folder / f"task-{self.files}.json"
        path.write_text(json.dumps({"idempotency_key": key, "plan": plan, **extra}))
        return path

    def args(self, command: str, *rest: str) -> list[str]:
        return ["task", command, "--url", self.url, "--token-file", str(self.token_file), *rest]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("served")
    db = folder / "ledger.db"
    token_file = folder / "operator-token"
    token_file.write_text(admin.create_token(db, "acme", "operator", init=True).secret + "\n")
    runner_token = admin.create_token(db, "acme/cli", "runner").secret
    origin, head = make_origin(folder / "tether")
    admin.add_repository(db, "acme", "tether", str(origin))
    with serving(db, folder / "serve.log") as (_proc, url):
        yield Served(url, token_file, runner_token, folder, head)


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_submit_with_approve_then_show(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    path = served.task_file("submit-approve", 2)
    code, out, err = run(capsys, served.args("submit", "--file", str(path), "--approve"))
    assert code == 0, err
    task = json.loads(out)
    assert task["state"] == "QUEUED"
    assert task["idempotency_key"] == "submit-approve"
    code, out, _ = run(capsys, served.args("show", task["id"]))
    assert code == 0
    shown = json.loads(out)
    assert shown["id"] == task["id"]
    assert [s["name"] for s in shown["steps"]] == ["s0", "s1"]


def test_submit_with_approve_binds_the_files_base_sha_and_checks(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    path = served.task_file(
        "repo-task",
        repository="tether",
        base_sha=served.head,
        allowed_paths=["src/"],
        checks={"tests": "python -m pytest -q"},
    )
    code, out, err = run(capsys, served.args("submit", "--file", str(path), "--approve"))
    assert code == 0, err
    task = json.loads(out)
    assert (task["state"], task["base_sha"]) == ("QUEUED", served.head)
    code, out, err = run(capsys, served.args("review", task["id"]))
    assert code == 0, err
    assert json.loads(out)["expected_checks"]["value"] == ["tests"]


def test_approve_on_a_stale_base_fails_with_one_line(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    path = served.task_file("stale", repository="tether", base_sha="a" * 40)
    code, out, err = run(capsys, served.args("submit", "--file", str(path)))
    assert code == 0, err
    task = json.loads(out)
    argv = served.args("approve", task["id"], "--plan-hash", task["plan_hash"])
    code, out, err = run(capsys, [*argv, "--base-sha", "a" * 40])
    assert (code, out) == (1, "")
    assert err.count("\n") == 1, err
    assert "409 stale_base" in err
    assert served.head in err
    code, out, err = run(capsys, served.args("show", task["id"]))
    assert json.loads(out)["state"] == "PLANNED"
    code, out, err = run(capsys, [*argv, "--base-sha", served.head])
    assert code == 0, err
    assert json.loads(out)["state"] == "QUEUED"


def test_submit_then_approve_by_plan_hash(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    path = served.task_file("approve-later")
    code, out, _ = run(capsys, served.args("submit", "--file", str(path)))
    assert code == 0
    task = json.loads(out)
    assert task["state"] == "PLANNED"
    code, _, err = run(capsys, served.args("approve", task["id"], "--plan-hash", "0" * 64))
    assert code == 1
    assert err.count("\n") == 1
    assert "409 plan_mismatch" in err
    code, out, _ = run(capsys, served.args("approve", task["id"], "--plan-hash", task["plan_hash"]))
    assert code == 0
    assert json.loads(out)["state"] == "QUEUED"


def test_cancel_then_cancel_again_fails_with_one_line(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, served.args("submit", "--file", str(served.task_file("cancel"))))
    task_id = json.loads(out)["id"]
    code, out, _ = run(capsys, served.args("cancel", task_id, "--reason", "not needed"))
    assert code == 0
    assert json.loads(out)["state"] == "CANCELLED"
    code, out, err = run(capsys, served.args("cancel", task_id))
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert "409 terminal" in err


def test_show_of_an_unknown_task_fails_with_one_line(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, served.args("show", "no-such-task"))
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert "404 not_found" in err


def test_show_against_nothing_listening_fails_with_one_line(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "task",
        "show",
        "--url",
        f"http://127.0.0.1:{free_port()}",
        "--token-file",
        str(served.token_file),
        "anything",
    ]
    code, out, err = run(capsys, argv)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert "cannot reach the supervisor" in err


def drive_to_success(served: Served, task_id: str, steps: int) -> None:
    """What a runner does, over HTTP: claim, renew, report each step in turn."""
    with httpx.Client(base_url=served.url, headers=served.runner, timeout=10) as http:
        for _ in range(steps):
            body = {"runner_id": "cli-test", "capacity": 1, "wait_s": 5}
            claim = http.post("/v1/leases/claim", json=body)
            assert claim.status_code == 200, claim.text
            [lease] = claim.json()["leases"]
            assert lease["task_id"] == task_id
            step = lease["step_id"]
            renewed = http.post(f"/v1/leases/{step}/renew", json={"fence": lease["fence"]})
            assert renewed.status_code == 200
            result = http.post(
                f"/v1/steps/{step}/result",
                json={
                    "fence": lease["fence"],
                    "payload_hash": lease["payload_hash"],
                    "output": {"ok": True},
                    "usage": {"total_tokens": 1},
                },
            )
            assert result.json() == {"outcome": "applied"}


def test_watch_prints_one_line_per_event_until_the_task_ends(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    path = served.task_file("watched", 2, pool="acme/cli")
    code, out, _ = run(capsys, served.args("submit", "--file", str(path), "--approve"))
    assert code == 0
    task_id = json.loads(out)["id"]

    outcome: list[tuple[int, str, str]] = []
    watcher = threading.Thread(
        target=lambda: outcome.append(run(capsys, served.args("watch", task_id))), daemon=True
    )
    watcher.start()
    try:
        drive_to_success(served, task_id, 2)
    finally:
        watcher.join(timeout=STOP_TIMEOUT_S)
    assert not watcher.is_alive(), "watch did not return when the task ended"
    [(code, out, err)] = outcome
    assert code == 0
    assert err.strip() == f"task {task_id} ended SUCCEEDED"

    events = httpx.get(
        f"{served.url}/v1/tasks/{task_id}/events",
        headers={"Authorization": f"Bearer {served.token_file.read_text().strip()}"},
    ).json()["events"]
    # Before a runner claims, watch may say what the task waits for; the rest are events.
    lines = [line for line in out.splitlines() if "waiting for a runner" not in line]
    assert len(lines) == len(events)  # one line per event, none twice
    for line, event in zip(lines, events, strict=True):
        fields = line.split()
        assert int(fields[0]) == event["seq"]
        assert event["state"] in fields
        assert event["kind"] in fields
    assert "SUCCEEDED" in lines[-1]
    assert sum("step_committed" in line for line in lines) == 2


def test_watch_of_a_task_that_already_ended_returns_at_once(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, served.args("submit", "--file", str(served.task_file("ended"))))
    task = json.loads(out)
    run(capsys, served.args("cancel", task["id"]))
    done: list[tuple[int, str, str]] = []
    argv = served.args("watch", task["id"], "--after", "999999")
    late = threading.Thread(target=lambda: done.append(run(capsys, argv)), daemon=True)
    late.start()
    late.join(timeout=STOP_TIMEOUT_S)
    assert not late.is_alive(), "watch kept waiting on a task that had ended"
    [(code, out, err)] = done
    assert code == 4  # CANCELLED (issue 16, finding 6: it was 0)
    assert out == ""
    assert err.strip() == f"task {task['id']} ended CANCELLED"


class _Terminal(io.StringIO):
    """Standard input as a terminal that answers `answer`."""

    def isatty(self) -> bool:
        return True


def test_show_plan_and_approve_print_the_steps_prompt(
    served: Served, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26, finding 1: `task show --plan` and `task approve` print the plan as submitted;
    approve asks on a terminal and, from a script, says to use --yes."""
    path = served.task_file("read-the-plan")
    body = json.loads(path.read_text())
    body["plan"]["steps"][0]["payload"]["messages"][0]["content"] = "then DELETE the old ones"
    path.write_text(json.dumps(body))
    code, out, err = run(capsys, served.args("submit", "--file", str(path)))
    assert code == 0, err
    task = json.loads(out)
    code, out, err = run(capsys, served.args("show", task["id"], "--plan"))
    assert code == 0, err
    assert f"plan {task['plan_hash']} (1 step)" in out
    assert "user: then DELETE the old ones" in out

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # a script: no terminal
    code, out, err = run(capsys, served.args("approve", task["id"]))
    assert (code, out) == (1, "")
    assert "--yes" in err
    assert err.count("\n") == 1

    monkeypatch.setattr(sys, "stdin", _Terminal("n\n"))
    code, out, err = run(capsys, served.args("approve", task["id"]))
    assert code == 1
    assert "user: then DELETE the old ones" in out
    assert "stays PLANNED" in err

    monkeypatch.setattr(sys, "stdin", _Terminal("y\n"))
    code, out, err = run(capsys, served.args("approve", task["id"]))
    assert code == 0, err
    assert "user: then DELETE the old ones" in out
    assert json.loads(out[out.index("[y/N] ") + 6 :])["state"] == "QUEUED"


def test_prefixes_and_a_resubmitted_key_on_the_cli(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 26, finding 5: `task show` and `--plan-hash` take unique prefixes of 8 or more
    characters; a key submitted again says which existing task it returned, on stderr."""
    path = served.task_file("prefixes-and-keys")
    code, out, err = run(capsys, served.args("submit", "--file", str(path)))
    assert (code, err) == (0, "")
    task = json.loads(out)
    code, out, err = run(capsys, served.args("submit", "--file", str(path)))
    assert code == 0, err
    assert json.loads(out)["id"] == task["id"]
    assert err == f"existing task {task['id']} (state PLANNED) returned\n"
    code, out, err = run(capsys, served.args("show", task["id"][:8]))
    assert code == 0, err
    assert json.loads(out)["id"] == task["id"]
    code, out, err = run(capsys, served.args("show", task["id"][:7]))
    assert (code, out) == (1, "")
    assert "at least 8" in err
    argv = served.args("approve", task["id"][:10], "--plan-hash", task["plan_hash"][:10], "--yes")
    code, out, err = run(capsys, argv)
    assert code == 0, err
    assert (json.loads(out)["id"], json.loads(out)["state"]) == (task["id"], "QUEUED")
    code, out, err = run(capsys, served.args("list"))
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "STATE", "CREATED", "STEPS", "WAITING-FOR", "KEY"]
    [row] = [r for r in rows if r.startswith(task["id"])]
    assert row.split()[-1] == "prefixes-and-keys"
