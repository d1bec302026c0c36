"""The stand-in model server (a test double): deterministic answers and its misbehaviour knobs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import examples.standin_model as standin
from examples.standin_model import Knobs, create_app, latency_for, main, read_scenario
from runner.errors import OperatorProblem, StepRejected
from runner.model_client import ModelClient
from tether.clocks import LoopClock

BODY = {
    "model": "stand-in",
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi there"},
    ],
}
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def knobs() -> Knobs:
    return Knobs()


@pytest.fixture
async def http(knobs: Knobs) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(knobs))
    async with httpx.AsyncClient(transport=transport, base_url="http://standin") as client:
        yield client


async def chat(http: httpx.AsyncClient, body: Any = None, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return await http.post("/v1/chat/completions", json=body or BODY, headers=headers)


async def test_answers_are_deterministic_with_usage(http: httpx.AsyncClient) -> None:
    first, second = (await chat(http)).json(), (await chat(http)).json()
    assert first == second
    message = first["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert message["content"].endswith("hi there")
    assert first["choices"][0]["finish_reason"] == "stop"
    usage = first["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    other = dict(BODY, messages=[{"role": "user", "content": "something else"}])
    assert (await chat(http, other)).json()["choices"][0]["message"] != message


async def test_max_tokens_truncates_with_finish_reason_length(http: httpx.AsyncClient) -> None:
    answer = (await chat(http, dict(BODY, max_tokens=1))).json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 1


async def test_a_bad_request_is_a_400_in_openai_shape(http: httpx.AsyncClient) -> None:
    answer = await chat(http, {"model": "m", "messages": []})
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "invalid_request_error"


async def test_the_key_is_checked_when_one_is_expected(
    knobs: Knobs, http: httpx.AsyncClient
) -> None:
    knobs.expected_key = "right"
    assert (await chat(http)).status_code == 401
    assert (await chat(http, key="wrong")).status_code == 401
    assert (await chat(http, key="right")).status_code == 200


async def test_429_and_500_for_the_next_n_calls_then_normal(
    knobs: Knobs, http: httpx.AsyncClient
) -> None:
    knobs.fail_429, knobs.retry_after_s, knobs.fail_500 = 2, 3, 1
    statuses = []
    for _ in range(4):
        answer = await chat(http)
        statuses.append(answer.status_code)
        if answer.status_code == 429:
            assert answer.headers["retry-after"] == "3"
    assert statuses == [429, 429, 500, 200]
    stats = (await http.get("/_admin/stats")).json()
    assert stats["calls"] == 4
    assert stats["by_status"] == {"429": 2, "500": 1, "200": 1}


async def test_quota_exhaustion_is_429_insufficient_quota(
    knobs: Knobs, http: httpx.AsyncClient
) -> None:
    knobs.quota_exhausted = True
    answer = await chat(http)
    assert answer.status_code == 429
    assert answer.json()["error"]["code"] == "insufficient_quota"


async def test_knobs_change_at_run_time_all_or_nothing(http: httpx.AsyncClient) -> None:
    changed = await http.post("/_admin/knobs", json={"fail_500": 1, "expected_key": "k"})
    assert changed.status_code == 200
    assert changed.json()["fail_500"] == 1
    assert changed.json()["key_required"] is True
    assert "k" not in changed.json().values()
    for bad in (
        {"fail_500": 2, "nope": 1},
        {"fail_500": -1},
        {"latency_s": "slow"},
        {"latency_spread": 1.5},
        {"latency_spread": -0.1},
        {"latency_spread": True},
        {"latency_spread": 0.5, "latency_s": "slow"},
        [1],
    ):
        refused = await http.post("/_admin/knobs", json=bad)
        assert refused.status_code == 400
        assert refused.json()["error"] == "invalid_field"
    for raw in (b'{"latency_spread": NaN}', b'{"latency_s": Infinity}'):
        refused = await http.post("/_admin/knobs", content=raw)
        assert refused.status_code == 400, raw
        assert "finite" in refused.json()["detail"]
    now = (await http.get("/_admin/knobs")).json()
    assert (now["fail_500"], now["latency_s"], now["latency_spread"]) == (1, 0.0, 0.0)


async def test_latency_delays_the_answer(knobs: Knobs, http: httpx.AsyncClient) -> None:
    knobs.latency_s = 10.0
    with anyio.move_on_after(0.2) as scope:
        await chat(http)
    assert scope.cancelled_caught


def test_latency_spread_is_even_bounded_and_computable_from_the_messages() -> None:
    many = [[{"role": "user", "content": f"no-op {i}"}] for i in range(400)]
    assert {latency_for(m, 0.2, 0.0) for m in many} == {0.2}
    assert latency_for(many[0], 0.0, 0.9) == 0.0
    held = [latency_for(m, 0.2, 0.9) for m in many]
    assert held == [latency_for(m, 0.2, 0.9) for m in many]  # the same messages, the same hold
    assert all(0.2 * 0.1 <= h <= 0.2 * 1.9 for h in held)
    # spread out, not bunched: each tenth of the range holds some of the 400
    tenths = {int((h - 0.02) / 0.036) for h in held}
    assert tenths >= set(range(10))


async def test_each_answer_is_held_as_latency_for_says(
    knobs: Knobs, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    holds: list[float] = []

    async def record(seconds: float) -> None:
        holds.append(seconds)

    monkeypatch.setattr(standin.anyio, "sleep", record)
    changed = await http.post("/_admin/knobs", json={"latency_s": 0.5, "latency_spread": 0.8})
    assert changed.status_code == 200
    bodies = [{"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(5)]
    for body in bodies:
        assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
    assert holds == [latency_for(b["messages"], 0.5, 0.8) for b in bodies]
    assert len(set(holds)) == 5


async def test_the_runners_model_client_reads_the_stand_in_as_a_provider(knobs: Knobs) -> None:
    transport = httpx.ASGITransport(app=create_app(knobs))
    client = ModelClient(base_url="http://standin/v1", clock=LoopClock(), transport=transport)
    knobs.fail_429, knobs.retry_after_s, knobs.fail_500 = 1, 0, 1
    got = await client.chat(BODY, key=None, deadline=anyio.current_time() + 30)
    assert got.text.endswith("hi there")
    assert got.usage["total_tokens"] > 0
    knobs.expected_key = "right"
    with pytest.raises(OperatorProblem):
        await client.chat(BODY, key="wrong", deadline=anyio.current_time() + 30)
    with pytest.raises(StepRejected):
        await client.chat(
            {"model": "m", "messages": []}, key="right", deadline=anyio.current_time() + 30
        )
    await client.aclose()


SCENARIO = {
    "turns": [
        {"name": "look", "assistant_turns": 0,
         "tool_calls": [{"name": "list_files", "arguments": {"path": "src/"}},
                        {"name": "read_file", "arguments": '{"path": broken', "id": "fixed"}]},
        {"name": "fix", "last_contains": "FAILED",
         "tool_calls": [{"name": "write_file", "arguments": {"path": "src/a.py", "content": "x"}}]},
        {"name": "done", "assistant_turns": 2, "text": "all tests pass"},
    ]
}  # fmt: skip
TOOL_FN = {"name": "list_files", "parameters": {"type": "object"}}


def conversation(*results: str) -> dict[str, Any]:
    """A request after `len(results)` tool turns, each answered by one tool message."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the test"}]
    for i, result in enumerate(results):
        call = {"id": f"c{i}", "type": "function",
                "function": {"name": "list_files", "arguments": "{}"}}  # fmt: skip
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": result})
    return {
        "model": "m",
        "messages": messages,
        "tools": [{"type": "function", "function": TOOL_FN}],
    }


