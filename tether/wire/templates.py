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

An `http` URL (`render_url`) is filled by position: each value is percent-encoded (every
byte but `A-Z a-z 0-9 - . _ ~`), and one that would add a `?`, a `#`, a path segment break
(`/`, `\\`) or a dot segment (`.`, `..`, an empty segment) is refused; after filling, the
scheme, host, port and everything before the first placeholder must read as the plan wrote
them. A header value (`check_header_value`) holds no line break, NUL or other control
character and no non-ASCII letter: HTTP cannot carry them, and the client would fail after
the attempt was recorded as maybe sent.

At create only a placeholder's form and its step's name can be checked: whether the path
exists in that step's output is known once the step has committed, and a path missing then
(or a value the rules above refuse) fails the effect step (`effect_render_failed`) before
anything is sent.

Pure functions over plain JSON data; nothing here reads the ledger or a file.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Final
from urllib.parse import quote, unquote

import httpx
from httpx._urlparse import MAX_URL_LENGTH

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


# The same few placeholders are parsed for every step that falls due: parsed once (a
# placeholder is a frozen value; an error is raised anew each time).
_parsed = functools.lru_cache(maxsize=4096)(parse)


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
        ref = _parsed(whole.group(1), where)
        if not isinstance(ref, StepRef):
            return text
        value = _lookup(outputs, ref, where)
        if sealed:
            _seal(_text(value), [], where)
        return value
    own: list[str] = []

    def fill(match: re.Match[str]) -> str:
        ref = _parsed(match.group(1), where)
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


def without_placeholders(text: str) -> str:
    """`text` with every placeholder replaced by `x`: a template's own shape, for reading
    what surrounds its placeholders (a URL's host)."""
    return _BRACES.sub("x", text)


# What a value in a URL may not hold, by position: it would add a query, a fragment or a
# path segment break (some servers read a backslash as a slash).
_URL_REFUSED: Final = {"path": "?#/\\", "query": "?#", "fragment": "?#"}
_DOT_SEGMENTS: Final = frozenset({"", ".", ".."})


def render_url(template: str, outputs: Mapping[str, Any], where: str = "payload.url") -> str:
    """The URL `template` with its step placeholders filled from `outputs`, each value
    percent-encoded for its position (path, query or fragment: the template's text before
    it says which); `RenderError` when a value holds what its position refuses
    (`_URL_REFUSED`), makes its path segment a dot or empty segment, or the filled URL's
    scheme, host, port or text before the first placeholder does not read as the
    template's (`_check_url`). A credential placeholder has no place in a URL."""
    literals, inners, positions = _url_template(template)
    pieces = [literals[0]]
    filled: list[tuple[int, int]] = []  # where each value sits in the rendered text
    length = len(literals[0])
    for inner, position, literal in zip(inners, positions, literals[1:], strict=True):
        ref = _parsed(inner, where)
        if not isinstance(ref, StepRef):
            raise RenderError(f"{where}: a credential has no place in a URL")
        text = _text(_lookup(outputs, ref, where))
        if any(c in text for c in _URL_REFUSED[position]):
            shown = " ".join(repr(c) for c in sorted(set(text) & set(_URL_REFUSED[position])))
            raise RenderError(
                f"{where}: the value of {{{{ {inner.strip()} }}}} holds {shown}, which"
                f" would change the URL's {'path' if position == 'path' else 'query'}; refused"
            )
        value = quote(text, safe="")
        pieces += (value, literal)
        filled.append((length, length + len(value)))
        length += len(value) + len(literal)
    rendered = "".join(pieces)
    if filled:
        _check_url(template, rendered, filled, where)
    return rendered


