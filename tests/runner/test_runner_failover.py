"""A runner with several supervisors on one ledger fails over between them (issue 14, item 3):
the setting's forms, the rule of `tether.runner.failover`, and steps whose lease outlives the
supervisor that granted it."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import AsyncIterator, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import structlog.testing

from tests.runner.test_runner_fakes import TOKEN, FakeSupervisor, error, make_lease
from tests.runner.test_runner_processes import (
    Cluster,
    environment,
    free_port,
    program,
    wait_for,
)
from tests.runner.test_runner_steps import Gate, step_outcomes, until
from tests.runner_failover_fakes import (
    make_failover_rig,
    no_answer_within_timeout,
    offer_all,
    on_one_ledger,
    url_of,
)
from tether.clocks import LoopClock
from tether.runner.cli import main
from tether.runner.errors import SupervisorUnreachable, TokenRejected
from tether.runner.failover import Endpoint, Endpoints
from tether.runner.settings import RunnerSettings
from tether.runner.supervisor_client import SupervisorClient
from tether.settings import SettingsError, load_settings

SWITCHED = "supervisor gave no answer; switching to the next"
REQUIRED = {"model_url": "http://model.test/v1", "model": "m"}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TETHER_") or name == "CREDENTIALS_DIRECTORY":
            monkeypatch.delenv(name)


def switches(logs: Sequence[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == SWITCHED]


# -- the setting -------------------------------------------------------------------------------


def test_one_url_keeps_its_meaning_and_several_are_listed_with_commas(tmp_path: Path) -> None:
    config = tmp_path / "runner.toml"
    config.write_text('supervisor_url = "http://a:8080, http://b:8080/"\n')
    from_file = load_settings(RunnerSettings, config_file=config, environ={}, flags=REQUIRED)
    assert from_file.supervisor_urls == ("http://a:8080", "http://b:8080/")
    from_env = load_settings(
        RunnerSettings,
        environ={"TETHER_SUPERVISOR_URL": "http://a,http://b,http://c"},
        flags=REQUIRED,
    )
    assert from_env.supervisor_urls == ("http://a", "http://b", "http://c")
    flag = load_settings(
        RunnerSettings,
        config_file=config,
        environ={"TETHER_SUPERVISOR_URL": "http://env"},
        flags={**REQUIRED, "supervisor_url": "https://one.example:8443"},
    )
    assert flag.supervisor_url == "https://one.example:8443"
    assert flag.supervisor_urls == ("https://one.example:8443",)


def test_the_file_may_list_the_urls_as_an_array(tmp_path: Path) -> None:
    config = tmp_path / "runner.toml"
    config.write_text('supervisor_url = ["http://a:8080", "http://b:8080"]\n')
    listed = load_settings(RunnerSettings, config_file=config, environ={}, flags=REQUIRED)
    assert listed.supervisor_urls == ("http://a:8080", "http://b:8080")
    config.write_text('supervisor_url = ["http://a:8080", 7]\n')
    with pytest.raises(SettingsError, match="'supervisor_url' must be a string or a non-empty"):
        load_settings(RunnerSettings, config_file=config, environ={}, flags=REQUIRED)
    config.write_text('supervisor_url = ["http://a:8080", "ftp://b"]\n')
    with pytest.raises(SettingsError, match="entry 2, 'ftp://b'"):
        load_settings(RunnerSettings, config_file=config, environ={}, flags=REQUIRED)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("http://a,ftp://b", "entry 2, 'ftp://b', is not an http:// or https:// URL"),
        ("http://a,,http://b", "entry 2 of 'http://a,,http://b' is empty"),
        ("http://a, http://a/", "lists 'http://a/' twice"),
        ("ftp://x", "must be an http:// or https:// URL, got 'ftp://x'"),
    ],
)
def test_a_bad_url_in_the_list_is_refused_naming_it(value: str, said: str) -> None:
    with pytest.raises(SettingsError, match="supervisor_url") as refused:
        RunnerSettings(supervisor_url=value, model_url="http://model.test/v1", model="m")
    assert said in str(refused.value)


def test_the_command_line_refuses_a_bad_url_in_the_list_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["run", "--supervisor", "http://127.0.0.1:1,ftp://b", "--model-url", "http://m/v1"]
    assert main([*argv, "--model", "m"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "'ftp://b'" in line
    assert line.startswith("tether-runner: ")


# -- the rule ----------------------------------------------------------------------------------


def _endpoints(count: int) -> Endpoints:
    return Endpoints([Endpoint(url_of(n), httpx.AsyncClient()) for n in range(count)])


def test_a_call_tries_the_current_then_the_next_ones_each_once() -> None:
    endpoints = _endpoints(3)
    a, b, c = endpoints.all
    assert [e.url for e in endpoints.attempts()] == [a.url, b.url, c.url]
    endpoints.failed(a, "down")  # b is current now, sticky until it fails
    assert [e.url for e in endpoints.attempts()] == [b.url, c.url, a.url]
    endpoints.failed(a, "down again")  # a call that was still on a moves nothing
    assert endpoints.current is b
    endpoints.failed(b, "down")
    endpoints.failed(c, "down")
    assert endpoints.current is a  # round-robin
    assert endpoints.switches == 3


def test_a_call_follows_a_switch_another_call_made_meanwhile() -> None:
    endpoints = _endpoints(3)
    a, _b, c = endpoints.all
    tried = endpoints.attempts()
    assert next(tried) is a
    endpoints.failed(a, "down")
    endpoints.failed(endpoints.current, "down")  # another call left b for c
    assert next(tried) is c
    assert next(tried).url == url_of(1)
    assert list(tried) == []


def _client(supervisors: list[FakeSupervisor]) -> SupervisorClient:
    return SupervisorClient(
        base_url=[url_of(n) for n in range(len(supervisors))],
        token=TOKEN,
        clock=LoopClock(),
        transport=[sup.transport for sup in supervisors],
    )


async def test_a_call_the_current_supervisor_cannot_answer_goes_to_the_next_at_once() -> None:
    first, second = on_one_ledger()
    client = _client([first, second])
    first.down = True
    with structlog.testing.capture_logs() as logs:
        assert await client.claim("r", 1, 0.0) == []
        first.down = False
        assert await client.claim("r", 1, 0.0) == []  # sticky: the second stays current
        second.down = True
        assert await client.claim("r", 1, 0.0) == []  # round-robin back to the first
    assert [len(first.of("claim")), len(second.of("claim"))] == [2, 3]  # one refused
    (one, two) = switches(logs)
    assert (one["from"], one["to"]) == (url_of(0), url_of(1))
    assert "ConnectError: connection refused" in one["reason"]
    assert (two["from"], two["to"]) == (url_of(1), url_of(0))
    assert TOKEN not in repr(logs)
    await client.aclose()


async def test_a_503_fails_over_and_a_401_does_not() -> None:
    first, second = on_one_ledger()
    client = _client([first, second])
    first.script("claim", error(503, "unavailable", "the ledger is busy"))
    with structlog.testing.capture_logs() as logs:
        assert await client.claim("r", 1, 0.0) == []
    assert client.base_url == url_of(1)
    (line,) = switches(logs)
    assert "answered 503 unavailable" in line["reason"]
    second.script("claim", error(401, "unauthorized", "revoked"))
    with structlog.testing.capture_logs() as logs, pytest.raises(TokenRejected):
        await client.claim("r", 1, 0.0)
    assert switches(logs) == []
    assert client.base_url == url_of(1)
    assert len(first.of("claim")) == 1  # a revoked token is not asked about elsewhere
    await client.aclose()


async def test_every_supervisor_silent_is_unreachable_after_one_try_each() -> None:
    first, second = on_one_ledger()
    client = _client([first, second])
    first.down = second.down = True
    with pytest.raises(SupervisorUnreachable, match=url_of(1)):
        await client.renew("s1", 1)
    assert [len(first.of("renew")), len(second.of("renew"))] == [1, 1]
    await client.aclose()


async def test_a_streamed_upload_is_never_sent_twice_but_moves_the_next() -> None:
    first, second = on_one_ledger()
    client = _client([first, second])
    data = b"x" * 1000
    digest = hashlib.sha256(data).hexdigest()

    async def stream() -> AsyncIterator[bytes]:
        yield data

    first.down = True
    with pytest.raises(SupervisorUnreachable):
        await client.put_artifact(digest, stream(), size=len(data))
    assert second.of("artifact") == []
    assert client.base_url == url_of(1)
    stored = await client.put_artifact(digest, stream(), size=len(data))  # the caller's retry
    assert stored.created
    assert second.artifacts == {digest: data}
    await client.aclose()


# -- at start ----------------------------------------------------------------------------------


async def test_the_runner_starts_when_one_supervisor_answers_naming_the_silent_one(
    tmp_path: Path,
) -> None:
    first, second = on_one_ledger()
    first.down = True
    rig = make_failover_rig(tmp_path, [first, second])
    offer_all([first, second], make_lease("s1"))
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await until(rig, lambda: step_outcomes(rig) == ["applied"])
            rig.runner.request_shutdown()
    assert rig.exit_code == 0
    (silent,) = [e for e in logs if e["event"].startswith("supervisor did not answer at start")]
    assert silent["url"] == url_of(0)
    assert "connection refused" in silent["error"]
    assert switches(logs) == []  # the one that answered was current from the start
    assert first.of("claim") == []
    assert [c.step_id for c in second.of("result")] == ["s1"]


@pytest.mark.parametrize("reply", ["a web page", "another ledger"])
async def test_a_url_that_is_not_a_supervisor_of_this_ledger_stops_the_runner(
    tmp_path: Path, reply: str
) -> None:
    first, second = on_one_ledger()
    if reply == "a web page":
        second.script("whoami", httpx.Response(200, text="<html>hello</html>"))
        said = f"{url_of(1)} is not a tether supervisor"
    else:
        second.pool = "elsewhere"
        said = "do not share one ledger"
    rig = make_failover_rig(tmp_path, [first, second])
    with structlog.testing.capture_logs() as logs:
        await rig.serve()
    assert rig.exit_code == 2
    (line,) = [e for e in logs if e["log_level"] == "error"]
    assert said in line["event"]
    assert first.of("claim") == []


# -- steps -------------------------------------------------------------------------------------


async def test_a_supervisor_that_dies_mid_step_leaves_its_lease_to_the_next(
    tmp_path: Path,
) -> None:
    """The first supervisor stops answering after it acknowledged the lease: the renews go on
    at the second by the same fence before the lease runs out (within one renew interval when
    the machine is not loaded: printed), the result reaches the second, and the step is not
    dropped."""
    first, second = on_one_ledger()
    rig = make_failover_rig(tmp_path, [first, second])
    gate = Gate()
    rig.model.script(gate)
    renew_every_s, ttl_s = 0.5, 5.0
    offer_all([first, second], make_lease("s1", fence=7, renew_every_s=renew_every_s, ttl_s=ttl_s))
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await first.until(lambda: len(first.of("renew", "s1")) == 1)
            died_at = anyio.current_time()
            first.down = True
            await second.until(lambda: len(second.of("renew", "s1")) >= 2)
            gate.open.set()
            await until(rig, lambda: step_outcomes(rig) == ["applied"])
            rig.runner.request_shutdown()
    renews = second.of("renew", "s1")
    assert {c.body["fence"] for c in renews} == {7}
    took = renews[0].at - died_at
    print(f"\nrenewed at the second {took:.2f} s after the first died (every {renew_every_s:g} s)")
    assert took < ttl_s
    assert [c.step_id for c in second.of("result")] == ["s1"]
    assert first.of("result") == []
    assert not gate.cancelled
    (line,) = switches(logs)
    assert (line["from"], line["to"]) == (url_of(0), url_of(1))
    assert not [e for e in logs if e["event"].startswith("step dropped")]


async def test_a_supervisor_that_hangs_costs_one_renew_interval_not_the_request_timeout(
    tmp_path: Path,
) -> None:
    """A renew the first leaves unanswered is taken to the second after the renew interval,
    not after the request's timeout: within half the timeout, so that a loaded machine's
    delays cannot be mistaken for it (the figure is printed)."""
    first, second = on_one_ledger()
    request_timeout_s, renew_every_s = 10.0, 0.5
    rig = make_failover_rig(tmp_path, [first, second], request_timeout_s=request_timeout_s)
    gate = Gate()
    rig.model.script(gate)
    offer_all([first, second], make_lease("s1", fence=3, renew_every_s=renew_every_s, ttl_s=5.0))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await first.until(lambda: len(first.of("renew", "s1")) == 1)
        first.script("renew", no_answer_within_timeout)
        await second.until(
            lambda: len(second.of("renew", "s1")) >= 2, within=request_timeout_s / 2 + 1.0
        )
        gate.open.set()
        await until(rig, lambda: step_outcomes(rig) == ["applied"])
        rig.runner.request_shutdown()
    hung = first.of("renew", "s1")[1]
    took = second.of("renew", "s1")[0].at - hung.at
    print(f"\nrenewed at the second {took:.2f} s after the hung renew (every {renew_every_s:g} s)")
    assert took < request_timeout_s / 2
    assert len(first.of("renew", "s1")) == 2  # sticky: nothing more went to the first
    assert [c.step_id for c in second.of("result")] == ["s1"]


async def test_with_every_supervisor_down_the_step_keeps_its_own_bound(tmp_path: Path) -> None:
    first, second = on_one_ledger()
    rig = make_failover_rig(tmp_path, [first, second])
    gate = Gate()
    rig.model.script(gate)
    ttl_s = 1.0
    offer_all([first, second], make_lease("s1", renew_every_s=0.2, ttl_s=ttl_s))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await first.until(lambda: len(first.of("renew", "s1")) == 1)
        acknowledged_at = first.of("renew", "s1")[0].at
        first.down = second.down = True
        await until(rig, lambda: step_outcomes(rig) == ["dropped: expired"], within=3 * ttl_s)
        dropped_at = anyio.current_time()
        rig.runner.request_shutdown()
    assert rig.exit_code == 0
    # Not before the lease's end; and at it, not a whole lease later (the figure is printed).
    held_s = dropped_at - acknowledged_at
    print(f"\ndropped {held_s:.2f} s after the last acknowledged renew (TTL {ttl_s:g} s)")
    assert ttl_s - 0.05 <= held_s < 2 * ttl_s
    assert len(second.of("renew", "s1")) >= 1  # both were asked
    assert first.of("result") == second.of("result") == []


async def test_a_token_refused_by_one_supervisor_is_not_a_reason_to_fail_over(
    tmp_path: Path,
) -> None:
    first, second = on_one_ledger()
    rig = make_failover_rig(tmp_path, [first, second])
    rig.model.script(Gate())
    offer_all([first, second], make_lease("s1", renew_every_s=0.2))
    first.script("renew", error(401, "unauthorized", "token revoked"))
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await until(rig, lambda: step_outcomes(rig) == ["dropped: token_rejected"])
            rig.runner.request_shutdown()
    assert switches(logs) == []
    assert second.of("renew") == []
    assert any(e["event"].startswith("claiming paused") for e in logs)


# -- as real processes: a second supervisor on the SQLite ledger file of a killed one ----------


@pytest.mark.slow
def test_a_runner_process_finishes_its_step_through_the_second_supervisor_process(
    tmp_path: Path,
) -> None:
    """The runner lists two supervisor URLs on one ledger file. The supervisor that granted
    the lease is SIGKILLed while the step runs and another `serve` starts on the same file
    (one file has one writer: it is refused while the first runs, `writer_lock`); the runner
    renews and reports through it, and the task succeeds on its first attempt."""
    cluster = Cluster(tmp_path)
    try:
        # A lease, and its window to be acknowledged, that outlive the second's start on a
        # loaded machine (seconds): the runner drops a step it could not renew in time. Its
        # first renewal (every 6 s) goes to the second, before the model answers (8 s).
        env = environment(TETHER_LEASE_TTL_S="30", TETHER_ACCEPT_WINDOW_S="12")
        serve = [*program("tether-supervisor"), "serve", "--db", str(cluster.db)]
        first = cluster.start("supervisor", [*serve, "--port", str(cluster.sup_port)], env)
        wait_for(lambda: cluster._up(f"{cluster.url}/healthz", first), "supervisor 1", 20, cluster)
        other_url = f"http://127.0.0.1:{free_port()}"
        argv = [*serve, "--host", "127.0.0.1", "--port", other_url.rsplit(":", 1)[1]]
        refused = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=60, check=False
        )
        assert refused.returncode == 1, refused.stderr  # while the first serves the file
        cluster.start_model()
        cluster.knobs(latency_s=8.0)
        runner = cluster.start(
            "runner",
            [
                *program("tether-runner"),
                "run",
                "--supervisor",
                f"{cluster.url},{other_url}",
                "--runner-id",
                "r-failover",
                "--token-file",
                str(cluster.runner_token_file),
                "--model",
                "stand-in",
                "--model-url",
                f"{cluster.model_url}/v1",
            ],
            environment(TETHER_LOG_FORMAT="json", TETHER_CLAIM_WAIT_S="1"),
        )
        wait_for(lambda: runner.events("supervisor answered"), "the runner", 20, cluster)
        task_id = cluster.submit()
        wait_for(lambda: cluster.leased_to(task_id), "the lease", 20, cluster)
        first.popen.kill()
        first.popen.wait(5)
        second = cluster.start("supervisor-2", argv, env)
        wait_for(lambda: cluster._up(f"{other_url}/healthz", second), "supervisor 2", 20, cluster)
        cluster.http.base_url = httpx.URL(other_url)
        wait_for(lambda: cluster.state(task_id) == "SUCCEEDED", "the task", 40, cluster)
        (attempt,) = cluster.attempts(task_id)
        assert attempt["runner_id"] == "r-failover"
        # Back and forth while the second starts; the first switch is away from the killed one.
        switch = runner.events(SWITCHED)[0]
        assert (switch["from"], switch["to"]) == (cluster.url, other_url)
        assert not runner.events("step dropped")
        assert runner.stop() == 0
        cluster.check_ledger()
    finally:
        cluster.stop_all()
