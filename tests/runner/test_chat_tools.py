"""Tool calls in `chat` (issue 12, item 1): a bad `tools` or `tool_choice` is refused at submit
naming the field, and a step whose model answers with tool calls commits an output holding them,
run by a real runner against a real supervisor and the stand-in model, all in process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from examples.standin_model import create_app, read_scenario
from tests.api_tasks import submitted
from tests.conftest import ApiHarness, assert_error, ledger_snapshot
from tests.runner.test_runner_fakes import settings
from tether.clocks import LoopClock
from tether.runner.credentials import SecretSource
from tether.runner.daemon import Runner
from tether.runner.kinds.registry import KindRegistry
from tether.runner.model_client import ModelClient
from tether.runner.models import wire_api
from tether.runner.supervisor_client import SupervisorClient

LIST_FILES = {
    "type": "function",
    "function": {
        "name": "list_files",
        "description": "List the files under a folder.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
}
ASK = [{"role": "user", "content": "What is under src/?"}]


def step(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "idempotency_key": "k",
        "plan": {"steps": [{"name": "look", "kind": "chat", "payload": payload}]},
    }


BAD_TOOLS: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "tool_choice_without_tools",
        {"messages": ASK, "tool_choice": "auto"},
        ["'plan.steps[0].payload.tool_choice'", "needs `tools`", "'look'"],
    ),
    (
        "tool_choice_unknown_word",
        {"messages": ASK, "tools": [LIST_FILES], "tool_choice": "any"},
        ["'plan.steps[0].payload.tool_choice'", "'any'"],
    ),
    (
        "tool_choice_undeclared",
        {
            "messages": ASK,
            "tools": [LIST_FILES],
            "tool_choice": {"type": "function", "function": {"name": "rm"}},
        },
        ["'plan.steps[0].payload.tool_choice.function.name'", "'rm' is not a declared tool"],
    ),
    (
        "tool_type",
        {"messages": ASK, "tools": [{**LIST_FILES, "type": "code_interpreter"}]},
        ["'plan.steps[0].payload.tools[0].type'", "'code_interpreter'"],
    ),
    (
        "tool_name",
        {"messages": ASK, "tools": [{"type": "function", "function": {"name": "ls -l"}}]},
        ["'plan.steps[0].payload.tools[0].function.name'"],
    ),
    (
        "tool_key_typo",
        {
            "messages": ASK,
            "tools": [{"type": "function", "function": {"name": "ls", "paramters": {}}}],
        },
        ["`paramters`", "did you mean `parameters`"],
    ),
    (
        "schema_not_an_object",
        {
            "messages": ASK,
            "tools": [
                {"type": "function", "function": {"name": "ls", "parameters": {"type": "string"}}}
            ],
        },
        ["'plan.steps[0].payload.tools[0].function'", "JSON Schema of type `object`"],
    ),
    (
        "tool_message_without_call",
        {"messages": [*ASK, {"role": "tool", "tool_call_id": "c1", "content": "a.py"}]},
        ["'plan.steps[0].payload.messages[1].tool_call_id'", "answers no open call"],
    ),
]


@pytest.mark.parametrize(
    ("payload", "words"), [c[1:] for c in BAD_TOOLS], ids=[c[0] for c in BAD_TOOLS]
)
async def test_a_bad_tool_shape_is_refused_at_submit_naming_the_field(
    api: ApiHarness, payload: dict[str, Any], words: list[str]
) -> None:
    before = {t: rows for t, rows in ledger_snapshot(api.path).items() if t != "tokens"}
    response = await api.client.post("/v1/tasks", headers=api.operator, json=step(payload))
    detail = assert_error(response, 422, "invalid_field")["detail"]
    for word in words:
        assert word in detail
    after = {t: rows for t, rows in ledger_snapshot(api.path).items() if t != "tokens"}
    assert after == before


SCENARIO = {
    "turns": [
        {
            "name": "look",
            "assistant_turns": 0,
            "tool_calls": [{"name": "list_files", "arguments": {"path": "src/"}}],
        },
        {"name": "answer", "assistant_turns": 1, "text": "src/ holds a.py"},
    ]
}


async def run_steps(
    api: ApiHarness,
    tmp_path: Path,
    model_app: Any,
    task_id: str,
    kinds: KindRegistry | None = None,
    *,
    model_key: str = "unused",
    within_s: float = 10,
    model_api: str = "chat",
) -> Any:
    """Serve one runner against `api` and `model_app` (speaking `model_api`) until the task
    ends (within `within_s`); its view."""
    (tmp_path / "runner-token").write_text(api.secrets["runner"] + "\n")
    (tmp_path / "model-key").write_text(model_key + "\n")
    cfg = settings(
        model_key_file=tmp_path / "model-key",
        token_file=tmp_path / "runner-token",
        claim_wait_s=0.05,
        model_api=model_api,
    )
    clock = LoopClock()
    runner = Runner(
        settings=cfg,
        supervisor=SupervisorClient(
            base_url=cfg.supervisor_url,
            token=api.secrets["runner"],
            clock=clock,
            transport=httpx.ASGITransport(app=api.app),
        ),
        model=ModelClient(
            base_url=cfg.model_url,
            clock=clock,
            transport=httpx.ASGITransport(app=model_app),
            api=wire_api(model_api),
        ),
        model_key=SecretSource(
            path=tmp_path / "model-key", credential="model-key", setting="model_key_file"
        ),
        kinds=kinds or KindRegistry.default(entry_points=False),
        clock=clock,
        backoff_max_s=0.05,
    )
    view: Any = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.run)
        with anyio.fail_after(within_s):
            while True:
                response = await api.client.get(f"/v1/tasks/{task_id}", headers=api.operator)
                view = response.json()
                if view["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    break
                await anyio.sleep(0.02)
        runner.request_shutdown()
    return view


async def approved_task(api: ApiHarness, payload: dict[str, Any]) -> str:
    return str((await submitted(api, step(payload)))["id"])


async def test_a_step_answered_with_tool_calls_commits_an_output_holding_them(
    api: ApiHarness, tmp_path: Path
) -> None:
    model_app = create_app(scenario=read_scenario(SCENARIO))
    payload = {"messages": ASK, "tools": [LIST_FILES], "tool_choice": "auto"}
    view = await run_steps(api, tmp_path, model_app, await approved_task(api, payload))
    assert view["state"] == "SUCCEEDED", view
    (committed,) = view["steps"]
    output = committed["output"]
    assert output["finish_reason"] == "tool_calls"
    assert output["text"] == ""
    (call,) = output["tool_calls"]
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"] == {"name": "list_files", "arguments": '{"path":"src/"}'}
    assert output["usage"]["total_tokens"] > 0
    assert "extra" not in output  # the stand-in's message holds nothing else
    assert model_app.state.turns == ["look"]


async def test_a_step_given_the_tool_results_gets_the_models_next_turn(
    api: ApiHarness, tmp_path: Path
) -> None:
    model_app = create_app(scenario=read_scenario(SCENARIO))
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "list_files", "arguments": '{"path":"src/"}'},
    }
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
    ]
    payload = {"messages": messages, "tools": [LIST_FILES]}
    view = await run_steps(api, tmp_path, model_app, await approved_task(api, payload))
    assert view["state"] == "SUCCEEDED", view
    output = view["steps"][0]["output"]
    assert (output["text"], output["finish_reason"]) == ("src/ holds a.py", "stop")
    assert "tool_calls" not in output
    assert model_app.state.turns == ["answer"]
