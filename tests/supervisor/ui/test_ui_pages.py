"""The status page (`/ui`) in process: signing in, the cookie, CSRF and origin checks, the
pages and their strict HTML5, and the operator's actions with the API's rules."""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

from tests.agent_repos import make_origin
from tests.api_tasks import submitted
from tests.conftest import ApiHarness, FakeClock, chat_payload, ledger_snapshot, open_api
from tests.ui_pages import IdleDispatcher, csrf_of, sign_in, strict, strict_fragment
from tether.supervisor import admin, service
from tether.supervisor.ledger.outbox import Delivered, Unanswered
from tether.supervisor.ledger.views import RUNNER_ONLINE_S

HOSTILE = "<script>alert('x')</script>\x00\x07\x85\ufffe & \"q\""


@pytest.fixture
async def web(tmp_path: Path, clock: FakeClock) -> AsyncIterator[ApiHarness]:
    async with open_api(tmp_path / "ui.db", clock, synchronous="OFF") as harness:
        yield harness


async def signed_in(web: ApiHarness, who: str = "operator") -> httpx.AsyncClient:
    answer = await sign_in(web.client, web.secrets[who])
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/ui"
    client: httpx.AsyncClient = web.client
    return client


async def page(client: httpx.AsyncClient, url: str, status: int = 200) -> str:
    answer = await client.get(url)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("text/html")
    strict(answer.text)
    return answer.text


async def post_form(
    client: httpx.AsyncClient, url: str, fields: dict[str, str], origin: str | None = None
) -> httpx.Response:
    headers = {"Origin": origin or "http://supervisor.test"}
    return await client.post(url, data=fields, headers=headers)


async def repository(web: ApiHarness, tmp_path: Path) -> str:
    """Register a real git repository `app` for tenant acme (as `repo add` does, in a thread:
    it runs an event loop of its own); answer its head."""
    path, head = make_origin(tmp_path / "origin")
    await anyio.to_thread.run_sync(admin.add_repository, web.path, "acme", "app", str(path))
    return head


async def finished(web: ApiHarness, key: str, output: Any = "done", **extra: Any) -> str:
    task = await web.queued(key)
    [lease] = await web.claim()
    answer = await web.report(lease, output, **extra)
    assert answer.status_code == 200, answer.text
    return str(task["id"])


# -- signing in ------------------------------------------------------------------------------


async def test_without_a_session_every_page_sends_to_the_login_form(web: ApiHarness) -> None:
    task = await web.create("k")
    for url in ("/ui", f"/ui/tasks/{task['id']}", "/ui/artifacts/" + "0" * 64, "/ui/runners"):
        answer = await web.client.get(url)
        assert (answer.status_code, answer.headers["location"]) == (303, "/ui/login"), url
    for url in (
        f"/ui/tasks/{task['id']}/fragment",
        f"/ui/tasks/{task['id']}/events",
        "/ui/tasks-fragment",
    ):
        assert (await web.client.get(url)).status_code == 401, url
    form = await page(web.client, "/ui/login")
    assert 'type="password"' in form
    assert 'action="/ui/login"' in form


async def test_the_cookie_is_httponly_strict_scoped_to_ui_and_not_secure_over_http(
    web: ApiHarness,
) -> None:
    answer = await sign_in(web.client, web.secrets["operator"])
    cookie = answer.headers["set-cookie"]
    flags = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/ui"} <= flags
    assert "secure" not in flags
    assert web.secrets["operator"] not in answer.headers["location"]


async def test_over_https_the_cookie_is_secure(web: ApiHarness) -> None:
    transport = httpx.ASGITransport(app=web.app)
    async with httpx.AsyncClient(transport=transport, base_url="https://ui.test") as client:
        answer = await sign_in(client, web.secrets["operator"])
        assert answer.status_code == 303
        assert "secure" in answer.headers["set-cookie"].lower().split("; ")
        assert (await client.get("/ui")).status_code == 200


@pytest.mark.parametrize(
    ("who", "status", "says"),
    [("runner", 403, "needs an operator token"), ("nobody", 401, "unknown or revoked")],
)
async def test_a_runner_or_unknown_token_is_refused(
    web: ApiHarness, who: str, status: int, says: str
) -> None:
    secret = web.secrets.get(who, "tether_made-up")
    answer = await sign_in(web.client, secret)
    assert answer.status_code == status
    assert says in answer.text
    assert "set-cookie" not in answer.headers
    strict(answer.text)
    web.client.cookies.set("tether_ui", secret, path="/ui")  # a cookie planted by hand
    assert (await web.client.get("/ui")).headers["location"] == "/ui/login"


async def test_a_login_posted_from_another_site_is_refused(web: ApiHarness) -> None:
    answer = await web.client.post(
        "/ui/login",
        data={"token": web.secrets["operator"]},
        headers={"Origin": "https://evil.example"},
    )
    assert answer.status_code == 403
    assert "set-cookie" not in answer.headers


async def test_sign_out_clears_the_cookie(web: ApiHarness) -> None:
    client = await signed_in(web)
    listing = await page(client, "/ui")
    answer = await post_form(client, "/ui/logout", {"csrf": csrf_of(listing)})
    assert (answer.status_code, answer.headers["location"]) == (303, "/ui/login")
    assert 'tether_ui=""' in answer.headers["set-cookie"]
    assert "max-age=0" in answer.headers["set-cookie"].lower()
    assert (await client.get("/ui")).status_code == 303


