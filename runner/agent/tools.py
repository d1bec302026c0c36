"""The built-in tools of an agent step and their dispatcher, `ToolBox.call`, which turns every
mistake or rule break of the model into a tool result (`{"error": code, "detail": text}`)
and never raises for one. Paths are confined by `runner/agent/paths.py`; `run` runs only a
command listed exactly in the plan's `allowed_commands` (`runner/agent/command.py`,
`runner/agent/sandbox.py`)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import shlex
import signal
import subprocess
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog

from tether.git import GitError, TreeGit, tree_git_env
from tether.runner import tracing
from tether.runner.agent import schemas
from tether.runner.agent.command import run_command
from tether.runner.agent.confine import Confiner, check_workspace_size
from tether.runner.agent.errors import CommandUnbounded, ToolError, ToolFailed, ToolRefused
from tether.runner.agent.mcp import McpTools
from tether.runner.agent.patch import patch_paths
from tether.runner.agent.paths import Confinement, normalize_prefix
from tether.runner.agent.sandbox import NoSandbox, Sandbox, private_tmp

log = structlog.get_logger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolLimits:
    list_max_entries: int = 500
    read_max_bytes: int = 64_000
    search_max_matches: int = 200
    search_timeout_s: float = 30.0
    write_max_bytes: int = 1_000_000
    run_timeout_s: float = 600.0
    run_output_bytes: int = 64_000
    result_max_chars: int = 20_000  # a tool result as it goes to the model and the transcript


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolResult:
    name: str
    content: str  # JSON text for the model, at most `result_max_chars` (plus a note)
    ok: bool
    refused: bool = False
    code: str | None = None


@dataclasses.dataclass
class ToolLog:
    """Counts of the calls, by tool, and of the refusals and failures, by code."""

    calls: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    refusals: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    failures: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {
            "calls": dict(self.calls),
            "refusals": dict(self.refusals),
            "failures": dict(self.failures),
        }


class ToolBox:
    """The tools of one attempt, bound to its worktree and its plan's rules."""

    def __init__(
        self,
        tree: Path,
        *,
        git: TreeGit,
        home: Path,
        allowed_paths: Iterable[str],
        allowed_commands: Iterable[str],
        allowed_entries: Iterable[str] = ("file",),
        sandbox: Sandbox | None = None,
        limits: ToolLimits | None = None,
        confiner: Confiner | None = None,
        ready: Callable[[], Awaitable[None]] | None = None,
        mcp: McpTools | None = None,
    ) -> None:
        """`git`: git on the tree (`search`, `apply_patch`). `ready`: waits until the tree
        exists (its checkout may still be running when the first model call is made); every
        call waits for it, and its error is the step's. `mcp`: the tools of the step's MCP
        servers, offered beside the built-in ones."""
        self.confinement = Confinement(tree, allowed_paths)
        self.tree = self.confinement.root
        self.git = git
        self.home = home
        self.allowed_commands = tuple(allowed_commands)
        self.allowed_entries = frozenset(allowed_entries)
        for command in self.allowed_commands:
            if not command.strip() or not shlex.split(command):
                raise ValueError(f"allowed command {command!r} is empty")
        self.sandbox: Sandbox = sandbox or NoSandbox()
        self.limits = limits or ToolLimits()
        self.confiner = confiner or Confiner()
        self.log = ToolLog()
        self._ready = ready
        self._mcp = mcp
        self._mcp_names = frozenset() if mcp is None else mcp.names()
        self._written: set[str] | None = set()  # None: a command ran, it may have written any
        self._tools: dict[str, Callable[[Any], Awaitable[dict[str, Any]]]] = {
            "list_files": self._list_files,
            "read_file": self._read_file,
            "search": self._search,
            "write_file": self._write_file,
            "apply_patch": self._apply_patch,
            "run": self._run,
        }

    def tools(self) -> list[Any]:
        """The `tools` list to give the model."""
        offered: list[Any] = schemas.tool_schemas(list(self.allowed_commands))
        if self._mcp is not None:
            offered += self._mcp.specs()
        return offered

    def take_written(self) -> frozenset[str] | None:
        """The paths (relative to the tree) the tools may have changed since the last call,
        None when a command ran (it may have changed any file); the record starts again."""
        written, self._written = self._written, set()
        return None if written is None else frozenset(written)

    def _wrote(self, *paths: str) -> None:
        if self._written is not None:
            self._written.update(paths)

    async def call(
        self, name: str, arguments_json: str | bytes, *, call_id: str | None = None
    ) -> ToolResult:
        """Decode the arguments, run the tool, and return its result; a model's mistake or
        a broken rule is an error result, counted in `self.log`. Its span (`execute_tool
        <name>`) names the tool only when it is one of ours: a name the model made up is the
        model's text."""
        if self._ready is not None:
            await self._ready()
        known = name in self._tools or name in self._mcp_names
        with tracing.tool_call(name if known else "unknown", call_id) as span:
            result = await self._call(name, arguments_json)
            span.set(ok=result.ok, refused=result.refused, error_code=result.code)
            span.set_standard({"error.type": result.code})
            if span.recording and tracing.records_content():
                arguments = (
                    arguments_json
                    if isinstance(arguments_json, str)
                    else (arguments_json.decode(errors="replace"))
                )
                span.set_standard(
                    {
                        "gen_ai.tool.call.arguments": arguments,
                        "gen_ai.tool.call.result": result.content,
                    }
                )
            return result

    async def _call(self, name: str, arguments_json: str | bytes) -> ToolResult:
        self.log.calls[name] += 1
        try:
            if self._mcp is not None and name in self._mcp_names:
                answer = await self._mcp.call(name, arguments_json)
                return ToolResult(name=name, ok=True, content=self._cap(answer))
            tool = self._tools.get(name)
            if tool is None:
                raise ToolFailed(
                    "unknown_tool",
                    f"there is no tool {name!r}; the tools are"
                    f" {sorted({*self._tools, *self._mcp_names})}",
                )
            try:
                arguments = msgspec.json.decode(
                    arguments_json or b"{}", type=schemas.ARGUMENTS[name]
                )
            except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
                raise ToolFailed("bad_arguments", str(exc)) from exc
            try:
                body = await tool(arguments)
            except OSError as exc:
                raise ToolFailed("os_error", f"{exc.strerror or exc}") from exc
        except ToolError as exc:
            refused = isinstance(exc, ToolRefused)
            (self.log.refusals if refused else self.log.failures)[exc.code] += 1
            if refused:
                log.info("tool refused", tool=name, code=exc.code)
            return ToolResult(
                name=name,
                ok=False,
                refused=refused,
                code=exc.code,
                content=self._cap({"error": exc.code, "detail": exc.detail}),
            )
        return ToolResult(name=name, ok=True, content=self._cap(body))

    def _cap(self, body: dict[str, Any]) -> str:
        text = json.dumps(body, ensure_ascii=False)
        cap = self.limits.result_max_chars
        if len(text) <= cap:
            return text
        return f"{text[:cap]}…[truncated: {len(text) - cap} more characters]"

    async def _list_files(self, args: schemas.ListFilesArgs) -> dict[str, Any]:
        real = self.confinement.resolve(args.path)
        cap = self.limits.list_max_entries
        entries, truncated = await anyio.to_thread.run_sync(
            _list, real, self.confinement, args.recursive, cap
        )
        return {"path": self.confinement.relative(real), "entries": entries, "truncated": truncated}

    async def _read_file(self, args: schemas.ReadFileArgs) -> dict[str, Any]:
        real = self.confinement.resolve(args.path)
        cap = self.limits.read_max_bytes
        size, chunk = await anyio.to_thread.run_sync(_read, real, args.offset, cap)
        body: dict[str, Any] = {"path": self.confinement.relative(real), "size": size}
        if b"\0" in chunk:
            return {**body, "binary": True, "content": ""}
        end = args.offset + len(chunk)
        body["content"] = chunk.decode("utf-8", errors="replace")
        if end < size:
            body["truncated"] = (
                f"showing bytes {args.offset}-{end} of {size}; call again "
                f"with offset={end} for more"
            )
        return body

    async def _search(self, args: schemas.SearchArgs) -> dict[str, Any]:
        if not args.pattern:
            raise ToolFailed("bad_arguments", "the pattern is empty")
        real = self.confinement.resolve(args.path)
        flags = ["-E" if args.regex else "-F"] + (["-i"] if args.ignore_case else [])
        spec = f":(literal){self.confinement.relative(real)}"
        options = ("--untracked", "-I", "-n", "--null", "--no-color", *flags)
        command = self.git.argv("grep", *options, "-e", args.pattern, "--", spec)
        cap = self.limits.search_max_matches
        lines, more, failure = await _first_lines(
            command, cwd=self.tree, limit=cap, timeout_s=self.limits.search_timeout_s
        )
        if failure:
            raise ToolFailed("bad_pattern", failure)
        matches = []
        for line in lines:
            path, _, rest = line.partition("\0")
            number, _, text = rest.partition("\0")
            matches.append({"path": path, "line": int(number or 0), "text": text[:500]})
        return {"matches": matches, "truncated": more}

    async def _write_file(self, args: schemas.WriteFileArgs) -> dict[str, Any]:
        real = self.confinement.resolve(args.path, write=True)
        data = args.content.encode()
        if len(data) > self.limits.write_max_bytes:
            raise ToolFailed(
                "too_large", f"{len(data)} bytes; the limit is {self.limits.write_max_bytes}"
            )
        self._wrote(self.confinement.relative(real))
        created = await anyio.to_thread.run_sync(_write, real, data)
        return {"path": self.confinement.relative(real), "bytes": len(data), "created": created}

    async def _apply_patch(self, args: schemas.ApplyPatchArgs) -> dict[str, Any]:
        data = args.patch.encode()
        if len(data) > self.limits.write_max_bytes:
            raise ToolFailed(
                "too_large", f"{len(data)} bytes; the limit is {self.limits.write_max_bytes}"
            )
        if not data.endswith(b"\n"):
            data += b"\n"
        options = ("--recount", "--whitespace=nowarn")
        try:
            numstat = await self.git("apply", *options, "--numstat", "-z", "-", stdin=data)
        except GitError as exc:
            raise ToolFailed("patch_invalid", exc.stderr.strip()[-2000:]) from exc
        named = {field.split("\t")[-1] for field in numstat.stdout.decode().split("\0")}
        paths = (patch_paths(args.patch, self.allowed_entries) | named) - {""}
        if not paths:
            raise ToolFailed("patch_empty", "the patch changes no file")
        changed = []
        for path in sorted(paths):
            try:
                real = self.confinement.resolve(path, write=True)
            except ToolRefused as exc:
                raise ToolRefused(
                    "patch_path_not_allowed", f"the patch was not applied: {exc.detail}"
                ) from exc
            changed += [normalize_prefix(path), self.confinement.relative(real)]
        self._wrote(*changed)
        try:
            await self.git("apply", *options, "-", stdin=data)
        except GitError as exc:
            raise ToolFailed("patch_does_not_apply", exc.stderr.strip()[-2000:]) from exc
        return {"applied": True, "paths": sorted(paths)}

    async def _run(self, args: schemas.RunArgs) -> dict[str, Any]:
        if args.command not in self.allowed_commands:
            raise ToolRefused(
                "command_not_allowed",
                f"{args.command!r} is not one of the "
                f"allowed commands {list(self.allowed_commands)}",
            )
        self._written = None
        try:
            outcome = await run_command(
                shlex.split(args.command),
                tree=self.tree,
                home=self.home,
                sandbox=self.sandbox,
                timeout_s=self.limits.run_timeout_s,
                output_cap=self.limits.run_output_bytes,
                confiner=self.confiner,
            )
        except FileNotFoundError as exc:
            raise ToolFailed("command_not_found", str(exc)) from exc
        except CommandUnbounded as exc:
            detail = exc.detail.removeprefix("command_unbounded: ")
            raise ToolFailed("command_unbounded", detail) from exc
        # Past `worktree_max_mb` the step fails here (WorktreeTooLarge is not a tool error).
        await check_workspace_size(
            (self.tree, self.home, private_tmp(self.home)),
            self.confiner.limits,
            after=f"`{args.command}`",
        )
        body: dict[str, Any] = {
            "command": args.command,
            "exit_code": outcome.exit_code,
            "timed_out": outcome.timed_out,
            "duration_s": outcome.duration_s,
            "output": outcome.output.decode("utf-8", errors="replace"),
            "sandbox": self.sandbox.name,
        }
        if outcome.limit_hit is not None:
            body["limit_hit"] = outcome.limit_hit
            body["limits"] = self.confiner.limits.as_dict()
        if outcome.output_bytes > len(outcome.output):
            body["output_truncated"] = (
                f"showing the first {len(outcome.output)} of {outcome.output_bytes} bytes"
            )
        return body


