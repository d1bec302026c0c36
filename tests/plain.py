"""The ledger's views as their JSON reads (records as dicts, tuples as lists): what the routes
send, so a test states a view's content as the wire has it."""

from __future__ import annotations

from typing import Any

import msgspec


def plain(view: Any) -> Any:
    """`view` (a record, or a list of records) as plain JSON data."""
    return msgspec.json.decode(msgspec.json.encode(view))
