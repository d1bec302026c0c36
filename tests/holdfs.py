"""A FUSE file system that loses what a power cut loses, for tests/drills/test_power_loss.py.

`python -m tests.holdfs BACKING MOUNTPOINT` mounts BACKING's files at MOUNTPOINT. Every operation
passes through to BACKING at once (reads see every write), while the file system keeps apart
what a disk would have made durable, as POSIX promises it and no more:

- a file's bytes as of its last `fsync` (a new file: empty until then);
- a folder's names as of its last `fsync` of the folder: a create, mkdir, link, unlink or
  rename not followed by one is lost, and a new folder whose parent was not synced is lost
  whole, whatever was synced inside it.

What was there at mount is durable. `drop` (the power cut) rewrites BACKING to hold only the
durable state, and from then on every operation fails with EIO until the file system is
unmounted; mounting BACKING again is the machine coming back.

Commands on stdin, one JSON object a line, each answered by one line on stdout:

    {"do": "arm", "op": "write", "path": "mirrors/*/objects/pack/tmp_pack_*",
     "caller": "fetch", "after": false, "skip": 0}
        hold the first operation `op` (any when left out) on a path matching the glob (any
        when left out), by a process whose command line, or a parent's, holds `caller`, past
        the `skip` first matches; `after`: once it is done instead of before. The held
        operation's caller waits (and with a single-threaded file system, everyone): a frozen
        instant. Its line, `held OP PATH`, comes when it happens.
    {"do": "drop"}     the power cut: releases a held operation with EIO; `dropped`.
    {"do": "stats"}    counters, as JSON.

The first line out is `ready` once the kernel has mounted it. Single-threaded (libfuse's `-s`),
with one lock besides for the command thread.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import json
import os
import shutil
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import mfusepy

F = TypeVar("F", bound=Callable[..., Any])


class Node:
    """A file, folder or symbolic link as the disk knows it. `durable` (a file's bytes) and
    `entries` (a folder's names) are None while the node is unchanged since the mount: the
    live one is the durable one then."""

    def __init__(self, kind: str, live: int | None, mode: int) -> None:
        self.kind = kind  # "file" | "dir" | "link"
        self.live = live  # the backing inode number, while the node lives
        self.mode = mode
        self.durable: bytearray | None = None
        self.pending: list[tuple[int, int, bytes]] = []  # (offset, truncate_to or -1, data)
        self.entries: dict[str, int] | None = None
        self.target = ""


class Disk:
    """The durable state beside the live one in `backing`."""

    def __init__(self, backing: Path) -> None:
        self.backing = backing
        self.nodes: dict[int, Node] = {}
        self.by_inode: dict[int, int] = {}
        self.root = self.node_of(os.lstat(backing))

    def real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def node_of(self, st: os.stat_result) -> int:
        found = self.by_inode.get(st.st_ino)
        if found is not None:
            return found
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode) else "file"
        node_id = len(self.nodes) + 1
        self.nodes[node_id] = Node(kind, st.st_ino, st.st_mode)
        self.by_inode[st.st_ino] = node_id
        return node_id

    def new(self, real: str, kind: str) -> int:
        """A node just created at `real`: a file durably empty, a folder durably empty."""
        st = os.lstat(real)
        self.by_inode.pop(st.st_ino, None)
        node_id = self.node_of(st)
        node = self.nodes[node_id]
        if kind == "file":
            node.durable = bytearray()
        elif kind == "dir":
            node.entries = {}
        else:
            node.target = os.readlink(real)
        return node_id

    def live_entries(self, real: str) -> dict[str, int]:
        return {name: self.node_of(os.lstat(os.path.join(real, name))) for name in os.listdir(real)}

    def folder_changes(self, path: str) -> None:
        """Before a name in `path`'s folder changes: keep its durable names."""
        real = os.path.dirname(self.real(path).rstrip("/"))
        node = self.nodes[self.node_of(os.lstat(real))]
        if node.entries is None:
            node.entries = self.live_entries(real)

    def file_changes(self, node_id: int, fd: int | None = None, real: str | None = None) -> Node:
        """Before a file's bytes change: keep its durable bytes."""
        node = self.nodes[node_id]
        if node.durable is None:
            if fd is not None:
                node.durable = bytearray(read_all(fd))
            else:
                assert real is not None
                with open(real, "rb") as fh:
                    node.durable = bytearray(fh.read())
        return node

    def dies(self, real: str) -> None:
        """`real` is about to lose its last name: keep what the disk holds of it."""
        st = os.lstat(real)
        node_id = self.node_of(st)
        node = self.nodes[node_id]
        if node.kind == "dir":
            if node.entries is None:
                node.entries = {}  # unchanged since the mount and empty now: empty then
        elif node.kind == "file":
            if st.st_nlink > 1:
                return
            self.file_changes(node_id, real=real)
        node.live = None
        self.by_inode.pop(st.st_ino, None)

    def synced(self, node: Node) -> None:
        if node.durable is None:
            node.pending.clear()
            return
        for offset, truncate_to, data in node.pending:
            if truncate_to >= 0:
                del node.durable[truncate_to:]
                node.durable.extend(b"\0" * (truncate_to - len(node.durable)))
            else:
                if len(node.durable) < offset:
                    node.durable.extend(b"\0" * (offset - len(node.durable)))
                node.durable[offset : offset + len(data)] = data
        node.pending.clear()

    def rebuild(self) -> int:
        """Rewrite `backing` to hold the durable state only; return how many files it has."""
        live_paths: dict[int, str] = {}
        for folder, dirs, files in os.walk(self.backing):
            live_paths.setdefault(os.lstat(folder).st_ino, folder)
            for name in dirs + files:
                path = os.path.join(folder, name)
                live_paths.setdefault(os.lstat(path).st_ino, path)
        built = self.backing.with_name(self.backing.name + ".rebuilt")
        shutil.rmtree(built, ignore_errors=True)
        made: dict[int, str] = {}
        visiting: set[int] = set()
        count = 0

        def build(node_id: int, dest: str) -> None:
            nonlocal count
            node = self.nodes[node_id]
            live = None if node.live is None else live_paths.get(node.live)
            if node.kind == "dir":
                if node_id in visiting:
                    return
                visiting.add(node_id)
                os.mkdir(dest)
                entries = node.entries
                if entries is None:
                    assert live is not None, "a folder unchanged since the mount is alive"
                    entries = self.live_entries(live)
                for name, child in entries.items():
                    build(child, os.path.join(dest, name))
                os.chmod(dest, stat.S_IMODE(node.mode))
                visiting.discard(node_id)
            elif node.kind == "link":
                os.symlink(node.target or (os.readlink(live) if live else ""), dest)
            elif node_id in made:
                os.link(made[node_id], dest)
            else:
                if node.durable is None:
                    assert live is not None, "a file unchanged since the mount is alive"
                    shutil.copyfile(live, dest)
                else:
                    with open(dest, "wb") as fh:
                        fh.write(node.durable)
                os.chmod(dest, stat.S_IMODE(os.lstat(live).st_mode if live else node.mode))
                made[node_id] = dest
                count += 1

        build(self.root, str(built))
        cut = self.backing.with_name(self.backing.name + ".cut")
        os.rename(self.backing, cut)
        os.rename(built, self.backing)
        shutil.rmtree(cut)
        return count


def backing_flags(flags: int) -> int:
    """`flags` for our own descriptor: readable (a file's durable bytes are read through it
    before its first change), never appending (the kernel gives every write its offset), and
    neither creating nor truncating (done apart, to keep what the disk holds first)."""
    if flags & os.O_ACCMODE == os.O_WRONLY:
        flags = (flags & ~os.O_ACCMODE) | os.O_RDWR
    return flags & ~(os.O_APPEND | os.O_TRUNC | os.O_CREAT | os.O_EXCL)


def read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def callers(pid: int) -> str:
    """The command lines of `pid` and its parents, up to four, as one string."""
    seen = []
    for _ in range(4):
        try:
            seen.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            pid = int(fields[1])
        except (OSError, ValueError, IndexError):
            break
        if pid <= 1:
            break
    return " | ".join(seen)


def operation(name: str) -> Callable[[F], F]:
    """An operation: held if armed for it, refused once the power is cut, run under the lock."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(self: HoldFS, path: str | None, *args: Any) -> Any:
            self.hold_if_armed(name, path, before=True)
            with self.mutex:
                if self.dead:
                    raise mfusepy.FuseOSError(errno.EIO)
                self.counts[name] = self.counts.get(name, 0) + 1
                result = fn(self, path, *args)
            self.hold_if_armed(name, path, before=False)
            return result

        return run  # type: ignore[return-value]

    return wrap


class HoldFS(mfusepy.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, backing: Path) -> None:
        self.disk = Disk(backing)
        self.mutex = threading.Lock()
        self.out = threading.Lock()
        self.dead = False
        self.handles: dict[int, int] = {}  # our descriptor -> node
        self.counts: dict[str, int] = {}
        self.armed: dict[str, Any] | None = None
        self.released = threading.Event()

    # -- the commands -------------------------------------------------------------------------

    def say(self, line: str) -> None:
        with self.out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def hold_if_armed(self, op: str, path: str | None, *, before: bool) -> None:
        armed = self.armed
        if armed is None or bool(armed.get("after")) == before:
            return
        if armed.get("op") not in (None, op):
            return
        relative = (path or "").lstrip("/")
        if armed.get("path") is not None and not fnmatch.fnmatch(relative, armed["path"]):
            return
        if armed.get("caller") is not None:
            _, _, pid = mfusepy.fuse_get_context()
            if armed["caller"] not in callers(pid):
                return
        with self.mutex:
            if self.armed is not armed:
                return
            if armed.get("skip", 0) > 0:
                armed["skip"] -= 1
                return
            self.armed = None
        self.say(f"held {op} {relative}")
        self.released.wait()
        raise mfusepy.FuseOSError(errno.EIO)

    def command(self, line: str) -> None:
        order = json.loads(line)
        if order["do"] == "arm":
            with self.mutex:
                self.armed = order
            self.say("armed")
        elif order["do"] == "drop":
            with self.mutex:
                self.dead = True
                self.armed = None
                files = self.disk.rebuild()
            self.released.set()
            self.say(f"dropped {files}")
        elif order["do"] == "stats":
            with self.mutex:
                self.say(json.dumps(self.counts))
        else:
            self.say(f"unknown {order['do']}")

    def init(self, path: str) -> None:
        threading.Thread(target=self.commands, daemon=True).start()
        self.say("ready")

    def commands(self) -> None:
        for line in sys.stdin:
            if line.strip():
                self.command(line)

    # -- the operations -----------------------------------------------------------------------

    def real(self, path: str) -> str:
        return self.disk.real(path)

    @operation("getattr")
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        st = os.fstat(fh) if fh is not None else os.lstat(self.real(path or "/"))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino")
        found: dict[str, Any] = {k: getattr(st, k) for k in keys}
        found |= {"st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns}
        found["st_ctime"] = st.st_ctime_ns
        return found

    @operation("readdir")
    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self.real(path))]

    @operation("readlink")
    def readlink(self, path: str) -> str:
        return os.readlink(self.real(path))

    @operation("access")
    def access(self, path: str, amode: int) -> int:
        if not os.access(self.real(path), amode):
            raise mfusepy.FuseOSError(errno.EACCES)
        return 0

    @operation("statfs")
    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.real(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files")
        return {k: getattr(st, k) for k in (*keys, "f_flag", "f_frsize", "f_namemax")}

    @operation("chmod")
    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self.real(path), mode)
        return 0

    @operation("chown")
    def chown(self, path: str, uid: int, gid: int) -> int:
        os.lchown(self.real(path), uid, gid)
        return 0

    @operation("utimens")
    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self.real(path), ns=times)
        return 0

    @operation("mkdir")
    def mkdir(self, path: str, mode: int) -> int:
        self.disk.folder_changes(path)
        os.mkdir(self.real(path), mode)
        self.disk.new(self.real(path), "dir")
        return 0

    @operation("rmdir")
    def rmdir(self, path: str) -> int:
        self.disk.folder_changes(path)
        self.disk.dies(self.real(path))
        os.rmdir(self.real(path))
        return 0

    @operation("unlink")
    def unlink(self, path: str) -> int:
        self.disk.folder_changes(path)
        self.disk.dies(self.real(path))
        os.unlink(self.real(path))
        return 0

    @operation("symlink")
    def symlink(self, target: str, source: str) -> int:
        self.disk.folder_changes(target)
        os.symlink(source, self.real(target))
        self.disk.new(self.real(target), "link")
        return 0

    @operation("link")
    def link(self, target: str, source: str) -> int:
        self.disk.folder_changes(target)
        os.link(self.real(source), self.real(target))
        return 0

    @operation("rename")
    def rename(self, old: str, new: str) -> int:
        self.disk.folder_changes(old)
        self.disk.folder_changes(new)
        real_old, real_new = self.real(old), self.real(new)
        if os.path.lexists(real_new) and os.lstat(real_new).st_ino != os.lstat(real_old).st_ino:
            self.disk.dies(real_new)
        os.rename(real_old, real_new)
        return 0

    @operation("create")
    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        real = self.real(path)
        existed = os.path.lexists(real)
        if not existed:
            self.disk.folder_changes(path)
        fd = os.open(real, backing_flags(flags) | os.O_CREAT, mode)
        if not existed:
            self.handles[fd] = self.disk.new(real, "file")
            return fd
        return self._opened(fd, flags)

    @operation("open")
    def open(self, path: str, flags: int) -> int:
        return self._opened(os.open(self.real(path), backing_flags(flags)), flags)

    def _opened(self, fd: int, flags: int) -> int:
        self.handles[fd] = self.disk.node_of(os.fstat(fd))
        if flags & os.O_TRUNC:
            self._truncate(fd, 0)
        return fd

    def _truncate(self, fd: int, length: int) -> None:
        """Truncate our descriptor `fd`'s file, keeping its durable bytes first."""
        node = self.disk.file_changes(self.handles[fd], fd=fd)
        if length == 0:  # nothing pending before it matters any more
            node.pending = [(0, 0, b"")]
        else:
            node.pending.append((0, length, b""))
        os.ftruncate(fd, length)

    @operation("read")
    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    @operation("write")
    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        node = self.disk.file_changes(self.handles[fh], fd=fh)
        node.pending.append((offset, -1, bytes(data)))
        return os.pwrite(fh, data, offset)

    @operation("truncate")
    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        if fh is not None and fh in self.handles:
            self._truncate(fh, length)
            return 0
        fd = os.open(self.real(path or "/"), os.O_RDWR)
        try:
            self.handles[fd] = self.disk.node_of(os.fstat(fd))
            self._truncate(fd, length)
        finally:
            self.handles.pop(fd, None)
            os.close(fd)
        return 0

    @operation("fsync")
    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        self.disk.synced(self.disk.nodes[self.handles[fh]])
        return 0

    @operation("fsyncdir")
    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        real = self.real(path or "/")
        node = self.disk.nodes[self.disk.node_of(os.lstat(real))]
        node.entries = self.disk.live_entries(real)
        return 0

    @operation("release")
    def release(self, path: str | None, fh: int) -> int:
        self.handles.pop(fh, None)
        os.close(fh)
        return 0

    @operation("flush")
    def flush(self, path: str | None, fh: int) -> int:
        return 0


def main() -> None:
    backing, mountpoint = Path(sys.argv[1]).resolve(), sys.argv[2]
    mfusepy.FUSE(
        HoldFS(backing),
        mountpoint,
        foreground=True,
        nothreads=True,
        hard_remove=True,
        fsname="holdfs",
    )


if __name__ == "__main__":
    main()
