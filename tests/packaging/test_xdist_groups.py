"""The xdist groups of tests/conftest.py: each names one test file that exists (a renamed file
would leave its group without a word, and its tests would run beside the others), and a
group's tests share one work unit where every other test is a unit of its own. The longest
tests (FIRST) are collected first, in FIRST's order, each entry naming tests that exist."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import (
    FIRST,
    GROUPS,
    first_rank,
    pytest_collection_modifyitems,
    xdist_scope,
)

TESTS = Path(__file__).resolve().parents[1]


def test_every_grouped_file_exists_once() -> None:
    for name in GROUPS:
        assert len(list(TESTS.rglob(name))) == 1, name


def test_a_groups_tests_share_one_unit_and_every_other_test_has_its_own() -> None:
    assert xdist_scope("tests/runner/agent/test_agent_limits.py::test_a[x]") == "limits"
    assert xdist_scope("tests/drills/test_power_loss.py::test_b") == "drills"
    other = "tests/sim/test_explorer_cli.py::test_c[0]"
    assert xdist_scope(other) == other


def test_every_first_entry_names_tests_that_exist() -> None:
    for head in FIRST:
        path, _, name = head.partition("::")
        assert f"def {name}" in (TESTS.parent / path).read_text(), head


def test_the_first_tests_come_first_in_firsts_order(request: pytest.FixtureRequest) -> None:
    ranks = [first_rank(item.nodeid) for item in request.session.items]
    assert ranks == sorted(ranks)  # this session's own collection
    share = "tests/sim/test_explorer_cli.py::test_ci_explores_ten_thousand_schedules_w[2]"
    pg = "tests/sim/test_explorer_pg.py::test_schedules_on_postgresql_find_no_violation"
    hypothesis = "tests/supervisor/ledger/test_hypothesis_ledger.py::TestLedgerVersusModel::runTest"
    others = ["tests/drills/test_power_loss.py::test_a", "tests/sim/test_explorer_cli.py::test_b"]
    items = [SimpleNamespace(nodeid=n) for n in [others[0], pg, others[1], share, hypothesis]]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [share, hypothesis, pg, *others]
