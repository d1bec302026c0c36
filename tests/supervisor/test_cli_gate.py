"""`tether-supervisor task gate TASK_ID STEP` against a scripted supervisor: it shows the
rendered request and its digest, opens the gate only with `--digest`, and resolves an
uncertain effect with `--happened yes|no` (docs/design.md, Effects)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.supervisor.test_cli_task_commands import STEP_FIELDS, Script, run, task_json, token_file

__all__ = ["token_file"]  # the fixture, used by name

DIGEST = "d" * 64
REQUEST = {
    "method": "POST",
    "url": "https://deploy.example/hook",
    "headers": {"Authorization": "Bearer {{ credential.deploy-token }}"},
    "body": {"amount": "$82,000"},
}


def gated_view(state: str = "gated") -> dict[str, Any]:
    effect = {
        "kind": "http",
        "keyed": False,
        "state": state,
        "request": REQUEST,
        "digest": DIGEST,
        "key": "k" * 64,
        "deliveries": [],
    }
    step = {
        "id": "t1.0",
        "name": "deploy",
        "kind": "http",
        "state": "due",
        "effect": effect,
        **STEP_FIELDS,
    }
    return task_json("RUNNING", 3, steps=[step])


def argv(token_file: Path, *rest: str) -> list[str]:
    return [
        "task",
        "gate",
        "t1",
        "deploy",
        *rest,
        "--url",
        "http://sup",
        "--token-file",
        str(token_file),
    ]


def sent_json(script: Script, path: str) -> list[Any]:
    return [json.loads(r.content) for r in script.requests if r.url.path == path]


def test_gate_shows_the_request_and_its_digest(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = Script([gated_view()])
    assert run(monkeypatch, script, argv(token_file)) == 0
    out = capsys.readouterr().out
    assert f"digest {DIGEST}" in out
    assert '"amount": "$82,000"' in out
    assert "{{ credential.deploy-token }}" in out
    assert all(r.method == "GET" for r in script.requests)


def test_open_without_a_digest_prints_the_request_and_a_hint_and_opens_nothing(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = Script([gated_view()])
    assert run(monkeypatch, script, argv(token_file, "--open")) == 1
    captured = capsys.readouterr()
    assert f"digest {DIGEST}" in captured.out
    [hint] = captured.err.strip().splitlines()
    assert f"--open --digest {DIGEST}" in hint
    assert all(r.method == "GET" for r in script.requests)


def test_open_with_the_digest_opens_the_gate_for_it(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = "/v1/tasks/t1/steps/deploy/gate"
    script = Script([gated_view()], routes={("POST", path): gated_view("open")})
    assert run(monkeypatch, script, argv(token_file, "--open", "--digest", DIGEST.upper())) == 0
    assert sent_json(script, path) == [{"digest": DIGEST}]
    assert "opened" in capsys.readouterr().out


def test_a_refused_digest_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            detail = "digest aaaa is not the digest of step 'deploy''s request"
            return httpx.Response(409, json={"error": "gate_mismatch", "detail": detail})
        return httpx.Response(200, json=gated_view())

    assert run(monkeypatch, handler, argv(token_file, "--open", "--digest", "a" * 64)) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "gate_mismatch" in line or "not the digest" in line


@pytest.mark.parametrize(("word", "happened"), [("yes", True), ("no", False)])
def test_happened_sends_the_operator_s_word(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, word: str, happened: bool
) -> None:
    path = "/v1/tasks/t1/steps/deploy/happened"
    script = Script([gated_view("uncertain")], routes={("POST", path): gated_view()})
    assert run(monkeypatch, script, argv(token_file, "--happened", word)) == 0
    assert sent_json(script, path) == [{"happened": happened}]


def test_gate_on_a_step_with_no_effect_says_so(
    monkeypatch: pytest.MonkeyPatch, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step = {"id": "t1.0", "name": "deploy", "kind": "chat", "state": "queued", **STEP_FIELDS}
    script = Script([task_json("RUNNING", 2, steps=[step])])
    assert run(monkeypatch, script, argv(token_file)) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "no effect" in line
