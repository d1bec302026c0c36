"""systemd's notify protocol without a dependency: one datagram per message to `$NOTIFY_SOCKET`.

Both programs use it: `READY=1`, `STOPPING=1`, `STATUS=...` and `WATCHDOG=1` (every half of
`$WATCHDOG_USEC`, sent from the event loop so a stuck loop stops the pings). A socket name
starting with `@` is in the abstract namespace. Without `NOTIFY_SOCKET` every call is a no-op.
A datagram that cannot be sent is dropped: notification must never stop the program.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class Notifier:
    """The notify socket named by `environ` (default: this process's environment).

    `watchdog_interval_s` is None unless systemd asked this very process for pings: with
    `WATCHDOG_PID` naming another process (a parent that exec'd us keeps its own), stay quiet.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        if raw.startswith("@"):
            self._address = b"\0" + raw[1:].encode()
        elif raw.startswith("/"):
            self._address = raw
        self.watchdog_interval_s: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval_s = int(usec) / 2_000_000
        self._last_status: str | None = None

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, message: str) -> bool:
        if self._address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                sock.sendto(message.encode(), self._address)
        except OSError:
            return False
        return True

    def ready(self) -> None:
        self.send("READY=1")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def status(self, text: str) -> None:
        """`STATUS=text`, sent only when it changed."""
        if text != self._last_status:
            self._last_status = text
            self.send("STATUS=" + text.replace("\n", " "))