async def test_a_revoked_token_ends_the_session(web: ApiHarness) -> None:
    from tether.supervisor import admin

    client = await signed_in(web)
    assert (await client.get("/ui")).status_code == 200
    token_id = await web.app.state.ledger.authenticate(web.secrets["operator"])
    admin.revoke_token(web.path, token_id.token_id)
    web.clock.advance(2)
    web.app.state.tokens._entries.clear()  # the API's one-second cache, passed at once
    answer = await client.get("/ui")
    assert (answer.status_code, answer.headers["location"]) == (303, "/ui/login")


# -- writes: CSRF and origin ---------------------------------------------------------------


async def test_a_write_without_the_sessions_csrf_token_changes_nothing(web: ApiHarness) -> None:
    client = await signed_in(web)
    task = await web.create("guarded")
    url = f"/ui/tasks/{task['id']}/approve"
    good = csrf_of(await page(client, f"/ui/tasks/{task['id']}"))
    before = ledger_snapshot(web.path)
    refused = [
        ({"plan_hash": task["plan_hash"]}, None),  # no token
        ({"plan_hash": task["plan_hash"], "csrf": "0" * 64}, None),  # a made-up one
        ({"plan_hash": task["plan_hash"], "csrf": good}, "https://evil.example"),
        ({"plan_hash": task["plan_hash"], "csrf": good}, "null"),
    ]
    with capture_logs() as logs:
        for fields, origin in refused:
            answer = await post_form(client, url, fields, origin)
            assert answer.status_code == 403, fields
            strict(answer.text)
    refusals = [e for e in logs if e["event"] == "write refused"]
    assert len(refusals) == 4
    assert all(e["path"] == url and e["log_level"] == "warning" for e in refusals)
    assert web.secrets["operator"] not in repr(logs)
    referred = await client.post(
        url,
        data={"plan_hash": task["plan_hash"], "csrf": good},
        headers={"Referer": "https://evil.example/page"},
    )
    assert referred.status_code == 403
    as_json = await client.post(url, json={"plan_hash": task["plan_hash"], "csrf": good})
    assert as_json.status_code == 403
    assert ledger_snapshot(web.path) == before


async def test_another_sessions_csrf_token_is_refused(web: ApiHarness) -> None:
    client = await signed_in(web, "rival")
    rivals = csrf_of(await page(client, "/ui"))
    client.cookies.clear()
    await signed_in(web)
    task = await web.create("mine")
    before = ledger_snapshot(web.path)
    answer = await post_form(
        client, f"/ui/tasks/{task['id']}/cancel", {"csrf": rivals, "reason": "x"}
    )
    assert answer.status_code == 403
    assert ledger_snapshot(web.path) == before


# -- pages -----------------------------------------------------------------------------------


async def test_tasks_are_listed_newest_first_and_paged_with_the_apis_cursor(
    web: ApiHarness,
) -> None:
    client = await signed_in(web)
    ids = [(await web.create(f"k{i}"))["id"] for i in range(5)]
    seen: list[str] = []
    url: str | None = "/ui?limit=2"
    while url is not None:
        text = await page(client, url)
        seen += re.findall(r'href="/ui/tasks/([^"/]+)"', text)
        older = re.search(r'rel="next" href="([^"]+)"', text)
        url = older.group(1).replace("&amp;", "&") if older else None
    assert seen == ids[::-1]


async def test_the_state_filter_shows_only_that_state(web: ApiHarness) -> None:
    client = await signed_in(web)
    planned = await web.create("planned")
    queued = await web.queued("queued")
    text = await page(client, "/ui?state=QUEUED")
    assert queued["id"] in text
    assert planned["id"] not in text
    assert '<option value="QUEUED" selected>' in text
    refused = await page(client, "/ui?state=BOGUS", 422)
    assert "state must be one of" in refused
    assert (await client.get("/ui?cursor=abc")).status_code == 422


def listed(text: str) -> list[str]:
    return re.findall(r'href="/ui/tasks/([^"/]+)"', text)


async def test_search_by_id_prefix_key_and_pool_with_the_state(web: ApiHarness) -> None:
    client = await signed_in(web)
    first = await web.create("deploy-2026-12-01")
    second = await web.queued("deploy-2026-12-02")
    other = await web.create("nightly", pool="acme")
    prefix = first["id"][:6].upper()  # any case, shorter than the shown prefix
    assert listed(await page(client, f"/ui?q={prefix}")) == [first["id"]]
    assert listed(await page(client, "/ui?q=deploy-2026-12-02")) == [second["id"]]
    assert listed(await page(client, "/ui?q=deploy-2026")) == []  # a key is matched whole
    assert listed(await page(client, "/ui?pool=acme")) == [other["id"]]
    assert listed(await page(client, "/ui?pool=default&state=QUEUED")) == [second["id"]]
    text = await page(client, "/ui?q=%20deploy-2026-12-02%20")  # trimmed
    assert 'value="deploy-2026-12-02"' in text
    assert listed(text) == [second["id"]]
    assert "No tasks match this search." in await page(client, "/ui?repository=none-such")
    assert "is too long" in await page(client, "/ui?q=" + "x" * 201, 422)


