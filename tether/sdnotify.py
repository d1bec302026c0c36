"""systemd's notify protocol without a dependency: one datagram per message to $NOTIFY_SOCKET.

Silently does nothing when the program is not started by systemd with `Type=notify`.
"""

from __future__ import annotations

import contextlib
import os
import socket


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        self._address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def watchdog_interval_s(self) -> float | None:
        """Half of systemd's WatchdogSec=, the interval at which to send WATCHDOG=1."""
        usec = os.environ.get("WATCHDOG_USEC", "")
        return int(usec) / 2_000_000 if usec.isdigit() and int(usec) > 0 else None

    def send(self, *fields: str) -> None:
        if not self._address:
            return
        target = self._address
        if target.startswith("@"):
            target = "\0" + target[1:]  # abstract socket namespace
        # Best effort: if systemd went away, there is no one left to tell.
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, contextlib.suppress(OSError):
            sock.sendto("\n".join(fields).encode(), target)
