"""A second opinion on the three model APIs (issue 27): LiteLLM's proxy in mock mode, run from
its own venv (`make litellm-venv`; skipped without it), answers the runner's requests on every
route it serves.

LiteLLM mocks text on all three routes (`/v1/chat/completions`, `/v1/responses`,
`/v1/messages`), and tool calls (`mock_tool_calls`) only on chat completions: on the other two
it ignores them and calls the real provider (measured with litellm 1.108.7), so the agent
tool loop runs against the chat route only.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.runner.test_runner_processes import free_port
from tether.clocks import LoopClock
from tether.runner.agent import AgentKind, NoSandbox
from tether.runner.kinds.base import StepContext
from tether.runner.kinds.chat import run_chat
from tether.runner.models import MODEL_APIS, Completion, ModelClient, wire_api

pytestmark = pytest.mark.slow

LITELLM = Path(__file__).resolve().parents[2] / "bench" / ".litellm-venv" / "bin" / "litellm"
MASTER_KEY = "sk-litellm-mock-0123456789abcdef"
CONFIG = """\
model_list:
  - model_name: stand-in
    litellm_params: {model: openai/gpt-4o, api_key: unused, mock_response: "mocked answer"}
  - model_name: tool-caller
    litellm_params:
      model: openai/gpt-4o
      api_key: unused
      mock_tool_calls:
        - {id: call_mock_1, type: function,
           function: {name: list_files, arguments: '{"path": "."}'}}
"""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not LITELLM.exists():
        line = "LiteLLM's venv is not built (make litellm-venv)"
        if os.environ.get("CI"):  # .ci/run builds it: under CI a missing venv is a failure
            pytest.fail(line, pytrace=False)
        pytest.skip(line)
    folder = tmp_path_factory.mktemp("litellm")
    (folder / "config.yaml").write_text(CONFIG)
    port = free_port()
    env = {
        **os.environ,
        "LITELLM_MASTER_KEY": MASTER_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "NO_PROXY": "127.0.0.1",
    }
    log = (folder / "proxy.log").open("wb")
    process = subprocess.Popen(
        [
            str(LITELLM),
            "--config",
            str(folder / "config.yaml"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, (folder / "proxy.log").read_text()[-2000:]
            try:
                if httpx.get(f"{url}/health/liveliness", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "LiteLLM's proxy did not start in 120 s"
            time.sleep(0.25)
        yield f"{url}/v1"
    finally:
        process.kill()
        process.wait()
        log.close()


def bound(url: str, api: str) -> ModelClient:
    return ModelClient(base_url=url, clock=LoopClock(), api=wire_api(api))


def step(chat: object, payload: dict[str, object], model: str) -> StepContext:
    return StepContext(
        step_id="s1",
        task_id="t1",
        name="ask",
        attempt=1,
        payload=payload,
        outputs=(),
        default_model=model,
        chat=chat,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("api", MODEL_APIS)
async def test_each_api_runs_a_chat_step_against_litellms_mock(proxy: str, api: str) -> None:
    model = bound(proxy, api)

    async def chat(body: dict[str, object]) -> Completion:
        return await model.chat(body, key=MASTER_KEY, deadline=anyio.current_time() + 60)

    try:
        done = await run_chat(
            step(
                chat,
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64},
                "stand-in",
            )
        )
    finally:
        await model.aclose()
    assert done.output["text"] == "mocked answer"
    assert done.usage["total_tokens"] > 0


async def test_the_agent_tool_loop_runs_against_litellms_mocked_tool_calls(
    proxy: str, tmp_path: Path
) -> None:
    model = bound(proxy, "chat")

    async def chat(body: dict[str, object]) -> Completion:
        return await model.chat(body, key=MASTER_KEY, deadline=anyio.current_time() + 60)

    kind = AgentKind(cache_dir=tmp_path / "cache", sandbox=NoSandbox(why="no commands"))
    payload = {
        "messages": [{"role": "user", "content": "look"}],
        "allowed_commands": [],
        "max_turns": 2,
    }
    try:
        done = await kind(step(chat, payload, "tool-caller"))
    finally:
        await model.aclose()
    # The mock calls list_files every turn: the loop runs it and stops at max_turns.
    assert (done.output["finish"], done.output["tool_calls"], done.output["tool_errors"]) == (
        "max_turns",
        2,
        0,
    )