async def test_a_scenario_answers_each_turn_with_its_scripted_tool_calls_or_text(
    http: httpx.AsyncClient,
) -> None:
    assert (await http.post("/_admin/scenario", json=SCENARIO)).status_code == 200
    first = (await chat(http, conversation())).json()
    assert first == (await chat(http, conversation())).json()  # deterministic
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["list_files", "read_file"]
    assert calls[0]["function"]["arguments"] == '{"path":"src/"}'
    assert calls[1]["function"]["arguments"] == '{"path": broken'  # a string is sent as it is
    assert calls[0]["id"].startswith("call_")
    assert calls[1]["id"] == "fixed"
    assert first["usage"]["completion_tokens"] > 0
    # Matched by a marker in the last message, whatever the count of turns so far.
    fix = (await chat(http, conversation("1 FAILED"))).json()["choices"][0]["message"]
    assert fix["tool_calls"][0]["function"]["name"] == "write_file"
    done = (await chat(http, conversation("ok", "ok"))).json()["choices"][0]
    assert (done["message"]["content"], done["finish_reason"]) == ("all tests pass", "stop")
    echo = (await chat(http, conversation("ok"))).json()["choices"][0]["message"]
    assert echo["content"].startswith("echo ")  # no turn matches: the echo answer
    stats = (await http.get("/_admin/stats")).json()
    assert stats["turns"] == ["look", "look", "fix", "done", None]