async def test_the_list_shows_short_ids_and_refreshes_its_own_part(web: ApiHarness) -> None:
    client = await signed_in(web)
    task = await web.create("k1")
    text = await page(client, "/ui?pool=default")
    short = re.search(rf'title="{task["id"]}"><code>([0-9a-f]+)</code>', text)
    assert short is not None
    assert len(short.group(1)) == 8
    assert task["id"].startswith(short.group(1))
    assert f'data-copy="{task["id"]}"' in text
    fragment_url = re.search(r'data-fragment="([^"]+)"', text)
    assert fragment_url is not None
    assert fragment_url.group(1) == "/ui/tasks-fragment?pool=default"
    later = await web.create("k2")
    part = await client.get(fragment_url.group(1))
    assert part.status_code == 200
    strict_fragment(part.text)
    assert listed(part.text) == [later["id"], task["id"]]


def runner_rows(text: str) -> dict[str, list[str]]:
    """The runners table: each runner's id with its other cells as text."""
    table = text.split('<table class="runners">', 1)[-1]
    rows = re.findall(r"<tr>\s*<td><code>([^<]+)</code></td>(.*?)</tr>", table, re.S)
    cells = (re.findall(r"<td>(.*?)</td>", rest, re.S) for _, rest in rows)
    return {
        rid: [re.sub(r"<[^>]+>", "", c).strip() for c in row]
        for (rid, _), row in zip(rows, cells, strict=True)
    }


async def test_the_runners_page_shows_each_runner_online_or_offline_and_the_queues(
    web: ApiHarness, clock: FakeClock
) -> None:
    client = await signed_in(web)
    await web.queued("a")
    await web.queued("b")
    [lease] = await web.claim(runner_id="box-1")
    idle = await web.client.post(
        "/v1/leases/claim",
        headers={"Authorization": f"Bearer {web.secrets['stranger']}"},
        json={"runner_id": "elsewhere-1", "capacity": 1, "wait_s": 0},
    )
    assert idle.status_code == 204  # a runner of a pool acme's tasks may not use
    text = await page(client, "/ui/runners")
    rows = runner_rows(text)
    assert set(rows) == {"box-1"}  # another pool's runner is not shown
    status, pool, kinds, in_flight = rows["box-1"][:4]
    assert (status, pool, kinds, in_flight) == ("online", "default", "chat", "1")
    assert re.search(r"<td><code>default</code></td>\s*<td>1</td>\s*<td>1</td>", text)
    assert "1 of 1 online" in text
    assert (await web.report(lease)).status_code == 200
    clock.advance(RUNNER_ONLINE_S + 1)  # no claim within the window, holding no lease
    part = await client.get("/ui/runners-fragment")
    strict_fragment(part.text)
    assert runner_rows(part.text)["box-1"][:4] == ["offline", "default", "chat", "0"]
    assert "0 of 1 online" in part.text


TRANSCRIPT = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Make the test pass."},
    {
        "role": "assistant",
        "turn": 1,
        "content": "Reading the module first.",
        "tool_calls": [{"id": "c1", "name": "read_file", "arguments": '{"path": "src/a.py"}'}],
        "finish_reason": "tool_calls",
    },
    {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "read_file",
        "ok": True,
        "content": "def answer():\n    return 41\n",
    },
    {"omitted": 3},
    {
        "role": "assistant",
        "turn": 2,
        "content": HOSTILE,
        "tool_calls": [{"id": "c2", "name": "run", "arguments": '{"argv": ["rm", "-rf", "/"]}'}],
    },
    {
        "role": "tool",
        "tool_call_id": "c2",
        "name": "run",
        "ok": False,
        "refused": True,
        "error": "command_not_allowed",
        "content": "rm is not an allowed command",
    },
    {"role": "assistant", "turn": 3, "content": "Done.", "finish_reason": "stop"},
]


async def test_an_agent_transcript_reads_as_a_conversation_turn_by_turn(web: ApiHarness) -> None:
    client = await signed_in(web)
    task_id = await finished(web, "agent", output={"transcript": TRANSCRIPT, "turns": 3})
    text = await page(client, f"/ui/tasks/{task_id}")
    talk = text.split('aria-label="Transcript"', 1)[1].split("</section>", 1)[0]
    turns = re.findall(r"<h5>Turn (\d+)", talk)
    assert turns == ["1", "2", "3"]
    assert talk.index("Make the test pass.") < talk.index("Reading the module first.")
    assert "<code>read_file</code>" in talk
    assert "{&#34;path&#34;: &#34;src/a.py&#34;}" in talk  # the arguments, as text
    assert "return 41" in talk  # the result under its call
    assert "3 entries left out of a long transcript." in talk
    assert "<strong>refused</strong> <code>command_not_allowed</code>" in talk
    assert "<script>" not in talk  # the model's text is escaped
    assert "&lt;script&gt;" in talk
    assert "<dt>turns</dt>" in text  # the rest of the output is still shown


