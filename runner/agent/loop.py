"""The built-in `agent` step kind: a bounded tool loop (model -> tool calls -> tool results ->
model ...) in a fresh workspace, each completed turn checkpointed, ending in a candidate commit,
its bundle and checks, and the workspace's removal (docs/design.md, The agent kind).

The workspace is a worktree at the lease's `repository.start_sha`, or, for a step without a
repository, an empty scratch folder. The worktree is checked out beside the first model call,
which needs only the messages and the tool list; the first tool call, a resume that applies a
checkpoint's changes, and the candidate's commit wait for it, and a failed checkout fails the
step as before. Likewise a turn's checkpoint is made beside the next model call, and the next
turn's tools wait for its snapshot of the worktree (`runner/agent/checkpoints.py`). A lease
with a `resume` point continues the loop after the turns that point covers.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import hashlib
import json
import os
import secrets
import shutil
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import anyio
import msgspec
import structlog

from tether.git import GitError, TreeGit, git, write_neutral_attributes
from tether.runner.agent import mcp
from tether.runner.agent.checkpoints import Checkpointer, Start, resume_start, unanswered_calls
from tether.runner.agent.checks import CheckLimits, run_checks
from tether.runner.agent.confine import CommandLimits, Confiner
from tether.runner.agent.paths import normalize_prefix
from tether.runner.agent.sandbox import Sandbox, detect_sandbox
from tether.runner.agent.sandbox_policy import CommandPolicy
from tether.runner.agent.setup import SetupRun, run_setup
from tether.runner.agent.tools import ToolBox, ToolLimits, ToolResult
from tether.runner.agent.workspace import CleanupRecord, RepoCache, Workspace, tree_size
from tether.runner.errors import StepRejected
from tether.runner.kinds.base import ChatModel, StepContext, StepOutput, WindDown
from tether.runner.models import USAGE_KEYS, Completion
from tether.wire.payloads import AgentPayload, ToolCall, plain, read_payload
from tether.wire.records import CheckRun, LeaseRepository

log = structlog.get_logger(__name__)

# The transcript in the step's output: each text clipped, at most this many entries (the first
# quarter and the last ones, with a note of how many were left out between), and at most this
# many characters in all, so a result stays well under the supervisor's 1 MiB body limit.
TRANSCRIPT_TEXT_MAX = 2_000
TRANSCRIPT_ENTRIES_MAX = 200
TRANSCRIPT_CHARS_MAX = 400_000


# Called after each completed turn with tool calls: (turn, messages so far, attempt's usage).
OnTurn = Callable[[int, list[dict[str, Any]], dict[str, int]], Awaitable[None]]


class Finish(enum.StrEnum):
    """Why the loop stopped."""

    ANSWERED = "answered"  # the model answered without calling a tool
    MAX_TURNS = "max_turns"  # `max_turns` model calls were made
    BUDGET = "budget"  # the tokens spent reached `max_tokens_total` before the next call


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopResult:
    text: str
    finish: Finish
    turns: int
    usage: dict[str, int]
    tool_calls: int
    tool_errors: int
    tool_refusals: int
    transcript: list[dict[str, Any]]


def default_cache_dir() -> Path:
    """Where the runner keeps mirrors and attempt folders: systemd's `CacheDirectory=` when the
    unit sets one, else `$XDG_CACHE_HOME/tether-runner` (`~/.cache/tether-runner`)."""
    systemd = os.environ.get("CACHE_DIRECTORY", "").split(":")[0]
    if systemd:
        return Path(systemd)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "tether-runner"


class AgentKind:
    """The `agent` kind as a `StepKind`, bound to the runner's cache directory and sandbox.

    The cache directory is created and the sandbox probed on the first agent step, not when the
    runner starts, so a runner that never gets one never touches either. Without a working
    sandbox, a step that would run commands is refused unless `commands_without_sandbox` (the
    runner's setting) allows it (`runner/agent/sandbox_policy.py`).
    """

    def __init__(
        self,
        *,
        cache_dir: Path | None = None,
        sandbox: Sandbox | None = None,
        limits: ToolLimits | None = None,
        check_limits: CheckLimits | None = None,
        commands_without_sandbox: bool = False,
        command_limits: CommandLimits | None = None,
        sandbox_read_only: Sequence[Path] = (),
    ) -> None:
        """`command_limits` and `sandbox_read_only` are the runner's settings of those names
        (`command_max_*`, `worktree_max_mb`; host folders bound read-only into the sandbox)."""
        self._cache_dir = cache_dir
        self._cache: RepoCache | None = None
        self._sandbox = sandbox
        self._sandbox_lock = anyio.Lock()
        self.limits = limits or ToolLimits()
        self.check_limits = check_limits or CheckLimits()
        self.policy = CommandPolicy(commands_without_sandbox=commands_without_sandbox)
        self.confiner = Confiner(command_limits)
        self._read_only = tuple(sandbox_read_only)

    @property
    def cache(self) -> RepoCache:
        if self._cache is None:
            self._cache = RepoCache(self._cache_dir or default_cache_dir())
        return self._cache

    async def sandbox(self) -> Sandbox:
        async with self._sandbox_lock:
            if self._sandbox is None:
                # The interpreter's installation, often outside /usr (a virtualenv), is readable
                # inside bubblewrap, so that `python -m pytest` runs there; so are the folders
                # the operator named (a shared toolchain).
                self._sandbox = await detect_sandbox(
                    [Path(sys.prefix), Path(sys.base_prefix), *self._read_only]
                )
            return self._sandbox

    async def __call__(self, ctx: StepContext) -> StepOutput:
        try:
            payload = read_payload(ctx.payload, AgentPayload)
        except ValueError as exc:
            raise StepRejected(f"agent payload: {exc}") from None
        limits, check_limits = self._limits(payload)
        repo = ctx.repository
        prefixes = _allowed_prefixes(payload, repo)
        # Where snapshots look for changes: None when nothing may be written or no repository.
        commit_paths = (
            None if repo is None or not prefixes else (() if "" in prefixes else prefixes)
        )
        setup = _setup_commands(payload, repo)
        sandbox = await self.sandbox()
        runs_commands = (
            bool(payload.allowed_commands or setup)
            or bool(repo is not None and repo.checks)
            or bool(payload.mcp_servers)  # a server is the repository's code, run
        )
        self.policy.admit(sandbox, step_id=ctx.step_id, runs_commands=runs_commands)
        label = f"{ctx.step_id}-{ctx.attempt}"
        fresh = [m.request() for m in payload.messages]
        candidate: str | None = None
        bundle: str | None = None
        checks: dict[str, CheckRun] = {}
        async with self._workspace(ctx, label) as space:
            # Before a checkpoint's changes are applied: setup never sees the model's work.
            setup_run = await self._setup(ctx, space, setup, sandbox, check_limits)
            start = Start(messages=fresh)
            if ctx.resume is not None and ctx.services is not None:
                start = await resume_start(
                    ctx.resume, services=ctx.services, workspace=space, fresh=fresh
                )
            # What a tool call waits for: the worktree's checkout, the last turn's stage.
            gates: list[Callable[[], Awaitable[None]]] = [space.ready]

            async def ready() -> None:
                for gate in gates:
                    await gate()

            # The step's MCP servers run while the loop does, and stop before its candidate
            # is committed (they run in the worktree and may write to it).
            async with self._mcp_servers(payload, space, sandbox, limits) as mcp_tools:
                try:
                    box = ToolBox(
                        space.tree,
                        git=space.git,
                        home=space.home,
                        allowed_paths=prefixes,
                        allowed_commands=payload.allowed_commands,
                        sandbox=sandbox,
                        limits=limits,
                        confiner=self.confiner,
                        ready=ready,
                        mcp=mcp_tools,
                        allowed_entries=payload.allowed_entries,
                    )
                except ValueError as exc:
                    raise StepRejected(f"agent payload: {exc}") from None
                checkpoints: AbstractAsyncContextManager[Checkpointer | None] = nullcontext()
                if ctx.services is not None:
                    checkpointer = Checkpointer(
                        services=ctx.services,
                        fence=ctx.fence,
                        step_id=ctx.step_id,
                        workspace=space,
                        paths=commit_paths,
                        start=start,
                        written=box.take_written,
                    )
                    gates.append(checkpointer.staged)
                    checkpoints = checkpointer.running()
                model = ctx.default_model if payload.model is msgspec.UNSET else payload.model
                budget = payload.max_tokens_total
                # The last checkpoint on its way is recorded before the candidate is made (they
                # share the worktree's bundle ref) and before the step's result or release.
                async with checkpoints as on_turn:
                    result = await run_loop(
                        ctx.chat,
                        model=model,
                        messages=start.messages,
                        box=box,
                        max_turns=payload.max_turns,
                        budget=None if budget is msgspec.UNSET else budget,
                        done_turns=start.turn,
                        spent=start.usage,
                        on_turn=on_turn,
                        wind_down=ctx.wind_down,
                    )
            if isinstance(space, Workspace) and commit_paths is not None:
                candidate = await space.commit(step_id=ctx.step_id, paths=commit_paths)
            if candidate is not None and repo is not None and isinstance(space, Workspace):
                bundle, checks = await self._deliver(ctx, space, candidate, repo, check_limits)
        cleanup = space.cleanup
        output = _output(result, start, sandbox.name, candidate, bundle, checks, cleanup)
        if setup_run is not None:
            output["setup"] = setup_run.as_dict()
        log.info(
            "agent step done",
            step_id=ctx.step_id,
            finish=str(result.finish),
            turns=result.turns,
            tool_calls=result.tool_calls,
            tool_errors=result.tool_errors,
            candidate_sha=candidate,
            workspace_gone=cleanup is not None and cleanup.gone,
        )
        return StepOutput(
            output=output,
            usage=result.usage,
            candidate_sha=candidate,
            bundle=bundle,
            checks=checks,
        )

    @asynccontextmanager
    async def _mcp_servers(
        self, payload: AgentPayload, space: Space, sandbox: Sandbox, limits: ToolLimits
    ) -> AsyncIterator[mcp.McpTools | None]:
        """The payload's MCP servers, started in the worktree under the sandbox and the command
        limits (none: None)."""
        if payload.mcp_servers:
            await space.ready()  # a server starts in the worktree
        wrap = functools.partial(sandbox.wrap, tree=space.tree, home=space.home)
        async with mcp.serving(
            payload.mcp_servers,
            tree=space.tree,
            home=space.home,
            wrap=wrap,
            confiner=self.confiner,
            call_timeout_s=limits.run_timeout_s,
        ) as tools:
            yield tools

    def _limits(self, payload: AgentPayload) -> tuple[ToolLimits, CheckLimits]:
        """The runner's tool and check limits, with the payload's timeouts."""
        limits = self.limits
        if payload.run_timeout_s is not msgspec.UNSET:
            limits = dataclasses.replace(limits, run_timeout_s=payload.run_timeout_s)
        check_limits = self.check_limits
        if payload.check_timeout_s is not msgspec.UNSET:
            check_limits = dataclasses.replace(check_limits, timeout_s=payload.check_timeout_s)
        return limits, check_limits

    async def _setup(
        self,
        ctx: StepContext,
        space: Space,
        commands: tuple[str, ...],
        sandbox: Sandbox,
        limits: CheckLimits,
    ) -> SetupRun | None:
        """Run the step's setup commands in its worktree, if it has any."""
        if not commands or not isinstance(space, Workspace):
            return None
        return await run_setup(
            space,
            commands,
            sandbox=sandbox,
            confiner=self.confiner,
            upload=digest_only if ctx.services is None else ctx.services.upload,
            limits=limits,
        )

    async def _deliver(
        self,
        ctx: StepContext,
        space: Workspace,
        candidate: str,
        repo: LeaseRepository,
        limits: CheckLimits,
    ) -> tuple[str | None, dict[str, CheckRun]]:
        """Upload the candidate's bundle (`base..candidate`: it applies to any mirror of the
        repository, whatever earlier steps it builds on) and run the checks at it."""
        services = ctx.services
        if services is None:
            log.warning("no supervisor behind the step: candidate not uploaded, checks not run")
            return None, {}
        path = await space.write_bundle(
            space.io / "candidate.bundle", candidate, since=repo.base_sha
        )
        bundle = await services.upload(path)
        sandbox = await self.sandbox()
        checks = await run_checks(
            space,
            candidate,
            repo.checks,
            sandbox=sandbox,
            upload=services.upload,
            limits=limits,
            confiner=self.confiner,
        )
        return bundle, checks

    @asynccontextmanager
    async def _workspace(self, ctx: StepContext, label: str) -> AsyncIterator[Space]:
        """The attempt's workspace, removed on the way out (even when cancelled)."""
        repo = ctx.repository
        if repo is None:
            async with scratch_space(self.cache.cache_dir, label) as scratch:
                yield scratch
            return
        services, digest = ctx.services, repo.start_bundle
        fetch_start = None
        if services is not None and digest is not None:

            async def fetch_start(into: Path) -> None:
                await services.download(digest, into)

        async with self.cache.attempt(
            url=repo.url,
            base_sha=repo.base_sha,
            start_sha=repo.start_sha,
            label=label,
            start_bundle=fetch_start,
            checkout_beside=True,
        ) as workspace:
            yield workspace


def _setup_commands(payload: AgentPayload, repo: LeaseRepository | None) -> tuple[str, ...]:
    """The repository's setup commands, then the payload's."""
    if payload.setup and repo is None:
        raise StepRejected(
            "agent payload: `setup` runs in a repository's worktree; this step has none"
        )
    return (() if repo is None else repo.setup) + payload.setup


async def digest_only(path: Path) -> str:
    """The sha256 of `path`, for a step with no artifact store behind it (nothing uploaded)."""
    data = await anyio.Path(path).read_bytes()
    return hashlib.sha256(data).hexdigest()


def _allowed_prefixes(payload: AgentPayload, repo: LeaseRepository | None) -> tuple[str, ...]:
    """The allowed paths, normalised: the lease's for a repository (the task's, bound by its
    approval), else the payload's, `("",)` (all of the tree) when left out."""
    if repo is not None and payload.allowed_paths is not msgspec.UNSET:
        raise StepRejected(
            "agent payload: `allowed_paths` is the task's for a repository-bound step; the"
            " payload must not carry its own"
        )
    if repo is not None:
        paths: tuple[str, ...] = repo.allowed_paths
    elif payload.allowed_paths is msgspec.UNSET:
        return ("",)
    else:
        paths = payload.allowed_paths
    try:
        return tuple(normalize_prefix(p) for p in paths)
    except ValueError as exc:
        raise StepRejected(f"agent payload: {exc}") from None


def _output(
    result: LoopResult,
    start: Start,
    sandbox: str,
    candidate: str | None,
    bundle: str | None,
    checks: dict[str, CheckRun],
    cleanup: CleanupRecord | None,
) -> dict[str, Any]:
    """The step's output: what the loop did, where it started from, what it delivered."""
    output: dict[str, Any] = {
        "text": result.text,
        "finish": str(result.finish),
        "turns": result.turns,
        "usage": _added(start.usage, result.usage),
        "tool_calls": result.tool_calls,
        "tool_errors": result.tool_errors,
        "tool_refusals": result.tool_refusals,
        "sandbox": sandbox,
    }
    if start.resumed_from is not None:
        output["resumed_from"] = {
            "turn": start.resumed_from.turn,
            "fence": start.resumed_from.fence,
        }
        output["attempt_usage"] = result.usage
    if start.skipped is not None:
        output["resume_skipped"] = start.skipped
    if candidate is not None:
        output["candidate_sha"] = candidate
    if bundle is not None:
        output["bundle"] = bundle
    if checks:
        output["checks"] = {
            name: {"exit_code": run.exit_code, "duration_s": run.duration_s, "log": run.log}
            for name, run in checks.items()
        }
    output["cleanup"] = None if cleanup is None else cleanup.as_dict()
    output["transcript"] = result.transcript
    return output


def _added(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in sorted({*a, *b})}


class Space(Protocol):
    """What the loop needs of a workspace: a repository `Workspace` or a `ScratchSpace`."""

    @property
    def tree(self) -> Path: ...
    @property
    def git(self) -> TreeGit: ...
    @property
    def home(self) -> Path: ...
    @property
    def io(self) -> Path: ...
    @property
    def cleanup(self) -> CleanupRecord | None: ...

    async def ready(self) -> None: ...
    async def commit(self, *, step_id: str, paths: Sequence[str] = ()) -> str | None: ...


@dataclasses.dataclass
class ScratchSpace:
    """An empty folder for an agent step without a repository; never yields a candidate.

    The tree is the work tree of an empty git repository (`git`, its git dir beside the tree)
    only so that the `search` tool (git grep) works in it.
    """

    folder: Path
    tree: Path
    home: Path
    io: Path
    git: TreeGit
    cleanup: CleanupRecord | None = None

    async def ready(self) -> None:
        return None

    async def commit(self, *, step_id: str, paths: Sequence[str] = ()) -> str | None:
        return None

    async def remove(self) -> CleanupRecord:
        if self.cleanup is None:
            files, size = await anyio.to_thread.run_sync(tree_size, self.folder)
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(self.folder, ignore_errors=True))
            self.cleanup = CleanupRecord(
                path=str(self.folder),
                bytes_removed=size,
                files_removed=files,
                exists_after=await anyio.Path(self.folder).exists(),
                listed_after=False,
            )
        return self.cleanup


