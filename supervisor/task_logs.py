"""`tether-supervisor logs TASK`: one task's story from the owned box, both halves of it: the
supervisor's journal and the lines its runners shipped, merged in the order the owned box saw
them (`ledger.logs.task_log`), from the API (`--url`) or from the ledger itself (`--db`).

Each entry is one line: text with every control or hiding character escaped, or with `--json`
one JSON object (ASCII, so nothing a runner wrote can move the terminal's cursor). `--follow`
keeps reading until the task has ended and its runners' last lines had time to arrive.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol, TextIO

import msgspec

from tether.supervisor import admin
from tether.supervisor.ledger import logs, views
from tether.supervisor.ledger.errors import LedgerError
from tether.supervisor.ledger.states import TERMINAL
from tether.supervisor.operator_client import EXIT_CODES, OperatorClient
from tether.supervisor.shown import fields_text, one_line
from tether.wire.records import TaskLogEntry, TaskLogs

# How often --follow reads again, and how long it goes on after the task ended: a runner
# ships its last lines (`step reported`) up to about a second after the commit.
FOLLOW_EVERY_S: Final = 1.0
TRAIL_S: Final = 3.0


class LogSource(Protocol):
    """Where a task's log is read from: the API, or the ledger."""

    def page(self, after_seq: int, after_line: int) -> TaskLogs: ...
    def state(self) -> str: ...


class ApiLogs:
    def __init__(self, client: OperatorClient, task_id: str) -> None:
        self._client = client
        self._task_id = task_id

    def page(self, after_seq: int, after_line: int) -> TaskLogs:
        return self._client.task_log(self._task_id, after_seq, after_line)

    def state(self) -> str:
        return self._client.view(self._task_id).state


class LedgerLogs:
    """The ledger read directly (`--db`), any tenant's task; `admin.AdminError` for a ledger
    that cannot be read or a task it does not hold."""

    def __init__(self, db: Path | str, task_id: str) -> None:
        self._db = db
        self._task_id = task_id

    def page(self, after_seq: int, after_line: int) -> TaskLogs:
        with admin.ledger_reads(self._db) as reads:
            try:
                return logs.task_log(reads, self._task_id, None, after_seq, after_line)
            except LedgerError as exc:
                raise admin.AdminError(str(exc)) from None

    def state(self) -> str:
        with admin.ledger_reads(self._db) as reads:
            try:
                return str(views._task_row(reads, None, self._task_id).state)
            except LedgerError as exc:
                raise admin.AdminError(str(exc)) from None


def entry_line(entry: TaskLogEntry) -> str:
    """One entry as text: when, whose (the supervisor's journal, or the runner's id), level,
    event, then the attempt and the fields as `key=value`."""
    who = "supervisor" if entry.source == "journal" else (entry.runner_id or "runner")
    parts = [entry.at, one_line(who), f"{entry.level:<7}", one_line(entry.event)]
    about = {
        "state": entry.state,
        "step_id": entry.step_id,
        "attempt": entry.attempt,
        "fence": entry.fence,
    }
    parts.append(fields_text({k: v for k, v in about.items() if v is not None}))
    if entry.fields:
        parts.append(fields_text(entry.fields))
    return "  ".join(parts)


def entry_json(entry: TaskLogEntry) -> str:
    """One entry as a JSON object on one line, ASCII only."""
    return json.dumps(msgspec.to_builtins(entry), ensure_ascii=True, sort_keys=True)


def print_log(
    source: LogSource,
    out: TextIO,
    *,
    as_json: bool = False,
    follow: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Print the task's log; with `follow`, until it ended and `TRAIL_S` passed. The exit
    status: 0, or with `follow` the task's as `task watch` gives it (0, 3, 4)."""
    show = entry_json if as_json else entry_line
    after_seq = after_line = 0
    ended_at: float | None = None
    while True:
        page = source.page(after_seq, after_line)
        for entry in page.entries:
            out.write(show(entry) + "\n")
        out.flush()
        after_seq, after_line = page.next_seq, page.next_line
        if page.entries:
            continue  # there may be more: read on before waiting
        if not follow:
            return 0
        if ended_at is None:
            state = source.state()
            if state in TERMINAL:
                ended_at = clock()
        elif clock() - ended_at >= TRAIL_S:
            return EXIT_CODES.get(source.state(), 1)
        sleep(FOLLOW_EVERY_S)
