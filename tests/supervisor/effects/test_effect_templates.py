"""The placeholder grammar of effect payloads (`tether.wire.templates`): checked at create,
filled at due time, credentials filled only at send time."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tether.wire import templates as t
from tether.wire.payloads import check_payload

OUTPUTS = {"build": {"version": "1.2", "sizes": [3, 5], "meta": {"ok": True}}}


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ("{{ steps.build.output.version }}", "1.2"),
        ("{{steps.build.output.sizes}}", [3, 5]),
        ("{{ steps.build.output.sizes.1 }}", 5),
        ("{{ steps.build.output.meta }}", {"ok": True}),
        ("v{{ steps.build.output.version }}-{{ steps.build.output.sizes }}", "v1.2-[3,5]"),
        ({"a": ["{{ steps.build.output.meta.ok }}"]}, {"a": [True]}),
        ("no placeholder", "no placeholder"),
        ("Bearer {{ credential.tok }}", "Bearer {{ credential.tok }}"),
    ],
)
def test_render_fills_step_outputs_and_leaves_credentials(value: Any, rendered: Any) -> None:
    assert t.render(value, OUTPUTS) == rendered


def test_a_header_value_stays_text_even_as_one_placeholder() -> None:
    assert t.render("{{ steps.build.output.sizes.0 }}", OUTPUTS, as_text=True) == "3"


def test_an_output_cannot_smuggle_a_credential_into_a_header_value() -> None:
    outputs = {"build": {"text": "x {{ credential.push-key }}"}}
    with pytest.raises(t.RenderError, match=r"put '\{\{' or '\}\}'"):
        t.render("v={{ steps.build.output.text }}", outputs, "headers.X-Note", as_text=True)
    # In a body, which is never filled with credentials, the text is data.
    body = t.render({"note": "{{ steps.build.output.text }}"}, outputs)
    assert body == {"note": "x {{ credential.push-key }}"}


@pytest.mark.parametrize(
    ("template", "outputs"),
    [
        # Two adjacent placeholders, each holding half of a credential placeholder.
        ("{{ steps.a.output }}{{ steps.b.output }}", {"a": "{", "b": "{ credential.x }}"}),
        ("{{ steps.a.output }}{{ steps.b.output }}", {"a": "{{ credential", "b": ".x }}"}),
        # An output beside the template's own credential, opening or closing it anew.
        ("{{ steps.a.output }}{{ credential.x }}", {"a": "{{ credential.y"}),
        ("{{ credential.x }}{{ steps.a.output }}", {"a": "}}"}),
        ("Bearer {{ credential.x }} {{ steps.a.output }}", {"a": "{{ credential.x }}"}),
    ],
)
def test_outputs_never_build_a_credential_placeholder_where_credentials_are_filled(
    template: str, outputs: dict[str, Any]
) -> None:
    with pytest.raises(t.RenderError, match="credentials are filled into it at send time"):
        t.render({"X-Note": template}, outputs, "payload.headers", as_text=True)
    # The same for a registered kind's payload, filled anywhere (`sealed`), one placeholder
    # taking the whole value included.
    with pytest.raises(t.RenderError):
        t.render({"text": template}, outputs, "payload", sealed=True)
    with pytest.raises(t.RenderError):
        t.render({"text": "{{ steps.a.output }}"}, {"a": ["{{ credential.x }}"]}, sealed=True)


def test_a_sealed_render_keeps_the_template_s_own_credentials_and_plain_outputs() -> None:
    outputs = {"a": "v1 {curly}", "b": {"n": 1}}
    header = t.render(
        "Bearer {{ credential.x }}; {{ steps.a.output }} {{ steps.b.output }}",
        outputs,
        as_text=True,
    )
    assert header == 'Bearer {{ credential.x }}; v1 {curly} {"n":1}'
    assert (
        t.fill_credentials(header, {"x": "s3cret"}.__getitem__)
        == 'Bearer s3cret; v1 {curly} {"n":1}'
    )
    assert t.render({"k": "{{ steps.b.output }}"}, outputs, sealed=True) == {"k": {"n": 1}}


@pytest.mark.parametrize(
    "value",
    [
        "{{ steps.build.output.missing }}",
        "{{ steps.build.output.sizes.9 }}",
        "{{ steps.other.output }}",
        "x{{ steps.build.output.version.deeper }}",
    ],
)
def test_a_missing_value_is_a_render_error(value: str) -> None:
    with pytest.raises(t.RenderError):
        t.render({"body": value}, OUTPUTS)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{{ step.build.output }}", "malformed placeholder"),
        ("{{ steps.build }}", "malformed placeholder"),
        ("{{ steps.build.output.a..b }}", "empty path segment"),
        ("{{ steps.build.output", "unbalanced"),
        ("}} nothing opened", "unbalanced"),
        ("{{ credential.a b }}", "malformed placeholder"),
        ("{{ credential.%s }}" % ("x" * 65), "credential name"),
        ("{{ steps.later.output }}", "not an earlier step"),
        ("{{ credential.tok }}", "only in header values"),
    ],
)
def test_check_refuses_what_cannot_be_rendered(text: str, words: str) -> None:
    with pytest.raises(t.TemplateError, match=words):
        t.check({"x": text}, "body", earlier=["build"], credentials_allowed=False)


def test_check_names_the_field_and_returns_the_placeholders() -> None:
    found = t.check(
        {"Authorization": "Bearer {{ credential.deploy-token }}", "X": "{{ steps.build.output }}"},
        "headers",
        earlier=["build"],
        credentials_allowed=True,
    )
    assert found == [t.CredentialRef("deploy-token"), t.StepRef("build", ())]
    with pytest.raises(t.TemplateError, match=r"^body\.items\[1\]: "):
        t.check({"items": ["ok", "{{ nope }}"]}, "body", earlier=[], credentials_allowed=False)


def test_credentials_are_filled_only_by_fill_credentials() -> None:
    assert t.credential_names({"h": "{{ credential.a }} {{credential.b}}"}) == {"a", "b"}
    filled = t.fill_credentials("Bearer {{ credential.a }}", {"a": "s3cret"}.__getitem__)
    assert filled == "Bearer s3cret"
    with pytest.raises(t.TemplateError):
        t.fill_credentials("{{ steps.build.output }}", str)


def test_a_push_credential_is_named_by_the_same_rule_as_a_placeholders() -> None:
    check_payload("git.push", {"branch": "main", "credential": "push-key"})
    for bad in ("..", ".", "a/b"):
        assert not t.valid_credential_name(bad)
        with pytest.raises(ValueError, match="credential"):
            check_payload("git.push", {"branch": "main", "credential": bad})


# -- a URL filled by position, header values HTTP can carry -------------------------------------

HOOK = "http://host/api/v1/deploy/{{ steps.build.output.v }}/hook"


@pytest.mark.parametrize(
    "value",
    [
        "../../../admin/delete-all?confirm=yes#",  # issue 23: a path and query of its own
        "a/b",
        "a\\b",
        "v?x=1",
        "v#frag",
        "..",
        ".",
        "",
    ],
)
def test_a_value_that_would_steer_the_url_is_refused(value: str) -> None:
    with pytest.raises(t.RenderError, match="refused"):
        t.render_url(HOOK, {"build": {"v": value}})


@pytest.mark.parametrize(
    ("template", "value", "rendered"),
    [
        (HOOK, "1.2.3", "http://host/api/v1/deploy/1.2.3/hook"),
        (HOOK, "%2e%2e", "http://host/api/v1/deploy/%252e%252e/hook"),
        (HOOK, "a b&c=d;é", "http://host/api/v1/deploy/a%20b%26c%3Dd%3B%C3%A9/hook"),
        (HOOK, "...", "http://host/api/v1/deploy/.../hook"),
        (
            "https://h/x?tag={{ steps.build.output.v }}",
            "a&admin=1",
            "https://h/x?tag=a%26admin%3D1",
        ),
        ("https://h/x?tag={{ steps.build.output.v }}", "..", "https://h/x?tag=.."),
        ("https://h/v{{ steps.build.output.v }}", 7, "https://h/v7"),
        ("https://h/{{ steps.build.output.v }}", {"k": 1}, "https://h/%7B%22k%22%3A1%7D"),
    ],
)
def test_a_value_is_percent_encoded_for_its_place(template: str, value: Any, rendered: str) -> None:
    assert t.render_url(template, {"build": {"v": value}}) == rendered


def test_a_placeholder_s_own_text_does_not_move_the_next_one_into_the_query() -> None:
    """A path key may hold `?`: the placeholder after it is still in the path."""
    outputs = {"build": {"a?b": "x", "v": "admin/delete"}}
    template = "http://h/api/{{ steps.build.output.a?b }}/{{ steps.build.output.v }}"
    with pytest.raises(t.RenderError, match="would change the URL's path"):
        t.render_url(template, outputs)


def test_a_value_may_not_complete_a_dot_segment_the_plan_began() -> None:
    with pytest.raises(t.RenderError, match=r"path segment '\.\.'"):
        t.render_url("http://h/a/.{{ steps.build.output.v }}/b", {"build": {"v": "."}})
    with pytest.raises(t.RenderError, match=r"path segment '%2e\.'"):
        t.render_url("http://h/a/%2e{{ steps.build.output.v }}/b", {"build": {"v": "."}})


@pytest.mark.parametrize(
    "value", ["1.0\r\nX-Injected: yes", "a\nb", "a\rb", "nul\x00", "bell\x07", "é", "del\x7f"]
)
def test_a_header_value_http_cannot_carry_is_refused_when_filled(value: str) -> None:
    headers = {"X-Version": "{{ steps.build.output.v }}", "Authorization": "{{ credential.k }}"}
    with pytest.raises(t.RenderError, match=r"payload\.headers\.X-Version: the filled value"):
        t.render_headers(headers, {"build": {"v": value}})
    assert t.render_headers(headers, {"build": {"v": "1.0\tok"}}) == {
        "X-Version": "1.0\tok",
        "Authorization": "{{ credential.k }}",
    }


@pytest.mark.parametrize(
    ("headers", "words"),
    [
        ({"X-A\r\nX-B": "v"}, "header name"),
        ({"X A": "v"}, "header name"),
        ({"X-A": "v\r\nX-B: w"}, "a carriage return"),
        ({"X-A": "caf\u00e9"}, "the character 'é'"),
    ],
)
def test_header_names_and_plan_values_are_checked_at_create(
    headers: dict[str, str], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        check_payload("http", {"url": "https://h/x", "headers": headers})


@pytest.mark.parametrize(
    "template",
    [
        "https://{{ steps.build.output.v }}/deploy",  # the whole host
        "https://api.{{ steps.build.output.v }}/deploy",  # the rest of the host
        "https://api.example.com{{ steps.build.output.v }}/deploy",  # host continued
        "https://api.example.com:{{ steps.build.output.p }}/deploy",  # the port
    ],
)
def test_a_step_output_cannot_steer_the_urls_host_or_port(template: str) -> None:
    """A model-written output placed in the authority would send the credentialed request
    elsewhere: the filled URL's scheme, host and port must read as the plan's."""
    outputs = {"build": {"v": "evil.example", "p": "8443"}}
    for _ in range(2):  # the second reads the plan's prefix from the cache
        with pytest.raises(t.RenderError, match="differs from the plan's"):
            t.render_url(template, outputs)


# -- the check's shortcut for a plan whose authority ends before its first placeholder -----------

_URL_BITS = [
    *("/", "//", ".", "..", "?", "#", "@", ":", ":80", ":443", "[", "]", "[::1]", "\\"),
    *("%", "%2e", "%2E", "%41", "%zz", " ", "\t", "\x7f", "é", "{", "`", "~", "a", "A", "9"),
]
_URL_TEXT = st.lists(st.sampled_from(_URL_BITS), max_size=8).map("".join)
_PLAN_REST = st.tuples(st.sampled_from(["", "/", "/a/"]), _URL_TEXT).map("".join)
_STARTS = ["https://", "http://", "HTTPS://", "h+x.y://", "https:", "https:///", "//", ""]
_HOSTS = ["h", "H.Example", "h:8443", "h:443", "h:x", "[::1]", "1.2.3.4", "u:p@h", "h%41", "é.e"]


def _full_check_passes(plan: str, rendered: str) -> bool:
    try:
        t._check_start(plan, rendered, "url")
    except t.RenderError:
        return False
    return True


@settings(max_examples=500, deadline=None)
@given(
    start=st.sampled_from(_STARTS),
    host=st.sampled_from(_HOSTS),
    rest=_PLAN_REST,
    tail=_URL_TEXT,
)
@example(start="https://", host="h", rest="/a/", tail="v/../../admin")  # a dot segment after
@example(start="https://", host="h", rest="/a/.", tail="./admin")  # one the plan began
@example(start="https://", host="h", rest="/a/", tail="v\t")  # httpx refuses a control char
@example(start="https://", host="h", rest="", tail=".evil/x")  # the authority goes on
@example(start="https://", host="h", rest="/a?q#", tail="/../x")  # fragment: path is plan's
def test_the_check_s_shortcut_passes_only_what_httpx_reads_as_the_plan(
    start: str, host: str, rest: str, tail: str
) -> None:
    """`_reads_as_plan` skips httpx's parse of the filled URL: whatever follows the plan's
    text, it may say yes only where the full check (`_check_start`) passes too."""
    plan = start + host + rest
    if t._reads_as_plan(plan, plan + tail):
        assert _full_check_passes(plan, plan + tail), (plan, tail)


@pytest.mark.parametrize(
    ("plan", "tail", "short"),
    [
        ("https://deploy.example/api/", "1.2.3/hook?tag=a%20b", True),
        ("https://h:8443/a/b-", "1.2.3", True),
        ("http://h/x?tag=", "a%26admin%3D1#f", True),
        ("https://h/a#", "frag/../x", True),
        ("https://h/a/", "v/../../admin", False),  # httpx drops the dot segments
        ("https://h/a/", "v" * 70_000, False),  # longer than httpx reads
        ("https://h/a/", "v\r\n", False),  # httpx refuses control characters
        ("https://h/a b/", "v", False),  # httpx quotes the plan's own space
        ("https://h/a/./", "v", False),  # and drops its dot segment
        ("https://api.example.com", ".evil/x", False),  # the authority is not ended
        ("https://h/é/", "v", False),
    ],
)
def test_the_check_s_shortcut_is_taken_where_it_holds(plan: str, tail: str, short: bool) -> None:
    assert t._reads_as_plan(plan, plan + tail) is short
    if short:
        assert _full_check_passes(plan, plan + tail)
