"""A cgroup per agent command, where this host lets the runner make one: it bounds the
command's processes (`pids.max`) and memory (`memory.max`, or v1's `memory.limit_in_bytes`)
as a whole, where rlimits bound each process alone (and RLIMIT_NPROC not at all for root), and
it lets the runner kill everything the command started, whatever it did to escape its process
group or session.

cgroup v2 is used when the runner's own cgroup is delegated to it (systemd `Delegate=yes`,
or a container's private cgroup namespace): the runner moves itself into a leaf `runner-<pid>`
of it, enables the `pids` and `memory` controllers there, and makes each command's cgroup a
sibling of that leaf. cgroup v1 is used when the runner can make folders under its own cgroup
in the `pids` and `memory` hierarchies (as root on a host with v1 or hybrid mounts). Where
neither works, `find_cgroups` says why and commands are bounded by their rlimits, the reaper
and bubblewrap's PID namespace only (`runner/agent/confine.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import os
import signal
import time
from pathlib import Path

CONTROLLERS = ("pids", "memory")
_KILL_ROUNDS = 200  # rounds of SIGKILL over cgroup.procs before giving up on removal
_NAME_TRIES = 100  # command cgroup names tried before creation gives up


@dataclasses.dataclass(frozen=True)
class Mount:
    """One cgroup hierarchy: where it is mounted, and the runner's own cgroup folder in it."""

    version: int
    controllers: frozenset[str]  # v1: this hierarchy's; v2: those the runner's cgroup offers
    own: Path


@dataclasses.dataclass(frozen=True)
class CommandCgroup:
    """One command's cgroup folders (v2: one; v1: one per controller)."""

    version: int
    folders: tuple[Path, ...]

    @property
    def procs(self) -> tuple[Path, ...]:
        """The files the command's reaper writes its pid to, joining the cgroup."""
        return tuple(folder / "cgroup.procs" for folder in self.folders)

    def limit_hit(self) -> str | None:
        """`processes` or `memory` when the command ran into that cgroup limit, else None."""
        for folder in self.folders:
            if _counter(folder / "pids.events", "max") > 0:
                return "processes"
            if _counter(folder / "memory.events", "oom_kill") > 0:
                return "memory"
            if _counter(folder / "memory.oom_control", "oom_kill") > 0:
                return "memory"
        return None

    def end(self) -> None:
        """Kill every process left in the cgroup, then remove its folders."""
        for folder in self.folders:
            kill = folder / "cgroup.kill"
            if kill.exists():
                with contextlib.suppress(OSError):
                    kill.write_text("1")
        for folder in self.folders:
            for _ in range(_KILL_ROUNDS):
                pids = _pids(folder / "cgroup.procs")
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        break
                    time.sleep(0.005)  # killed, not yet reaped


class Cgroups:
    """Where this runner makes its commands' cgroups."""

    def __init__(self, version: int, parents: dict[str, Path]) -> None:
        self.version = version
        self.parents = parents  # by controller; v2: every controller shares one parent
        self._names = itertools.count(1)

    @property
    def controllers(self) -> tuple[str, ...]:
        return tuple(sorted(self.parents))

    def create(self, *, max_processes: int, max_memory_bytes: int) -> CommandCgroup:
        """A new command cgroup with these limits; `OSError` when the host refuses. A name
        already taken is skipped: a folder left by an earlier process that had this pid (a
        killed runner's, not yet swept, since this runner's pid is alive) must not cost a
        command its cgroup."""
        for _ in range(_NAME_TRIES):
            name = f"cmd-{os.getpid()}-{next(self._names)}"
            try:
                return self._create(name, max_processes, max_memory_bytes)
            except FileExistsError:
                continue
        raise FileExistsError(errno.EEXIST, f"{_NAME_TRIES} command cgroup names in a row taken")

    def _create(self, name: str, max_processes: int, max_memory_bytes: int) -> CommandCgroup:
        made: list[Path] = []
        try:
            for controller, parent in sorted(self.parents.items()):
                folder = parent / name
                if folder not in made:
                    folder.mkdir()
                    made.append(folder)
                limit = max_processes if controller == "pids" else max_memory_bytes
                _set_limit(self.version, controller, folder, limit)
        except OSError:
            CommandCgroup(self.version, tuple(made)).end()
            raise
        return CommandCgroup(self.version, tuple(made))


# The file each controller's limit goes to, by cgroup version, and the files that must not
# let the command swap past it (written only where the kernel has them).
_LIMIT_FILES: dict[tuple[int, str], tuple[str, tuple[tuple[str, str | None], ...]]] = {
    (2, "pids"): ("pids.max", ()),
    (2, "memory"): ("memory.max", (("memory.swap.max", "0"),)),
    (1, "pids"): ("pids.max", ()),
    (1, "memory"): ("memory.limit_in_bytes", (("memory.memsw.limit_in_bytes", None),)),
}


