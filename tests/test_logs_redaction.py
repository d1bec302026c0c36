"""A secret the program has read never reaches a log line, whatever field it slips into.

Two views: the event dicts after the redaction processor (`capture_logs`), and the text the
real `configure_logging` renders to stdout, as JSON lines and as the console format.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from tether.logs import configure_logging, redact_secrets, register_secret
from tether.settings import read_secret


@pytest.fixture
def secret(tmp_path: Path) -> str:
    """A fresh token, read the way the programs read one (a credentials file), then registered."""
    value = "tt_" + secrets.token_hex(16)
    (tmp_path / "runner-token").write_text(value + "\n", encoding="utf-8")
    read = read_secret(None, "runner-token", {"CREDENTIALS_DIRECTORY": str(tmp_path)})
    register_secret(read)
    return read


@pytest.fixture
def restore_structlog() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


def test_registered_secret_is_masked_in_captured_events(secret: str) -> None:
    log = structlog.get_logger("test")
    with capture_logs(processors=[redact_secrets]) as entries:
        log.info("calling", url=f"http://sup/v1?token={secret}", note=f"Bearer {secret}")
        log.warning("nested", request={"headers": {"x-extra": secret}, "body": [secret, 1]})
        log.info("by key", token=secret, authorization="Bearer x", model_key="k", api_key="k")
    assert len(entries) == 3
    assert secret not in repr(entries)
    assert entries[0]["url"] == "http://sup/v1?token=***"
    assert entries[1]["request"]["body"] == ["***", 1]
    assert {entries[2][k] for k in ("token", "authorization", "model_key", "api_key")} == {"***"}


def _emit(secret: str) -> None:
    log = structlog.get_logger("test")
    log.info("step claimed", task_id="t1", step_id="s1", attempt=1, fence=7, token=secret)
    log.warning("model refused", detail=f"401 for key {secret[:4]}... no: {secret}")
    try:
        raise RuntimeError(f"supervisor said: bad bearer {secret}")
    except RuntimeError:
        log.exception("report failed", task_id="t1")


def test_json_lines_on_stdout_never_hold_the_secret(
    secret: str, capsys: pytest.CaptureFixture[str], restore_structlog: None
) -> None:
    configure_logging(json_lines=True)
    _emit(secret)
    out = capsys.readouterr().out
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["event"] for line in lines] == ["step claimed", "model refused", "report failed"]
    assert lines[0]["fence"] == 7
    assert lines[0]["token"] == "***"
    assert "RuntimeError" in lines[2]["exception"]  # the traceback is kept, masked
    assert secret not in out


def test_console_format_never_holds_the_secret(
    secret: str, capsys: pytest.CaptureFixture[str], restore_structlog: None
) -> None:
    configure_logging(json_lines=False)
    _emit(secret)
    out = capsys.readouterr().out
    assert "report failed" in out
    assert "RuntimeError" in out
    assert secret not in out


def test_secret_inside_non_string_values_is_masked(
    secret: str, capsys: pytest.CaptureFixture[str], restore_structlog: None
) -> None:
    configure_logging(json_lines=True)
    log = structlog.get_logger("test")
    log.warning("call failed", error=ValueError(f"rejected key {secret}"))
    log.info("raw", body=secret.encode(), seen={secret: 1})
    out = capsys.readouterr().out
    assert out.count("\n") == 2
    assert secret not in out


def test_standard_library_lines_are_json_lines_too_and_masked(
    secret: str, capsys: pytest.CaptureFixture[str], restore_structlog: None
) -> None:
    """uvicorn and asyncio log through `logging`: their lines are JSON lines like ours (the
    documented `jq` filter keeps them), masked the same way; httpx's per-request lines are not
    logged below warning."""
    configure_logging(json_lines=True)
    logging.getLogger("uvicorn.error").warning("Invalid HTTP request received.")
    logging.getLogger("asyncio").error("Task exception: bad bearer %s", secret)
    logging.getLogger("httpx").info("HTTP Request: POST http://sup/v1/leases/claim")
    out = capsys.readouterr().out
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(x["logger"], x["level"], x["event"]) for x in lines] == [
        ("uvicorn.error", "warning", "Invalid HTTP request received."),
        ("asyncio", "error", "Task exception: bad bearer ***"),
    ]
    assert all("timestamp" in x for x in lines)
    assert secret not in out
