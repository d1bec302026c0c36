"""Text an operator reads before approving it (a gate's request), with every character that
hides or reorders text made visible: a bidi override or a zero-width space from a step's output
could make "$820,000" read as "$82,000". The digest the operator opens binds the exact bytes;
this only makes what they read match them."""

from __future__ import annotations

import json
import unicodedata
from typing import Any, Final

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
