"""The owned side against hostile outputs and an operator aiming it inward, live (docs/design.md,
Threat model: The owned side; issue 23, findings 1, 2 and 5).

A real supervisor process (`serve`, with the names effects go to answered by a script: a DNS
server the attacker controls, tests/scripted_dns_supervisor.py), a fake runner reporting what
a compromised runner would, and a receiver of our own on 127.0.0.1 (`Hook`) that records every
request it gets and echoes the credential back in the encodings careless receivers use.
`effect_allowed_hosts` is `*, 127.0.0.1:<the hook's port>`. Nothing is ever sent anywhere
else: every other destination is refused from the plan's text, before any name is resolved,
or at send before anything connects (the script answers only loopback and link-local
addresses, which are refused unless named).

- an output holding `../../../admin/delete-all?confirm=yes#` for a credentialed deploy's path
  fails the step `effect_render_failed`; the hook never sees another path;
- each internal destination is refused at create with the rule, nothing resolved or sent;
- a DNS answer that changes after the check cannot move the connection, and a name answering
  an internal address is refused at send;
- the credential echoed base64-, hex-, URL-encoded or case-changed is stored nowhere;
- a line break in a header, from an output or a credential, is `effect_render_failed`, never
  `uncertain`, nothing sent.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from tests.conftest import chat_payload
from tests.runner.test_runner_processes import Proc, environment, free_port
from tests.supervisor.ui.test_ui_browser import Served
from tether.supervisor import admin

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TOKEN = "s3cret-deploy-Token_0123456789/x"
WAIT_S = 30.0
SCRIPT = Path(__file__).resolve().parents[2] / "scripted_dns_supervisor.py"
ANSWERS = {
    "swap.test": [["127.0.0.1"], ["127.0.0.2"]],  # checked once, then a refused address
    "metadata.test": [["169.254.169.254"]],
}


def echoes(token: str) -> list[str]:
    """How a careless receiver echoes a credential: each is stored nowhere."""
    raw = token.encode()
    return [
        token.lower(),
        token.upper(),
        raw.hex(),
        raw.hex().upper(),
        base64.b64encode(raw).decode(),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
        base64.b64encode(b"Bearer " + raw).decode(),
        base64.b64encode(b"x:" + raw).decode(),
        quote(token, safe=""),
        quote(token, safe="").lower(),
    ]


class Hook(Served):
    """The receiver: records each request (method, raw path and query, Host, Authorization)
    and answers 200 with the bearer credential it was sent, echoed in `echoes`."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
        super().__init__(Starlette(routes=[Route("/{path:path}", self.receive, methods=methods)]))

    async def receive(self, request: Request) -> Response:
        query = request.scope["query_string"].decode()
        self.seen.append(
            {
                "method": request.method,
                "target": request.scope["raw_path"].decode() + (f"?{query}" if query else ""),
                "host": request.headers.get("host", ""),
                "authorization": request.headers.get("authorization", ""),
            }
        )
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        return PlainTextResponse(" | ".join(echoes(token)) if token else "ok")

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


