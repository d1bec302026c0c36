"""The ledger's stored JSON (`supervisor/ledger/tx.py`, `dumps`): msgspec writes what
`json.dumps(sort_keys=True, compact, ensure_ascii=False)` wrote, and `loads` reads it back."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tether.supervisor.ledger.tx import dumps, loads


def stdlib(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


scalars = st.none() | st.booleans() | st.integers() | st.text()
numbers = st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    scalars | numbers,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
without_floats = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(without_floats)
def test_the_text_is_the_standard_librarys(value: Any) -> None:
    assert dumps(value) == stdlib(value)


@given(json_values)
def test_what_is_stored_reads_back_as_it_was(value: Any) -> None:
    assert loads(dumps(value)) == value
    assert loads(dumps(value)) == loads(stdlib(value))


def test_a_floats_exponent_is_the_one_difference() -> None:
    assert dumps({"b": 1e16, "a": 0.5}) == '{"a":0.5,"b":1e16}'
    assert stdlib({"b": 1e16, "a": 0.5}) == '{"a":0.5,"b":1e+16}'


def test_what_msgspec_would_change_or_refuse_is_written_as_before() -> None:
    for value in ({"a": [1, {"b": math.inf}]}, {"n": -math.inf, "none": None}, {1: "x"}):
        assert dumps(value) == stdlib(value)
    assert math.isnan(loads(dumps({"a": math.nan}))["a"])
    assert dumps({"a": None, "b": [None]}) == '{"a":null,"b":[null]}'
