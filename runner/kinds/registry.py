"""The step kinds a runner serves, by name: `chat` (runner/kinds/chat.py), `agent` (a tool
loop in a workspace: runner/agent/loop.py), `verify` (a task's checks re-run at another
runner's candidate: runner/agent/verify.py), and whatever a deployment adds with
`KindRegistry.register` or, without touching the runner's code, through the entry-point group
`tether.runner.kinds` (`name = "package.module:function"`), loaded at start.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable
from pathlib import Path

from tether.runner.agent.confine import CommandLimits
from tether.runner.agent.loop import AgentKind
from tether.runner.agent.verify import VerifyKind
from tether.runner.errors import StepUnsupported
from tether.runner.kinds.base import StepKind
from tether.runner.kinds.chat import run_chat

ENTRY_POINT_GROUP = "tether.runner.kinds"


class KindRegistry:
    """Kinds by name. `default()` holds `chat`, `agent`, `verify` and whatever entry points
    add."""

    def __init__(self, kinds: Iterable[tuple[str, StepKind]] = ()) -> None:
        self._kinds: dict[str, StepKind] = {}
        for name, kind in kinds:
            self.register(name, kind)

    def register(self, name: str, kind: StepKind) -> None:
        if not name or not name.isprintable():
            raise ValueError(f"step kind name {name!r} is not usable")
        self._kinds[name] = kind

    def get(self, name: str) -> StepKind:
        try:
            return self._kinds[name]
        except KeyError:
            known = ", ".join(sorted(self._kinds)) or "none"
            raise StepUnsupported(
                f"this runner has no step kind {name!r} (it knows: {known})"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._kinds)

    @classmethod
    def default(
        cls,
        *,
        entry_points: bool = True,
        commands_without_sandbox: bool = False,
        command_limits: CommandLimits | None = None,
        sandbox_read_only: Iterable[Path] = (),
    ) -> KindRegistry:
        """`commands_without_sandbox`, `command_limits` and `sandbox_read_only` are the
        runner's settings, for the agent kind."""
        agent = AgentKind(
            commands_without_sandbox=commands_without_sandbox,
            command_limits=command_limits,
            sandbox_read_only=tuple(sandbox_read_only),
        )
        registry = cls([("chat", run_chat), ("agent", agent), ("verify", VerifyKind(agent))])
        if entry_points:
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                registry.register(ep.name, ep.load())
        return registry