class Owned:
    """The supervisor process, its operator and runner clients, and the hook."""

    def __init__(self, folder: Path, hook: Hook) -> None:
        self.folder, self.hook = folder, hook
        self.db = folder / "ledger.db"
        operator = admin.create_token(self.db, "acme", "operator", init=True).secret
        runner = admin.create_token(self.db, "default", "runner").secret
        credentials = folder / "credentials"
        credentials.mkdir()
        (credentials / "deploy").write_text(TOKEN + "\n")
        (credentials / "crlf").write_text("tok\r\nX-Injected: yes\n")
        self.answers, self.asked = folder / "answers.json", folder / "asked.jsonl"
        self.answers.write_text(json.dumps(ANSWERS))
        self.asked.touch()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, str(SCRIPT), "--answers", str(self.answers)]
        argv += ["--asked", str(self.asked), "--db", str(self.db), "--port", str(self.port)]
        env = environment(
            TETHER_EFFECT_ALLOWED_HOSTS=f"*, 127.0.0.1:{hook.port}",
            TETHER_CREDENTIALS_DIR=str(credentials),
            TETHER_LOG_LEVEL="debug",
        )
        self.proc = Proc("supervisor", argv, env, folder)
        self.operator = self._client(operator)
        self.runner = self._client(runner)
        self._wait(self._healthy, "the supervisor to answer /healthz")

    def _client(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=WAIT_S,
            trust_env=False,
        )

    def _healthy(self) -> bool:
        if self.proc.popen.poll() is not None:
            pytest.fail(f"the supervisor exited\n{self.proc.tail()}")
        try:
            return self.operator.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def _wait(self, condition: Any, what: str) -> Any:
        end = time.monotonic() + WAIT_S
        while not (found := condition()):
            if time.monotonic() > end:
                pytest.fail(f"waited {WAIT_S:g} s for {what}\n{self.proc.tail()}")
            time.sleep(0.05)
        return found

    def questions(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.asked.read_text().splitlines()]

    def create(self, key: str, steps: list[dict[str, Any]]) -> httpx.Response:
        return self.operator.post(
            "/v1/tasks", json={"idempotency_key": key, "plan": {"steps": steps}}
        )

    def run(self, key: str, steps: list[dict[str, Any]], **outputs: Any) -> dict[str, Any]:
        """Create and approve the task, report `outputs[name]` for each of its chat steps as
        a runner would, and return its view once it ended (or waits on an operator)."""
        created = self.create(key, steps)
        assert created.status_code == 201, created.text
        task = created.json()
        approval = {"plan_hash": task["plan_hash"], "base_sha": None}
        assert self.operator.post(f"/v1/tasks/{task['id']}/approve", json=approval).is_success
        for step in steps:
            if step["kind"] == "chat":
                lease = self.claim(task["id"])
                self.report(lease, outputs[step["name"]])
        return self.settled(task["id"])

    def claim(self, task_id: str) -> dict[str, Any]:
        claim = {"runner_id": "compromised-box", "capacity": 1, "wait_s": 5}
        answer = self.runner.post("/v1/leases/claim", json=claim)
        assert answer.status_code == 200, answer.text
        [lease] = answer.json()["leases"]
        assert lease["task_id"] == task_id
        lease_: dict[str, Any] = lease
        return lease_

    def report(self, lease: dict[str, Any], output: Any) -> None:
        result = {"fence": lease["fence"], "payload_hash": lease["payload_hash"], "output": output}
        answer = self.runner.post(f"/v1/steps/{lease['step_id']}/result", json=result)
        assert answer.json() == {"outcome": "applied"}, answer.text

    def view(self, task_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.operator.get(f"/v1/tasks/{task_id}").json()
        return found

    def settled(self, task_id: str) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            view = self.view(task_id)
            waiting = (view.get("waiting_for") or {}).get("reason")
            return view if view["state"] in ("SUCCEEDED", "FAILED") or waiting else None

        found: dict[str, Any] = self._wait(ended, f"task {task_id} to end")
        return found

    def close(self) -> None:
        self.operator.close()
        self.runner.close()
        self.proc.stop()


@pytest.fixture(scope="module")
def owned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Owned]:
    with Hook().running() as hook:
        sup = Owned(tmp_path_factory.mktemp("owned-side"), hook)
        try:
            yield sup
        finally:
            sup.close()


def build(name: str = "build") -> dict[str, Any]:
    return {"name": name, "kind": "chat", "payload": chat_payload("build it")}


def deploy(url: str, **extra: Any) -> dict[str, Any]:
    headers = {"Authorization": "Bearer {{ credential.deploy }}", **extra.pop("headers", {})}
    return {"name": "deploy", "kind": "http", "payload": {"url": url, "headers": headers, **extra}}


