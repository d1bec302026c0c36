"""A notice from anything else: a file whose existence is the notice (a shutdown hook, a
provider's agent, an operator's `touch`). It names no deadline."""

from __future__ import annotations

from pathlib import Path

import anyio

from tether.runner.preemption.notice import Notice


class FileNotice:
    """Polls whether `path` exists."""

    provider = "file"

    def __init__(self, path: Path) -> None:
        self._path = anyio.Path(path)

    async def poll(self) -> Notice | None:
        if not await self._path.exists():
            return None
        return Notice(provider=self.provider, action="file", deadline=None, left_s=None)
