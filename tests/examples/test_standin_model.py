"""The stand-in model server (a test double): deterministic answers and its misbehaviour knobs."""

from __future__ import annotations

import json
import os
import re
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
from tether.clocks import LoopClock
from tether.git import TreeGit
from tether.runner.agent.loop import LoopResult, run_loop
from tether.runner.agent.sandbox import NoSandbox
from tether.runner.agent.tools import ToolBox
from tether.runner.errors import OperatorProblem, StepRejected
from tether.runner.model_client import Completion, ModelClient

BODY = {
    "model": "stand-in",
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi there"},
    ],
}
ROOT = Path(__file__).resolve().parents[2]


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
        {
            "name": "look",
            "assistant_turns": 0,
            "tool_calls": [
                {"name": "list_files", "arguments": {"path": "src/"}},
                {"name": "read_file", "arguments": '{"path": broken', "id": "fixed"},
            ],
        },
        {
            "name": "fix",
            "last_contains": "FAILED",
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "src/a.py", "content": "x"}}
            ],
        },
        {"name": "done", "assistant_turns": 2, "text": "all tests pass"},
    ]
}
TOOL_FN = {"name": "list_files", "parameters": {"type": "object"}}


def conversation(*results: str) -> dict[str, Any]:
    """A request after `len(results)` tool turns, each answered by one tool message."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the test"}]
    for i, result in enumerate(results):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "list_files", "arguments": "{}"},
        }
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
    ]:
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


# The demo's script (issue 12, item 9): write the fix, run the tests, answer done. Each turn is
# matched by its index in the loop, so a resumed loop gets the turns it has not had yet.
CALC = "def add(a, b):\n    return a + b\n"
FIX_SCENARIO = {
    "turns": [
        {
            "name": "write",
            "assistant_turns": 0,
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "src/calc.py", "content": CALC}}
            ],
        },
        {
            "name": "test",
            "assistant_turns": 1,
            "tool_calls": [{"name": "run", "arguments": {"command": "python -m pytest -q"}}],
        },
        {"name": "done", "assistant_turns": 2, "text": "done: the test passes"},
    ]
}
CALC_TEST = "from src.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


async def _agent_loop(
    app: Any, tree: Path, messages: list[dict[str, Any]]
) -> tuple[LoopResult, ToolBox]:
    """The runner's own tool loop (runner/agent/loop.py) against the stand-in `app`."""
    client = ModelClient(
        base_url="http://standin/v1", clock=LoopClock(), transport=httpx.ASGITransport(app=app)
    )

    async def chat(body: dict[str, Any]) -> Completion:
        return await client.chat(body, key=None, deadline=anyio.current_time() + 60)

    box = ToolBox(
        tree,
        git=TreeGit(git_dir=tree.parent / "git", work_tree=tree),
        home=tree.parent / "home",
        allowed_paths=["src/"],
        allowed_commands=["python -m pytest -q"],
        sandbox=NoSandbox(),
    )
    try:
        result = await run_loop(
            chat, model="stand-in", messages=messages, box=box, max_turns=10, budget=None
        )
    finally:
        await client.aclose()
    return result, box