async def test_a_task_not_yet_ended_has_a_pending_verdict(web: ApiHarness) -> None:
    client = await signed_in(web)
    planned = await web.create("planned")
    text = await page(client, f"/ui/tasks/{planned['id']}")
    assert "Verdict: <strong>pending</strong>" in text
    assert "not acceptable" not in text
    done = await finished(web, "done")
    assert "Verdict: <strong>acceptable</strong>" in await page(client, f"/ui/tasks/{done}")


async def test_another_tenants_task_is_not_found(web: ApiHarness) -> None:
    task = await web.create("private")
    client = await signed_in(web, "rival")
    await page(client, f"/ui/tasks/{task['id']}", 404)
    for part in ("fragment", "events"):
        assert (await client.get(f"/ui/tasks/{task['id']}/{part}")).status_code == 404
    assert task["id"] not in await page(client, "/ui")


async def test_the_task_page_shows_the_plan_steps_attempts_review_and_budget(
    web: ApiHarness,
) -> None:
    client = await signed_in(web)
    task_id = await finished(web, "shown", {"answer": 42})
    text = await page(client, f"/ui/tasks/{task_id}")
    task = (await web.client.get(f"/v1/tasks/{task_id}", headers=web.operator)).json()
    step = task["steps"][0]
    for shown in (
        task["plan_hash"],
        step["payload_hash"],
        step["effect_key"],
        "SUCCEEDED",
        "r1",
        "committed",
        "Expected (declared before the run)",
        "Observed (recorded by the ledger)",
        "Verdict",
        "spent 3 tokens",
        "answer",
    ):
        assert shown in text, shown
    fragment = await client.get(f"/ui/tasks/{task_id}/fragment")
    strict_fragment(fragment.text)
    assert f'data-seq="{task["seq"]}"' in fragment.text


async def test_hostile_output_is_escaped_and_every_page_still_parses(web: ApiHarness) -> None:
    client = await signed_in(web)
    task = await web.queued("hostile")
    answer = await web.client.post(
        "/v1/leases/claim",
        headers=web.runner,
        json={"runner_id": "<b>r</b>", "capacity": 1, "wait_s": 0},
    )
    [lease] = answer.json()["leases"]
    await web.report(lease, {HOSTILE: [HOSTILE]})
    text = await page(client, f"/ui/tasks/{task['id']}")
    assert "<script>alert" not in text
    assert "<b>r</b>" not in text
    assert "&lt;script&gt;alert" in text
    assert "&lt;b&gt;r&lt;/b&gt;" in text
    strict_fragment((await client.get(f"/ui/tasks/{task['id']}/fragment")).text)


async def test_each_attempt_shows_its_runners_shipped_lines_escaped(web: ApiHarness) -> None:
    """Issue 26, finding 3: the lines a runner shipped (`POST /v1/logs`) show under their
    attempt, in the order they arrived, with markup escaped and control characters visible."""
    client = await signed_in(web)
    task = await web.queued("shipped")
    answer = await web.client.post(
        "/v1/leases/claim",
        headers=web.runner,
        json={"runner_id": "r1", "capacity": 1, "wait_s": 0},
    )
    [lease] = answer.json()["leases"]
    lines = [
        {
            "step_id": lease["step_id"],
            "fence": lease["fence"],
            "level": "info",
            "event": "step leased",
            "fields": {"kind": "chat"},
        },
        {
            "step_id": lease["step_id"],
            "fence": lease["fence"],
            "level": "warning",
            "event": "model call failed\x1b[2J",
            "fields": {"error": HOSTILE + "\nnext"},
        },
    ]
    kept = await web.client.post("/v1/logs", headers=web.runner, json={"lines": lines})
    assert kept.json() == {"kept": 2, "refused": 0, "over_limit": 0}
    await web.report(lease, "done")
    text = await page(client, f"/ui/tasks/{task['id']}")
    assert "Runner log of attempt 1" in text
    assert text.index("step leased") < text.index("model call failed")
    assert "model call failed\\u001b[2J" in text
    assert "\x1b" not in text
    assert "<script>alert" not in text
    assert "next" in text
    assert "\\nnext" in text
    strict_fragment((await client.get(f"/ui/tasks/{task['id']}/fragment")).text)


async def test_a_check_log_reads_as_escaped_text_for_its_tenant_only(
    web: ApiHarness, tmp_path: Path
) -> None:
    head = await repository(web, tmp_path)
    client = await signed_in(web)
    log = b"ok\n" + HOSTILE.encode() + b"\n\xff\xfe broken utf-8 \xe2\x82"
    digest = hashlib.sha256(log).hexdigest()
    # Uploaded by acme's operator token: a runner's upload to the shared pool `default` would
    # be readable by every tenant that may use that pool (the API's rule).
    put = await web.client.put(f"/v1/artifacts/{digest}", headers=web.operator, content=log)
    assert put.status_code == 200, put.text
    task = await web.queued("checked", repository="app", base_sha=head, expected_checks=["test"])
    [lease] = await web.claim()
    answer = await web.report(
        lease,
        "done",
        candidate_sha="b" * 40,
        artifacts={"test": digest},
        checks={"test": {"log": digest, "exit_code": 0, "duration_s": 1.0}},
    )
    assert answer.status_code == 200, answer.text
    text = await page(client, f"/ui/tasks/{task['id']}")
    assert f'href="/ui/artifacts/{digest}"' in text
    # No verifier re-ran the check: the page says whose word it is, never "verified".
    assert "checks: attested by runner " in text
    shown = await page(client, f"/ui/artifacts/{digest}")
    assert "&lt;script&gt;alert(&#x27;x&#x27;)" in shown or "&lt;script&gt;alert('x')" in shown
    assert "<script>alert" not in shown
    assert "broken utf-8" in shown
    assert shown.count("\ufffd") >= 3
    await page(client, "/ui/artifacts/" + "0" * 64, 404)
    await page(client, "/ui/artifacts/not-a-digest", 422)
    client.cookies.clear()
    await signed_in(web, "rival")
    await page(client, f"/ui/artifacts/{digest}", 404)


