"""The agent's exceptions: git work on the runner that fails the step, and a tool call that the
model gets back as an error.

    StepFailure (runner/errors.py)
    ├── TransientFailure
    │   ├── FetchFailed        the repository could not be fetched: retryable on any runner
    │   └── CommandUnbounded   a root runner could not make a command's cgroup: the command
    │                          is not run (the `run` tool tells the model; a check, setup or
    │                          MCP server ends the step, retryable)
    ├── StepRejected
    │   ├── BaseNotFound       the approved base is not a commit of the repository: the task
    │   │                      cannot succeed as approved
    │   ├── WorktreeTooLarge   a command left the worktree past `worktree_max_mb`
    │   └── SetupFailed        a setup command failed (runner/agent/setup.py)
    └── WorkspaceFailed        local git work (worktree, commit, bundle) failed: retryable

    ToolError                  never leaves `ToolBox.call`: it becomes the model's tool result
    ├── ToolRefused            the call broke a rule; it was not executed and is counted
    └── ToolFailed             the call was allowed but did not work (no such file, a patch
                               that does not apply)

Each error carries a stable `code` for the tool result (`{"error": code, "detail": text}`).
"""

from __future__ import annotations

from tether.runner.errors import StepFailure, StepRejected, TransientFailure


class FetchFailed(TransientFailure):
    """The repository could not be fetched into the runner's mirror."""


class CommandUnbounded(TransientFailure):
    """A command's cgroup could not be made on a host that offers cgroups, and as root its
    rlimits do not bound its processes: it was not run. The detail starts
    `command_unbounded:`."""


class BaseNotFound(StepRejected):
    """The approved base SHA is not a commit of the repository."""


class WorktreeTooLarge(StepRejected):
    """A command left the worktree and HOME larger than the runner's `worktree_max_mb`; the
    detail starts `worktree_too_large:`."""


class SetupFailed(StepRejected):
    """A setup command failed; the detail starts `setup_failed:` and names its log."""


class WorkspaceFailed(StepFailure):
    """Git work in the attempt's workspace failed."""


class ToolError(Exception):
    """A tool call did not do what the model asked."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        self.detail = detail
        super().__init__(f"{code}: {detail}")


class ToolRefused(ToolError):
    """The tool call broke a rule of the workspace and was not executed."""


class ToolFailed(ToolError):
    """The tool call was allowed but did not succeed."""