def _list(
    real: Path, confinement: Confinement, recursive: bool, cap: int
) -> tuple[list[str], bool]:
    if not real.is_dir():
        if real.exists():
            return [confinement.relative(real)], False
        raise ToolFailed("not_found", f"{confinement.relative(real)} does not exist")
    entries: list[str] = []
    for folder, dirs, files in os.walk(real):
        dirs[:] = sorted(d for d in dirs if d.lower() != ".git")
        base = Path(folder)
        names = [*(f"{d}/" for d in dirs), *(f for f in files if f.lower() != ".git")]
        for name in sorted(names):
            if len(entries) == cap:
                return entries, True
            entries.append(
                confinement.relative(base / name.rstrip("/")) + ("/" if name.endswith("/") else "")
            )
        if not recursive:
            break
    return entries, False


def _read(real: Path, offset: int, cap: int) -> tuple[int, bytes]:
    if not real.is_file():
        raise ToolFailed("not_a_file", "no such file (or it is a folder)")
    with real.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(offset)
        return size, handle.read(cap)


def _write(real: Path, data: bytes) -> bool:
    if real.is_dir():
        raise ToolFailed("is_a_folder", "the path is a folder")
    created = not real.exists()
    real.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    descriptor = os.open(real, flags, 0o644)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    return created