async def test_no_page_puts_the_token_in_a_url(web: ApiHarness) -> None:
    client = await signed_in(web)
    secret = web.secrets["operator"]
    task_id = await finished(web, "urls")
    for url in ("/ui", f"/ui/tasks/{task_id}", "/ui/login", "/ui?state=SUCCEEDED"):
        answer = await client.get(url)
        assert secret not in answer.text, url
        assert secret not in answer.headers.get("location", "")


# -- actions ---------------------------------------------------------------------------------


async def test_approve_binds_the_plan_hash_the_form_shows(web: ApiHarness) -> None:
    client = await signed_in(web)
    task = await web.create("approve-me")
    text = await page(client, f"/ui/tasks/{task['id']}")
    assert f'name="plan_hash" value="{task["plan_hash"]}"' in text
    answer = await post_form(
        client,
        f"/ui/tasks/{task['id']}/approve",
        {"csrf": csrf_of(text), "plan_hash": task["plan_hash"]},
    )
    assert (answer.status_code, answer.headers["location"]) == (303, f"/ui/tasks/{task['id']}")
    assert "QUEUED" in await page(client, answer.headers["location"])


async def test_the_approval_form_shows_each_steps_prompt_above_approve(web: ApiHarness) -> None:
    """Issue 26, finding 1: the approver reads the plan, not only its hash. A prompt's hiding
    characters (a bidi override, a zero-width space) show as their escapes."""
    client = await signed_in(web)
    prompt = "Tidy the backups, then DELETE the old ones\u202e\u200b!"
    plan = {
        "steps": [
            {"name": "tidy", "kind": "chat", "payload": chat_payload(prompt)},
            {
                "name": "notify",
                "kind": "http",
                "payload": {
                    "url": "https://hooks.example.org/done",
                    "keyed": True,
                    "headers": {"Authorization": "Bearer sekrit-in-the-plan"},
                },
            },
        ]
    }
    answer = await web.client.post(
        "/v1/tasks", headers=web.operator, json={"idempotency_key": "read-me", "plan": plan}
    )
    assert answer.status_code == 201, answer.text
    task = answer.json()
    [shown] = [s for s in task["plan"]["steps"] if s["name"] == "tidy"]
    assert shown["payload"] == chat_payload(prompt)
    assert shown["payload_hash"] == task["steps"][0]["payload_hash"]
    text = await page(client, f"/ui/tasks/{task['id']}")
    said = "user: Tidy the backups, then DELETE the old ones\\u202e\\u200b!"
    assert said in text
    assert "\u202e" not in text
    assert "\u200b" not in text
    assert text.index(said) < text.index("Approve</button>")
    assert "POST https://hooks.example.org/done" in text
    assert "Authorization: Bearer" in text
    assert "sekrit-in-the-plan" not in text


async def test_a_repository_tasks_approval_shows_its_base(web: ApiHarness, tmp_path: Path) -> None:
    head = await repository(web, tmp_path)
    client = await signed_in(web)
    task = await web.create("repo", repository="app", base_sha=head)
    text = await page(client, f"/ui/tasks/{task['id']}")
    assert f'name="base_sha" value="{head}"' in text
    answer = await post_form(
        client,
        f"/ui/tasks/{task['id']}/approve",
        {"csrf": csrf_of(text), "plan_hash": task["plan_hash"], "base_sha": head},
    )
    assert answer.status_code == 303
    view = (await web.client.get(f"/v1/tasks/{task['id']}", headers=web.operator)).json()
    assert (view["state"], view["base_sha"]) == ("QUEUED", head)


async def test_a_refused_action_says_why_in_one_line_and_changes_nothing(
    web: ApiHarness,
) -> None:
    client = await signed_in(web)
    task = await web.create("mismatch")
    csrf = csrf_of(await page(client, f"/ui/tasks/{task['id']}"))
    before = ledger_snapshot(web.path)
    answer = await post_form(
        client, f"/ui/tasks/{task['id']}/approve", {"csrf": csrf, "plan_hash": "f" * 64}
    )
    assert answer.status_code == 409
    strict(answer.text)
    [notice] = re.findall(r'<p class="notice" role="alert">(.*?)</p>', answer.text)
    assert "plan_mismatch" in notice
    assert "\n" not in notice
    assert "PLANNED" in answer.text
    empty = await post_form(client, f"/ui/tasks/{task['id']}/approve", {"csrf": csrf})
    assert empty.status_code == 422
    assert "plan_hash" in empty.text
    assert ledger_snapshot(web.path)["tasks"] == before["tasks"]