@functools.lru_cache(maxsize=1024)
def _url_template(template: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """`template` taken apart once (every step of a task renders the same text): the
    literal text around its placeholders, each placeholder's inner text, and each one's
    position (`_url_position`)."""
    literals: list[str] = []
    inners: list[str] = []
    positions: list[str] = []
    at = 0
    for match in _BRACES.finditer(template):
        literals.append(template[at : match.start()])
        inners.append(match.group(1))
        positions.append(_url_position(without_placeholders(template[: match.start()])))
        at = match.end()
    literals.append(template[at:])
    return tuple(literals), tuple(inners), tuple(positions)


def _url_position(before: str) -> str:
    """Where a placeholder after the URL text `before` sits: path, query or fragment."""
    if "#" in before:
        return "fragment"
    return "query" if "?" in before else "path"


def _check_url(template: str, rendered: str, filled: list[tuple[int, int]], where: str) -> None:
    """`RenderError` when a path segment holding a value is `.`, `..` or empty (percent-encoded
    dots count: a receiver may decode them), or `rendered`, read as the client sends it, has
    another scheme, host or port than the template's text before its first placeholder, or
    a path-and-query that does not start with that text's."""
    path_end = min(
        (i for i in (rendered.find("?"), rendered.find("#")) if i >= 0), default=len(rendered)
    )
    authority_end = rendered.find("/", rendered.find("://") + 3)
    for start, end in filled:
        if start >= path_end or authority_end < 0:
            continue
        segment_start = rendered.rfind("/", authority_end, start) + 1
        segment_end = rendered.find("/", end, path_end)
        segment = rendered[segment_start : path_end if segment_end < 0 else segment_end]
        if unquote(segment) in _DOT_SEGMENTS:
            raise RenderError(
                f"{where}: a value makes the path segment {segment!r}, which would move the"
                " request to another path; refused"
            )
    plan = template[: filled[0][0]]
    if not _reads_as_plan(plan, rendered):
        _check_start(plan, rendered, where)


def _check_start(plan: str, rendered: str, where: str) -> None:
    """`RenderError` unless `rendered`, read as httpx sends it, has the scheme, host and port
    of `plan` (the template's text before its first placeholder) and a path-and-query that
    starts with `plan`'s."""
    try:
        origin, path = _origin_and_path(rendered)
        prefix_origin, prefix_path = _plan_origin_and_path(plan)
    except httpx.InvalidURL as exc:
        raise RenderError(f"{where}: the filled URL is not a URL: {exc}") from None
    if origin != prefix_origin or not path.startswith(prefix_path):
        raise RenderError(
            f"{where}: the filled URL's scheme, host, port or start differs from the plan's"
            f" {plan[:80]!r}; refused"
        )


def _origin_and_path(url: str) -> tuple[tuple[str, bytes, int | None], bytes]:
    """`url` read as httpx sends it: (scheme, host, port) and the raw path with its query."""
    parsed = httpx.URL(url)
    return (parsed.scheme, parsed.raw_host, parsed.port), parsed.raw_path


# The plan's text before its first placeholder is the same for every step of a task, and
# httpx's parser is most of a check's cost (two parses were 60 of 71 us a URL): parsed once.
_plan_origin_and_path = functools.lru_cache(maxsize=1024)(_origin_and_path)

# `scheme://authority/`, as httpx's own URL pattern splits the start of a URL.
_AUTHORITY_ENDED: Final = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*/")


def _reads_as_plan(plan: str, rendered: str) -> bool:
    """Whether `rendered` (which starts with `plan`) passes `_check_start` without being
    parsed: true only when `_plan_path_start` vouches for `plan` and `rendered` is printable
    ASCII within httpx's length limit whose path has no `.` or `..` segment. False says
    nothing: `_check_start` decides.

    Why that is enough, read from httpx's parser (tests/supervisor/effects/
    test_effect_templates.py holds it to the full parse): the scheme and the authority end
    inside `plan`, so httpx reads the same ones from both texts, and fails on `rendered`
    only for its length or a control character; the path then starts at the same `/`.
    httpx removes dot segments from the path (none here, nor in `plan`'s) and quotes the
    path and the query character by character (`%` is left as it is), so what `plan` holds
    of them, which httpx leaves as written, is the start of what `rendered` holds; where
    `plan` already holds the `?` or the `#`, the path (and the query) are `plan`'s own."""
    start = _plan_path_start(plan)
    if start is None or len(rendered) > MAX_URL_LENGTH:
        return False
    if not (rendered.isascii() and rendered.isprintable()):
        return False
    ends = [i for i in (rendered.find("?", start), rendered.find("#", start)) if i >= 0]
    path = rendered[start : min(ends, default=len(rendered))]
    return "." not in path or not _DOT_NAMES.intersection(path.split("/"))


_DOT_NAMES: Final = frozenset({".", ".."})


@functools.lru_cache(maxsize=1024)
def _plan_path_start(plan: str) -> int | None:
    """Where the path starts in `plan` (the `/` that ends its authority) when httpx reads
    `plan`'s path and query as written (so they hold no dot segment, which it drops); None
    otherwise (the authority does not end inside `plan`, or httpx would quote, drop or
    refuse some of it)."""
    ended = _AUTHORITY_ENDED.match(plan)
    if ended is None:
        return None
    start = ended.end() - 1
    written = plan[start:].split("#", 1)[0]
    if not written.isascii():
        return None
    try:
        _, path = _plan_origin_and_path(plan)
    except httpx.InvalidURL:
        return None
    return start if path == written.encode("ascii") else None


# HTTP field values: visible ASCII, space and tab (RFC 9110, 5.5; h11 refuses the rest).
_HEADER_VALUE: Final = re.compile(r"[\t\x20-\x7e]*")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def header_name_problem(name: str) -> str | None:
    """Why `name` cannot be an HTTP header's name (RFC 9110 token characters), or None."""
    if _HEADER_NAME.fullmatch(name):
        return None
    return f"header name {name[:80]!r} holds a character a header name may not"


def header_value_problem(value: str) -> str | None:
    """Why `value` cannot be sent as an HTTP header's value, or None: a line break, NUL or
    other control character would end the header early (or be refused by the client after
    the attempt is recorded), and a non-ASCII character cannot be encoded."""
    if _HEADER_VALUE.fullmatch(value):
        return None
    bad = next(c for c in value if not _HEADER_VALUE.fullmatch(c))
    what = {"\r": "a carriage return", "\n": "a line feed", "\0": "a NUL"}.get(bad)
    return f"holds {what or f'the character {bad!r}'}, which an HTTP header value may not"


def render_headers(
    headers: Mapping[str, Any], outputs: Mapping[str, Any], where: str = "payload.headers"
) -> dict[str, str]:
    """The header values filled from `outputs` (as text, sealed: credentials are filled in at
    send time); `RenderError` for a value `header_value_problem` refuses."""
    rendered: dict[str, str] = render(headers, outputs, where, as_text=True)
    for name, value in rendered.items():
        problem = header_value_problem(str(value))
        if problem is not None:
            raise RenderError(f"{where}.{name}: the filled value {problem}; refused")
    return rendered
