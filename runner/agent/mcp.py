"""Tools from MCP servers for an agent step (docs/design.md, The agent kind): each server an
agent payload lists (`mcp_servers`) is started over stdio in the step's sandbox, in the
worktree, with the same environment as an allowed command (no token, no key); its tools are
offered to the model as `mcp__<server>__<tool>` and every call goes through `ToolBox`, so it
is counted, capped, traced and checkpointed like a built-in tool.

The MCP SDK (`mcp`, the extra `tether[mcp]`) is imported only when a step lists a server, so
the light runner neither needs nor loads it. A runner without it releases such a step
`operator` (another runner may have it). A server that does not start, or does not answer
`initialize` and `tools/list` within `START_TIMEOUT_S`, fails the step naming the server: the
payload asked for something that does not work.

The SDK runs each server's pipes in task groups of its own; an exception raised inside one
(our `LeaseLost` among them) would come out wrapped in an `ExceptionGroup`. `serving`
hands a lone wrapped exception on unwrapped, so the runner sees the `LeaseLost` it expects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Final

import anyio
import structlog

from tether.runner.agent.command import command_env
from tether.runner.agent.confine import Confiner
from tether.runner.agent.errors import ToolFailed
from tether.runner.errors import OperatorProblem, StepRejected
from tether.wire.payloads import McpServer

log = structlog.get_logger(__name__)

PREFIX: Final = "mcp__"
START_TIMEOUT_S: Final = 30.0
# OpenAI's rule for a function's name; Anthropic's and Responses' are no wider.
_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")

# The argv that starts a server: the sandbox's (and the command limits') wrapping of its own.
Wrap = Callable[[Sequence[str]], list[str]]


class McpUnavailable(OperatorProblem):
    """This runner has no MCP SDK: install the extra (`pip install 'tether[mcp]'`)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class McpTool:
    server: str
    tool: str  # the server's own name for it
    description: str
    schema: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.server}__{self.tool}"

    def spec(self) -> dict[str, Any]:
        """The tool as the model is offered it (a Chat Completions function)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": f"[MCP server {self.server}] {self.description}".strip(),
                "parameters": self.schema or {"type": "object", "properties": {}},
            },
        }


class McpTools:
    """The tools of the step's running MCP servers, and calls to them."""

    def __init__(self, sessions: dict[str, Any], tools: list[McpTool], call_timeout_s: float):
        self._sessions = sessions
        self._tools = {t.name: t for t in tools}
        self._call_timeout_s = call_timeout_s

    def specs(self) -> list[dict[str, Any]]:
        return [t.spec() for t in self._tools.values()]

    def names(self) -> frozenset[str]:
        return frozenset(self._tools)

    async def call(self, name: str, arguments_json: str | bytes) -> dict[str, Any]:
        """Call one tool; its error, a bad argument or a silent server is a `ToolFailed` the
        model sees, never the step's end."""
        tool = self._tools[name]
        try:
            arguments = json.loads(arguments_json or "{}")
        except ValueError as exc:
            raise ToolFailed("bad_arguments", f"the arguments are not JSON: {exc}") from None
        if not isinstance(arguments, dict):
            raise ToolFailed("bad_arguments", "the arguments must be a JSON object")
        from mcp.shared.exceptions import MCPError

        session = self._sessions[tool.server]
        try:
            with anyio.fail_after(self._call_timeout_s):
                result = await session.call_tool(tool.tool, arguments)
        except TimeoutError:
            raise ToolFailed(
                "timeout", f"MCP server {tool.server} did not answer in {self._call_timeout_s} s"
            ) from None
        except MCPError as exc:
            raise ToolFailed("mcp_error", f"MCP server {tool.server}: {exc}") from None
        text = "\n".join(_text_of(block) for block in result.content)
        if result.is_error:
            raise ToolFailed("mcp_tool_error", text or f"{tool.tool} reported an error")
        body: dict[str, Any] = {"content": text}
        if result.structured_content is not None:
            body["structured"] = result.structured_content
        return body


def _text_of(block: Any) -> str:
    text = getattr(block, "text", None)
    if isinstance(text, str):
        return text
    return f"[{getattr(block, 'type', 'content')} omitted]"


@contextlib.asynccontextmanager
async def serving(
    servers: Sequence[McpServer],
    *,
    tree: Path,
    home: Path,
    wrap: Wrap,
    confiner: Confiner,
    call_timeout_s: float,
) -> AsyncIterator[McpTools | None]:
    """Start `servers` (none: yields None and imports nothing), each wrapped by the sandbox
    (`wrap`) and under the command limits (`confiner`), list their tools, and stop them all
    on the way out."""
    if not servers:
        yield None
        return
    try:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
    except ImportError:
        raise McpUnavailable(action="install tether[mcp] on this runner") from None
    try:
        async with contextlib.AsyncExitStack() as stack:
            # A server's stderr is the repository's code talking: it goes nowhere.
            discard = stack.enter_context(open(os.devnull, "w"))  # noqa: ASYNC230, SIM115
            sessions: dict[str, Any] = {}
            tools: list[McpTool] = []
            for server in servers:
                confined = await stack.enter_async_context(confiner.confine(wrap(server.command)))
                argv = confined.argv
                params = StdioServerParameters(
                    command=argv[0], args=argv[1:], env=command_env(home), cwd=str(tree)
                )
                try:
                    read, write = await stack.enter_async_context(
                        stdio_client(params, errlog=discard)
                    )
                    session = await stack.enter_async_context(ClientSession(read, write))
                    # Only the requests are timed: a cancel scope around entering the SDK's
                    # contexts would close before their task groups do.
                    with anyio.fail_after(START_TIMEOUT_S):
                        await session.initialize()
                        listed = await session.list_tools()
                except Exception as exc:  # the SDK's many errors: the server does not work
                    raise StepRejected(
                        f"MCP server {server.name} did not start: {_said(exc)}"
                    ) from None
                sessions[server.name] = session
                tools += _offered(server.name, listed.tools)
            log.info("mcp servers started", servers=[s.name for s in servers], tools=len(tools))
            yield McpTools(sessions, tools, call_timeout_s)
    except BaseExceptionGroup as group:
        lone = _lone(group)
        if lone is group:
            raise
        raise lone from None


def _lone(exc: BaseException) -> BaseException:
    """The one exception inside groups of one (the SDK nests a task group per layer)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _offered(server: str, listed: Sequence[Any]) -> list[McpTool]:
    offered = []
    for tool in listed:
        made = McpTool(
            server=server,
            tool=str(tool.name),
            description=str(tool.description or ""),
            schema=dict(tool.input_schema or {}),
        )
        if _TOOL_NAME.fullmatch(made.name) is None:
            log.warning("mcp tool left out: its name is not a valid tool name", tool=made.name)
            continue
        offered.append(made)
    return offered


def _said(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer to initialize and tools/list within {START_TIMEOUT_S} s"
    return str(exc) or type(exc).__name__