async def test_cancel_records_the_reason(web: ApiHarness) -> None:
    client = await signed_in(web)
    task = await web.queued("stop-me")
    csrf = csrf_of(await page(client, f"/ui/tasks/{task['id']}"))
    answer = await post_form(
        client, f"/ui/tasks/{task['id']}/cancel", {"csrf": csrf, "reason": "wrong branch"}
    )
    assert answer.status_code == 303
    text = await page(client, f"/ui/tasks/{task['id']}")
    assert "CANCELLED" in text
    assert "wrong branch" in text
    again = await post_form(client, f"/ui/tasks/{task['id']}/cancel", {"csrf": csrf})
    assert again.status_code == 409
    assert "terminal" in again.text


async def test_a_review_decision_follows_the_verdict(web: ApiHarness) -> None:
    client = await signed_in(web)
    task = await web.queued("review-me")
    csrf = csrf_of(await page(client, f"/ui/tasks/{task['id']}"))
    url = f"/ui/tasks/{task['id']}/review"
    early = await post_form(client, url, {"csrf": csrf, "decision": "reject"})
    assert early.status_code == 422
    assert "invalid_field" in early.text
    await post_form(client, f"/ui/tasks/{task['id']}/cancel", {"csrf": csrf, "reason": "x"})
    refused = await post_form(client, url, {"csrf": csrf, "decision": "accept"})
    assert refused.status_code == 422
    assert "CANCELLED" in refused.text
    rejected = await post_form(client, url, {"csrf": csrf, "decision": "reject", "note": "no"})
    assert rejected.status_code == 303
    review = (await web.client.get(f"/v1/tasks/{task['id']}/review", headers=web.operator)).json()
    assert review["reviewer_decision"]["value"]["decision"] == "reject"
    assert "reject" in await page(client, f"/ui/tasks/{task['id']}")


async def test_the_pages_own_files_are_served(web: ApiHarness) -> None:
    css = await web.client.get("/ui/static/ui.css")
    script = await web.client.get("/ui/static/live.js")
    assert css.headers["content-type"].startswith("text/css")
    assert "@media" in css.text
    assert script.headers["content-type"].startswith("text/javascript")
    assert "lastEventId" in script.text
    listing = await web.client.get("/ui/static/list.js")
    assert listing.headers["content-type"].startswith("text/javascript")
    assert "data-fragment" in listing.text


# -- effects: the request behind a gate, opening it, an uncertain effect -------------------

SECRET = "s3cret-from-the-folder"
LITERAL = "literal-key-in-the-plan"


@pytest.fixture
async def effects(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ApiHarness]:
    """The status page with a credentials folder; deliveries are driven by hand through the
    ledger's effects methods (`IdleDispatcher`), so nothing reaches the network."""
    monkeypatch.setattr(service, "Dispatcher", IdleDispatcher)
    folder = tmp_path / "credentials"
    folder.mkdir()
    (folder / "deploy-token").write_text(SECRET + "\n")
    async with open_api(
        tmp_path / "ui.db", clock, synchronous="OFF", credentials_dir=folder
    ) as harness:
        yield harness


def effect_plan(key: str, keyed: bool = False) -> dict[str, Any]:
    payload = {
        "url": "https://ops:hunter2@deploy.example/hook",
        "keyed": keyed,
        "headers": {
            "Authorization": "Bearer {{ credential.deploy-token }}",
            "X-Api-Key": LITERAL,
            "X-Team": "blue",
        },
        "body": {"amount": "$82,000"},
    }
    return {
        "idempotency_key": key,
        "plan": {"steps": [{"name": "deploy", "kind": "http", "payload": payload}]},
    }


async def approved_effect(web: ApiHarness, key: str, keyed: bool = False) -> dict[str, Any]:
    """A task of one http effect, approved through the API: its effect is due (or gated)."""
    return await submitted(web, effect_plan(key, keyed))


async def effect_now(web: ApiHarness, task_id: str) -> dict[str, Any]:
    view = (await web.client.get(f"/v1/tasks/{task_id}", headers=web.operator)).json()
    effect: dict[str, Any] = view["steps"][0]["effect"]
    return {**effect, "task_state": view["state"]}


async def send(web: ApiHarness, *answers: Delivered | Unanswered) -> None:
    """A dispatcher takes the effect and, for each of `answers`, begins a send and records
    that answer (as its retry loop does while it holds the effect)."""
    ledger = web.app.state.ledger
    [out] = await ledger.take_effects("d1", 8)
    for answer in answers:
        attempt = await ledger.begin_attempt(out.effect_id, "d1", out.digest)
        await ledger.record_attempt(out.effect_id, attempt, "d1", answer)


def shown_digest(text: str) -> str:
    found = re.search(r'name="digest" value="([0-9a-f]{64})"', text)
    assert found, "the page has no gate form"
    return found.group(1)


def notice_of(text: str) -> str:
    [notice] = re.findall(r'<p class="notice" role="alert">(.*?)</p>', text)
    assert "\n" not in notice
    return str(notice)