async def _first_lines(
    command: list[str], *, cwd: Path, limit: int, timeout_s: float
) -> tuple[list[str], bool, str | None]:
    """The first `limit` lines of a command's output, whether there were more, and its error
    text when it failed (exit code above 1); the command is killed once it has said enough."""
    lines: list[str] = []
    more = False
    pending = b""
    process = await anyio.open_process(
        command, cwd=cwd, env=tree_git_env(), stdin=subprocess.DEVNULL
    )
    try:
        with anyio.move_on_after(timeout_s):
            assert process.stdout is not None
            async for chunk in process.stdout:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                lines.extend(c.decode("utf-8", errors="replace") for c in complete)
                if len(lines) > limit:
                    more = True
                    break
    finally:
        if process.returncode is None:
            # Not process.kill(): Popen.send_signal first polls, which reaps the child behind
            # asyncio's watcher and makes its exit code 255.
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
        with anyio.CancelScope(shield=True):
            await process.wait()
            error = b""
            if process.stderr is not None:
                error = await _read_all(process.stderr)
            await process.aclose()
    if not more and process.returncode not in (0, 1, -9):
        return [], False, error.decode(errors="replace").strip()[-1000:]
    return lines[:limit], more, None


async def _read_all(stream: Any) -> bytes:
    parts = []
    async for chunk in stream:
        parts.append(chunk)
    return b"".join(parts)
