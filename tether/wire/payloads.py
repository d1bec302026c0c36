"""The payloads of the built-in step kinds as typed records, one per kind in `PAYLOADS`.

The supervisor checks each step of a plan against its kind's record when the task is created
(`tether.wire.records.PlanStep`), and the runner reads a lease's payload into the same record
before it acts; so a payload is refused at submit for exactly what a runner would refuse. A
kind not in the table (one a deployment adds to its runners) has a payload of its own shape,
checked by its runner only.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec
import msgspec.inspect

from tether.wire import templates

R = TypeVar("R", bound=msgspec.Struct)

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


# OpenAI's rule for a function's name.
ToolName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


def plain(value: Any) -> Any:
    """`value` (records, tuples) as plain JSON data: dicts, lists, strings, numbers."""
    return msgspec.json.decode(msgspec.json.encode(value))


def _at(field: str, problem: str) -> ValueError:
    """`problem` about `field` of the payload, in the form msgspec gives its own errors (so
    `read_payload` names the field the same way)."""
    return ValueError(f"{problem} - at `$.{field}`")


class FunctionDef(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A function the model may call: `parameters` is a JSON Schema object, passed as it is."""

    name: ToolName
    description: str | msgspec.UnsetType = msgspec.UNSET
    parameters: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    strict: bool | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        schema = self.parameters
        if schema is msgspec.UNSET:
            return
        if schema.get("type", "object") != "object":
            raise ValueError("`parameters` must be a JSON Schema of type `object`")
        if not isinstance(schema.get("properties", {}), dict):
            raise TypeError("`parameters.properties` must be an object")