async def test_the_call_log_shows_a_turn_asked_again(http: httpx.AsyncClient) -> None:
    assert (await http.post("/_admin/scenario", json=SCENARIO)).status_code == 200
    await chat(http, conversation())
    await chat(http, conversation("ok", "ok"))
    assert (await http.get("/_admin/stats")).json()["turns"] == ["look", "done"]
    await chat(http, conversation())  # a client that starts over asks for "look" again
    assert (await http.get("/_admin/stats")).json()["turns"].count("look") == 2


async def test_a_bad_scenario_is_refused_and_the_script_kept(http: httpx.AsyncClient) -> None:
    assert (await http.post("/_admin/scenario", json=SCENARIO)).status_code == 200
    for bad, words in [
        ({"turns": [{"name": "a"}]}, "exactly one of `text` and `tool_calls`"),
        ({"turns": [{"name": "a", "text": "x", "tool_calls": [{"name": "f"}]}]}, "exactly one"),
        ({"turns": [{"name": "a", "text": "x"}, {"name": "a", "text": "y"}]}, "names must differ"),
        ({"turns": [{"name": "a", "text": "x", "assistant_turn": 1}]}, "`assistant_turns`"),
        ({"turns": [{"name": "a", "assistant_turns": -1, "text": "x"}]}, "$.turns[0]"),
        ({"turns": [{"name": "a", "tool_calls": [{"name": ""}]}]}, "$.turns[0].tool_calls[0]"),
        ([], "Expected `object`"),
    ]:  # fmt: skip
        refused = await http.post("/_admin/scenario", json=bad)
        assert refused.status_code == 400, bad
        assert refused.json()["error"] == "invalid_field"
        assert words in refused.json()["detail"], bad
    assert (await http.post("/_admin/scenario", content=b"{")).status_code == 400
    kept = (await http.get("/_admin/scenario")).json()
    assert [t["name"] for t in kept["turns"]] == ["look", "fix", "done"]


async def test_the_runners_model_client_reads_the_stand_ins_tool_calls() -> None:
    app = create_app(scenario=read_scenario(SCENARIO))
    client = ModelClient(
        base_url="http://standin/v1", clock=LoopClock(), transport=httpx.ASGITransport(app=app)
    )
    got = await client.chat(conversation(), key=None, deadline=anyio.current_time() + 30)
    await client.aclose()
    assert got.finish_reason == "tool_calls"
    assert [c.function.name for c in got.tool_calls] == ["list_files", "read_file"]
    assert app.state.turns == ["look"]


def test_cli_help_and_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert "test double" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["--port", "1", "--key-file", "/nonexistent"]) == 2
    assert main(["--port", "1", "--latency-spread", "2"]) == 2
    assert "--latency-spread must be 0..1" in capsys.readouterr().err
    assert main(["--port", "1", "--latency", "nan"]) == 2
    assert "--latency must be a finite number" in capsys.readouterr().err


def test_cli_refuses_a_scenario_file_it_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--port", "1", "--scenario", str(tmp_path / "none.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    for text, words in [("{", "JSON"), ('{"turns": [{"name": "a"}]}', "exactly one of")]:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        assert main(["--port", "1", "--scenario", str(bad)]) == 2
        assert words in capsys.readouterr().err


def test_it_runs_as_a_process(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    key_file = tmp_path / "key"
    key_file.write_text("proc-key\n")
    scenario_file = tmp_path / "scenario.json"
    scenario_file.write_text(json.dumps(SCENARIO))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "examples.standin_model",
            "--port",
            str(port),
            "--key-file",
            str(key_file),
            "--scenario",
            str(scenario_file),
        ],
        cwd=ROOT,
        env=dict(os.environ),
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            for _ in range(200):  # the server needs a moment to listen
                try:
                    assert client.get("/healthz").json() == {"ok": True}
                    break
                except httpx.TransportError:
                    if proc.poll() is not None:
                        pytest.fail(f"stand-in exited with {proc.returncode}")
                    time.sleep(0.05)
            headers = {"Authorization": "Bearer proc-key"}
            answer = client.post("/v1/chat/completions", json=BODY, headers=headers)
            assert answer.status_code == 200
            assert client.post("/v1/chat/completions", json=BODY).status_code == 401
            scripted = client.post("/v1/chat/completions", json=conversation(), headers=headers)
            assert scripted.json()["choices"][0]["finish_reason"] == "tool_calls"
            # BODY too has no assistant turn yet; the refused (401) call answered no turn
            assert client.get("/_admin/stats").json()["turns"] == ["look", "look"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