@asynccontextmanager
async def scratch_space(cache_dir: Path, label: str) -> AsyncIterator[ScratchSpace]:
    """A fresh `ScratchSpace` under `cache_dir/scratch`, removed on the way out (shielded)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in label)[:80]
    folder = cache_dir / "scratch" / f"{safe}-{secrets.token_hex(4)}"
    tree = folder / "tree"
    git_here = TreeGit(git_dir=folder / "git", work_tree=tree)
    space = ScratchSpace(
        folder=folder, tree=tree, home=folder / "home", io=folder / "io", git=git_here
    )
    try:
        await anyio.Path(space.tree).mkdir(parents=True)
        await anyio.Path(space.home).mkdir()
        await anyio.Path(space.io).mkdir()
        try:
            await git("init", "--bare", "--quiet", str(space.git.git_dir), cwd=folder)
            await anyio.to_thread.run_sync(write_neutral_attributes, space.git.git_dir)
        except (GitError, OSError) as exc:
            raise StepRejected(f"cannot create the scratch workspace: {exc}") from exc
        yield space
    finally:
        with anyio.CancelScope(shield=True):
            await space.remove()


async def run_loop(
    chat: ChatModel,
    *,
    model: str,
    messages: list[dict[str, Any]],
    box: ToolBox,
    max_turns: int,
    budget: int | None,
    done_turns: int = 0,
    spent: dict[str, int] | None = None,
    on_turn: OnTurn | None = None,
    wind_down: WindDown | None = None,
) -> LoopResult:
    """Ask the model, run the tools it calls, give it their results, and again, until it
    answers without a tool call, the step made `max_turns` calls, or its tokens spent reach
    `budget` (checked before each call, so the last turn may pass it by its own size).

    A resumed attempt passes the turns already done and what they spent. `on_turn` gets
    each completed turn that called tools (its number, the messages so far and this attempt's
    usage). The result's `usage` is this attempt's; its `turns` the step's.

    On a `wind_down` request the loop stops at its next save point: before a model call, or
    as soon as the model call or tool call in flight returns. A turn it stops inside goes to
    `on_turn` as it stands (the model's answer and the results of the calls that ran), and
    the loop that resumes it runs the calls left before it asks the model again."""
    messages = list(messages)
    stop = wind_down or WindDown()
    transcript = Transcript()
    for message in messages:
        transcript.message(message)
    usage: collections.Counter[str] = collections.Counter()
    before = (spent or {}).get("total_tokens", 0)
    tools = box.tools()
    text = ""
    turns = done_turns
    calls = errors = refusals = 0
    saved = len(messages)  # the messages the last checkpoint (or the resume point) holds

    async def save() -> None:
        nonlocal saved
        if on_turn is not None and len(messages) > saved:
            saved = len(messages)
            await on_turn(turns, messages, dict(usage))

    async def call_tools(pending: Sequence[ToolCall]) -> None:
        nonlocal calls, errors, refusals
        for call in pending:
            if stop.requested:
                await save()
                stop.check()
            result = await box.call(call.function.name, call.function.arguments, call_id=call.id)
            calls += 1
            errors += not result.ok
            refusals += result.refused
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result.content})
            transcript.tool(call, result)
        await save()

    if left := unanswered_calls(messages):  # a turn checkpointed before its calls all ran
        await call_tools(left)
    while True:
        if turns >= max_turns:
            finish = Finish.MAX_TURNS
            break
        if budget is not None and before + usage["total_tokens"] >= budget:
            finish = Finish.BUDGET
            break
        stop.check()
        completion = await chat({"model": model, "messages": messages, "tools": tools})
        turns += 1
        usage.update({k: v for k, v in completion.usage.items() if k in USAGE_KEYS})
        text = completion.text
        messages.append(_assistant_message(completion))
        transcript.assistant(completion, turn=turns)
        if not completion.tool_calls:
            finish = Finish.ANSWERED
            break
        await call_tools(completion.tool_calls)
    return LoopResult(
        text=text,
        finish=finish,
        turns=turns,
        usage=dict(usage),
        tool_calls=calls,
        tool_errors=errors,
        tool_refusals=refusals,
        transcript=transcript.entries(),
    )


def _assistant_message(completion: Completion) -> dict[str, Any]:
    """The model's turn as the next request holds it (content null beside tool calls)."""
    if not completion.tool_calls:
        return {"role": "assistant", "content": completion.text}
    calls = plain(completion.tool_calls)
    return {"role": "assistant", "content": completion.text or None, "tool_calls": calls}


def clip(text: str, limit: int = TRANSCRIPT_TEXT_MAX) -> str:
    """`text` cut to `limit` characters, with a note of how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[{len(text) - limit} more characters]"


class Transcript:
    """What the agent did, for the step's output: messages, tool calls and tool results."""

    def __init__(self) -> None:
        self._entries: list[dict[str, Any]] = []

    def message(self, message: dict[str, Any]) -> None:
        entry: dict[str, Any] = {"role": message["role"]}
        if isinstance(message.get("content"), str):
            entry["content"] = clip(message["content"])
        if message.get("tool_calls"):
            entry["tool_calls"] = [_call_entry(c) for c in message["tool_calls"]]
        if message.get("tool_call_id"):
            entry["tool_call_id"] = message["tool_call_id"]
        self._entries.append(entry)

    def assistant(self, completion: Completion, *, turn: int) -> None:
        entry: dict[str, Any] = {
            "role": "assistant",
            "turn": turn,
            "content": clip(completion.text),
        }
        if completion.tool_calls:
            entry["tool_calls"] = [_call_entry(plain(c)) for c in completion.tool_calls]
        entry["finish_reason"] = completion.finish_reason
        entry["usage"] = completion.usage
        self._entries.append(entry)

    def tool(self, call: ToolCall, result: ToolResult) -> None:
        entry: dict[str, Any] = {
            "role": "tool",
            "tool_call_id": call.id,
            "name": call.function.name,
            "ok": result.ok,
        }
        if result.code is not None:
            entry["error"] = result.code
        if result.refused:
            entry["refused"] = True
        entry["content"] = clip(result.content)
        self._entries.append(entry)

    def entries(self) -> list[dict[str, Any]]:
        """The entries within `TRANSCRIPT_ENTRIES_MAX` and `TRANSCRIPT_CHARS_MAX`: the first
        ones and the last ones, with `{"omitted": n}` between when some were left out."""
        entries = self._entries
        sizes = [len(json.dumps(e, ensure_ascii=False)) for e in entries]
        if len(entries) <= TRANSCRIPT_ENTRIES_MAX and sum(sizes) <= TRANSCRIPT_CHARS_MAX:
            return list(entries)
        count = len(entries)
        head = min(count, TRANSCRIPT_ENTRIES_MAX // 4)
        tail = min(count - head, TRANSCRIPT_ENTRIES_MAX - head - 1)
        while head + tail and sum(sizes[:head]) + sum(sizes[count - tail :]) > TRANSCRIPT_CHARS_MAX:
            if head > 1 and head * 3 > tail:
                head -= 1
            else:
                tail -= 1
        omitted = {"omitted": count - head - tail}
        return [*entries[:head], omitted, *entries[count - tail :]]


def _call_entry(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "id": call.get("id"),
        "name": function.get("name"),
        "arguments": clip(str(function.get("arguments", ""))),
    }
