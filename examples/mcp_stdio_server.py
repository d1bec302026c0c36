"""A small MCP server over stdio in the standard library alone, for tests and the docs: it
answers `initialize`, `tools/list` and `tools/call` (newline-delimited JSON-RPC, as the MCP
stdio transport is). Copied into a test repository, it plays the repository's own server, run
by a runner inside its sandbox with whatever `python3` is there.

Tools: `echo` (its `text` back), `read` (a file's text, by path: what the sandbox lets it
see), `write` (a file of `size` bytes, to meet the command limits) and `fail` (an error
result)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TOOLS = [
    {
        "name": "echo",
        "description": "Say the text back.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
    {
        "name": "read",
        "description": "Read a file's text.",
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "write",
        "description": "Write a file of so many bytes.",
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "size": {"type": "integer"}},
            "required": ["path", "size"],
        },
    },
    {
        "name": "fail",
        "description": "Always fails.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]


def call(name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    """A tool's text and whether it is an error."""
    if name == "echo":
        return str(arguments.get("text", "")), False
    if name == "read":
        try:
            return Path(arguments["path"]).read_text(), False
        except OSError as exc:
            return f"cannot read: {exc.strerror}", True
    if name == "write":
        try:
            with Path(arguments["path"]).open("wb") as out:
                out.write(b"x" * int(arguments["size"]))
        except OSError as exc:
            return f"cannot write: {exc.strerror}", True
        return "written", False
    return "it failed, as it always does", True


def answer(request: dict[str, Any]) -> dict[str, Any] | None:
    method, ident = request.get("method"), request.get("id")
    if ident is None:  # a notification: no answer
        return None
    params = request.get("params") or {}
    if method == "initialize":
        result: dict[str, Any] = {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "example", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        text, failed = call(params.get("name", ""), params.get("arguments") or {})
        result = {"content": [{"type": "text", "text": text}], "isError": failed}
    elif method == "ping":
        result = {}
    else:
        return {
            "jsonrpc": "2.0",
            "id": ident,
            "error": {"code": -32601, "message": f"no method {method}"},
        }
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = answer(json.loads(line))
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
