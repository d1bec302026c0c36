"""The demo's own checks: its account refuses every outcome the ledger must not produce, so a
green `make demo` means what it prints."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from examples.demo import DemoError, account
from tether.wire import effect_key

KILLED = ("runner-b", "t.1", 2)


def _step(position: int, attempts: list[dict[str, Any]]) -> dict[str, Any]:
    step_id, payload_hash = f"t.{position}", f"{position:064x}"
    return {
        "id": step_id,
        "name": f"s{position}",
        "state": "committed",
        "payload_hash": payload_hash,
        "effect_key": effect_key(step_id, payload_hash),
        "attempts": attempts,
    }


def _attempt(attempt: int, fence: int, runner: str, state: str) -> dict[str, Any]:
    return {"attempt": attempt, "fence": fence, "runner_id": runner, "state": state}


def _good() -> tuple[dict[str, Any], dict[str, list[tuple[str, int]]]]:
    steps = [
        _step(0, [_attempt(1, 1, "runner-a", "committed")]),
        _step(
            1,
            [_attempt(1, 2, "runner-b", "expired"), _attempt(2, 3, "runner-a", "committed")],
        ),
    ]
    view = {"id": "t", "state": "SUCCEEDED", "plan_hash": "ab" * 32, "steps": steps}
    effects = {s["id"]: [(s["effect_key"], s["attempts"][-1]["fence"])] for s in steps}
    return view, effects


def test_a_clean_run_is_accounted() -> None:
    view, effects = _good()
    lines = account(view, effects, KILLED)
    assert lines[-1] == "effects in the ledger: 2 for 2 steps (exactly one each)"
    assert any("<- SIGKILLed" in line for line in lines)
    assert any("<- replayed" in line for line in lines)


def test_two_effects_for_one_step_fail_the_demo() -> None:
    view, effects = _good()
    effects["t.1"].append(("another-key", 4))
    with pytest.raises(DemoError, match="s1 has 2 effects"):
        account(view, effects, KILLED)


def test_a_missing_effect_fails_the_demo() -> None:
    view, effects = _good()
    del effects["t.0"]
    with pytest.raises(DemoError, match="s0 has 0 effects"):
        account(view, effects, KILLED)


def test_an_effect_under_another_key_fails_the_demo() -> None:
    view, effects = _good()
    effects["t.0"] = [("0" * 64, 1)]
    with pytest.raises(DemoError, match="not keyed"):
        account(view, effects, KILLED)


def test_a_task_that_did_not_succeed_fails_the_demo() -> None:
    view, effects = _good()
    view["state"] = "FAILED"
    view["reason"] = "max_attempts"
    with pytest.raises(DemoError, match="ended FAILED"):
        account(view, effects, KILLED)


def test_a_kill_that_came_after_the_commit_fails_the_demo() -> None:
    view, effects = _good()
    bad = copy.deepcopy(view)
    bad["steps"][1]["attempts"] = [_attempt(1, 2, "runner-b", "committed")]
    with pytest.raises(DemoError, match="kill came too late"):
        account(bad, effects, KILLED)


def test_a_replay_under_a_lower_fence_fails_the_demo() -> None:
    view, effects = _good()
    view["steps"][1]["attempts"][1]["fence"] = 1
    with pytest.raises(DemoError, match="higher fence"):
        account(view, effects, KILLED)
