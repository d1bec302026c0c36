"""The placeholder grammar of effect payloads (`tether.wire.templates`): checked at create,
filled at due time, credentials filled only at send time."""

from __future__ import annotations

from typing import Any

import pytest

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
        "Bearer {{ credential.x }}; {{ steps.a.output }} {{ steps.b.output }}", outputs,
        as_text=True,
    )  # fmt: skip
    assert header == 'Bearer {{ credential.x }}; v1 {curly} {"n":1}'
    assert (
        t.fill_credentials(header, {"x": "s3cret"}.__getitem__)
        == 'Bearer s3cret; v1 {curly} {"n":1}'
    )
    assert t.render({"k": "{{ steps.b.output }}"}, outputs, sealed=True) == {"k": {"n": 1}}


@pytest.mark.parametrize(
    "value",
    ["{{ steps.build.output.missing }}", "{{ steps.build.output.sizes.9 }}",
     "{{ steps.other.output }}", "x{{ steps.build.output.version.deeper }}"],
)  # fmt: skip
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
        "headers", earlier=["build"], credentials_allowed=True,
    )  # fmt: skip
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