def _set_limit(version: int, controller: str, folder: Path, limit: int) -> None:
    name, extras = _LIMIT_FILES[version, controller]
    (folder / name).write_text(str(limit))
    for extra, value in extras:
        path = folder / extra
        if path.exists():
            path.write_text(str(limit) if value is None else value)


def find_cgroups(
    mountinfo: Path = Path("/proc/self/mountinfo"), own: Path = Path("/proc/self/cgroup")
) -> tuple[Cgroups | None, str]:
    """The cgroups this runner may use, or None, and what was found (for the log)."""
    mounts = _mounts(mountinfo.read_text(), own.read_text())
    v2 = next((m for m in mounts if m.version == 2 and m.controllers & set(CONTROLLERS)), None)
    if v2 is not None:
        found, why = _delegated_v2(v2)
        if found is not None:
            return found, why
    else:
        why = "no cgroup v2 with the pids or memory controller"
    parents: dict[str, Path] = {}
    for mount in mounts:
        if mount.version != 1:
            continue
        for controller in mount.controllers & set(CONTROLLERS):
            sweep(mount.own, "tether-runner-")
            parent = mount.own / f"tether-runner-{os.getpid()}"
            try:
                parent.mkdir(exist_ok=True)
            except OSError as exc:
                why += f"; cgroup v1 {controller}: {exc.strerror or exc}"
                continue
            parents[controller] = parent
    if parents:
        return Cgroups(1, parents), f"cgroup v1 ({', '.join(sorted(parents))})"
    return None, why


def _delegated_v2(mount: Mount) -> tuple[Cgroups | None, str]:
    """Use the runner's own v2 cgroup if it is delegated: move the runner into a leaf of it
    and enable the controllers for its children."""
    own = mount.own
    wanted = sorted(mount.controllers & set(CONTROLLERS))
    if not os.access(own / "cgroup.subtree_control", os.W_OK):
        return None, f"cgroup v2: {own} is not delegated to this user"
    sweep(own, "cmd-")
    sweep(own, "runner-")
    leaf = own / f"runner-{os.getpid()}"
    try:
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        (own / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
    except OSError as exc:
        with contextlib.suppress(OSError):
            (own / "cgroup.procs").write_text(str(os.getpid()))
            leaf.rmdir()
        return None, f"cgroup v2: cannot use {own}: {exc.strerror or exc}"
    return Cgroups(2, dict.fromkeys(wanted, own)), f"cgroup v2 ({', '.join(wanted)}) at {own}"


def sweep(folder: Path, prefix: str) -> None:
    """Remove what runners that are gone left under `folder`: the cgroups named `prefix<pid>`
    (`-...` may follow) whose runner pid is not alive, with the commands' cgroups in them, any
    process still in one killed first. A pid reused since is taken for alive: left alone."""
    try:
        found = [f for f in folder.iterdir() if f.name.startswith(prefix) and f.is_dir()]
    except OSError:
        return
    for stale in found:
        pid = stale.name.removeprefix(prefix).split("-")[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            for child in [c for c in stale.iterdir() if c.is_dir()]:
                CommandCgroup(0, (child,)).end()
        CommandCgroup(0, (stale,)).end()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mounts(mountinfo: str, own_cgroups: str) -> list[Mount]:
    """The cgroup hierarchies mounted here, each with the runner's own folder in it."""
    own_v1: dict[str, str] = {}
    own_v2: str | None = None
    for line in own_cgroups.splitlines():
        number, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        if number == "0" and not names:
            own_v2 = path
        for name in names.split(","):
            own_v1[name] = path
    found: list[Mount] = []
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        parts, extra = fields.split(), tail.split()
        if len(parts) < 5 or len(extra) < 3:
            continue
        root, point, fstype, options = parts[3], Path(parts[4]), extra[0], extra[2]
        if fstype == "cgroup2" and own_v2 is not None:
            folder = _inside(point, root, own_v2)
            try:
                offered = (folder / "cgroup.controllers").read_text().split()
            except OSError:
                continue
            found.append(Mount(2, frozenset(offered), folder))
        elif fstype == "cgroup":
            for name in set(options.split(",")) & set(CONTROLLERS):
                if name in own_v1:
                    found.append(Mount(1, frozenset({name}), _inside(point, root, own_v1[name])))
    return found


def _inside(point: Path, root: str, path: str) -> Path:
    """The folder of cgroup `path` in a hierarchy whose `root` is mounted at `point`."""
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    return point / path.lstrip("/")


def _counter(path: Path, key: str) -> int:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _pids(path: Path) -> list[int]:
    try:
        return [int(pid) for pid in path.read_text().split()]
    except OSError:
        return []
