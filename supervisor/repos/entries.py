"""What kind of entries a candidate may add or change (docs/design.md, Verification): each
changed entry of `git diff-tree --raw` judged by its git mode against the task's
`allowed_entries` (`tether.wire.payloads.ENTRY_KINDS`), since names alone hide a symlink to
`/etc/passwd`, a gitlink or a file made executable.

Deleting an entry, or changing a file's content and keeping the base's mode, needs nothing; a
symlink or gitlink changed in any way is judged as a new one.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Collection, Mapping, Sequence

KIND_OF_MODE = {
    "100644": "file",
    "100755": "executable",
    "120000": "symlink",
    "160000": "submodule",
}
_REGULAR = frozenset({"100644", "100755"})
_GONE = "000000"
SHOWN = 10  # entries named in a finding's detail, then "..."


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
    """One changed entry of `git diff-tree -r -z --raw --no-renames`."""

    path: str
    old_mode: str
    new_mode: str
    new_sha: str


def parse_raw(out: bytes) -> list[Entry]:
    """The entries of `git diff-tree -r -z --raw --no-renames` output."""
    fields = out.decode(errors="surrogateescape").split("\0")
    entries = []
    for header, path in zip(fields[0::2], fields[1::2], strict=False):
        if not header.startswith(":"):
            continue
        old_mode, new_mode, _old_sha, new_sha, _status = header[1:].split(" ")
        entries.append(Entry(path=path, old_mode=old_mode, new_mode=new_mode, new_sha=new_sha))
    return entries


def links_to_read(entries: Sequence[Entry], allowed: Collection[str]) -> list[Entry]:
    """The symlinks whose targets `refusals` must see (only when symlinks are allowed)."""
    if "symlink" not in allowed:
        return []
    return [e for e in entries if e.new_mode == "120000"]


def refusals(
    entries: Sequence[Entry], allowed: Collection[str], targets: Mapping[str, bytes]
) -> tuple[list[str], list[str]]:
    """The entries that are not allowed (`path (mode M, kind)`) and the mode changes that are
    not (`path: A -> B`); `targets` holds each symlink of `links_to_read` by path."""
    not_allowed: list[str] = []
    changed: list[str] = []
    for entry in entries:
        old, new = entry.old_mode, entry.new_mode
        if new == _GONE:
            continue
        if new in _REGULAR:
            if "executable" in allowed or old == new:
                continue
            if old in _REGULAR:
                changed.append(f"{entry.path}: {old} -> {new}")
            elif new == "100755":
                not_allowed.append(f"{entry.path} (mode {new}, executable)")
            continue
        # A symlink or gitlink added or changed, or a mode git does not make itself.
        kind = KIND_OF_MODE.get(new, "unknown")
        target = targets.get(entry.path)
        if kind not in allowed:
            not_allowed.append(f"{entry.path} (mode {new}, {kind})")
        elif kind == "symlink" and not target_inside(entry.path, target):
            to = (target or b"").decode(errors="replace")
            not_allowed.append(f"{entry.path} (mode {new}, symlink to {to!r} outside the tree)")
    return not_allowed, changed


def target_inside(path: str, target: bytes | None) -> bool:
    """Whether a symlink at `path` whose target is `target` names a place inside the tree
    (by its text: relative, never above the root, never into `.git`)."""
    if not target or target.startswith(b"/") or b"\0" in target:
        return False
    joined = posixpath.normpath(
        posixpath.join(posixpath.dirname(path), target.decode(errors="replace"))
    )
    parts = joined.split("/")
    return joined != ".." and parts[0] != ".." and ".git" not in {p.lower() for p in parts}


def shown(items: Sequence[str]) -> str:
    return ", ".join(items[:SHOWN]) + (" ..." if len(items) > SHOWN else "")
