"""Where the runner token and the model key come from, re-read when an operator fixes them.

A secret is read from its file, or from `$CREDENTIALS_DIRECTORY/<credential>` under systemd.
Every value read is registered with the log redactor before it is used. After the provider
or the supervisor refuses a secret, the source is invalidated and the next use reads the file
again, so an operator fixes a key by rewriting its file, without restarting the runner.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import anyio

from tether.logs import register_secret
from tether.settings import SettingsError, read_secret


class SecretMissing(Exception):
    """The secret could not be read; the message says where it was looked for, never a value."""


class SecretSource:
    """One secret, cached until `invalidate()`.

    `optional` sources with neither a file nor a systemd credential return None: no secret is
    configured (a local model server that needs no key).
    """

    def __init__(
        self,
        *,
        path: Path | None,
        credential: str,
        setting: str,
        optional: bool = False,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._path = path
        self._credential = credential
        self._setting = setting
        self._optional = optional
        self._environ = dict(os.environ if environ is None else environ)
        self._value: str | None = None

    @property
    def configured(self) -> bool:
        """Whether a file or a credential is expected to hold this secret."""
        if self._path is not None:
            return True
        directory = self._environ.get("CREDENTIALS_DIRECTORY")
        if not directory:
            return False
        return not self._optional or (Path(directory) / self._credential).exists()

    def read_now(self) -> str | None:
        """Read the secret at once (start-up, before the event loop); None if not configured."""
        if not self.configured:
            if self._optional:
                return None
            raise SecretMissing(
                f"no {self._credential}: set {self._setting}"
                f" (or --{self._setting.replace('_', '-')}),"
                f" or LoadCredential={self._credential}:... under systemd"
            )
        try:
            value = read_secret(self._path, self._credential, self._environ)
        except SettingsError as exc:
            raise SecretMissing(str(exc)) from None
        register_secret(value)
        self._value = value
        return value

    async def get(self) -> str | None:
        """The cached secret, read again (off the event loop) after `invalidate()`."""
        if self._value is not None:
            return self._value
        if self._path is None and not self._environ.get("CREDENTIALS_DIRECTORY"):
            return self.read_now()  # no file to read (a model without a key): no thread hop
        return await anyio.to_thread.run_sync(self.read_now)

    def invalidate(self) -> None:
        self._value = None

    def describe(self) -> str:
        """Where the secret lives, for an operator's log line (never the value)."""
        if self._path is not None:
            return str(self._path)
        directory = self._environ.get("CREDENTIALS_DIRECTORY")
        if directory:
            return str(Path(directory) / self._credential)
        return f"a file named by the {self._setting} setting (or LoadCredential={self._credential})"
