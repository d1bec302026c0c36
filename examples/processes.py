"""The demos' process handling: tether's programs started as real processes on 127.0.0.1 with
their output in log files, always stopped, and a deadline for every wait.

Shared by `make demo` (examples/demo.py), `make demo-agent` (examples/demo_agent.py) and `make
demo-effects` (examples/demo_effects.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import httpx

STOP_BUDGET_S = 10.0
CHECKOUT = Path(__file__).resolve().parent.parent  # examples/ is imported from here, not installed
# Inherited variables that would point a child at another configuration or another systemd.
_SCRUBBED_PREFIXES = ("TETHER_",)
_SCRUBBED = frozenset({"CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"})


class DemoError(Exception):
    """The demo did not go as the ledger promises; the message says what was off."""


def say(line: str) -> None:
    print(line, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def program(name: str) -> str:
    """A console script of this installation: beside this Python first, then on PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise DemoError(
            f"{name} is not installed; run `make demo` or `make demo-agent`, which install it"
        )
    return found


def child_environment(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIXES)
    }
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"  # loopback never via a proxy
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclasses.dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    stop_signal: signal.Signals = signal.SIGTERM

    def tail(self, lines: int = 12) -> str:
        if not self.log_file.closed:
            self.log_file.flush()
        text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(f"    {line}" for line in text[-lines:]) or "    (no output)"

    def kill(self) -> None:
        """SIGKILL it, as a cloud provider reclaiming the server would, and reap it."""
        self.process.kill()
        self.process.wait()


class Children:
    """The demo's processes: started with their output in a log file, always stopped."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self.all: dict[str, Child] = {}

    def start(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        stop_signal: signal.Signals = signal.SIGTERM,
    ) -> Child:
        """Start `argv`; `stop_signal` is what `stop_all` sends it first (SIGKILL for a test
        double whose way of dying proves nothing and that may hold a request for an hour)."""
        log_path = self._folder / f"{name}.log"
        log_file = log_path.open("wb")
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env
        )
        child = Child(name, process, log_path, log_file, stop_signal)
        self.all[name] = child
        return child

    def stop_all(self, budget_s: float = STOP_BUDGET_S) -> None:
        """Stop in reverse start order (runners before the supervisor they poll): each its
        stop signal, and SIGKILL whoever is still running when the shared `budget_s` is spent."""
        end = time.monotonic() + budget_s
        for child in reversed(self.all.values()):
            if child.process.poll() is None:
                child.process.send_signal(child.stop_signal)
                try:
                    child.process.wait(max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.kill()
            child.log_file.close()

    def exited_badly(self, *, ignoring: tuple[str, ...] = ()) -> list[str]:
        """After `stop_all`: each child outside `ignoring` that did not exit 0."""
        return [
            f"{c.name} exited {c.process.returncode}"
            for c in self.all.values()
            if c.name not in ignoring and c.process.returncode != 0
        ]

    def report(self) -> str:
        return "\n".join(
            f"  {c.name} (exit {c.process.returncode}), {c.log_path}:\n{c.tail()}"
            for c in self.all.values()
        )


class Deadline:
    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds
        self.seconds = seconds

    def left(self) -> float:
        return self._end - time.monotonic()

    def spent(self) -> float:
        return self.seconds - self.left()

    def check(self, waiting_for: str) -> None:
        if self.left() <= 0:
            raise DemoError(f"still waiting for {waiting_for} after {self.seconds:g} s")


def wait_until_up(url: str, child: Child, deadline: Deadline) -> None:
    with httpx.Client(trust_env=False, timeout=2.0) as http:
        while True:
            if child.process.poll() is not None:
                raise DemoError(f"{child.name} exited with {child.process.returncode} at start")
            with contextlib.suppress(httpx.TransportError):
                if http.get(url).status_code < 500:
                    return
            deadline.check(f"{child.name} to answer on {url}")
            time.sleep(0.1)


def admin(*args: str) -> subprocess.CompletedProcess[str]:
    """Run one `tether-supervisor` command, its output captured."""
    return subprocess.run(
        [program("tether-supervisor"), *args],
        capture_output=True,
        text=True,
        env=child_environment(),
        timeout=30,
        check=False,
    )


def create_token(db: Path, tenant: str, role: str) -> str:
    # --init: the demo's first token makes its ledger (without it, a new path is refused)
    done = admin("token", "create", "--init", "--db", str(db), "--tenant", tenant, "--role", role)
    if done.returncode != 0:
        raise DemoError(f"token create failed: {done.stderr.strip()}")
    return done.stdout.strip()


def write_secret(path: Path, value: str) -> Path:
    path.touch(mode=0o600)
    path.write_text(value + "\n", encoding="utf-8")
    return path


def ledger_check(db: Path) -> str:
    """`tether-supervisor check` on the ledger: its line, or DemoError with what it found."""
    done = admin("check", "--db", str(db))
    if done.returncode != 0:
        raise DemoError(f"tether-supervisor check found a violation:\n{done.stdout}{done.stderr}")
    return done.stdout.strip()


def call(http: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
    """One request whose answer must be a success; its JSON body."""
    try:
        response = http.request(method, path, **kwargs)
    except httpx.TransportError as exc:
        raise DemoError(f"{method} {path}: no answer ({exc})") from None
    if response.status_code >= 400:
        raise DemoError(f"{method} {path} answered {response.status_code}: {response.text[:300]}")
    return response.json()


def expect(holds: bool, problem: str) -> None:
    """A claim the demo is about to print: DemoError with `problem` unless it holds."""
    if not holds:
        raise DemoError(problem)


def run_guarded(
    name: str,
    body: Callable[[], None],
    *,
    folder: Path,
    children: Children,
    close: Callable[[], None],
    keep: bool,
    kept: str,
) -> int:
    """Run a demo's `body`; return 0 when it returned, else print one line saying what was off
    (and where the logs are kept) and return 1 (130 when interrupted).

    `close`, then every child, is stopped before the return; `folder` is removed unless the
    demo failed or `keep` is set (then it is printed, `kept` saying what it holds).
    """
    failure: str | None = None
    try:
        body()
    except DemoError as exc:
        failure = " ".join(str(exc).split())  # one line
        return 1
    except KeyboardInterrupt:
        failure = "interrupted"
        return 130
    except Exception as exc:  # a surprise is a failed demo too: one line, logs kept
        failure = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        return 1
    else:
        return 0
    finally:
        close()
        children.stop_all()
        if failure is not None:
            print(f"{name}: error: {failure} (logs kept in {folder})", file=sys.stderr)
        elif keep:
            say(f"{kept} kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