class Tool(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One entry of `tools`: `{"type": "function", "function": {...}}`."""

    type: Literal["function"]
    function: FunctionDef


class FunctionName(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: ToolName


class NamedToolChoice(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A `tool_choice` that makes the model call this one declared function."""

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The function a tool call names; `arguments` is the model's JSON text, kept unparsed."""

    name: ToolName
    arguments: str


class ToolCall(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A call the model made: in an `assistant` message of a payload, and in a chat output."""

    id: NonEmpty
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One message of a `chat` payload.

    `system` and `user` messages carry `content`; an `assistant` message carries `content`,
    `tool_calls` or both; a `tool` message answers the call `tool_call_id` with `content`.
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: str | msgspec.UnsetType | None = msgspec.UNSET
    tool_calls: Annotated[tuple[ToolCall, ...], msgspec.Meta(min_length=1)] | msgspec.UnsetType = (
        msgspec.UNSET
    )
    tool_call_id: NonEmpty | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        if self.tool_calls is not msgspec.UNSET and self.role != "assistant":
            raise ValueError("only an `assistant` message carries `tool_calls`")
        if self.tool_call_id is not msgspec.UNSET and self.role != "tool":
            raise ValueError("only a `tool` message carries `tool_call_id`")
        if self.role == "tool" and self.tool_call_id is msgspec.UNSET:
            raise ValueError("a `tool` message needs `tool_call_id`, the call it answers")
        if self.role == "assistant" and self.tool_calls is not msgspec.UNSET:
            ids = [call.id for call in self.tool_calls]
            if len(set(ids)) != len(ids):
                raise ValueError("the ids of `tool_calls` must differ")
        elif self.role == "assistant" and not isinstance(self.content, str):
            raise ValueError("an `assistant` message needs `content` (a string) or `tool_calls`")
        elif not isinstance(self.content, str):
            raise ValueError(f"a `{self.role}` message needs `content`, a string")

    def call_ids(self) -> tuple[str, ...]:
        """The ids of the tool calls this message makes (none unless `assistant`)."""
        return () if self.tool_calls is msgspec.UNSET else tuple(c.id for c in self.tool_calls)

    def request(self) -> dict[str, Any]:
        """The message as the provider's request body holds it."""
        as_json: dict[str, Any] = plain(self)
        return as_json


class ChatPayload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The payload of the built-in `chat` kind: one completion for `messages`.

    `model` defaults to the runner's `model` setting; the model parameters, when given, go to
    the provider as they are, and so do `tools` and `tool_choice` (OpenAI's function calling).
    With `use_outputs` the outputs of the task's earlier steps go to the model as one `user`
    message after the payload's leading `system` messages. A key not here is refused, never
    ignored.
    """

    messages: Annotated[tuple[ChatMessage, ...], msgspec.Meta(min_length=1)]
    model: NonEmpty | msgspec.UnsetType = msgspec.UNSET
    temperature: float | msgspec.UnsetType = msgspec.UNSET
    top_p: float | msgspec.UnsetType = msgspec.UNSET
    max_tokens: int | msgspec.UnsetType = msgspec.UNSET
    seed: int | msgspec.UnsetType = msgspec.UNSET
    stop: str | tuple[str, ...] | msgspec.UnsetType = msgspec.UNSET
    tools: Annotated[tuple[Tool, ...], msgspec.Meta(min_length=1)] | msgspec.UnsetType = (
        msgspec.UNSET
    )
    tool_choice: ToolChoice | msgspec.UnsetType = msgspec.UNSET
    use_outputs: bool = False

    def __post_init__(self) -> None:
        declared = [] if self.tools is msgspec.UNSET else [t.function.name for t in self.tools]
        for i, name in enumerate(declared):
            if name in declared[:i]:
                raise _at(f"tools[{i}].function.name", f"tool {name!r} is declared twice")
        choice = self.tool_choice
        if choice is not msgspec.UNSET and not declared:
            raise _at("tool_choice", "needs `tools` to choose from")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in declared:
            names = ", ".join(declared)
            raise _at(
                "tool_choice.function.name",
                f"{choice.function.name!r} is not a declared tool (declared: {names})",
            )
        _check_tool_answers(self.messages)

    def model_parameters(self) -> dict[str, Any]:
        """The parameters the payload sets, by name, for the provider's request body."""
        names = ("temperature", "top_p", "max_tokens", "seed", "stop", "tools", "tool_choice")
        found = {name: getattr(self, name) for name in names}
        return {name: plain(v) for name, v in found.items() if v is not msgspec.UNSET}


def _check_tool_answers(messages: tuple[ChatMessage, ...]) -> None:
    """Each `tool` message answers a call of the `assistant` message before it, and every such
    call is answered before the next other message, as providers require."""
    open_calls: list[str] = []
    for i, message in enumerate(messages):
        if message.role == "tool":
            if message.tool_call_id not in open_calls:
                raise _at(
                    f"messages[{i}].tool_call_id",
                    f"{message.tool_call_id!r} answers no open call of an earlier"
                    " `assistant` message",
                )
            open_calls.remove(str(message.tool_call_id))
            continue
        if open_calls:
            raise _at(f"messages[{i}]", f"tool calls {open_calls} are not answered before it")
        open_calls = list(message.call_ids())
    if open_calls:
        raise _at("messages", f"tool calls {open_calls} of the last message are not answered")


McpServerName = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9-]{0,31}$")]
MCP_SERVERS_MAX = 8


class McpServer(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An MCP server an agent step starts over stdio, in its sandbox, in the worktree
    (runner/agent/mcp.py): its tools are offered as `mcp__<name>__<tool>`. `command` is the
    argv, run as an allowed command is (no shell, no secret in its environment)."""

    name: McpServerName
    command: Annotated[tuple[NonEmpty, ...], msgspec.Meta(min_length=1, max_length=64)]


# The kinds of tree entry a candidate may hold, by git mode: "file" a regular file (100644),
# "executable" one with its x bit (100755, or a mode changed either way), "symlink" a symlink
# (120000) whose target stays inside the tree, "submodule" a gitlink (160000).
ENTRY_KINDS: Final = ("file", "executable", "symlink", "submodule")


class AgentPayload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The payload of the built-in `agent` kind: a tool loop over `messages` (runner/agent/loop.py).

    `allowed_commands` are the only command lines the `run` tool runs, matched exactly;
    `allowed_paths` the prefixes the model may write under in a scratch workspace (all of it
    when left out, none when empty). A step of a repository-bound task works in the repository
    its lease carries, under the task's allowed paths, and must not carry its own: the
    repository is never named in a payload. `max_tokens_total` is the step's token budget (all
    its attempts' completed turns), checked before each model call. `check_timeout_s` bounds
    each of the task's checks and each `setup` command (600 s when left out). `setup` are
    command lines run in the worktree before the first model call, after the repository's own
    (runner/agent/setup.py). `mcp_servers` are started for the step and their tools offered
    beside the built-in ones. `allowed_entries` are the kinds of entry a candidate may add
    or change (`ENTRY_KINDS`): regular files only when left out. A key not here is
    refused, never ignored.
    """

    messages: Annotated[tuple[ChatMessage, ...], msgspec.Meta(min_length=1)]
    allowed_commands: tuple[NonEmpty, ...]
    model: NonEmpty | msgspec.UnsetType = msgspec.UNSET
    max_turns: Annotated[int, msgspec.Meta(ge=1, le=100)] = 20
    max_tokens_total: Annotated[int, msgspec.Meta(ge=1)] | msgspec.UnsetType = msgspec.UNSET
    allowed_paths: tuple[str, ...] | msgspec.UnsetType = msgspec.UNSET
    run_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] | msgspec.UnsetType = msgspec.UNSET
    check_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] | msgspec.UnsetType = (
        msgspec.UNSET
    )
    mcp_servers: Annotated[tuple[McpServer, ...], msgspec.Meta(max_length=MCP_SERVERS_MAX)] = ()
    setup: tuple[NonEmpty, ...] = ()
    allowed_entries: tuple[str, ...] = ("file",)

    def __post_init__(self) -> None:
        _check_tool_answers(self.messages)
        for i, entry in enumerate(self.allowed_entries):
            if entry not in ENTRY_KINDS:
                raise _at(
                    f"allowed_entries[{i}]",
                    f"{entry!r} is not a kind of entry; the kinds are {', '.join(ENTRY_KINDS)}",
                )
        names = [server.name for server in self.mcp_servers]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise _at(f"mcp_servers[{i}].name", f"{name!r} is named twice")
        for field, commands in (("allowed_commands", self.allowed_commands), ("setup", self.setup)):
            for i, command in enumerate(commands):
                problem = command_line_problem(command)
                if problem is not None:
                    raise _at(f"{field}[{i}]", problem)
        paths = () if self.allowed_paths is msgspec.UNSET else self.allowed_paths
        for i, prefix in enumerate(paths):
            if not _inside_tree(prefix):
                raise _at(
                    f"allowed_paths[{i}]",
                    f"{prefix!r} is not a path inside the repository (absolute, climbing"
                    " above the root with `..`, or naming `.git`)",
                )


def command_line_problem(command: str) -> str | None:
    """What is wrong with `command` as a command line (split as a POSIX shell would, run
    without one), or None."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        return f"{command!r} is not a command line: {exc}"
    return None if words else "the command is empty"


def _inside_tree(prefix: str) -> bool:
    """Whether `prefix` names a place inside a worktree by its text alone (the runner checks
    it again on the real tree: runner/agent/paths.py)."""
    if "\0" in prefix or prefix.startswith(("/", "\\")):
        return False
    depth = 0
    for part in prefix.replace("\\", "/").split("/"):
        if part.lower() == ".git":
            return False
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in ("", "."):
            depth += 1
    return True


HttpMethod = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
DeadlineS = Annotated[float, msgspec.Meta(gt=0, le=7 * 86400)]
CredentialName = Annotated[str, msgspec.Meta(pattern=f"^{templates.CREDENTIAL_NAME.pattern}$")]
# An effect's delivery deadline when its payload names none.
DEFAULT_DEADLINE_S: Final = 300.0
# A branch name git accepts as `refs/heads/<branch>`, by its text (no `..`, no leading `-`).
_BRANCH = re.compile(r"(?!-)(?!.*\.\.)(?!.*//)(?!.*@\{)[A-Za-z0-9._/-]{1,200}(?<![./])")


def valid_branch(name: str) -> bool:
    """Whether git accepts `name` as `refs/heads/<name>`, by its text alone."""
    return _BRANCH.fullmatch(name) is not None and not name.endswith(".lock")


def _template_problem(exc: ValueError) -> ValueError:
    """A template error as a field problem: `read_payload` names the field from the
    `- at `$.<field>`` suffix, which the template error's own text starts with."""
    where, _, problem = str(exc).partition(": ")
    return _at(where, problem)


class HttpPayload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The payload of the built-in `http` effect kind, sent by the supervisor (never a runner).

    `url`, the header values and any string inside `body` may hold placeholders
    (`tether.wire.templates`): earlier steps' outputs, and in header values only,
    `{{ credential.<name> }}`. The URL's scheme is written in the plan: it starts with
    `http://` or `https://`. A header's name is an HTTP token and its text holds no control
    character or non-ASCII letter (what outputs fill in is checked again when due).
    `keyed: false` puts the effect behind an operator's gate; `deadline_s` bounds its
    delivery, retries included.
    """

    url: NonEmpty
    method: HttpMethod = "POST"
    headers: dict[NonEmpty, str] = {}
    body: Any = None
    keyed: bool = True
    deadline_s: DeadlineS = DEFAULT_DEADLINE_S

    def __post_init__(self) -> None:
        if not self.url.lower().startswith(("http://", "https://")):
            raise _at("url", "must start with http:// or https://")
        try:
            templates.check(self.url, "url", earlier=_ANY, credentials_allowed=False)
            templates.check(self.headers, "headers", earlier=_ANY, credentials_allowed=True)
            templates.check(self.body, "body", earlier=_ANY, credentials_allowed=False)
        except templates.TemplateError as exc:
            raise _template_problem(exc) from None
        for name, value in self.headers.items():
            problem = templates.header_name_problem(name)
            if problem is not None:
                raise _at(f"headers.{name}", problem)
            problem = templates.header_value_problem(templates.without_placeholders(value))
            if problem is not None:
                raise _at(f"headers.{name}", f"the value {problem}")


class GitPushPayload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The payload of the built-in `git.push` effect kind: move `branch` of the task's
    repository to the task's verified candidate, compare-and-swap against the approved base.
    Only a repository-bound task may have one. `credential` names a file of the supervisor's
    credentials folder (an SSH key or an HTTPS token). A push is keyed by nature."""

    branch: NonEmpty
    credential: CredentialName | None = None
    keyed: Literal[True] = True
    deadline_s: DeadlineS = DEFAULT_DEADLINE_S

    def __post_init__(self) -> None:
        if not valid_branch(self.branch):
            raise _at("branch", f"{self.branch!r} is not a branch name git accepts")
        if self.credential is not None and not templates.valid_credential_name(self.credential):
            raise _at("credential", f"{self.credential!r} cannot name a credential file")


class _Anything:
    """Every step name: the payload alone cannot know the plan's earlier steps (the ledger
    checks those at create)."""

    def __contains__(self, item: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


_ANY: Final = _Anything()

# The built-in kinds and their payload records: adding a kind is one line here.
PAYLOADS: Final[Mapping[str, type[msgspec.Struct]]] = MappingProxyType(
    {
        "chat": ChatPayload,
        "agent": AgentPayload,
        "http": HttpPayload,
        "git.push": GitPushPayload,
    }
)
# The built-in kinds the supervisor delivers itself; the others are leased to runners.
EFFECT_KINDS: Final = frozenset({"http", "git.push"})
BUILT_IN_KINDS: Final = frozenset(PAYLOADS)
# The supervisor's own step that re-runs a task's checks on a verifier (docs/design.md,
# Verification): added by the ledger's rules, never written in a plan.
VERIFY_KIND: Final = "verify"


class VerifyPayload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A `verify` step's payload: the candidate it re-checks, the digest of that candidate's
    bundle in the artifact store, and the setup commands the making step's payload added to
    the repository's (its lease's `repository` carries the checks and the repository's
    setup)."""

    candidate_sha: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{40}([0-9a-f]{24})?$")]
    bundle: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    setup: tuple[str, ...] = ()


def read_payload(payload: Any, into: type[R]) -> R:
    """`payload` (plain JSON data) as the record `into`; `ValueError` naming the field, like
    "`payload.messages[0].role`: invalid enum value 'usr'", if it is not one."""
    try:
        return msgspec.convert(payload, into)
    except msgspec.ValidationError as exc:
        what, _, path = with_hint(str(exc), into).partition(" - at `$")
        field = f"payload{path.rstrip('`')}"
        raise ValueError(f"`{field}`: {what[:1].lower()}{what[1:]}") from None


def check_payload(kind: str, payload: Any) -> None:
    """`ValueError` naming the field if `payload` is not what the built-in `kind` takes; any
    payload passes for a kind that is not built in."""
    if kind == VERIFY_KIND:
        raise ValueError(
            f"kind {VERIFY_KIND!r} is the supervisor's own step: a plan names a verifier with"
            ' the task\'s `verify` ({"pool": POOL}), never a step of that kind'
        )
    into = PAYLOADS.get(kind)
    if into is not None:
        read_payload(payload, into)


_UNKNOWN = re.compile(r"unknown field `(?P<field>[^`]*)`")


def with_hint(message: str, into: type[msgspec.Struct]) -> str:
    """msgspec's `message` about a value read as `into`, with "(did you mean `use_outputs`?)"
    after an unknown field that is a near miss of a field of `into` or of a record inside it.
    A message already hinted (by the payload's own record, read first) keeps its one hint."""
    unknown = _UNKNOWN.search(message)
    if unknown is None or message[unknown.end() :].startswith(" (did you mean"):
        return message  # none, or hinted already by the record the field is in: the closest
    close = difflib.get_close_matches(unknown["field"], sorted(set(_field_names(into))), n=1)
    if not close:
        return message
    at = unknown.end()
    return f"{message[:at]} (did you mean `{close[0]}`?){message[at:]}"


def _field_names(into: type[msgspec.Struct]) -> Iterator[str]:
    def walk(info: msgspec.inspect.Type) -> Iterator[str]:
        if isinstance(info, msgspec.inspect.StructType):
            for field in info.fields:
                yield field.encode_name
                yield from walk(field.type)
        elif isinstance(info, msgspec.inspect.UnionType):
            for member in info.types:
                yield from walk(member)
        elif isinstance(info, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
            yield from walk(info.item_type)

    yield from walk(msgspec.inspect.type_info(into))
