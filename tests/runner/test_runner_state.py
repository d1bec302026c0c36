"""`RunnerState`: the daemon's one state and its transitions, without a daemon around it."""

from __future__ import annotations

from tether.runner.preemption.notice import Notice
from tether.runner.state import RunnerPhase, RunnerState

NOTICE = Notice(provider="aws", action="terminate", deadline=None, left_s=120.0)


def serving() -> RunnerState:
    return RunnerState(next_pause_s=1.0).introduced("default")


def test_a_preemption_heard_before_the_shutdown_is_kept() -> None:
    stopped = serving().preempt(NOTICE, cancel_at=110.0).stop()
    assert stopped.phase is RunnerPhase.STOPPING
    assert stopped.stopping
    assert stopped.preemption is not None
    assert stopped.preemption.cancel_at == 110.0
    assert stopped.describe(now=0.0) == "stopping"
    assert not stopped.takes_leases(now=0.0)


def test_status_says_the_most_pressing_state_first() -> None:
    state = serving()
    assert state.describe(now=0.0) == "claiming"
    paused = state.paused_until(10.0, "rate limited")
    assert paused.describe(now=5.0) == "paused: rate limited"
    assert paused.describe(now=10.0) == "claiming"  # a pause ends by itself
    down = paused.link_down(now=5.0)
    assert down.describe(now=5.0) == "supervisor unreachable"
    assert down.link_up().describe(now=5.0) == "paused: rate limited"
    preempted = down.preempt(NOTICE, cancel_at=100.0)
    assert preempted.describe(now=5.0) == "preempted (aws): claiming nothing more"


def test_leases_are_taken_only_while_serving_unpaused_with_a_good_token_and_a_pool() -> None:
    state = serving()
    assert state.takes_leases(now=0.0)
    assert not RunnerState(next_pause_s=1.0).takes_leases(now=0.0)  # pool not known yet
    assert not state.paused_until(1.0, "why").takes_leases(now=0.0)
    assert state.paused_until(1.0, "why").takes_leases(now=1.0)
    assert not state.token_refused().takes_leases(now=0.0)
    assert not state.preempt(NOTICE, cancel_at=1.0).takes_leases(now=0.0)
    assert not state.stop().takes_leases(now=0.0)


def test_a_token_read_again_asks_whose_it_is_only_when_it_was_replaced() -> None:
    refused = serving().token_refused()
    kept = refused.token_read_again(replaced=False)
    assert (kept.token_stale, kept.pool) == (False, "default")
    replaced = refused.token_read_again(replaced=True)
    assert (replaced.token_stale, replaced.pool) == (False, None)


def test_the_pause_grows_to_its_bound_and_a_reported_step_resets_it() -> None:
    state = serving()
    for _ in range(5):
        state = state.pause_grown(pause_max_s=5.0)
    assert state.next_pause_s == 5.0
    assert state.pause_reset(pause_initial_s=1.0).next_pause_s == 1.0


def test_the_claim_after_a_waited_out_pause_says_claiming_resumed_once() -> None:
    state = serving().paused_until(3.0, "operator problem").pause_waited_out()
    assert state.resuming
    answered = state.claim_answered()
    assert not answered.resuming
    assert answered.pause.why == "operator problem"  # for the `claiming resumed` line
