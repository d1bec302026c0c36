"""The OpenAPI 3.1 document of the v1 API, built from the operations the app serves
(`tether.supervisor.api.contract`) and their records' JSON Schemas, and served at
`GET /v1/openapi.json` without a token: it is the contract, it holds no data."""

from __future__ import annotations

import importlib.metadata
import re
from collections import defaultdict
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any, Final

import msgspec
from starlette.responses import Response

from tether.supervisor.api.operation import Answer, Body, Call, Declared, Param, Raw
from tether.supervisor.settings import SupervisorSettings
from tether.wire import ERRORS, ErrorCode
from tether.wire.records import ErrorBody, Record

PATH: Final = "/v1/openapi.json"
DIALECT: Final = "https://spec.openapis.org/oas/3.1/dialect/base"
REF: Final = "#/components/schemas/{name}"
BEARER: Final = "bearer"
DESCRIPTION: Final = (
    "Wire protocol v1 (docs/design.md, Wire protocol v1). Every error is"
    ' `{"error": CODE, "detail": TEXT}`; each status lists the codes it can carry. Bodies are'
    " strict JSON: an integer is written without a fraction or an exponent (`3`, never"
    " `3.0`), and a field a record does not name is ignored, except in `POST /v1/tasks`."
)


def _records(operations: Sequence[Declared[Any]]) -> list[type[Record]]:
    """Every record the operations read or answer with, ErrorBody first, each once."""
    found: dict[type[Record], None] = {ErrorBody: None}
    for op in operations:
        for body in (op.body, *op.answers.values()):
            if isinstance(body, type):
                found[body] = None
    return list(found)


class _Builder:
    """One document's state: each record's `$ref`, and the settings that bound parameters."""

    def __init__(self, refs: dict[type[Record], Any], settings: SupervisorSettings) -> None:
        self._refs = refs
        self._settings = settings

    def _schema(self, body: Body) -> Any:
        return dict(body.schema) if isinstance(body, Raw) else self._refs[body]

    def _media(self, body: Body) -> dict[str, Any]:
        media = body.media_type if isinstance(body, Raw) else "application/json"
        return {media: {"schema": self._schema(body)}}

    def _param(self, param: Param, where: str) -> dict[str, Any]:
        schema = dict(param.schema)
        if param.bound_by is not None:
            schema["maximum"] = getattr(self._settings, param.bound_by)
        return {
            "name": param.name,
            "in": where,
            "required": where == "path",
            "description": param.description,
            "schema": schema,
        }

    def _answer(self, status: int, answer: Answer) -> dict[str, Any]:
        described: dict[str, Any] = {"description": HTTPStatus(status).phrase}
        if answer is not None:
            described["content"] = self._media(answer)
        return described

    def _errors(self, codes: tuple[ErrorCode, ...]) -> dict[str, dict[str, Any]]:
        by_status: defaultdict[int, list[str]] = defaultdict(list)
        for code in codes:
            by_status[ERRORS[code].status].append(code.value)
        return {
            str(status): {
                "description": f"{HTTPStatus(status).phrase}: {', '.join(named)}",
                "content": {
                    "application/json": {
                        "schema": {
                            "allOf": [
                                self._refs[ErrorBody],
                                {"type": "object", "properties": {"error": {"enum": named}}},
                            ]
                        }
                    }
                },
            }
            for status, named in sorted(by_status.items())
        }

    def operation(self, op: Declared[Any]) -> dict[str, Any]:
        errors = self._errors(op.codes)
        clash = set(errors) & {str(status) for status in op.answers}
        if clash:
            raise ValueError(
                f"{op.method} {op.path}: status {clash} is both an answer and an error"
            )
        described: dict[str, Any] = {
            "operationId": op.name,
            "summary": op.summary,
            "tags": [op.tag],
            "security": [{BEARER: []}] if op.roles else [],
            "x-tether-roles": [role.value for role in op.roles],
            "responses": {
                **{str(s): self._answer(s, answer) for s, answer in sorted(op.answers.items())},
                **errors,
            },
        }
        params = [self._param(p, "path") for p in op.params]
        params += [self._param(p, "query") for p in op.query]
        if params:
            described["parameters"] = params
        if op.body is not None:
            described["requestBody"] = {"required": True, "content": self._media(op.body)}
        return described


def _bound(
    schemas: dict[str, Any], operations: Sequence[Declared[Any]], settings: SupervisorSettings
) -> None:
    """Give each body field whose maximum is a setting (`Operation.bound_by`) that maximum."""
    for op in operations:
        if not op.bound_by:
            continue
        if not isinstance(op.body, type):
            raise TypeError(f"{op.method} {op.path}: only a record's fields can be bounded")
        fields = schemas[op.body.__name__]["properties"]
        for field, setting in op.bound_by.items():
            fields[field]["maximum"] = getattr(settings, setting)


_MODULE_PATH = re.compile(r"\b\w+(?:\.\w+)+\.(?=\w)")


def short_names(schemas: dict[str, Any]) -> dict[str, Any]:
    """`schemas` with each generic record's schema (`Observation[str | None]`) named after its
    parameters' short names: msgspec names it after their module paths. Every `$ref` follows."""
    renamed: dict[str, str] = {}
    for name, schema in schemas.items():
        title = schema.get("title", name)
        if "[" in title:
            short = _MODULE_PATH.sub("", title)
            schema["title"] = short
            renamed[name] = re.sub(r"\W+", "_", short).strip("_")
    if len(set(renamed.values())) != len(renamed) or set(renamed.values()) & set(schemas):
        raise ValueError(f"two schemas would share a short name: {sorted(renamed.values())}")
    refs = {REF.format(name=old): REF.format(name=new) for old, new in renamed.items()}

    def follow(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: refs.get(v, v) if k == "$ref" else follow(v) for k, v in value.items()}
        if isinstance(value, list):
            return [follow(v) for v in value]
        return value

    return {renamed.get(name, name): follow(schema) for name, schema in schemas.items()}


def document(settings: SupervisorSettings, operations: Sequence[Declared[Any]]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `operations`, with the limits `settings` set."""
    records = _records(operations)
    refs, generated = msgspec.json.schema_components(records, ref_template=REF)
    schemas = short_names(generated)
    _bound(schemas, operations, settings)
    builder = _Builder(dict(zip(records, refs, strict=True)), settings)
    paths: defaultdict[str, dict[str, Any]] = defaultdict(dict)
    for op in operations:
        paths[op.path][op.method.lower()] = builder.operation(op)
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": DIALECT,
        "info": {
            "title": "tether supervisor",
            "version": importlib.metadata.version("tether"),
            "description": DESCRIPTION,
        },
        "paths": dict(paths),
        "components": {
            "schemas": schemas,
            "securitySchemes": {BEARER: {"type": "http", "scheme": "bearer"}},
        },
    }


async def openapi_json(call: Call[None]) -> Response:
    """The document of the operations the app serves (`app.state.operations`), for this
    supervisor's settings, built once per app."""
    state = call.request.app.state
    built: bytes | None = getattr(state, "openapi_json", None)
    if built is None:
        built = msgspec.json.encode(document(state.settings, state.operations))
        state.openapi_json = built
    return Response(built, media_type="application/json")
