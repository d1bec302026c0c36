"""The runner's side of an agent step: the `agent` kind's tool loop (`loop`), the attempt's
repository workspace (`workspace`), the confinement of the paths a tool names (`paths`), the
built-in tools and their dispatcher (`tools`), and how an allowed command runs (`command`,
`sandbox`)."""

from runner.agent.errors import (
    BaseNotFound,
    FetchFailed,
    ToolError,
    ToolFailed,
    ToolRefused,
    WorkspaceFailed,
)
from runner.agent.loop import AgentKind, Finish, LoopResult, run_loop
from runner.agent.paths import Confinement
from runner.agent.sandbox import Bubblewrap, NoSandbox, Sandbox, detect_sandbox
from runner.agent.tools import ToolBox, ToolLimits, ToolLog, ToolResult
from runner.agent.workspace import CleanupRecord, RepoCache, Workspace, commit_date

__all__ = [
    "AgentKind",
    "BaseNotFound",
    "Bubblewrap",
    "CleanupRecord",
    "Confinement",
    "FetchFailed",
    "Finish",
    "LoopResult",
    "NoSandbox",
    "RepoCache",
    "Sandbox",
    "ToolBox",
    "ToolError",
    "ToolFailed",
    "ToolLimits",
    "ToolLog",
    "ToolRefused",
    "ToolResult",
    "Workspace",
    "WorkspaceFailed",
    "commit_date",
    "detect_sandbox",
    "run_loop",
]
