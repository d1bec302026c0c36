"""The runner's lines about its steps, shipped to the supervisor (`POST /v1/logs`) so that a
step's story outlives the borrowed server (docs/design.md, The runner, Logs).

`LogBuffer` is a structlog processor placed after the secrets are masked: it copies each line
that names an attempt (`step_id` and `fence`, which the step binds for all it runs) into a
bounded buffer and hands the line on untouched. `LogShipper` sends what is buffered about once
a second, in batches, the lines logged meanwhile waiting for the next turn. Neither can hold a
step up: the processor only appends under a lock, and a supervisor that is down or slow costs
lines, never the step. Each attempt keeps its newest `LINES_PER_ATTEMPT` lines; the lines it
lost (to that bound, or to a batch that got no answer) are shipped as one marker line, `log
lines dropped` with `dropped`, where they were.

What a line carries is its level, its event and its fields as the log shows them after
masking, strings cut to `FIELD_CHARS`; never the runner's clock (the supervisor orders lines as
it receives them) and never an exception's message (only its type's name).
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import MutableMapping
from typing import Any, Final

import anyio
import msgspec
import structlog

from tether.clocks import MonotonicClock
from tether.logs import mask
from tether.runner.errors import SupervisorError, SupervisorRefused
from tether.runner.supervisor_client import SupervisorClient
from tether.wire.records import (
    LOG_EVENT_MAX,
    LOG_FIELDS_MAX,
    LOG_LINES_PER_REQUEST_MAX,
    LogLine,
)

log = structlog.get_logger("runner")

LINES_PER_ATTEMPT: Final = 1_000
LINES_MAX: Final = 20_000  # buffered at most, all attempts together
FIELD_CHARS: Final = 500
SHIP_EVERY_S: Final = 1.0
# After a batch got no answer, the next waits up to this long (doubling from SHIP_EVERY_S).
SHIP_BACKOFF_MAX_S: Final = 30.0
# At shutdown, the last lines get this long to reach the supervisor.
FLUSH_AT_EXIT_S: Final = 2.0
DROPPED_EVENT: Final = "log lines dropped"

# Keys of the attempt itself, carried by the line's own fields; and the runner's clock.
_HEADER: Final = frozenset(
    {"task_id", "step_id", "attempt", "fence", "event", "level", "log_level", "timestamp"}
)
_SCALARS: Final = (str, int, bool, type(None))
_encode = msgspec.json.Encoder().encode


def _value(value: Any) -> Any:
    """`value` as a line ships it: JSON scalars as they are (strings cut); a list or a dict as
    itself when its JSON is short and holds no secret; anything else as its text, masked and
    cut (an object's text is not masked by the key-wise pass before)."""
    if isinstance(value, str):
        return value[:FIELD_CHARS]
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict | list | tuple):
        try:
            text = _encode(value).decode()
        except (TypeError, ValueError, OverflowError):
            text = str(value)
        masked = mask(text)
        return value if masked == text and len(text) <= FIELD_CHARS else masked[:FIELD_CHARS]
    return mask(str(value))[:FIELD_CHARS]


def step_line(method: str, event_dict: MutableMapping[str, Any]) -> LogLine | None:
    """The line to ship for one log line, or None when it is not about an attempt."""
    step_id, fence = event_dict.get("step_id"), event_dict.get("fence")
    if not isinstance(step_id, str) or not isinstance(fence, int) or isinstance(fence, bool):
        return None
    if not step_id or not 0 <= fence <= 2**62 or len(step_id) > 200:
        return None
    level = str(event_dict.get("level") or event_dict.get("log_level") or method)
    fields: dict[str, Any] = {}
    for key, value in event_dict.items():
        if key in _HEADER or len(fields) >= LOG_FIELDS_MAX:
            continue
        if key == "exception":  # a formatted traceback: its last line's type only
            last = str(value).strip().rsplit("\n", 1)[-1]
            fields["error_type"] = last.split(":", 1)[0][:FIELD_CHARS]
            continue
        fields[str(key)[:FIELD_CHARS]] = _value(value)
    event = str(event_dict.get("event", ""))[:LOG_EVENT_MAX].replace("\x00", "\ufffd") or "-"
    return LogLine(
        step_id=step_id.replace("\x00", "\ufffd"),
        fence=fence,
        level={"exception": "error", "warn": "warning"}.get(level, level)[:16] or "info",
        event=event,
        fields=fields,
    )


class _Attempt:
    __slots__ = ("dropped", "lines")

    def __init__(self) -> None:
        self.lines: collections.deque[LogLine] = collections.deque()
        self.dropped = 0


