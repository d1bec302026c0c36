"""Finding a NUL character in a decoded record where the ledger cannot keep one: a string of a
type marked `messages.NO_NUL` (PostgreSQL's text holds no NUL; a JSON value under `Any` may).

`codec.decode` asks only when the body spells a NUL (`\\u0000`), so a body without one costs a
byte search and no walk.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
import msgspec.inspect as mi

from tether.wire.records import NO_NUL

ESCAPED_NUL: Final = b"\\u0000"


_INFO: dict[type[Any], mi.Type] = {}  # a record's field types, looked up once per record


def _info(into: type[Any]) -> mi.Type:
    if (found := _INFO.get(into)) is None:
        found = _INFO[into] = mi.type_info(into)
    return found


def nul_field(record: Any, into: type[Any]) -> str | None:
    """Where in `record` (decoded as `into`) the first marked string holding NUL is, as the
    client wrote it (`'plan.steps[0].name'`, `'artifacts' (a key)`); None when none does."""
    return _find(record, _info(into), "")


def _find(value: Any, t: mi.Type, path: str) -> str | None:
    if isinstance(t, mi.Metadata):
        if t.extra == NO_NUL and isinstance(value, str):
            return repr(path) if "\x00" in value else None
        return _find(value, t.type, path)
    if isinstance(t, mi.StructType):
        if not isinstance(value, msgspec.Struct):
            return None
        return _first(
            (getattr(value, f.name), f.type, f"{path}.{f.encode_name}" if path else f.encode_name)
            for f in t.fields
        )
    if isinstance(t, mi.DictType) and isinstance(value, dict):
        for key, item in value.items():
            if _find(key, t.key_type, path) is not None:
                return f"{path!r} (a key)"
            if (found := _find(item, t.value_type, f"{path}[...]")) is not None:
                return found
        return None
    if isinstance(t, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        if not isinstance(value, list | tuple | set | frozenset):
            return None
        return _first((item, t.item_type, f"{path}[{i}]") for i, item in enumerate(value))
    if isinstance(t, mi.TupleType) and isinstance(value, tuple):
        return _first(
            (item, kind, f"{path}[{i}]")
            for i, (item, kind) in enumerate(zip(value, t.item_types, strict=False))
        )
    if isinstance(t, mi.UnionType):  # each member ignores a value that is not its own
        return _first((value, member, path) for member in t.types)
    return None  # Any, numbers, enums, an unmarked str: nothing to look for


def _first(candidates: Any) -> str | None:
    for value, t, path in candidates:
        if (found := _find(value, t, path)) is not None:
            return found
    return None
