"""Power cuts under load (docs/design.md, Power loss and the disk): a real supervisor keeps its
ledger, artifact store and mirrors on a file system that loses what a disk loses when the
power goes (tests/holdfs.py), while two runners run chat and agent tasks through a proxy that
records every answer the supervisor acknowledged (tests/recording_proxy.py).

The power is cut at each of `CUTS`, moments the file system holds on (a write into a new
mirror, into a fetch's or an unbundle's objects, just after a candidate's ref is renamed in, into
the ledger's -wal, into an upload, just after an artifact is linked in, and once at any
moment): the supervisor and its git children are stopped, what no sync made durable is
dropped, they are killed, and the file system is mounted again. Then, before the supervisor
starts again, every acknowledged answer must be in what the disk kept: each task created and
approved, each lease's fence, each result applied, each checkpoint, each uploaded artifact
(its bytes intact), and each committed candidate's ref in its mirror, which `git fsck` finds
sound; and `tether-supervisor check` passes.

The same run with a planted missing sync (tests/serve_planted.py: folders are never synced)
must fail those checks. Without /dev/fuse or fuse3 the test skips with one line, and fails
instead under CI (`CI` set), where both are installed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from examples.demo_repo import Repository, make_repository
from tests.runner.test_runner_processes import environment, free_port, program
from tether.supervisor.repos import Mirrors, candidate_ref

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]

CHECKOUT = Path(__file__).resolve().parents[2]
TENANT, POOL, REPOSITORY = "acme", "default", "app"
MARK = "AGENT-STEP"  # in an agent step's prompt: what the stand-in's script answers
SCRIPT = {
    "turns": [
        {
            "name": "write",
            "assistant_turns": 0,
            "last_contains": MARK,
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "src/work.txt", "content": "done\n"}}
            ],
        },
        {"name": "done", "assistant_turns": 1, "text": "Done."},
    ]
}
AGENT_PLAN = {
    "steps": [
        {
            "name": "fix",
            "kind": "agent",
            "payload": {
                "messages": [{"role": "user", "content": f"{MARK}: write src/work.txt"}],
                "allowed_commands": [],
                "max_turns": 4,
            },
        },
    ]
}
WAIT_S = 40.0  # for one cut point to be reached (they come within seconds, unloaded)
# Where the power is cut: what the file system holds on, in this order (see tests/holdfs.py).
CUTS: list[tuple[str, dict[str, Any]]] = [
    ("a mirror being made", {"op": "write", "path": "mirrors/*.partial/*"}),
    # A pack or a loose object (older supervisors let a small fetch write loose ones).
    ("mid-fetch", {"op": "write", "path": "mirrors/*/objects/*", "caller": "fetch"}),
    ("mid-unbundle", {"op": "write", "path": "mirrors/*/objects/*", "caller": "unbundle"}),
    (
        "a candidate ref just renamed in",
        {"op": "rename", "path": "mirrors/*/refs/tether/*", "after": True},
    ),
    ("mid ledger commit", {"op": "write", "path": "ledger.db-wal", "skip": 25}),
    ("mid upload", {"op": "write", "path": "artifacts/tmp/upload-*"}),
    ("an artifact just linked in", {"op": "link", "path": "artifacts/sha256/*", "after": True}),
    ("any moment", {"skip": 400}),
]


def why_no_fuse() -> str | None:
    if not Path("/dev/fuse").exists():
        return "/dev/fuse is absent"
    if shutil.which("fusermount3") is None:
        return "fuse3 is not installed (no fusermount3)"
    try:
        import mfusepy  # noqa: F401 - loads libfuse3
    except (ImportError, OSError) as exc:
        return f"mfusepy cannot load libfuse3: {exc}"
    return None


def skip_or_fail(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"power-loss test: {why}, and CI must run it (install fuse3)")
    pytest.skip(f"power-loss test needs FUSE: {why}")


class Disk:
    """tests/holdfs.py mounted at `mount`, its files in `backing`."""

    def __init__(self, folder: Path) -> None:
        self.backing = folder / "disk"
        self.mount = folder / "mnt"
        self.backing.mkdir()
        self.mount.mkdir()
        self.log = (folder / "holdfs.log").open("ab")
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str] = queue.Queue()
        self.mounted_once = False

    def up(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.holdfs", str(self.backing), str(self.mount)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            cwd=CHECKOUT,
            env=environment(PYTHONPATH=str(CHECKOUT)),
        )
        assert self.proc.stdout is not None
        self.reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self.reader.start()
        line = self.next_line(90)  # a loaded machine: seconds to start Python and mount
        if line != "ready" or not os.path.ismount(self.mount):
            self.down()
            why = f"cannot mount a FUSE file system here (holdfs said {line!r})"
            if self.mounted_once:
                pytest.fail(why)
            skip_or_fail(why)
        self.mounted_once = True

    def _read(self, out: IO[str]) -> None:
        with out:
            for line in out:
                self.lines.put(line.strip())
        self.lines.put("")

    def next_line(self, within: float) -> str:
        try:
            return self.lines.get(timeout=within)
        except queue.Empty:
            return ""

    def order(self, **order: Any) -> str:
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(order) + "\n")
        self.proc.stdin.flush()
        return self.next_line(60)

    def down(self) -> None:
        if self.proc is None:
            return
        unmount = ["fusermount3", "-u", "-z", str(self.mount)]
        subprocess.run(unmount, capture_output=True, check=False)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            subprocess.run(unmount, capture_output=True, check=False)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self.reader.join(30)  # it closes the daemon's stdout at its end
        self.proc = None
        while not self.lines.empty():
            self.lines.get()


@dataclasses.dataclass
class World:
    """The processes of one run and where they keep things."""

    folder: Path
    disk: Disk
    repo: Repository
    plant: str | None
    sup_port: int = dataclasses.field(default_factory=free_port)
    proxy_port: int = dataclasses.field(default_factory=free_port)
    model_port: int = dataclasses.field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)
    lives: int = 0

    @property
    def db(self) -> Path:
        return self.disk.mount / "ledger.db"

    @property
    def record(self) -> Path:
        return self.folder / "acknowledged.jsonl"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def start(self, name: str, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        log = (self.folder / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment(PYTHONPATH=str(CHECKOUT), **env),
            cwd=CHECKOUT,
            start_new_session=True,  # its own process group: the supervisor's holds its git
        )
        log.close()
        self.procs[name] = proc
        return proc

    def admin(self, *args: str) -> str:
        done = subprocess.run(
            [*program("tether-supervisor"), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=environment(),
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def supervisor(self) -> None:
        self.lives += 1
        serve = ["serve", "--db", str(self.db), "--port", str(self.sup_port)]
        argv = (
            [*program("tether-supervisor"), *serve]
            if self.plant is None
            else [sys.executable, "-m", "tests.serve_planted", self.plant, *serve]
        )
        proc = self.start(
            f"supervisor-{self.lives}", argv, TETHER_LEASE_TTL_S="4", TETHER_ACCEPT_WINDOW_S="2"
        )
        up(f"http://127.0.0.1:{self.sup_port}/healthz", proc, self.folder)

    def cut(self) -> None:
        """SIGSTOP the supervisor with its git children, drop what is not durable, SIGKILL
        them, mount the disk again."""
        proc = self.procs[f"supervisor-{self.lives}"]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGSTOP)
        dropped = self.disk.order(do="drop")
        assert dropped.startswith("dropped"), dropped
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        self.disk.down()
        self.disk.up()

    def stop_all(self) -> None:
        for proc in reversed(self.procs.values()):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)

    def logs(self) -> str:
        tails = []
        for name in self.procs:
            lines = (self.folder / f"{name}.log").read_text(errors="replace").splitlines()
            tails.append(f"--- {name}\n" + "\n".join(lines[-15:]))
        return "\n".join(tails)


def up(url: str, proc: subprocess.Popen[bytes], folder: Path, within: float = 60.0) -> None:
    end = time.monotonic() + within
    with httpx.Client(trust_env=False, timeout=2.0) as http:
        while time.monotonic() < end:
            assert proc.poll() is None, f"{proc.args} exited {proc.returncode}"
            with contextlib.suppress(httpx.TransportError):
                if http.get(url).status_code == 200:
                    return
            time.sleep(0.1)
    pytest.fail(f"{url} did not come up within {within:g} s")


class Load:
    """Operators' work, through the recording proxy, on a thread of its own until stopped:
    chat tasks, agent tasks on the repository's current head (moved now and then, so that a
    candidate's base is new to the mirror and the supervisor fetches), and uploads."""

    def __init__(self, world: World, token: str) -> None:
        self.world = world
        self.http = httpx.Client(
            base_url=world.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=10.0,
            trust_env=False,
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.numbers = itertools.count(1)
        self.agent_tasks = True
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            n = next(self.numbers)
            try:
                self.chat(n)
                if self.agent_tasks:
                    if n % 30 == 0:
                        self.world.repo.push_commit(f"note-{n}.md", f"note {n}\n", f"note {n}")
                    self.agent(n)
                if n % 3 == 0:
                    data = os.urandom(2048) + str(n).encode()
                    digest = hashlib.sha256(data).hexdigest()
                    self.http.put(f"/v1/artifacts/{digest}", content=data)
            except httpx.HTTPError:
                pass  # the supervisor is down (a cut): the next round tries again
            except Exception as exc:  # the test fails on it, not the thread on its own
                self.failures.append(repr(exc))
            self.stop.wait(0.3)

    def submit(self, body: dict[str, Any], base: str | None) -> None:
        created = self.http.post("/v1/tasks", json=body)
        if created.status_code in (200, 201):
            task = created.json()
            self.http.post(
                f"/v1/tasks/{task['id']}/approve",
                json={"plan_hash": task["plan_hash"], "base_sha": base},
            )

    def chat(self, n: int) -> None:
        plan = {
            "steps": [
                {
                    "name": "ask",
                    "kind": "chat",
                    "payload": {"messages": [{"role": "user", "content": f"chat {n}"}]},
                }
            ]
        }
        self.submit({"idempotency_key": f"chat-{n}", "plan": plan, "pool": POOL}, None)

    def agent(self, n: int) -> None:
        body = {
            "idempotency_key": f"agent-{n}",
            "plan": AGENT_PLAN,
            "pool": POOL,
            "repository": REPOSITORY,
            "allowed_paths": ["src/"],
        }
        self.submit(body, self.world.repo.head())

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.http.close()


def acknowledged(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def lost(world: World) -> list[str]:
    """Every acknowledged answer the disk did not keep, every committed candidate whose ref
    does not resolve in a sound mirror, and what `check` finds; empty when nothing was lost.
    Run while no supervisor runs, on the disk as mounted again after a cut."""
    problems: list[str] = []
    db = sqlite3.connect(world.db, timeout=30)
    try:
        tasks = {r[0]: r[1] for r in db.execute("SELECT id, state FROM tasks")}
        fences = {(r[0], r[1]) for r in db.execute("SELECT step_id, fence FROM attempts")}
        effects = {r[0]: r[1] for r in db.execute("SELECT step_id, fence FROM effects")}
        checkpoints = {r[0]: r[1] for r in db.execute("SELECT step_id, turn FROM checkpoints")}
        owned = {r[0] for r in db.execute("SELECT digest FROM artifact_owners")}
        candidates = db.execute(
            "SELECT e.task_id, e.step_id, e.fence, e.candidate_sha FROM effects e"
            " JOIN tasks t ON t.id = e.task_id WHERE e.candidate_sha IS NOT NULL"
            " AND t.repository IS NOT NULL"
        ).fetchall()
    finally:
        db.close()
    for ack in acknowledged(world.record):
        path, answer = ack["path"], ack["answer"] or {}
        if path == "/v1/tasks" and ack["method"] == "POST" and answer["id"] not in tasks:
            problems.append(f"acknowledged task {answer['id']} is not in the ledger")
        elif path.endswith("/approve") and tasks.get(path.split("/")[3]) in (None, "PLANNED"):
            problems.append(f"acknowledged approval of {path.split('/')[3]} is not in the ledger")
        elif path.endswith("/checkpoint") and not (
            checkpoints.get(path.split("/")[3], 0) >= answer["turn"]
            or path.split("/")[3] in effects
        ):
            problems.append(f"acknowledged checkpoint of {path.split('/')[3]} is lost")
        elif path.startswith("/v1/artifacts/") and ack["method"] == "PUT":
            digest = path.rsplit("/", 1)[1]
            stored = world.disk.mount / "artifacts" / "sha256" / digest[:2] / digest
            if digest not in owned:
                problems.append(f"acknowledged upload {digest[:12]} is not in the ledger")
            if not stored.exists() or hashlib.sha256(stored.read_bytes()).hexdigest() != digest:
                problems.append(f"acknowledged upload {digest[:12]} is not intact in the store")
        granted = path == "/v1/leases/claim" or path.startswith("/v1/steps/")
        for lease in answer.get("leases", []) if granted and isinstance(answer, dict) else []:
            if (lease["step_id"], lease["fence"]) not in fences:
                problems.append(f"acknowledged lease fence {lease['fence']} is not in the ledger")
        results = []
        if path.endswith("/result"):
            results = [(path.split("/")[3], answer["outcome"], ack["request"]["fence"])]
        elif path == "/v1/steps/results":
            sent = {i["step_id"]: i.get("fence") for i in ack["request"].get("results", [])}
            results = [
                (i["step_id"], i.get("outcome"), sent.get(i["step_id"])) for i in answer["results"]
            ]
        for step_id, outcome, fence in results:
            if outcome in ("applied", "replayed") and step_id not in effects:
                problems.append(f"acknowledged result of {step_id} ({outcome}) is lost")
            elif outcome == "applied" and fence is not None and effects[step_id] != fence:
                problems.append(f"result of {step_id} applied under {fence} is now another")
    mirrors = Mirrors(world.disk.mount / "mirrors")
    mirror = mirrors.path(str(world.repo.bare))
    for task_id, step_id, fence, sha in candidates:
        ref = candidate_ref(task_id, step_id, fence)
        found = git(mirror, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        if found.stdout.strip() != sha:
            problems.append(f"committed candidate {sha[:12]}'s ref {ref} does not resolve")
    folder = world.disk.mount / "mirrors"
    for each in sorted(folder.glob("*.git")) if folder.exists() else []:
        fsck = git(each, "fsck", "--no-dangling", "--no-progress")
        if fsck.returncode != 0:
            problems.append(f"git fsck {each.name}: {' '.join(fsck.stderr.split())[-300:]}")
    healed = sorted(p.name for p in folder.glob("*.damaged-*")) if folder.exists() else []
    problems += [f"a mirror was found damaged: {name}" for name in healed]
    check = subprocess.run(
        [*program("tether-supervisor"), "check", "--db", str(world.db)],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(),
        check=False,
    )
    if check.returncode != 0:
        problems.append(f"tether-supervisor check: {check.stdout.strip()} {check.stderr.strip()}")
    return problems


def git(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", f"--git-dir={folder}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@contextlib.contextmanager
def world_on_fuse(folder: Path, plant: str | None) -> Iterator[tuple[World, Load]]:
    """A ledger on the FUSE disk with an operator, a runner pool and the repository; the
    stand-in model, the recording proxy, the supervisor and two runners running; the load
    started. Everything is stopped (and the disk unmounted) when the block ends."""
    why = why_no_fuse()
    if why is not None:
        skip_or_fail(why)
    disk = Disk(folder)
    disk.up()
    world = World(folder=folder, disk=disk, repo=make_repository(folder / "git"), plant=plant)
    load: Load | None = None
    try:
        operator = world.admin(
            "token",
            "create",
            "--init",
            "--db",
            str(world.db),
            "--tenant",
            TENANT,
            "--role",
            "operator",
        )
        runner = world.admin(
            "token", "create", "--db", str(world.db), "--tenant", POOL, "--role", "runner"
        )
        token_file = folder / "runner-token"
        token_file.write_text(runner + "\n")
        world.admin(
            "repo",
            "add",
            REPOSITORY,
            "--url",
            str(world.repo.bare),
            "--tenant",
            TENANT,
            "--db",
            str(world.db),
        )
        script = folder / "script.json"
        script.write_text(json.dumps(SCRIPT))
        model = world.start(
            "model",
            [
                sys.executable,
                "-m",
                "examples.standin_model",
                "--port",
                str(world.model_port),
                "--scenario",
                str(script),
            ],
        )
        up(f"http://127.0.0.1:{world.model_port}/healthz", model, folder)
        proxy = world.start(
            "proxy",
            [
                sys.executable,
                "-m",
                "tests.recording_proxy",
                "--port",
                str(world.proxy_port),
                "--upstream",
                f"http://127.0.0.1:{world.sup_port}",
                "--record",
                str(world.record),
            ],
        )
        world.supervisor()
        up(f"{world.url}/healthz", proxy, folder)
        for n in (1, 2):
            world.start(
                f"runner-{n}",
                [
                    *program("tether-runner"),
                    "run",
                    "--supervisor",
                    world.url,
                    "--runner-id",
                    f"runner-{n}",
                    "--token-file",
                    str(token_file),
                    "--concurrency",
                    "2",
                    "--model",
                    "stand-in",
                    "--model-url",
                    f"http://127.0.0.1:{world.model_port}/v1",
                ],
                TETHER_CLAIM_WAIT_S="1",
                TETHER_PAUSE_INITIAL_S="0.2",
                TETHER_COMMANDS_WITHOUT_SANDBOX="true",
                CACHE_DIRECTORY=str(folder / f"cache-{n}"),
            )
        load = Load(world, operator)
        load.thread.start()
        yield world, load
    finally:
        if load is not None:
            load.close()
        world.stop_all()
        disk.down()
        disk.log.close()


def committed_candidates(world: World) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{world.db}?mode=ro", uri=True)) as db:
        return int(
            db.execute("SELECT COUNT(*) FROM effects WHERE candidate_sha IS NOT NULL").fetchone()[0]
        )


def wait_for_a_candidate(world: World) -> None:
    end = time.monotonic() + WAIT_S
    while committed_candidates(world) < 1:
        if time.monotonic() > end:
            pytest.fail(f"no candidate committed within {WAIT_S:g} s\n{world.logs()}")
        time.sleep(0.2)


def wait_held(world: World, what: str) -> str:
    line = world.disk.next_line(WAIT_S)
    if not line.startswith("held"):
        pytest.fail(f"the cut point '{what}' was never reached in {WAIT_S:g} s\n{world.logs()}")
    return line


def test_power_cuts_under_load_lose_nothing_acknowledged(tmp_path: Path) -> None:
    with world_on_fuse(tmp_path, plant=None) as (world, load):
        for what, point in CUTS:
            if what == "mid ledger commit":  # from here on, cuts come after a candidate's commit
                wait_for_a_candidate(world)
            assert world.disk.order(do="arm", **point) == "armed"
            held = wait_held(world, what)
            world.cut()
            problems = lost(world)
            assert not problems, f"after the cut at {what} ({held}):\n" + "\n".join(problems)
            print(f"cut at {what}: {held}; nothing acknowledged lost")
            world.supervisor()
        # The last restart serves on: a result is acknowledged after it, and a clean stop
        # leaves everything acknowledged in place too.
        before = len(acknowledged(world.record))
        end = time.monotonic() + WAIT_S
        while not any(
            a["path"].startswith("/v1/steps/") for a in acknowledged(world.record)[before:]
        ):
            if time.monotonic() > end:
                pytest.fail(f"no result acknowledged after the last restart\n{world.logs()}")
            time.sleep(0.2)
        load.stop.set()
        last = world.procs[f"supervisor-{world.lives}"]
        last.send_signal(signal.SIGTERM)
        assert last.wait(60) == 0
        problems = lost(world)
        assert not problems, "after the last stop:\n" + "\n".join(problems)
        assert not load.failures, load.failures
        acks = acknowledged(world.record)
        kinds = {a["path"].split("/")[2] for a in acks if a["path"].startswith("/v1/")}
        print(
            f"{len(acks)} acknowledged answers ({sorted(kinds)}),"
            f" {committed_candidates(world)} committed candidates"
        )
        assert committed_candidates(world) >= 1
        assert {"tasks", "leases", "steps", "artifacts"} <= kinds


def test_the_power_loss_test_catches_a_folder_that_is_never_synced(tmp_path: Path) -> None:
    with world_on_fuse(tmp_path, plant="no-folder-sync") as (world, load):
        wait_for_a_candidate(world)
        load.stop.set()
        assert world.disk.order(do="arm", op="write", path="ledger.db-wal") == "armed"
        wait_held(world, "mid ledger commit")
        world.cut()
        problems = lost(world)
    assert any("does not resolve" in p for p in problems), problems
    print("the planted missing sync is caught:\n" + "\n".join(problems[:6]))
