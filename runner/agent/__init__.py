"""The runner's side of an agent step: the `agent` kind's tool loop (`loop`), the attempt's
repository workspace (`workspace`), per-turn checkpoints and resume (`checkpoints`), the
task's checks at the candidate (`checks`), the confinement of the paths a tool names
(`paths`), the built-in tools and their dispatcher (`tools`), and how an allowed command runs
(`command`, `sandbox`) under its limits (`confine`, `cgroups`, `reaper`)."""

from tether.runner.agent.checkpoints import Checkpointer, Start, resume_start
from tether.runner.agent.checks import CheckLimits, run_checks
from tether.runner.agent.errors import (
    BaseNotFound,
    FetchFailed,
    ToolError,
    ToolFailed,
    ToolRefused,
    WorkspaceFailed,
)
from tether.runner.agent.loop import AgentKind, Finish, LoopResult, run_loop
from tether.runner.agent.paths import Confinement
from tether.runner.agent.sandbox import Bubblewrap, NoSandbox, Sandbox, detect_sandbox
from tether.runner.agent.tools import ToolBox, ToolLimits, ToolLog, ToolResult
from tether.runner.agent.workspace import CleanupRecord, RepoCache, Snapshot, Workspace, commit_date

__all__ = [
    "AgentKind",
    "BaseNotFound",
    "Bubblewrap",
    "CheckLimits",
    "Checkpointer",
    "CleanupRecord",
    "Confinement",
    "FetchFailed",
    "Finish",
    "LoopResult",
    "NoSandbox",
    "RepoCache",
    "Sandbox",
    "Snapshot",
    "Start",
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
    "resume_start",
    "run_checks",
    "run_loop",
]
