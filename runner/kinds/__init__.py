"""Step kinds: what a step of a given `kind` does with its payload. A kind is an async function
`(StepContext) -> StepOutput`; this package holds its interface (`base`, re-exported here for
a kind's author), the built-in `chat` kind (`chat`) and the registry of the kinds a runner
serves (`registry`: `chat`, `agent`, `verify` and the entry-point group
`tether.runner.kinds`). The agent's kinds live in runner/agent/.

The registry is a module of its own rather than this package's body: the agent's modules build
on `base`, and importing `base` runs this file first, so this file imports no kind that does.
"""

from tether.runner.kinds.base import (
    ChatModel,
    StepContext,
    StepKind,
    StepOutput,
    StepServices,
    WindDown,
)

__all__ = ["ChatModel", "StepContext", "StepKind", "StepOutput", "StepServices", "WindDown"]