@pytest.fixture
def calc_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch tree with a test of `src/calc.py`, which does not exist yet."""
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    (tree / "tests" / "test_calc.py").write_text(CALC_TEST)
    (tmp_path / "home").mkdir()
    # `python` in the command is this interpreter (it has pytest), as on a runner's PATH.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return tree


async def test_a_scenario_scripts_a_fix_a_test_run_and_done_through_the_real_loop(
    calc_tree: Path,
) -> None:
    app = create_app(scenario=read_scenario(FIX_SCENARIO))
    result, _ = await _agent_loop(app, calc_tree, [{"role": "user", "content": "fix it"}])
    assert (calc_tree / "src" / "calc.py").read_text() == CALC
    assert (result.text, result.turns, result.tool_errors) == ("done: the test passes", 3, 0)
    ran = next(e for e in result.transcript if e.get("name") == "run")
    assert ran["ok"]
    assert "1 passed" in ran["content"]
    assert app.state.turns == ["write", "test", "done"]
    log = app.state.asked
    assert [(a["turn"], a["turn_index"]) for a in log] == [("write", 0), ("test", 1), ("done", 2)]
    assert [a["messages"] for a in log] == [1, 3, 5]  # user; + call and result, twice


async def test_the_call_log_shows_a_resumed_loop_not_asking_again_for_done_turns(
    calc_tree: Path,
) -> None:
    first = create_app(scenario=read_scenario(FIX_SCENARIO))
    done, _ = await _agent_loop(first, calc_tree, [{"role": "user", "content": "fix it"}])
    # A resumed attempt starts from the checkpointed conversation after turn 1 (the write).
    after_write = _messages_through_turn(done.transcript, 1)
    (calc_tree / "src" / "calc.py").unlink()
    again = create_app(scenario=read_scenario(FIX_SCENARIO))
    resumed, _ = await _agent_loop(again, calc_tree, after_write)
    assert resumed.text == "done: the test passes"
    assert [a["turn_index"] for a in again.state.asked] == [1, 2]
    assert "write" not in again.state.turns
    # Its first request is the very one the first attempt sent for turn 1 (the next differs
    # by the test run's timing in the tool result).
    assert again.state.asked[0]["digest"] == first.state.asked[1]["digest"]


def _messages_through_turn(transcript: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    """The request messages of a transcript up to the tool results of assistant turn `turn`,
    rebuilt as a checkpoint's transcript would hold them."""
    out: list[dict[str, Any]] = []
    seen = 0
    for entry in transcript:
        if entry["role"] == "assistant":
            seen += 1
            if seen > turn:
                break
            calls = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in entry["tool_calls"]
            ]
            out.append(
                {"role": "assistant", "content": entry["content"] or None, "tool_calls": calls}
            )
        elif entry["role"] == "tool":
            out.append(
                {"role": "tool", "tool_call_id": entry["tool_call_id"], "content": entry["content"]}
            )
        else:
            out.append({"role": entry["role"], "content": entry["content"]})
    return out


async def test_a_turn_holds_its_first_answers_then_answers_at_once(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    holds: list[float] = []

    async def record(seconds: float) -> None:
        holds.append(seconds)

    monkeypatch.setattr(anyio, "sleep", record)  # the stand-in's hold, not the test's
    scenario = {"turns": [{"name": "slow", "text": "ok", "hold_s": 30, "holds": 1}]}
    assert (await http.post("/_admin/scenario", json=scenario)).status_code == 200
    for _ in range(2):
        assert (await chat(http)).json()["choices"][0]["message"]["content"] == "ok"
    assert holds == [30.0]  # the second request (a resumed attempt) is not held
    asked = (await http.get("/_admin/stats")).json()["asked"]
    assert [a["hold_s"] for a in asked] == [30.0, 0.0]
    # A new script starts counting holds again; without `holds`, every answer is held.
    scenario["turns"][0].pop("holds")
    assert (await http.post("/_admin/scenario", json=scenario)).status_code == 200
    for _ in range(2):
        await chat(http)
    assert holds == [30.0, 30.0, 30.0]


async def test_a_release_ends_the_holds_under_way(http: httpx.AsyncClient) -> None:
    """A test decides when a held answer comes (the preemption tests hold one until the runner
    heard its notice)."""
    scenario = {"turns": [{"name": "held", "text": "ok", "hold_s": 3600}]}
    assert (await http.post("/_admin/scenario", json=scenario)).status_code == 200
    answers: list[httpx.Response] = []

    async def ask() -> None:
        answers.append(await chat(http))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            while not (await http.get("/_admin/stats")).json()["asked"]:  # noqa: ASYNC110
                await anyio.sleep(0.01)
            assert (await http.post("/_admin/release")).json() == {"released": 1}
    assert answers[0].json()["choices"][0]["message"]["content"] == "ok"
    assert (await http.post("/_admin/release")).json() == {"released": 0}


async def test_a_request_killed_while_held_is_in_the_log_unanswered(
    http: httpx.AsyncClient,
) -> None:
    scenario = {"turns": [{"name": "blocked", "assistant_turns": 0, "text": "x", "hold_s": 3600}]}
    assert (await http.post("/_admin/scenario", json=scenario)).status_code == 200
    with anyio.move_on_after(0.3) as scope:
        await chat(http)
    assert scope.cancelled_caught
    stats = (await http.get("/_admin/stats")).json()
    assert [(a["turn"], a["turn_index"], a["hold_s"]) for a in stats["asked"]] == [
        ("blocked", 0, 3600.0)
    ]
    assert stats["turns"] == []  # asked, never answered


@pytest.mark.parametrize(
    ("turn", "words"),
    [
        ({"hold_s": -1}, "$.turns[0].hold_s"),
        ({"hold_s": 90_000}, "$.turns[0].hold_s"),
        ({"hold_s": 1, "holds": 0}, "$.turns[0].holds"),
    ],
)
def test_a_bad_hold_is_refused(turn: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        read_scenario({"turns": [{"name": "t", "text": "x", **turn}]})