def step(view: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(s for s in view["steps"] if s["name"] == name)
    return found


# -- 1. an output never steers a credentialed deploy ------------------------------------------


def test_an_output_cannot_move_a_credentialed_deploy_to_another_path(owned: Owned) -> None:
    url = f"{owned.hook.url}/api/v1/deploy/{{{{ steps.build.output.v }}}}/hook"
    before = len(owned.hook.seen)
    attack = owned.run(
        "steer", [build(), deploy(url)], build={"v": "../../../admin/delete-all?confirm=yes#"}
    )
    assert attack["state"] == "FAILED"
    assert attack["reason"].startswith("effect_render_failed: payload.url: ")
    assert step(attack, "deploy")["state"] == "failed"
    assert owned.hook.seen[before:] == []  # nothing sent: the step never became due
    # The same plan with an honest version: the value stays inside its one segment.
    honest = owned.run("honest", [build(), deploy(url)], build={"v": "1.2.3 beta&x=1"})
    assert honest["state"] == "SUCCEEDED", honest
    [seen] = owned.hook.seen[before:]
    assert seen["method"] == "POST"
    assert seen["target"] == "/api/v1/deploy/1.2.3%20beta%26x%3D1/hook"
    assert seen["authorization"] == f"Bearer {TOKEN}"


# -- 2. internal destinations are refused at create, from the plan's text -----------------------


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("http://127.0.0.1:{supervisor}/v1/tasks", "127.0.0.1 is a loopback address"),
        ("http://127.0.0.1:5432/", "127.0.0.1 is a loopback address"),
        ("http://169.254.169.254/latest/meta-data/", "is a link-local address"),
        ("http://[fd00:ec2::254]/latest/meta-data/", "is a unique-local address"),
        ("http://10.0.0.1/admin", "10.0.0.1 is a private address"),
        ("http://192.168.1.1/", "is a private address"),
        ("http://[::1]:22/", "::1 is a loopback address"),
        ("http://[::ffff:127.0.0.1]:22/", "127.0.0.1 is a loopback address"),
        ("http://0.0.0.0:{hook}/", "0.0.0.0 is the unspecified address"),
        ("http://0x7f000001:{hook}/", "numeric spelling"),
        ("http://2130706433:{hook}/", "numeric spelling"),
        ("http://017700000001:{hook}/", "numeric spelling"),
        ("http://127.1:{hook}/", "numeric spelling"),
        ("http://localhost:{hook}/", "always names a loopback address"),
    ],
)
def test_an_internal_destination_is_refused_at_create(owned: Owned, url: str, rule: str) -> None:
    target = url.format(supervisor=owned.port, hook=owned.hook.port)
    seen, asked = len(owned.hook.seen), len(owned.questions())
    answer = owned.create(f"inward-{target}", [deploy(target, method="GET")])
    assert answer.status_code == 422, answer.text
    refusal = answer.json()
    assert refusal["error"] == "invalid_field"
    assert refusal["detail"].startswith("'plan.steps[0].payload.url': step 'deploy': destination")
    assert rule in refusal["detail"]
    listed = owned.operator.get("/v1/tasks").json()["tasks"]
    assert not [t for t in listed if t["idempotency_key"] == f"inward-{target}"]
    assert (len(owned.hook.seen), len(owned.questions())) == (seen, asked)  # plan text only


# -- 3. resolve once: DNS cannot move the connection ------------------------------------------


