"""The placeholders of an effect step's payload: checked when the plan is created, filled in
when the step becomes due (docs/design.md, Effects).

Two placeholders exist, written `{{ ... }}` with optional spaces inside the braces:

- `{{ steps.<step name>.output }}` or `{{ steps.<step name>.output.<dotted.path> }}`: the
  committed output of an earlier step of the same plan, or a value inside it (a path segment
  of digits indexes a list). A string that is exactly one placeholder takes the JSON value
  itself (except in a header value, which stays text); a placeholder inside a longer string
  is replaced by its text (a string as it is, anything else as compact JSON).
- `{{ credential.<name> }}`: a file of the supervisor's credentials folder, allowed only where
  the payload's kind says (an `http` step's header values). It is never filled in here: the
  rendered request keeps it by name, and the dispatcher substitutes it at send time.

Where credentials are filled at send time (and in an `http` URL), the rendered text may hold
no `{{` or `}}` but the template's own credential placeholders, in their order: outputs (a
model's words) could otherwise build one, even from two adjacent placeholders each holding
half of it, and have a secret sent where the plan put none.

At create only a placeholder's form and its step's name can be checked: whether the path
exists in that step's output is known once the step has committed, and a path missing then
fails the effect step (`effect_render_failed`) before anything is sent.

Pure functions over plain JSON data; nothing here reads the ledger or a file.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Final

CREDENTIAL_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_BRACES: Final = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_STEP: Final = re.compile(r"steps\.(?P<step>[^.\s{}]+)\.output(?:\.(?P<path>[^\s{}]+))?")
_CREDENTIAL: Final = re.compile(r"credential\.(?P<name>\S+)")


def valid_credential_name(name: str) -> bool:
    """A credential's name: 1 to 64 of `A-Z a-z 0-9 _ . -`, and not `.` or `..` (it names a
    file of the credentials folder)."""
    return CREDENTIAL_NAME.fullmatch(name) is not None and name not in (".", "..")


class TemplateError(ValueError):
    """A placeholder is malformed or names what it may not; the message says which and where."""


class RenderError(ValueError):
    """A placeholder's value is not in the committed outputs at due time."""


@dataclasses.dataclass(frozen=True)
class StepRef:
    """`{{ steps.<step>.output[.<path>] }}`."""

    step: str
    path: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class CredentialRef:
    """`{{ credential.<name> }}`."""

    name: str


Placeholder = StepRef | CredentialRef


def parse(inner: str, where: str) -> Placeholder:
    """The placeholder written `{{ inner }}` at `where`; `TemplateError` if it is neither form."""
    text = inner.strip()
    step = _STEP.fullmatch(text)
    if step is not None:
        path = tuple(step["path"].split(".")) if step["path"] else ()
        if any(not segment for segment in path):
            raise TemplateError(f"{where}: placeholder {{{{ {text} }}}} has an empty path segment")
        return StepRef(step["step"], path)
    credential = _CREDENTIAL.fullmatch(text)
    if credential is not None:
        name = credential["name"]
        if not valid_credential_name(name):
            raise TemplateError(
                f"{where}: credential name {name!r} must be 1..64 of A-Z a-z 0-9 _ . -"
            )
        return CredentialRef(name)
    raise TemplateError(
        f"{where}: malformed placeholder {{{{ {text} }}}}; write"
        " {{ steps.<step>.output.<path> }} or {{ credential.<name> }}"
    )


def placeholders_in(text: str, where: str) -> list[Placeholder]:
    """Every placeholder of one string; `TemplateError` for a malformed one or a stray `{{`."""
    found = [parse(m.group(1), where) for m in _BRACES.finditer(text)]
    rest = _BRACES.sub("", text)
    if "{{" in rest or "}}" in rest:
        raise TemplateError(f"{where}: unbalanced '{{{{' or '}}}}' in {text[:80]!r}")
    return found


def strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every string inside `value` (object keys excluded), with where it is (`body.items[0]`)."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from strings(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from strings(item, f"{where}[{i}]")