class LogBuffer:
    """The lines waiting to be shipped, per attempt; a structlog processor (see the module's
    docstring). Safe to call from any thread."""

    def __init__(self, per_attempt: int = LINES_PER_ATTEMPT, most: int = LINES_MAX) -> None:
        self._per_attempt = per_attempt
        self._most = most
        self._attempts: dict[tuple[str, int], _Attempt] = {}
        self._size = 0
        self._lock = threading.Lock()

    def __call__(
        self, _logger: Any, method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        line = step_line(method, event_dict)
        if line is not None:
            self.add(line)
        return event_dict

    def __len__(self) -> int:
        return self._size

    def add(self, line: LogLine) -> None:
        with self._lock:
            key = (line.step_id, line.fence)
            held = self._attempts.get(key)
            if held is None:
                held = self._attempts[key] = _Attempt()
            held.lines.append(line)
            self._size += 1
            if len(held.lines) > self._per_attempt:
                self._drop_oldest(held)
            while self._size > self._most:
                self._drop_oldest(next(a for a in self._attempts.values() if a.lines))

    def _drop_oldest(self, held: _Attempt) -> None:
        held.lines.popleft()
        held.dropped += 1
        self._size -= 1

    def take(self, most: int = LOG_LINES_PER_REQUEST_MAX) -> list[LogLine]:
        """Up to `most` lines to send, oldest attempt first, each attempt's lost lines as one
        marker line before what it still holds."""
        batch: list[LogLine] = []
        with self._lock:
            for key in list(self._attempts):
                held = self._attempts[key]
                if held.dropped and len(batch) < most:
                    batch.append(_marker(key, held.dropped))
                    held.dropped = 0
                while held.lines and len(batch) < most:
                    batch.append(held.lines.popleft())
                    self._size -= 1
                if not held.lines and not held.dropped:
                    del self._attempts[key]
                if len(batch) >= most:
                    break
        return batch

    def lost(self, batch: list[LogLine]) -> None:
        """`batch` never reached the supervisor: count its lines as dropped (not its markers:
        the count is carried again) so the next marker says so."""
        with self._lock:
            for line in batch:
                held = self._attempts.setdefault((line.step_id, line.fence), _Attempt())
                if line.event == DROPPED_EVENT and "dropped" in line.fields:
                    held.dropped += int(line.fields["dropped"])
                else:
                    held.dropped += 1


def _marker(key: tuple[str, int], dropped: int) -> LogLine:
    return LogLine(
        step_id=key[0],
        fence=key[1],
        level="warning",
        event=DROPPED_EVENT,
        fields={"dropped": dropped, "by": "runner"},
    )


class LogShipper:
    """Sends the buffer's lines to the supervisor about every `SHIP_EVERY_S`, a batch after
    another while they go full (`ship`); after a batch without an answer, it waits longer
    (doubling up to `SHIP_BACKOFF_MAX_S`). A supervisor without the route (404, 405) is not
    asked again."""

    def __init__(
        self, buffer: LogBuffer, supervisor: SupervisorClient, *, clock: MonotonicClock
    ) -> None:
        self._buffer = buffer
        self._supervisor = supervisor
        self._clock = clock
        self._wait_s = SHIP_EVERY_S
        self.sent = 0
        self.off = False

    async def run(self) -> None:
        while not self.off:
            await self._clock.sleep(self._wait_s)
            await self.ship()

    async def ship(self, *, drain: bool = False) -> None:
        """Send what is buffered, batch by batch, until a batch fails or is not full; with
        `drain`, until nothing is left. A turn that went on past a batch that was not full
        would chase the lines steps log while each batch is on the wire: on a busy runner, a
        small request after another instead of one a second, each costing both sides a
        request and the supervisor a write."""
        while not self.off and (batch := self._buffer.take()):
            try:
                await self._supervisor.ship_logs(batch)
            except SupervisorRefused as exc:
                self._buffer.lost(batch)
                if exc.status in (404, 405):
                    self.off = True
                    log.info("the supervisor does not take log lines; not shipping them")
                return
            except SupervisorError:  # no answer, or the token refused: the next try waits
                self._buffer.lost(batch)
                self._wait_s = min(2 * self._wait_s, SHIP_BACKOFF_MAX_S)
                return
            self.sent += len(batch)
            self._wait_s = SHIP_EVERY_S
            if not drain and len(batch) < LOG_LINES_PER_REQUEST_MAX:
                return

    async def flush(self, within: float = FLUSH_AT_EXIT_S) -> None:
        """Ship what is left, for at most `within` seconds (at shutdown)."""
        with anyio.move_on_after(within):
            await self.ship(drain=True)
