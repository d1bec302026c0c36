"""Issue 26, finding 5: one time format. Every time the operator's API sends (a task's
`created_at`, events' `at`, attempts', the review record's start and stop and its decision's
`at`) is ISO 8601 in UTC to the millisecond; durations stay seconds (`..._s`)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ApiHarness, FakeClock, open_api
from tether.clocks import epoch, iso

ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
TIME_KEYS = frozenset({"at", "start_time", "stop_time"})


@pytest.fixture
async def api(tmp_path: Path, clock: FakeClock) -> AsyncIterator[ApiHarness]:
    async with open_api(tmp_path / "times.db", clock, synchronous="OFF") as harness:
        yield harness


def times(value: Any, where: str = "") -> Iterator[tuple[str, Any]]:
    """Every (path, value) under a key that names a time: `at`, `*_at`, `*_time`."""
    if isinstance(value, dict):
        for key, inner in value.items():
            path = f"{where}.{key}"
            if key in TIME_KEYS or key.endswith("_at"):
                field = isinstance(inner, dict) and "value" in inner  # a review record's
                yield path, inner["value"] if field else inner
            else:
                yield from times(inner, path)
    elif isinstance(value, list):
        for number, inner in enumerate(value):
            yield from times(inner, f"{where}[{number}]")


async def test_every_time_the_operator_reads_is_iso_8601_utc(api: ApiHarness) -> None:
    task = await api.queued("times")
    [lease] = await api.claim()
    assert (await api.report(lease, "done")).status_code == 200
    decided = await api.client.post(
        f"/v1/tasks/{task['id']}/review",
        headers=api.operator,
        json={"decision": "accept", "note": "fine"},
    )
    assert decided.status_code == 200, decided.text
    answers = {}
    for path in (
        "/v1/tasks",
        f"/v1/tasks/{task['id']}",
        f"/v1/tasks/{task['id']}/events",
        f"/v1/tasks/{task['id']}/review",
    ):
        answer = await api.client.get(path, headers=api.operator)
        assert answer.status_code == 200, answer.text
        answers[path] = answer.json()
    found = [(path + at, value) for path, body in answers.items() for at, value in times(body)]
    named = {at.rsplit(".", 1)[1] for at, value in found if value is not None}
    assert {"created_at", "at", "granted_at", "ended_at", "start_time", "stop_time"} <= named
    wrong = [
        (at, value)
        for at, value in found
        if value is not None and not (isinstance(value, str) and ISO_UTC.fullmatch(value))
    ]
    assert not wrong


def test_iso_and_epoch_are_each_others_inverse() -> None:
    assert iso(1.5) == "1970-01-01T00:00:01.500Z"
    assert epoch(iso(1_700_000_000.25)) == pytest.approx(1_700_000_000.25)
    with pytest.raises(ValueError, match="not a UTC time"):
        epoch("2025-01-02T03:04:05")
