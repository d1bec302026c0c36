"""The OpenAPI document (`tether.supervisor.api.openapi`): the app's routes and the declarations
agree, the document is valid OpenAPI 3.1 built from the records' own schemas, each status lists
only its own error codes, and it is served without a token.
(tests/supervisor/api/test_openapi_live.py runs schemathesis against a live supervisor.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema_rs
import msgspec
import pytest
from schemathesis.specs.openapi.definitions import OPENAPI_31
from starlette.routing import Route

from tests.conftest import ApiHarness
from tether.supervisor.api import create_app, openapi
from tether.supervisor.api.contract import OPERATIONS
from tether.supervisor.api.operation import Declared, Raw
from tether.supervisor.ledger import Role
from tether.supervisor.settings import SupervisorSettings
from tether.wire import ERRORS, ErrorCode
from tether.wire import records as messages


@pytest.fixture
def doc(tmp_path: Path) -> dict[str, Any]:
    settings = SupervisorSettings(db=tmp_path / "x.db", events_wait_max_s=7.5, claim_wait_max_s=2.5)
    built = openapi.document(settings, OPERATIONS)
    loaded: dict[str, Any] = json.loads(msgspec.json.encode(built))
    return loaded


def _served(tmp_path: Path) -> set[tuple[str, str]]:
    app = create_app(SupervisorSettings(db=tmp_path / "routes.db"))
    routes = [route for route in app.routes if isinstance(route, Route)]
    assert len(routes) == len(app.routes), "a route that is not a Route (a Mount?) is not checked"
    return {
        (method, route.path)
        for route in routes
        for method in route.methods or ()
        # Starlette answers HEAD wherever it answers GET; the status page is HTML for a
        # browser, not part of the API's contract.
        if method != "HEAD" and not route.path.startswith("/ui")
    }


def test_the_app_serves_every_declared_route_and_declares_every_route_it_serves(
    tmp_path: Path,
) -> None:
    served = _served(tmp_path)
    declared = {(op.method, op.path) for op in OPERATIONS}
    assert len(declared) == len(OPERATIONS), "a route is declared twice"
    undeclared = sorted(served - declared)
    absent = sorted(declared - served)
    mismatch = {
        "served but not declared in supervisor/api/contract.py": undeclared,
        "declared but not served by create_app": absent,
    }
    assert mismatch == {k: [] for k in mismatch}, mismatch


def test_the_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"] == "3.1.0"
    assert doc["jsonSchemaDialect"] == "https://spec.openapis.org/oas/3.1/dialect/base"
    problems = [str(e) for e in jsonschema_rs.Draft202012Validator(OPENAPI_31).iter_errors(doc)]
    assert not problems, problems
    refs = set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(doc)))
    assert refs
    assert refs <= set(doc["components"]["schemas"]), "a $ref names no schema"


def test_a_broken_document_is_refused_by_the_same_validation(doc: dict[str, Any]) -> None:
    """The validation above can fail: an operation whose answer has no description."""
    doc["paths"]["/v1/pools"]["get"]["responses"]["200"] = {}
    assert list(jsonschema_rs.Draft202012Validator(OPENAPI_31).iter_errors(doc))


def _op(doc: dict[str, Any], op: Declared) -> dict[str, Any]:
    described: dict[str, Any] = doc["paths"][op.path][op.method.lower()]
    return described


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: f"{op.method} {op.path}")
def test_each_operation_states_its_token_body_parameters_and_answers(
    doc: dict[str, Any], op: Declared
) -> None:
    described = _op(doc, op)
    assert described["operationId"] == op.name
    assert described["security"] == ([{"bearer": []}] if op.roles else [])
    assert described["x-tether-roles"] == [r.value for r in op.roles]
    named = set(re.findall(r"{(\w+)}", op.path))
    params = described.get("parameters", [])
    assert {p["name"] for p in params if p["in"] == "path"} == named
    assert all(p["required"] for p in params if p["in"] == "path")
    if isinstance(op.body, type):
        content = described["requestBody"]["content"]["application/json"]
        assert content["schema"] == {"$ref": f"#/components/schemas/{op.body.__name__}"}
    statuses = {int(s) for s in described["responses"]}
    assert set(op.answers) <= statuses
    if op.roles:
        assert {401, 403} <= statuses


def test_each_error_status_lists_exactly_the_codes_of_that_status(doc: dict[str, Any]) -> None:
    for op in OPERATIONS:
        described = _op(doc, op)
        listed: list[str] = []
        for status, answer in described["responses"].items():
            schema = answer.get("content", {}).get("application/json", {}).get("schema", {})
            if "allOf" not in schema:
                continue
            assert schema["allOf"][0] == {"$ref": "#/components/schemas/ErrorBody"}
            codes = schema["allOf"][1]["properties"]["error"]["enum"]
            assert all(ERRORS[ErrorCode(c)].status == int(status) for c in codes), (op, codes)
            listed += codes
        assert sorted(listed) == sorted(c.value for c in op.codes), op.path


def test_routes_with_a_body_or_a_token_list_the_refusals_those_bring() -> None:
    claim = next(op for op in OPERATIONS if op.path == "/v1/leases/claim")
    assert {ErrorCode.MALFORMED_JSON, ErrorCode.INVALID_FIELD, ErrorCode.UNAUTHORIZED} <= set(
        claim.codes
    )
    healthz = next(op for op in OPERATIONS if op.path == "/healthz")
    assert ErrorCode.UNAUTHORIZED not in healthz.codes
    assert ErrorCode.MALFORMED_JSON not in healthz.codes


def test_the_schemas_are_the_records_own(doc: dict[str, Any]) -> None:
    """One source: each component is exactly what msgspec says of the record."""
    records = [messages.Lease, messages.TaskCreate, messages.Result, messages.ErrorBody]
    _, own = msgspec.json.schema_components(records, ref_template=openapi.REF)
    for name, schema in own.items():
        assert doc["components"]["schemas"][name] == json.loads(msgspec.json.encode(schema))


def test_a_setting_that_bounds_a_parameter_or_a_field_is_its_maximum(doc: dict[str, Any]) -> None:
    events = doc["paths"]["/v1/tasks/{task_id}/events"]["get"]["parameters"]
    assert next(p for p in events if p["name"] == "wait")["schema"]["maximum"] == 7.5
    claim = doc["components"]["schemas"]["ClaimRequest"]["properties"]["wait_s"]
    assert claim == {"type": "number", "minimum": 0.0, "default": 0.0, "maximum": 2.5}


def test_the_artifact_upload_is_raw_bytes() -> None:
    put = next(op for op in OPERATIONS if op.method == "PUT" and "artifacts" in op.path)
    assert put.roles == (Role.RUNNER, Role.OPERATOR)
    assert isinstance(put.body, Raw)
    assert put.body.media_type == "application/octet-stream"


async def test_the_document_is_served_without_a_token(api: ApiHarness) -> None:
    response = await api.client.get(openapi.PATH)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    expected = json.loads(msgspec.json.encode(openapi.document(api.app.state.settings, OPERATIONS)))
    assert response.json() == expected
    again = await api.client.get(openapi.PATH)
    assert again.content == response.content


def test_the_verifier_fields_are_in_the_document(doc: dict[str, Any]) -> None:
    """Issue 22: a task's verifier, who vouches for its checks, and the review's `checks`."""
    schemas = doc["components"]["schemas"]
    assert schemas["TaskCreate"]["properties"]["verify"]["anyOf"][0] == {
        "$ref": "#/components/schemas/VerifySpec"
    }
    assert schemas["VerifySpec"]["required"] == ["pool"]
    assert {"verify_pool", "checks_standing"} <= set(schemas["TaskDetail"]["properties"])
    assert {"checks", "verify_pool"} <= set(schemas["ReviewRecord"]["required"])
