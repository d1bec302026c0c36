"""Credentials for effects: files in the supervisor's credentials folder (docs/design.md,
Effects).

A plan names a credential; the folder (setting `credentials_dir`, by default systemd's
`$CREDENTIALS_DIRECTORY` from `LoadCredential=`) holds its value as a file of that name. Values
are read at send time only, never stored in the ledger, never sent to a runner, and masked in
anything shown or logged.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import string
from collections.abc import Iterable
from pathlib import Path
from typing import Final
from urllib.parse import quote, quote_plus

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
    """`text` with every occurrence of each non-empty value, and of its common encodings,
    replaced by `****`.

    Why mask, rather than keep no answer body of a request that carried a credential: the
    body is how an operator learns why a receiver refused (`HTTP 401: token expired`), and
    the receiver already holds the credential, so the masking guards against a careless
    echo (an error page quoting the header, a debug endpoint reflecting it), not against a
    receiver that means to leak it: that one could publish it anyway, in any encoding. The
    encodings masked are those echoes use (`_spellings`): the value as it is, hex,
    percent-encoded and JSON-escaped, each in any ASCII letter case; base64 and base64url at
    each of the three alignments it can have inside a longer encoded text (`Basic
    base64(user:token)`), widened by the neighbouring characters that carry its edge bits;
    and, for a value that is itself base64 or hex text (a `Basic` credential), its decoded
    text. Measured: a 64 KiB body against one 33-character credential, 0.6 ms (matching
    with `re.IGNORECASE` instead of on an ASCII-lowered copy took 30 ms)."""
    folded: set[str] = set()
    exact: set[str] = set()
    for value in values:
        if value:
            any_case, as_is = _spellings(value)
            folded |= any_case
            exact |= as_is
    spans = []
    if folded:
        lowered = text.translate(_ASCII_LOWER)  # the same length: positions carry over
        spans += [m.span() for m in _alternation(frozenset(folded)).finditer(lowered)]
    if exact:
        spans += [_widen(text, *m.span()) for m in _alternation(frozenset(exact)).finditer(text)]
    masked, at = [], 0
    for start, end in sorted(spans):
        if end <= at:
            continue
        masked.append(text[at:start] if start > at else "")
        if start >= at:
            masked.append(MASK)
        at = end
    masked.append(text[at:])
    return "".join(masked)


_ASCII_LOWER: Final = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_BASE64: Final = frozenset(string.ascii_letters + string.digits + "+/-_")


def _spellings(value: str) -> tuple[set[str], set[str]]:
    """`value`'s spellings matched in any ASCII case (lower-cased here), and those matched as
    they are (base64, whose case is its content)."""
    raw = value.encode("utf-8")
    any_case = {value, raw.hex(), quote(value, safe=""), quote_plus(value), json.dumps(value)[1:-1]}
    decoded = _decoded(value)
    if decoded:
        any_case.add(decoded)
    as_is = set()
    for start in range(3):  # base64 encodes 3 bytes as 4 characters, at 3 possible offsets
        piece = raw[start:]
        piece = piece[: len(piece) - len(piece) % 3]
        if piece:
            as_is |= {base64.b64encode(piece).decode(), base64.urlsafe_b64encode(piece).decode()}
    return {s.translate(_ASCII_LOWER) for s in any_case if s}, as_is


def _widen(text: str, start: int, end: int) -> tuple[int, int]:
    """A base64 match widened by up to 3 base64 characters on each side (the partial
    groups that carry the value's first and last bits), and any `=` padding after."""
    for _ in range(3):
        if start > 0 and text[start - 1] in _BASE64:
            start -= 1
    for _ in range(3):
        if end < len(text) and text[end] in _BASE64:
            end += 1
    while end < len(text) and text[end] == "=":
        end += 1
    return start, end


def _decoded(value: str) -> str | None:
    """The text `value` encodes, if it is base64, base64url or hex of printable UTF-8 text of
    at least four characters."""
    for decode in (_from_base64, bytes.fromhex):
        try:
            text = decode(value).decode("utf-8")
        except ValueError:
            continue
        if len(text) >= 4 and text.isprintable():
            return text
    return None


def _from_base64(value: str) -> bytes:
    padded = value + "=" * (-len(value) % 4)
    return base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)


@functools.lru_cache(maxsize=64)
def _alternation(spellings: frozenset[str]) -> re.Pattern[str]:
    ordered = sorted(spellings, key=len, reverse=True)  # a value holding another: masked whole
    return re.compile("|".join(re.escape(s) for s in ordered))
