"""The runner's log lines, kept on the owned box: one log for both halves of a step's story,
readable after the borrowed server is gone (docs/design.md, Runner API, `POST /v1/logs`).

A line is kept only under a fence that was granted to the token sending it, for the step the
fence belongs to: no runner can write into another's attempt. Each attempt keeps at most
`LINES_PER_ATTEMPT` lines, then one marker line, then nothing. A batch costs one read (every
attempt its fences name, with what each holds) and one `executemany`, so the writer's group
commit stays cheap. A line sorts among its task's events by the task's last sequence number
when it arrived (`after_seq`), then in receipt order: never by the runner's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from tether.clocks import iso
from tether.supervisor.ledger import views
from tether.supervisor.ledger.records import EventRow, LoggingAttempt, LogLineRow, from_row
from tether.supervisor.ledger.tx import Statements, Tx, dumps, loads
from tether.wire.records import LogLine, LogLinesKept, TaskLogEntry, TaskLogs

LINES_PER_ATTEMPT: Final = 2_000
# A line whose fields encode longer than this keeps only their names.
FIELDS_MAX_CHARS: Final = 4_096
# What one read of a task's log returns at most, of each kind.
EVENTS_PAGE: Final = 500
LINES_PAGE: Final = 1_000
OVER_LIMIT_EVENT: Final = "log lines dropped"


def keep(tx: Tx, lines: Sequence[LogLine], pool: str, token_id: str) -> LogLinesKept:
    """Keep each of `lines` whose fence was granted to `token_id` in `pool` for its step."""
    tx.request = "log lines"
    fences = sorted({line.fence for line in lines})
    held = {
        r.fence: r for r in tx.all_as(LoggingAttempt, "attempts_of_fences", fences=dumps(fences))
    }
    count = {fence: int(r.kept) for fence, r in held.items()}
    rows: list[dict[str, Any]] = []
    refused = over = 0
    for line in lines:
        attempt = held.get(line.fence)
        if attempt is None or not _granted(attempt, line, pool, token_id):
            refused += 1
            continue
        n = count[line.fence]
        if n >= LINES_PER_ATTEMPT:
            over += 1
            if n == LINES_PER_ATTEMPT:
                marker = {"limit": LINES_PER_ATTEMPT, "by": "supervisor"}
                rows.append(_row(tx, attempt, "warning", OVER_LIMIT_EVENT, dumps(marker)))
                count[line.fence] = n + 1
            continue
        rows.append(_row(tx, attempt, line.level, line.event, _fields(line.fields)))
        count[line.fence] = n + 1
    if rows:
        tx.many("keep_log_line", rows)
    return LogLinesKept(kept=len(lines) - refused - over, refused=refused, over_limit=over)


def _granted(attempt: LoggingAttempt, line: LogLine, pool: str, token_id: str) -> bool:
    return bool(
        attempt.token_id == token_id and attempt.pool == pool and attempt.step_id == line.step_id
    )


def _fields(fields: dict[str, Any]) -> str:
    text = dumps(fields)
    if len(text) > FIELDS_MAX_CHARS:
        return dumps({"fields_cut": sorted(fields)[:16]})
    return text


def _row(
    tx: Tx, attempt: LoggingAttempt, level: str, event: str, fields_json: str
) -> dict[str, Any]:
    return {
        "task_id": attempt.task_id,
        "step_id": attempt.step_id,
        "fence": attempt.fence,
        "after_seq": attempt.last_seq,
        "level": level,
        "event": event,
        "fields_json": fields_json,
        "at": tx.now,
    }


def task_log(
    s: Statements, task_id: str, tenant: str | None, after_seq: int, after_line: int
) -> TaskLogs:
    """The task's journal events after `after_seq` and runner lines after `after_line`,
    merged: a line after the event its `after_seq` names, before the next. When either kind
    fills its page, the other is cut where the page ends, so the next read goes on from
    there without skipping or repeating anything."""
    views._task_row(s, tenant, task_id)  # not found, or another tenant's: NotFound
    events = [
        from_row(EventRow, r)
        for r in s.all("events_after", task_id=task_id, after=after_seq, limit=EVENTS_PAGE)
    ]
    lines = [
        from_row(LogLineRow, r)
        for r in s.all("log_lines_after", task_id=task_id, after_line=after_line, limit=LINES_PAGE)
    ]
    events_end = events[-1].seq if len(events) == EVENTS_PAGE else None
    lines_end = lines[-1].after_seq if len(lines) == LINES_PAGE else None
    if events_end is not None:
        lines = [r for r in lines if r.after_seq <= events_end]
    if lines_end is not None:
        events = [r for r in events if r.seq <= lines_end]
    keyed = [((r.seq, 0, 0), _event_entry(r)) for r in events]
    keyed += [((r.after_seq, 1, r.id), _line_entry(r)) for r in lines]
    keyed.sort(key=lambda pair: pair[0])
    return TaskLogs(
        entries=tuple(entry for _, entry in keyed),
        next_seq=events[-1].seq if events else after_seq,
        next_line=lines[-1].id if lines else after_line,
    )


def _event_entry(r: EventRow) -> TaskLogEntry:
    data = loads(r.data_json)
    fields = data if isinstance(data, dict) else {"data": data}
    step_id = fields.get("step_id")
    fence = fields.get("fence")
    return TaskLogEntry(
        source="journal",
        seq=r.seq,
        at=iso(r.at),
        level="info",
        event=r.kind,
        state=r.state,
        step_id=step_id if isinstance(step_id, str) else None,
        fence=fence if isinstance(fence, int) else None,
        fields={k: v for k, v in fields.items() if k not in ("step_id", "fence")},
    )


def _line_entry(r: LogLineRow) -> TaskLogEntry:
    fields = loads(r.fields_json)
    return TaskLogEntry(
        source="runner",
        seq=r.after_seq,
        line=r.id,
        at=iso(r.at),
        level=r.level,
        event=r.event,
        step_id=r.step_id,
        attempt=r.attempt,
        fence=r.fence,
        runner_id=r.runner_id,
        fields=fields if isinstance(fields, dict) else {},
    )
