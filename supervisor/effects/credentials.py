"""Credentials for effects: files in the supervisor's credentials folder (docs/design.md,
Effects).

A plan names a credential; the folder (setting `credentials_dir`, by default systemd's
`$CREDENTIALS_DIRECTORY` from `LoadCredential=`) holds its value as a file of that name. Values
are read at send time only, never stored in the ledger, never sent to a runner, and masked in
anything shown or logged.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Final

from tether.supervisor.ledger.errors import InvalidRequest
from tether.wire.templates import valid_credential_name

MASK: Final = "****"


class CredentialMissing(InvalidRequest):
    """The credentials folder holds no credential of this name."""


class Credentials:
    """The credentials folder; `None` means the supervisor was given none (every name is
    missing)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    def _path(self, name: str) -> Path | None:
        if self.folder is None or not valid_credential_name(name):
            return None
        return self.folder / name

    def has(self, name: str) -> bool:
        path = self._path(name)
        return path is not None and path.is_file()

    def read(self, name: str) -> str:
        """The credential's value, less one trailing newline; `CredentialMissing` if absent."""
        path = self._path(name)
        if path is None or not path.is_file():
            raise CredentialMissing(f"no credential named {name!r} in the credentials folder")
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise CredentialMissing(f"credential {name!r} cannot be read: {exc.strerror}") from exc
        if text.endswith("\r\n"):
            return text[:-2]
        return text[:-1] if text.endswith("\n") else text


def mask(text: str, values: Iterable[str]) -> str:
    """`text` with every occurrence of each non-empty value replaced by `****`, longest first
    (so a value containing another is masked whole)."""
    for value in sorted({v for v in values if v}, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text
