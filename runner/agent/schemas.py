"""The built-in tools as the model sees them (OpenAI function-calling schemas) and as the
runner decodes their arguments (one msgspec record per tool; an unknown key is refused)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class ListFilesArgs(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    path: str = "."
    recursive: bool = False


class ReadFileArgs(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    path: str
    offset: NonNegative = 0


class SearchArgs(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pattern: str
    path: str = "."
    regex: bool = False
    ignore_case: bool = False


class WriteFileArgs(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    path: str
    content: str


class ApplyPatchArgs(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    patch: str


class RunArgs(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    command: str


ARGUMENTS: dict[str, type[msgspec.Struct]] = {
    "list_files": ListFilesArgs,
    "read_file": ReadFileArgs,
    "search": SearchArgs,
    "write_file": WriteFileArgs,
    "apply_patch": ApplyPatchArgs,
    "run": RunArgs,
}

_PATH = {"type": "string", "description": "A path relative to the repository root."}


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Any:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


def tool_schemas(allowed_commands: list[str]) -> list[Any]:
    """The `tools` list for the model; `run` names the commands it may ask for."""
    return [
        _tool(
            "list_files",
            "List the files and folders under a folder of the repository (folders end in /).",
            {"path": {**_PATH, "default": "."}, "recursive": {"type": "boolean", "default": False}},
            [],
        ),
        _tool(
            "read_file",
            "Read a text file. Long files come in pieces: call again with the offset given.",
            {
                "path": _PATH,
                "offset": {
                    "type": "integer",
                    "minimum": 0,
                    "default": 0,
                    "description": "Byte offset to start reading at.",
                },
            },
            ["path"],
        ),
        _tool(
            "search",
            "Search the repository's text files for a fixed string, or a POSIX extended "
            "regular expression with regex=true. Returns path, line number and line.",
            {
                "pattern": {"type": "string"},
                "path": {**_PATH, "default": "."},
                "regex": {"type": "boolean", "default": False},
                "ignore_case": {"type": "boolean", "default": False},
            },
            ["pattern"],
        ),
        _tool(
            "write_file",
            "Create or replace a file with the given content (only under the allowed paths).",
            {"path": _PATH, "content": {"type": "string"}},
            ["path", "content"],
        ),
        _tool(
            "apply_patch",
            "Apply a unified diff (as `git diff` prints it, paths prefixed a/ and b/) to the "
            "working tree; refused whole if it touches a path outside the allowed paths.",
            {"patch": {"type": "string"}},
            ["patch"],
        ),
        _tool(
            "run",
            "Run one of the allowed commands in the repository root and return its exit code "
            "and output.",
            {"command": {"type": "string", "enum": list(allowed_commands)}},
            ["command"],
        ),
    ]