def check(
    value: Any, where: str, *, earlier: Collection[str], credentials_allowed: bool
) -> list[Placeholder]:
    """The placeholders inside `value`, after checking each: a step placeholder must name one
    of `earlier` (the names of the steps before this one), a credential only where allowed.
    `TemplateError` otherwise."""
    found: list[Placeholder] = []
    for at, text in strings(value, where):
        for ref in placeholders_in(text, at):
            if isinstance(ref, StepRef) and ref.step not in earlier:
                raise TemplateError(
                    f"{at}: placeholder names step {ref.step!r}, which is not an earlier step"
                    " of this plan"
                )
            if isinstance(ref, CredentialRef) and not credentials_allowed:
                raise TemplateError(
                    f"{at}: {{{{ credential.{ref.name} }}}} is allowed only in header values"
                )
            found.append(ref)
    return found


def credential_names(value: Any) -> set[str]:
    """The names of every credential placeholder inside `value` (already checked)."""
    return {
        ref.name
        for at, text in strings(value, "")
        for ref in placeholders_in(text, at)
        if isinstance(ref, CredentialRef)
    }


def _lookup(outputs: Mapping[str, Any], ref: StepRef, where: str) -> Any:
    if ref.step not in outputs:
        raise RenderError(f"{where}: step {ref.step!r} has no committed output")
    value = outputs[ref.step]
    walked = f"steps.{ref.step}.output"
    for segment in ref.path:
        if isinstance(value, Mapping) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            raise RenderError(f"{where}: {walked} has no {segment!r}")
        walked += f".{segment}"
    return value


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def render(
    value: Any,
    outputs: Mapping[str, Any],
    where: str = "payload",
    *,
    as_text: bool = False,
    sealed: bool = False,
) -> Any:
    """`value` with every step placeholder filled from `outputs` (committed outputs by step
    name); credential placeholders are left as written. `RenderError` for a missing value.
    With `as_text` (header values, a URL) even a string that is one placeholder stays a
    string. With `sealed` or `as_text` (credentials may be filled into the result at send
    time), `RenderError` too when a rendered string holds any `{{` or `}}` but the template's
    own credential placeholders (`_seal`)."""
    if isinstance(value, str):
        return _render_string(value, outputs, where, as_text, sealed or as_text)
    if isinstance(value, Mapping):
        return {
            k: render(v, outputs, f"{where}.{k}", as_text=as_text, sealed=sealed)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [
            render(v, outputs, f"{where}[{i}]", as_text=as_text, sealed=sealed)
            for i, v in enumerate(value)
        ]
    return value


def _render_string(
    text: str, outputs: Mapping[str, Any], where: str, as_text: bool, sealed: bool
) -> Any:
    whole = _BRACES.fullmatch(text) if not as_text else None
    if whole is not None and len(_BRACES.findall(text)) == 1:
        ref = parse(whole.group(1), where)
        if not isinstance(ref, StepRef):
            return text
        value = _lookup(outputs, ref, where)
        if sealed:
            _seal(_text(value), [], where)
        return value
    own: list[str] = []

    def fill(match: re.Match[str]) -> str:
        ref = parse(match.group(1), where)
        if isinstance(ref, CredentialRef):
            own.append(match.group(0))
            return match.group(0)
        return _text(_lookup(outputs, ref, where))

    rendered = _BRACES.sub(fill, text)
    if sealed:
        _seal(rendered, own, where)
    return rendered


def _seal(rendered: str, own: list[str], where: str) -> None:
    """`RenderError` unless the only `{{`...`}}` in `rendered` are `own`, the template's own
    credential placeholders as written, in order, and no `{{` or `}}` is left beside them:
    the text credentials are filled into at send time holds none that outputs built."""
    found = [m.group(0) for m in _BRACES.finditer(rendered)]
    rest = _BRACES.sub("", rendered)
    if found != own or "{{" in rest or "}}" in rest:
        raise RenderError(
            f"{where}: earlier steps' outputs put '{{{{' or '}}}}' into it; refused, since"
            " credentials are filled into it at send time"
        )


def fill_credentials(text: str, read: Callable[[str], str]) -> str:
    """`text` with each `{{ credential.<name> }}` replaced by `read(name)`: for the dispatcher,
    at send time, on the copy it sends. Step placeholders were filled at due time; any left
    raises `TemplateError`."""

    def fill(match: re.Match[str]) -> str:
        ref = parse(match.group(1), "request")
        if isinstance(ref, StepRef):
            raise TemplateError("request: an unfilled step placeholder is left at send time")
        return read(ref.name)

    return _BRACES.sub(fill, text)