def test_a_dns_answer_that_changes_cannot_reach_a_refused_address(owned: Owned) -> None:
    url = f"http://swap.test:{owned.hook.port}/rebind"
    before = len(owned.hook.seen)
    first = owned.run("swap-1", [deploy(url)])
    assert first["state"] == "SUCCEEDED", first
    # One question, answered 127.0.0.1 (named in the list); the scripted server answers
    # 127.0.0.2 to every later one, and the connection went to the first answer.
    assert [q for q in owned.questions() if q["name"] == "swap.test"] == [
        {"name": "swap.test", "answer": ["127.0.0.1"]}
    ]
    [seen] = owned.hook.seen[before:]
    assert (seen["host"], seen["target"]) == (f"swap.test:{owned.hook.port}", "/rebind")
    # The next attempt's one question is answered 127.0.0.2, which no entry names.
    second = owned.run("swap-2", [deploy(url)])
    assert second["state"] == "FAILED"
    assert second["reason"].startswith(
        "destination_refused: swap.test resolved to 127.0.0.2: destination"
    )
    assert len(owned.hook.seen) == before + 1


def test_a_name_answering_the_metadata_address_is_refused_at_send(owned: Owned) -> None:
    view = owned.run("metadata", [deploy("http://metadata.test/latest/meta-data/", method="GET")])
    assert view["state"] == "FAILED"
    assert "169.254.169.254 is a link-local address" in view["reason"]
    assert view["reason"].startswith("destination_refused: ")


# -- 4. an echoed credential is stored nowhere ------------------------------------------------


def test_encoded_echoes_of_the_credential_are_not_stored(owned: Owned) -> None:
    plan = [deploy(f"{owned.hook.url}/echo"), build("after")]
    created = owned.create("echo", plan)
    task = created.json()
    approval = {"plan_hash": task["plan_hash"], "base_sha": None}
    assert owned.operator.post(f"/v1/tasks/{task['id']}/approve", json=approval).is_success
    lease = owned.claim(task["id"])  # the step after the effect, handed its answer
    owned.report(lease, "done")
    view = owned.settled(task["id"])
    assert view["state"] == "SUCCEEDED", view
    assert owned.hook.seen[-1]["authorization"] == f"Bearer {TOKEN}"  # the hook echoed it
    detail = step(view, "deploy")["output"]["detail"]
    assert detail.startswith("HTTP 200: ****")
    stored = [json.dumps(view), json.dumps(lease)]
    stored += [p.read_bytes().decode("latin-1") for p in owned.folder.glob("ledger.db*")]
    stored.append(owned.proc.log_path.read_text(errors="replace"))
    for echo in [TOKEN, *echoes(TOKEN)]:
        for text in stored:
            assert echo not in text, echo


# -- 5. a line break in a header: refused, never `uncertain` ----------------------------------


def test_a_line_break_from_an_output_fails_the_render(owned: Owned) -> None:
    before = len(owned.hook.seen)
    plan = [
        build(),
        deploy(f"{owned.hook.url}/v", headers={"X-Version": "{{ steps.build.output }}"}),
    ]
    view = owned.run("crlf-output", plan, build="1.0\r\nX-Injected: yes")
    assert view["state"] == "FAILED"
    assert view["reason"].startswith("effect_render_failed: payload.headers.X-Version: ")
    assert owned.hook.seen[before:] == []


def test_a_line_break_in_a_credential_fails_an_unkeyed_send_unsent(owned: Owned) -> None:
    before = len(owned.hook.seen)
    notify = {
        "name": "notify",
        "kind": "http",
        "payload": {
            "url": f"{owned.hook.url}/charge",
            "keyed": False,
            "headers": {"Authorization": "Bearer {{ credential.crlf }}"},
        },
    }
    gated = owned.run("crlf-credential", [notify])
    assert gated["waiting_for"]["reason"] == "gate"
    digest = gated["waiting_for"]["digest"]
    opened = owned.operator.post(
        f"/v1/tasks/{gated['id']}/steps/notify/gate", json={"digest": digest}
    )
    assert opened.status_code == 200, opened.text
    view = owned._wait(lambda: (v := owned.view(gated["id"]))["state"] == "FAILED" and v, "fail")
    assert view["reason"].startswith("effect_render_failed: request: header Authorization")
    assert "X-Injected" not in json.dumps(view)
    assert step(view, "notify")["effect"]["state"] == "failed"  # not "uncertain"
    assert owned.hook.seen[before:] == []
