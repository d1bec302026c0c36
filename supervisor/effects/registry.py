"""Effect kinds by name: what delivers an effect step of a given kind (docs/design.md, Effects).

`http` and `git.push` are built in. A deployment adds its own through the entry-point group
`tether.effects`: the entry point's name is the kind, and it loads to a `Deliverer` (an object
with `kind` and `deliver`) or to a class or function that, called with no arguments, returns
one. A name that clashes with a built-in kind is refused at start, and so is an entry point
whose deliverer names another kind than its own.

A deliverer answers `Delivered`, `Refused` or `Unanswered` (supervisor.ledger.outbox). An
`Unanswered` that knows when to try again (an HTTP `Retry-After`) is a `RetryLater`; the
dispatcher waits at least that long and records it as a plain `Unanswered`.

What a registered kind is handed (`Outgoing.request`, rendered once when the step fell due,
`outbox_render.render_request`): its step's payload less `keyed` and `deadline_s`, where a string
that is exactly one `{{ steps.<step>.output[.path] }}` became that output's JSON value and a
placeholder inside a longer string became its text as it is -- not percent-encoded, not
checked for line breaks: a value is a model's words, and the deliverer, which alone knows
where it puts it (a URL, a header, a command), must encode or refuse it there as the
built-in `http` kind does (`tether.wire.templates.render_url`, `header_value_problem`).
`{{ credential.<name> }}` placeholders are left by name, for the deliverer to fill at send
time (`templates.fill_credentials` with `Credentials.read`) and to mask in what it answers
(`credentials.mask`); no output can have built one. The supervisor's `effect_allowed_hosts`
do not hold a registered kind: it connects where its code does
(`supervisor.effects.addresses.checked_address` is there to use).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from tether.supervisor.effects.credentials import Credentials
from tether.supervisor.ledger.outbox import Answer, Outgoing, Unanswered
from tether.wire.payloads import EFFECT_KINDS

ENTRY_POINT_GROUP = "tether.effects"


@runtime_checkable
class Deliverer(Protocol):
    """Sends one attempt of an effect and classifies what came back. It must not raise for
    anything the receiver or the network does: that is an answer (an exception is recorded as
    `Unanswered(sent=True)`, since nobody can say whether it sent)."""

    @property
    def kind(self) -> str: ...

    async def deliver(self, out: Outgoing, secrets: Credentials) -> Answer: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryLater(Unanswered):
    """An `Unanswered` whose receiver said when to try again (seconds from now)."""

    retry_after_s: float


class EffectKindError(Exception):
    """The effect kinds cannot be assembled; the message is one line naming the culprit."""


class EffectKinds:
    """Deliverers by kind. `with_entry_points(built_ins)` adds the group's."""

    def __init__(self, deliverers: Iterable[Deliverer] = ()) -> None:
        self._by_kind: dict[str, Deliverer] = {}
        for deliverer in deliverers:
            self.add(deliverer)

    def add(self, deliverer: Deliverer, *, origin: str = "") -> None:
        kind = deliverer.kind
        if not isinstance(kind, str) or not kind or not kind.isprintable() or " " in kind:
            raise EffectKindError(f"effect kind {kind!r}{origin} is not a usable name")
        if kind in self._by_kind:
            clash = "a built-in kind" if kind in EFFECT_KINDS else "another effect kind"
            raise EffectKindError(f"effect kind {kind!r}{origin} clashes with {clash}")
        self._by_kind[kind] = deliverer

    def get(self, kind: str) -> Deliverer | None:
        return self._by_kind.get(kind)

    def names(self) -> frozenset[str]:
        return frozenset(self._by_kind)

    @classmethod
    def with_entry_points(
        cls,
        built_ins: Iterable[Deliverer],
        entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    ) -> EffectKinds:
        """`built_ins` plus every deliverer of the group `tether.effects` (or of
        `entry_points`, when given)."""
        kinds = cls(built_ins)
        found = (
            importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
            if entry_points is None
            else entry_points
        )
        for ep in found:
            origin = f" (entry point {ep.name} = {ep.value})"
            if ep.name in kinds.names():
                clash = "a built-in kind" if ep.name in EFFECT_KINDS else "another entry point"
                raise EffectKindError(f"effect kind {ep.name!r}{origin} clashes with {clash}")
            try:
                loaded = ep.load()
                ready = isinstance(loaded, Deliverer) and not isinstance(loaded, type)
                deliverer = loaded if ready else loaded()
            except Exception as exc:
                raise EffectKindError(
                    f"effect kind {ep.name!r}{origin} cannot be loaded: {exc}"
                ) from exc
            if not isinstance(deliverer, Deliverer):
                raise EffectKindError(f"effect kind {ep.name!r}{origin} is not a Deliverer")
            if deliverer.kind != ep.name:
                raise EffectKindError(
                    f"effect kind {ep.name!r}{origin} delivers kind {deliverer.kind!r} instead"
                )
            kinds.add(deliverer, origin=origin)
        return kinds
