"""Text an operator reads before approving it (a plan, a gate's request), with every character
that hides or reorders text made visible: a bidi override or a zero-width space from a step's
output could make "$820,000" read as "$82,000". The digest the operator opens binds the exact
bytes; this only makes what they read match them. A header whose name says it carries a secret
is masked (`shown_header`)."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any, Final

from tether.wire.templates import TemplateError, credential_names

MASK: Final = "••••••"
# Header names whose literal value is a secret as far as the page is concerned.
_SECRET_HEADER = re.compile(
    r"authorization|cookie|api[-_]?key|token|secret|password|passwd|signature|session",
    re.IGNORECASE,
)
# An Authorization value's scheme is shown; only its credentials are masked.
_SCHEME = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]*) +\S")
# Format (bidi controls, zero-width), control, private-use, surrogate, line/paragraph separators.
_HIDDEN: Final = frozenset({"Cf", "Cc", "Co", "Cs", "Zl", "Zp"})


def reveal(text: str) -> str:
    """`text` with each hiding character written as its `\\uXXXX` escape; newlines and tabs
    (layout of indented JSON) stay."""
    return "".join(
        f"\\u{ord(c):04x}" if c not in "\n\t" and unicodedata.category(c) in _HIDDEN else c
        for c in text
    )


def reveal_all(value: Any) -> Any:
    """`value` (JSON data) with `reveal` applied to every string in it, keys included."""
    if isinstance(value, str):
        return reveal(value)
    if isinstance(value, dict):
        return {reveal_all(k): reveal_all(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [reveal_all(v) for v in value]
    return value


def reveal_json(value: Any) -> str:
    """`value` as indented JSON, each hiding character revealed: how a gate's request reads on
    the CLI and on the status page alike."""
    return reveal(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def _credentials_in(text: str) -> list[str]:
    try:
        return sorted(credential_names(text))
    except TemplateError:
        return []


def shown_header(name: str, value: Any) -> dict[str, Any]:
    """One header as shown: `value` (placeholders kept, a literal secret masked), the
    credentials it names (`credentials`) and whether the page masked it (`masked`)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    named = _credentials_in(text)
    if named or not _SECRET_HEADER.search(name):
        return {"name": name, "value": text, "credentials": named, "masked": False}
    scheme = _SCHEME.match(text)
    masked = f"{scheme['scheme']} {MASK}" if scheme else MASK
    return {"name": name, "value": masked, "credentials": [], "masked": True}


def one_line(text: str) -> str:
    """`text` on one line: `reveal`ed, and line breaks and tabs as `\\n` and `\\t` (a
    runner's log line as `tether-supervisor logs` and the task page show it)."""
    return reveal(text).replace("\n", "\\n").replace("\t", "\\t")


def fields_text(fields: dict[str, Any]) -> str:
    """A log line's fields as `key=value` pairs on one line, sorted by key; a value that is not
    a string as its JSON."""
    return "  ".join(f"{one_line(str(k))}={_shown_value(v)}" for k, v in sorted(fields.items()))


def _shown_value(value: Any) -> str:
    if isinstance(value, str):
        return one_line(value)
    return one_line(json.dumps(value, ensure_ascii=False, sort_keys=True))
