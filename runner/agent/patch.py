"""The paths a unified diff touches, read from its headers, so that `apply_patch` can check
every one of them before `git apply` runs (git's own `--numstat` names only the new side of
a rename), and the modes it would give them: what the supervisor refuses in a candidate
(`supervisor/repos/entries.py`) is refused here before anything is written."""

from __future__ import annotations

import re
from collections.abc import Collection

from tether.runner.agent.errors import ToolRefused

_HEADER = re.compile(r"^(rename from|rename to|copy from|copy to) (.*)$")
_MODE = re.compile(r"^(new file mode|new mode) (\d+)$")
_LINK_MODES = frozenset({"120000", "160000"})  # symlink, submodule


def patch_paths(patch: str, allowed_entries: Collection[str] = ("file",)) -> set[str]:
    """Every path the patch names, with the `a/` and `b/` prefixes taken off; `ToolRefused`
    for a quoted path, a symlink or submodule it would create (never, whatever
    `allowed_entries` says: a command may make those), or, unless `allowed_entries` holds
    "executable", an executable file it would create or a mode it would change."""
    paths: set[str] = set()
    lines = patch.splitlines()
    for index, line in enumerate(lines):
        # A file header is a `---` line followed by a `+++` line (a lone one is hunk text).
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if line.startswith("--- ") and following.startswith("+++ "):
            for header in (line, following):
                name = header[4:].split("\t", 1)[0]
                if name != "/dev/null":
                    paths.add(_strip_prefix(_unquoted(name)))
        elif line.startswith("diff --git "):
            rest = line[len("diff --git ") :]
            _unquoted(rest)
            old, sep, new = rest.partition(" b/")
            if sep:
                paths.update({_strip_prefix(old), new})
        elif match := _HEADER.match(line):
            paths.add(_unquoted(match.group(2)))
        elif match := _MODE.match(line):
            if match.group(2) in _LINK_MODES:
                raise ToolRefused("patch_link", "a patch may not create a symlink or a submodule")
            if "executable" in allowed_entries:
                continue
            if match.group(1) == "new mode":
                raise ToolRefused(
                    "mode_changed",
                    f"the patch changes a file's mode to {match.group(2)}; allowed_entries"
                    ' lacks "executable"',
                )
            if match.group(2) != "100644":
                raise ToolRefused(
                    "entry_not_allowed",
                    f"the patch creates a file of mode {match.group(2)}; allowed_entries"
                    ' lacks "executable"',
                )
    return paths


def _unquoted(name: str) -> str:
    if name.startswith('"'):
        raise ToolRefused(
            "patch_quoted_path", "quoted paths (names with special characters) are not supported"
        )
    return name


def _strip_prefix(name: str) -> str:
    _first, sep, rest = name.partition("/")
    return rest if sep else name
