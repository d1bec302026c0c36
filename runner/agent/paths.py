"""Confinement of the paths a tool call names: every path is resolved inside the attempt's
worktree, or the call is refused before anything runs.

Reads are allowed repository-wide: the runner holds the whole repository anyway (its mirror
and the bundle), and a model that may read only `src/` cannot read the tests it must make
pass. Writes (write_file, apply_patch) are allowed only under `allowed_paths`; an empty list
allows no write at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from tether.runner.agent.errors import ToolRefused


def normalize_prefix(prefix: str) -> str:
    """An allowed-paths entry as a relative POSIX path without `./` or a trailing slash
    (`""` allows the whole tree); a prefix that could name anything outside the tree is a
    `ValueError`."""
    parts = _lexical_parts(prefix)
    if parts is None:
        raise ValueError(f"allowed path {prefix!r} is not a path inside the repository")
    return "/".join(parts)


def _lexical_parts(path: str) -> list[str] | None:
    """The path's parts after `.` and `..` are applied; None when it is absolute, climbs
    above the root, holds a NUL or names `.git`."""
    if "\0" in path or path.startswith(("/", "\\")) or PurePosixPath(path).is_absolute():
        return None
    parts: list[str] = []
    for part in path.replace("\\", "/").split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
            continue
        if part.lower() == ".git":
            return None
        parts.append(part)
    return parts


class Confinement:
    """The rules for one worktree: `resolve(path, write=...)` returns the real path to use."""

    def __init__(self, root: Path, allowed_paths: Iterable[str]) -> None:
        self.root = Path(os.path.realpath(root))
        self.allowed = tuple(sorted({normalize_prefix(p) for p in allowed_paths}))

    def resolve(self, path: str, *, write: bool = False) -> Path:
        """The real path `path` names inside the tree; `ToolRefused` when a rule forbids it."""
        if not isinstance(path, str) or "\0" in path:
            raise ToolRefused("bad_path", "a path must be a string without NUL")
        if path.startswith(("/", "\\", "~")) or PurePosixPath(path).is_absolute():
            raise ToolRefused(
                "path_absolute",
                f"{path!r} is absolute; name a path relative to the repository root",
            )
        parts = _lexical_parts(path)
        if parts is None:
            if any(p.lower() == ".git" for p in path.replace("\\", "/").split("/")):
                raise ToolRefused("path_git_dir", f"{path!r} is inside .git")
            raise ToolRefused("path_escapes", f"{path!r} climbs out of the repository")
        lexical = "/".join(parts)
        real = Path(os.path.realpath(self.root.joinpath(*parts)))
        if real != self.root and not real.is_relative_to(self.root):
            raise ToolRefused(
                "path_symlink_escape", f"{path!r} leads out of the repository through a symlink"
            )
        relative = real.relative_to(self.root).as_posix() if real != self.root else ""
        if any(p.lower() == ".git" for p in relative.split("/")):
            raise ToolRefused("path_git_dir", f"{path!r} leads into .git")
        if write:
            for name in {lexical, relative}:
                if not self.writable(name):
                    raise ToolRefused(
                        "path_not_allowed",
                        f"{path!r} is outside the allowed paths {list(self.allowed)}",
                    )
        return real

    def writable(self, relative: str) -> bool:
        """Whether the normalized relative path lies under an allowed prefix."""
        return any(
            prefix in ("", relative) or relative.startswith(prefix + "/") for prefix in self.allowed
        )

    def relative(self, real: Path) -> str:
        """A resolved path as the model names it (`.` for the root)."""
        return real.relative_to(self.root).as_posix() if real != self.root else "."
