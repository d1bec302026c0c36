"""The xdist groups of tests/conftest.py: each names one test file that exists (a renamed file
would leave its group without a word, and its tests would run beside the others), and a
group's tests share one work unit where every other test is a unit of its own."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import GROUPS, xdist_scope

TESTS = Path(__file__).resolve().parents[1]


def test_every_grouped_file_exists_once() -> None:
    for name in GROUPS:
        assert len(list(TESTS.rglob(name))) == 1, name


def test_a_groups_tests_share_one_unit_and_every_other_test_has_its_own() -> None:
    assert xdist_scope("tests/runner/agent/test_agent_limits.py::test_a[x]") == "limits"
    assert xdist_scope("tests/drills/test_power_loss.py::test_b") == "drills"
    other = "tests/sim/test_explorer_cli.py::test_c[0]"
    assert xdist_scope(other) == other
