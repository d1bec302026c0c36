"""The payloads of the built-in step kinds as typed records, one per kind in `PAYLOADS`.

The supervisor checks each step of a plan against its kind's record when the task is created
(`tether.messages.PlanStep`), and the runner reads a lease's payload into the same record
before it acts; so a payload is refused at submit for exactly what a runner would refuse. A
kind not in the table (one a deployment adds to its runners) has a payload of its own shape,
checked by its runner only.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec
import msgspec.inspect

R = TypeVar("R", bound=msgspec.Struct)

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One message of a `chat` payload."""

    role: Literal["system", "user", "assistant"]
    content: str


class ChatPayload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The payload of the built-in `chat` kind: one completion for `messages`.

    `model` defaults to the runner's `model` setting; the model parameters, when given, go to
    the provider as they are. With `use_outputs` the outputs of the task's earlier steps go to
    the model as one `user` message after the payload's leading `system` messages. A key not
    here is refused, never ignored.
    """

    messages: Annotated[tuple[ChatMessage, ...], msgspec.Meta(min_length=1)]
    model: NonEmpty | msgspec.UnsetType = msgspec.UNSET
    temperature: float | msgspec.UnsetType = msgspec.UNSET
    top_p: float | msgspec.UnsetType = msgspec.UNSET
    max_tokens: int | msgspec.UnsetType = msgspec.UNSET
    seed: int | msgspec.UnsetType = msgspec.UNSET
    stop: str | tuple[str, ...] | msgspec.UnsetType = msgspec.UNSET
    use_outputs: bool = False

    def model_parameters(self) -> dict[str, Any]:
        """The parameters the payload sets, by name, for the provider's request body."""
        names = ("temperature", "top_p", "max_tokens", "seed", "stop")
        found = {name: getattr(self, name) for name in names}
        return {
            name: list(value) if isinstance(value, tuple) else value
            for name, value in found.items()
            if value is not msgspec.UNSET
        }


# The built-in kinds and their payload records: adding a kind is one line here.
PAYLOADS: Final[Mapping[str, type[msgspec.Struct]]] = MappingProxyType({
    "chat": ChatPayload,
})  # fmt: skip
BUILT_IN_KINDS: Final = frozenset(PAYLOADS)


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
    into = PAYLOADS.get(kind)
    if into is not None:
        read_payload(payload, into)


_UNKNOWN = re.compile(r"unknown field `(?P<field>[^`]*)`")


def with_hint(message: str, into: type[msgspec.Struct]) -> str:
    """msgspec's `message` about a value read as `into`, with "(did you mean `use_outputs`?)"
    after an unknown field that is a near miss of a field of `into` or of a record inside it."""
    unknown = _UNKNOWN.search(message)
    if unknown is None:
        return message
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