def without_rejections(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot less the rejections table: a refused gate is recorded there, as the API's
    refusal is (tests/supervisor/api/test_api_gates.py); nothing else may change."""
    return {k: v for k, v in snapshot.items() if k != "rejections"}


async def test_a_gate_shows_the_request_to_approve_masked_with_its_digest(
    effects: ApiHarness,
) -> None:
    client = await signed_in(effects)
    task = await approved_effect(effects, "gated")
    effect = task["steps"][0]["effect"]
    text = await page(client, f"/ui/tasks/{task['id']}")
    assert shown_digest(text) == effect["digest"]
    request = re.search(r'<div class="request".*?<p>Digest .*?</p>', text, re.DOTALL)
    assert request, "no request shown"
    shown = request.group(0)
    for part in (
        "The request to approve",
        "POST",
        "https://***@deploy.example/hook",
        "X-Team",
        "blue",
        "Bearer {{ credential.deploy-token }}",
        "credential <code>deploy-token</code>",
        "X-Api-Key",
        "masked",
        "&#34;amount&#34;: &#34;$82,000&#34;",
        effect["digest"],
    ):
        assert part in shown, part
    for hidden in (SECRET, LITERAL, "hunter2"):
        assert hidden not in text, hidden
    assert 'name="step" value="deploy"' in text
    assert "Open the gate for this digest" in text
    assert "needs an operator" in text
    assert 'href="#effect-step-1"' in text  # the summary's waiting line links to it
    listing = await page(client, "/ui")
    assert "waiting for an operator to open the gate of effect <code>deploy</code>" in listing
    strict_fragment((await client.get(f"/ui/tasks/{task['id']}/fragment")).text)


async def test_the_gate_opens_for_the_shown_digest_once(effects: ApiHarness) -> None:
    client = await signed_in(effects)
    task = await approved_effect(effects, "open-me")
    text = await page(client, f"/ui/tasks/{task['id']}")
    fields = {"csrf": csrf_of(text), "step": "deploy", "digest": shown_digest(text)}
    answer = await post_form(client, f"/ui/tasks/{task['id']}/gate", fields)
    assert (answer.status_code, answer.headers["location"]) == (303, f"/ui/tasks/{task['id']}")
    effect = await effect_now(effects, task["id"])
    assert effect["state"] == "open"
    token = await effects.app.state.ledger.authenticate(effects.secrets["operator"])
    assert effect["gate"] == {**effect["gate"], "opened_by": token.token_id}
    assert effect["gate"]["digest"] == fields["digest"]
    after = await page(client, answer.headers["location"])
    assert 'name="digest"' not in after
    assert "gate opened for one send" in after
    again = await post_form(client, f"/ui/tasks/{task['id']}/gate", fields)
    assert again.status_code == 409
    assert "invalid_transition" in notice_of(again.text)
    strict(again.text)


async def test_another_digest_is_refused_in_one_line_and_changes_nothing(
    effects: ApiHarness,
) -> None:
    client = await signed_in(effects)
    task = await approved_effect(effects, "mismatch")
    text = await page(client, f"/ui/tasks/{task['id']}")
    csrf, digest = csrf_of(text), shown_digest(text)
    url = f"/ui/tasks/{task['id']}/gate"
    before = without_rejections(ledger_snapshot(effects.path))
    wrong = await post_form(client, url, {"csrf": csrf, "step": "deploy", "digest": "a" * 64})
    assert wrong.status_code == 409
    strict(wrong.text)
    notice = notice_of(wrong.text)
    assert "gate_mismatch" in notice
    assert "look at the request again" in notice
    assert shown_digest(wrong.text) == digest  # the page shows the request again
    refusals = [
        ({"csrf": csrf, "step": "deploy", "digest": ""}, 422, "invalid_field"),
        ({"csrf": csrf, "step": "deploy", "digest": "z" * 65}, 422, "invalid_field"),
        ({"csrf": csrf, "digest": digest}, 422, "names no effect step"),
        ({"csrf": csrf, "step": "nosuch", "digest": digest}, 404, "no step"),
    ]
    for fields, status, says in refusals:
        answer = await post_form(client, url, fields)
        assert answer.status_code == status, fields
        assert says in notice_of(answer.text), fields
    assert without_rejections(ledger_snapshot(effects.path)) == before
    assert (await effect_now(effects, task["id"]))["state"] == "gated"


async def test_a_gate_needs_the_tenants_operator_session_and_its_csrf_token(
    effects: ApiHarness,
) -> None:
    task = await approved_effect(effects, "guarded-gate")
    digest = task["steps"][0]["effect"]["digest"]
    url = f"/ui/tasks/{task['id']}/gate"
    before = ledger_snapshot(effects.path)
    client: httpx.AsyncClient = effects.client
    client.cookies.set("tether_ui", effects.secrets["runner"], path="/ui")  # a runner's token
    as_runner = await post_form(client, url, {"step": "deploy", "digest": digest})
    assert (as_runner.status_code, as_runner.headers["location"]) == (303, "/ui/login")
    client.cookies.clear()
    await signed_in(effects)
    csrf = csrf_of(await page(client, f"/ui/tasks/{task['id']}"))
    no_csrf = await post_form(client, url, {"step": "deploy", "digest": digest})
    assert no_csrf.status_code == 403
    other_site = await post_form(
        client, url, {"csrf": csrf, "step": "deploy", "digest": digest}, "https://evil.example"
    )
    assert other_site.status_code == 403
    happened = await post_form(
        client, f"/ui/tasks/{task['id']}/happened", {"step": "deploy", "happened": "yes"}
    )
    assert happened.status_code == 403
    client.cookies.clear()
    await signed_in(effects, "rival")
    rival_csrf = csrf_of(await page(client, "/ui"))
    rival = await post_form(client, url, {"csrf": rival_csrf, "step": "deploy", "digest": digest})
    assert rival.status_code == 404
    assert ledger_snapshot(effects.path) == before
    assert (await effect_now(effects, task["id"]))["state"] == "gated"


async def test_an_uncertain_effect_is_resolved_from_its_page_with_the_clis_rules(
    effects: ApiHarness,
) -> None:
    client = await signed_in(effects)
    task = await approved_effect(effects, "uncertain")
    task_url = f"/ui/tasks/{task['id']}"
    happened_url = f"{task_url}/happened"

    async def open_and_lose_the_answer() -> str:
        text = await page(client, task_url)
        fields = {"csrf": csrf_of(text), "step": "deploy", "digest": shown_digest(text)}
        assert (await post_form(client, f"{task_url}/gate", fields)).status_code == 303
        await send(effects, Unanswered(detail="connection reset", sent=True))
        return await page(client, task_url)

    fields = {"csrf": csrf_of(await page(client, task_url)), "step": "deploy", "happened": "yes"}
    early = await post_form(client, happened_url, fields)
    assert early.status_code == 409
    assert "only an uncertain effect is resolved" in notice_of(early.text)
    text = await open_and_lose_the_answer()
    csrf = csrf_of(text)
    assert "may have been sent" in text
    assert 'id="happened-step-1"' in text
    assert 'name="happened" value="yes"' in text
    assert 'name="happened" value="no"' in text
    assert 'name="digest"' not in text  # no gate to open while it is uncertain
    assert "connection reset" in text
    listing = await page(client, "/ui")
    assert "say whether effect <code>deploy</code> happened" in listing
    maybe = await post_form(
        client, happened_url, {"csrf": csrf, "step": "deploy", "happened": "maybe"}
    )
    assert maybe.status_code == 422
    assert "yes or no" in notice_of(maybe.text)
    no = await post_form(client, happened_url, {"csrf": csrf, "step": "deploy", "happened": "no"})
    assert no.status_code == 303
    assert (await effect_now(effects, task["id"]))["state"] == "gated"
    text = await open_and_lose_the_answer()
    before = without_rejections(ledger_snapshot(effects.path))
    second_no = await post_form(
        client, happened_url, {"csrf": csrf, "step": "deploy", "happened": "no"}
    )
    assert second_no.status_code == 409
    assert "already re-opened once" in notice_of(second_no.text)
    assert without_rejections(ledger_snapshot(effects.path)) == before
    yes = await post_form(client, happened_url, {"csrf": csrf, "step": "deploy", "happened": "yes"})
    assert yes.status_code == 303
    effect = await effect_now(effects, task["id"])
    assert (effect["task_state"], effect["state"]) == ("SUCCEEDED", "delivered")
    done = await page(client, task_url)
    assert f"<code>{effect['resolved']['by']}</code> said it happened" in done
    deliveries = re.search(r'<table class="deliveries">.*?</table>', done, re.DOTALL)
    assert deliveries
    assert deliveries.group(0).count("<tr>") == 3  # a head and two sends


async def test_a_keyed_effect_shows_each_delivery_and_its_answer(effects: ApiHarness) -> None:
    client = await signed_in(effects)
    task = await approved_effect(effects, "keyed", keyed=True)
    text = await page(client, f"/ui/tasks/{task['id']}")
    assert "every try carries its <code>Idempotency-Key</code>" in text
    assert 'name="digest"' not in text  # a keyed effect has no gate
    await send(
        effects,
        Unanswered(detail="HTTP 503: busy", sent=True, status=503),
        Delivered(status=201, detail='HTTP 201: {"applied": 1}'),
    )
    text = await page(client, f"/ui/tasks/{task['id']}")
    assert "SUCCEEDED" in text
    deliveries = re.search(r'<table class="deliveries">.*?</table>', text, re.DOTALL)
    assert deliveries
    rows = deliveries.group(0)
    for part in ("503", "HTTP 503: busy", "<strong>delivered</strong>", "201", "applied"):
        assert part in rows, part
    assert "delivered; the receiver&#39;s answer is recorded" in text


async def test_an_effect_not_due_yet_says_so_and_offers_no_gate(effects: ApiHarness) -> None:
    client = await signed_in(effects)
    body = effect_plan("later")
    body["plan"]["steps"].insert(0, {"name": "s0", "kind": "chat", "payload": chat_payload("x")})
    task = (await effects.client.post("/v1/tasks", headers=effects.operator, json=body)).json()
    text = await page(client, f"/ui/tasks/{task['id']}")
    assert "An effect, not due yet" in text
    assert 'name="digest"' not in text
    assert 'id="effect-step-2"' not in text
