"""The status page in real headless Chromium (Debian's chromium and chromedriver; nothing is
downloaded) against a real uvicorn on a free port: refused without a token, signed in, a task
approved from its page and watched live through an expired attempt, its replay, its effect
delivered and SUCCEEDED; then an effect's gate opened from its page and the effect seen
delivered live; the list searched and updating itself, the runners page, and an agent's
transcript read as a conversation. With TETHER_SCREENSHOTS=1 the tests write the screenshots
the docs show (docs/screenshots/: the list, a task page, the runners page); otherwise they
write nothing into the checkout.

The runner side is a fake runner speaking the HTTP API: it claims, then stops renewing, as a
runner killed with SIGKILL would; its unacknowledged lease lapses after the 1 s acceptance
window and the reaper requeues the step for the next runner. Effects are sent by the
supervisor's own dispatcher to examples/receiver.py, served on 127.0.0.1 in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import anyio
import httpx
import pytest
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from examples import receiver as example_receiver
from tests.conftest import chat_payload, task_body
from tether.supervisor import admin
from tether.supervisor.api import create_app, drain
from tether.supervisor.settings import SupervisorSettings

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = Path(__file__).resolve().parents[3] / "docs" / "screenshots"
WAIT_S = 15.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Served:
    """An ASGI app served by uvicorn on a free port of 127.0.0.1, in a thread."""

    def __init__(self, app: ASGIApp) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        # log_config=None: uvicorn's own would take over the process's `uvicorn.*` loggers
        # (handlers of its own, propagate off) for every test that runs after.
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            ws="none",
            lifespan="on",
            timeout_graceful_shutdown=2,
            interface="asgi3",
            log_config=None,
        )
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve()

    def before_stop(self) -> None:
        """What to do in the server's loop before it is told to exit."""

    @contextlib.contextmanager
    def running(self) -> Iterator[Self]:
        self.thread.start()
        deadline = time.monotonic() + WAIT_S
        while not self.server.started:
            assert self.thread.is_alive(), "uvicorn stopped while starting"
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        try:
            yield self
        finally:
            self.before_stop()
            self.server.should_exit = True
            self.thread.join(timeout=WAIT_S)


class Supervisor(Served):
    """A supervisor app with the status page and its effects dispatcher."""

    def __init__(self, root: Path, receiver_url: str) -> None:
        db = root / "ledger.db"
        self.secrets = {
            name: admin.create_token(db, scope, role, init=True).secret
            for name, scope, role in [
                ("operator", "acme", "operator"),
                ("runner", "default", "runner"),
            ]
        }
        # A lease nobody acknowledges lapses after 1 s; one renewed lives 3 s.
        # Effects go to the receiver on 127.0.0.1, an internal address: it must be named.
        allowed = receiver_url.removeprefix("http://")
        settings = SupervisorSettings(
            db=db, lease_ttl_s=3.0, accept_window_s=1.0, effect_allowed_hosts=allowed
        )
        self.app = create_app(settings)
        super().__init__(self.app)

    def before_stop(self) -> None:
        if self.loop is not None:  # end the open event streams, as `serve` does on SIGTERM
            self.loop.call_soon_threadsafe(drain, self.app)

    def api(self, who: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            timeout=WAIT_S,
            headers={"Authorization": f"Bearer {self.secrets[who]}"},
        )


class Receiver(Served):
    """examples/receiver.py, with a hold in front: while held, a delivery waits (at most
    `WAIT_S`) before the receiver sees it, so a page can be looked at mid-send."""

    def __init__(self, root: Path) -> None:
        self.receiver = example_receiver.create_app(root / "receiver.db")
        self.released = threading.Event()
        self.released.set()
        super().__init__(self._held)

    async def _held(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/counts":
            await anyio.to_thread.run_sync(self.released.wait, WAIT_S)
        await self.receiver(scope, receive, send)

    def counts(self) -> dict[str, Any]:
        counts: dict[str, Any] = httpx.get(f"{self.url}/counts", timeout=WAIT_S).json()
        return counts


@pytest.fixture(scope="module")
def supervisor(
    tmp_path_factory: pytest.TempPathFactory, receiver: Receiver
) -> Iterator[Supervisor]:
    with Supervisor(tmp_path_factory.mktemp("ui-browser"), receiver.url).running() as running:
        yield running


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    with Receiver(tmp_path_factory.mktemp("receiver")).running() as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} and {CHROMEDRIVER} are needed in CI (.ci/run installs them)")
        pytest.skip("no /usr/bin/chromium or /usr/bin/chromedriver: apt install chromium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
        "--hide-scrollbars",
        "--no-first-run",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


# The page's live parts are replaced whole while a test reads them (ui/static/live.js swaps
# `#live` at each event, list.js the list and the runners every 5 s): an element handle taken
# a moment before may be detached, or gone from chromium's inspector, by the time its text is
# asked for ("No node with given id found"). So the tests read what a page shows in one
# script run, which no swap can interleave with, and wait for a state, never for a handle.
READ = """
const found = document.querySelector(arguments[0]);
return found === null ? null : found.innerText.replace(/[ \\t]+/g, " ");
"""


def shown(driver: Any, css: str) -> str:
    """What the first element matching `css` shows now (cells separated by one space), or ""
    when there is none."""
    text: str | None = driver.execute_script(READ, css)
    return text or ""


def wait_for(driver: Any, text: str, where: str = "live") -> None:
    """Wait until the element of id `where` shows `text` (live updates replace it meanwhile)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S).until(
        lambda d: text in shown(d, f"#{where}"), f"{where!r} never showed {text!r}"
    )


def notice(driver: Any) -> str:
    """The page's one-line refusal, once the page that carries it has loaded."""
    from selenium.webdriver.support.ui import WebDriverWait

    found: str = WebDriverWait(driver, WAIT_S).until(
        lambda d: shown(d, ".notice"), "no refusal shown"
    )
    return found


def sign_in(driver: Any, supervisor: Supervisor, secret: str) -> None:
    """Submit the login form and wait for the page it leads to (the status page, or the login
    page again with its refusal): `click` returns before that navigation ends. The wait is for
    a new document, marked in the old one, not for the button's handle to go stale: asked about
    mid-navigation, chromium can answer that the node "does not belong to the document"."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{supervisor.url}/ui/login")
    driver.find_element(By.ID, "token").send_keys(secret)
    driver.execute_script("window.loginPage = true;")
    driver.find_element(By.CSS_SELECTOR, "form.card button[type=submit]").click()
    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.execute_script(
            "return window.loginPage !== true && document.readyState === 'complete';"
        ),
        "no new page",
    )


def screenshot(driver: Any, name: str) -> None:
    """With TETHER_SCREENSHOTS=1, the whole page as docs/screenshots/NAME (the docs show it)."""
    if os.environ.get("TETHER_SCREENSHOTS") != "1":
        return
    height = driver.execute_script("return document.documentElement.scrollHeight;")
    driver.set_window_size(1280, min(int(height) + 40, 4000))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(SCREENSHOTS / name))
    assert (SCREENSHOTS / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    driver.set_window_size(1280, 1000)


def test_without_an_operator_token_the_page_stays_shut(
    browser: Any, supervisor: Supervisor
) -> None:

    browser.delete_all_cookies()
    browser.get(f"{supervisor.url}/ui")
    assert browser.current_url == f"{supervisor.url}/ui/login"
    sign_in(browser, supervisor, supervisor.secrets["runner"])
    assert "needs an operator token" in notice(browser)
    sign_in(browser, supervisor, "tether_not-a-token")
    assert "unknown or revoked" in notice(browser)
    assert browser.get_cookies() == []


def deploy_step(receiver: Receiver, name: str, *, keyed: bool, **body: Any) -> dict[str, Any]:
    """An `http` effect step that delivers `body` to the receiver."""
    payload = {"url": f"{receiver.url}/{name}", "keyed": keyed, "body": body}
    return {"name": name, "kind": "http", "payload": payload}


def test_approve_then_watch_an_expired_attempt_its_replay_and_success_live(
    browser: Any, supervisor: Supervisor, receiver: Receiver
) -> None:
    from selenium.webdriver.common.by import By

    # A chat step, then a keyed effect the supervisor sends once the chat step is committed.
    plan = {
        "steps": [
            {"name": "s0", "kind": "chat", "payload": chat_payload("apply patch 0")},
            deploy_step(receiver, "notify", keyed=True, patched="{{ steps.s0.output }}"),
        ]
    }
    with supervisor.api("operator") as operator, supervisor.api("runner") as runner:
        created = operator.post("/v1/tasks", json={"idempotency_key": "watched", "plan": plan})
        assert created.status_code == 201, created.text
        task = created.json()
        browser.delete_all_cookies()
        sign_in(browser, supervisor, supervisor.secrets["operator"])
        assert browser.current_url == f"{supervisor.url}/ui"
        assert task["id"][:8] in shown(browser, "main")  # its short id
        [cookie] = browser.get_cookies()
        assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/ui")

        browser.get(f"{supervisor.url}/ui/tasks/{task['id']}")
        assert task["plan_hash"] in shown(browser, "#approve")
        browser.find_element(By.CSS_SELECTOR, "#approve button").click()
        wait_for(browser, "QUEUED")
        browser.execute_script("window.notReloaded = true;")

        claim = {"runner_id": "box-killed", "capacity": 1, "wait_s": 5}
        [first] = runner.post("/v1/leases/claim", json=claim).json()["leases"]
        wait_for(browser, "RUNNING")
        # box-killed never renews nor reports: its lease lapses and the reaper requeues.
        replay = {**claim, "runner_id": "box-replay"}
        [second] = runner.post("/v1/leases/claim", json=replay).json()["leases"]
        assert second["fence"] > first["fence"]
        renew = (f"/v1/leases/{second['step_id']}/renew", {"fence": second["fence"]})
        assert runner.post(renew[0], json=renew[1]).status_code == 200  # box-replay lives on
        with renewing(supervisor, second):  # however long the page takes on a loaded machine
            wait_for(browser, "expired")
        result = {
            "fence": second["fence"],
            "payload_hash": second["payload_hash"],
            "output": "patched",
            "usage": {"total_tokens": 7},
        }
        answer = runner.post(f"/v1/steps/{second['step_id']}/result", json=result)
        assert answer.json() == {"outcome": "applied"}
        wait_for(browser, "SUCCEEDED")
        assert browser.execute_script("return window.notReloaded === true;")
        wait_for(browser, "Review decision", "actions")  # the state changed: so did the forms
        for attempts in ("box-killed", "box-replay", "committed"):
            wait_for(browser, attempts)
        wait_for(browser, "delivered", "effect-step-2")
        wait_for(browser, '"patched": "patched"', "effect-step-2")  # the chat step's output
        key = operator.get(f"/v1/tasks/{task['id']}").json()["steps"][1]["effect"]["key"]
        assert receiver.counts()["by_key"][key] == 1

        screenshot(browser, "task-page.png")

        browser.set_window_size(390, 844)  # a phone: nothing wider than the screen
        browser.refresh()
        assert browser.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth;"
        )
        browser.set_window_size(1280, 1000)


def test_open_a_gate_from_the_page_and_see_the_effect_delivered_live(
    browser: Any, supervisor: Supervisor, receiver: Receiver
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    plan = {"steps": [deploy_step(receiver, "charge", keyed=False, amount="$82,000")]}
    with supervisor.api("operator") as operator:
        task = operator.post("/v1/tasks", json={"idempotency_key": "gated", "plan": plan}).json()
        approved = operator.post(
            f"/v1/tasks/{task['id']}/approve", json={"plan_hash": task["plan_hash"]}
        )
        effect = approved.json()["steps"][0]["effect"]
        assert effect["state"] == "gated"  # approval opens no gate
        browser.delete_all_cookies()
        sign_in(browser, supervisor, supervisor.secrets["operator"])
        assert "open the gate of effect charge" in shown(browser, "main")

        browser.get(f"{supervisor.url}/ui/tasks/{task['id']}")
        wait_for(browser, "needs an operator", "effect-step-1")
        request = shown(browser, "#request-step-1")
        for part in ("POST", f"{receiver.url}/charge", '"amount": "$82,000"', effect["digest"]):
            assert part in request, part
        digest = browser.execute_script(
            'return document.querySelector("#gate-step-1 input[name=digest]").value;'
        )
        assert digest == effect["digest"]
        assert receiver.counts()["by_key"].get(effect["key"]) is None

        receiver.released.clear()  # the send waits at the receiver while the page is read
        try:
            browser.execute_script("window.gatePage = true;")
            browser.find_element(By.CSS_SELECTOR, "#gate-step-1 button").click()
            WebDriverWait(browser, WAIT_S).until(
                lambda d: d.execute_script("return window.gatePage !== true;"), "no new page"
            )
            # 303 back to the task page, the effect open or being sent: held at the receiver.
            wait_for(browser, "Gate opened", "effect-step-1")
            held = shown(browser, "#effect-step-1")
            assert "delivered" not in held
            assert "Open the gate" not in held
            browser.execute_script("window.notReloaded = true;")
        finally:
            receiver.released.set()
        wait_for(browser, "delivered", "effect-step-1")
        wait_for(browser, "SUCCEEDED")
        assert browser.execute_script("return window.notReloaded === true;")
        assert receiver.counts()["by_key"][effect["key"]] == 1
        view = operator.get(f"/v1/tasks/{task['id']}").json()["steps"][0]["effect"]
        assert (view["state"], view["openings"], len(view["deliveries"])) == ("delivered", 1, 1)


def test_the_event_stream_resumes_after_the_last_event_id(supervisor: Supervisor) -> None:
    with supervisor.api("operator") as operator:
        task = operator.post("/v1/tasks", json=task_body("streamed", 1)).json()
        operator.post(f"/v1/tasks/{task['id']}/approve", json={"plan_hash": task["plan_hash"]})
        seqs = [e["seq"] for e in operator.get(f"/v1/tasks/{task['id']}/events").json()["events"]]
    assert len(seqs) >= 3
    with httpx.Client(base_url=supervisor.url, timeout=WAIT_S) as client:
        login = client.post("/ui/login", data={"token": supervisor.secrets["operator"]})
        assert login.status_code == 303
        client.cookies.set("tether_ui", login.cookies["tether_ui"], path="/ui")
        headers = {"Last-Event-ID": str(seqs[0])}
        ids: list[int] = []
        with client.stream("GET", f"/ui/tasks/{task['id']}/events", headers=headers) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            for line in stream.iter_lines():
                if line.startswith("id: "):
                    ids.append(int(line[4:]))
                if len(ids) == len(seqs) - 1:
                    break
    assert ids == seqs[1:]


def claim_for(runner: httpx.Client, task_id: str, runner_id: str) -> dict[str, Any]:
    """A lease on `task_id`'s step: a lease another test left queued is finished first."""
    for _ in range(10):
        claim = {"runner_id": runner_id, "capacity": 1, "wait_s": 5}
        [lease] = runner.post("/v1/leases/claim", json=claim).json()["leases"]
        if lease["task_id"] == task_id:
            return lease
        result = {"fence": lease["fence"], "payload_hash": lease["payload_hash"], "output": "ok"}
        runner.post(f"/v1/steps/{lease['step_id']}/result", json=result)
    raise AssertionError(f"no lease on {task_id}")


@contextlib.contextmanager
def renewing(supervisor: Supervisor, lease: dict[str, Any]) -> Iterator[None]:
    """Renew `lease` every half second in a thread while the block runs: a lease nobody
    renews lapses after the 1 s acceptance window."""
    done = threading.Event()

    def renew() -> None:
        with supervisor.api("runner") as runner:
            while True:  # at once, then every half second
                path = f"/v1/leases/{lease['step_id']}/renew"
                runner.post(path, json={"fence": lease["fence"]})
                if done.wait(0.5):
                    return

    thread = threading.Thread(target=renew, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=WAIT_S)


def test_search_the_list_and_see_a_new_task_appear_without_a_reload(
    browser: Any, supervisor: Supervisor
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with supervisor.api("operator") as operator:
        wanted = operator.post("/v1/tasks", json=task_body("search-wanted", 1)).json()
        other = operator.post("/v1/tasks", json=task_body("search-other", 1)).json()
        browser.delete_all_cookies()
        sign_in(browser, supervisor, supervisor.secrets["operator"])
        field = browser.find_element(By.ID, "q")
        field.send_keys(wanted["id"][:10])
        field.submit()
        WebDriverWait(browser, WAIT_S).until(lambda d: "q=" in d.current_url, "not searched")
        found = shown(browser, "#tasks-live")
        assert "search-wanted" in found
        assert "search-other" not in found
        assert other["id"][:8] not in found
        title, short = browser.execute_script(
            'const a = document.querySelector("#tasks-live td a"); return [a.title, a.innerText];'
        )
        assert title == wanted["id"]  # the whole id on hover
        assert len(short) == 8

        browser.get(f"{supervisor.url}/ui?pool=default")
        browser.execute_script("window.notReloaded = true;")
        later = operator.post("/v1/tasks", json=task_body("search-later", 1)).json()
        WebDriverWait(browser, WAIT_S).until(
            lambda d: "search-later" in shown(d, "#tasks-live"), "the list never updated"
        )
        assert browser.execute_script("return window.notReloaded === true;")
        assert later["id"][:8] in shown(browser, "#tasks-live")
        screenshot(browser, "tasks.png")


def test_the_runners_page_shows_a_runner_online_and_its_pool(
    browser: Any, supervisor: Supervisor
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with supervisor.api("operator") as operator, supervisor.api("runner") as runner:
        task = operator.post("/v1/tasks", json=task_body("runners-page", 1)).json()
        operator.post(f"/v1/tasks/{task['id']}/approve", json={"plan_hash": task["plan_hash"]})
        browser.delete_all_cookies()
        sign_in(browser, supervisor, supervisor.secrets["operator"])
        browser.find_element(By.LINK_TEXT, "Runners and pools").click()
        WebDriverWait(browser, WAIT_S).until(lambda d: d.current_url.endswith("/ui/runners"))
        browser.execute_script("window.notReloaded = true;")
        lease = claim_for(runner, task["id"], "box-on-the-page")
        with renewing(supervisor, lease):
            WebDriverWait(browser, WAIT_S).until(
                lambda d: "box-on-the-page online default chat 1 " in shown(d, "table.runners"),
                "the runner never showed online holding its lease",
            )
            assert browser.execute_script("return window.notReloaded === true;")
            assert "default" in shown(browser, "table.pools")
            screenshot(browser, "runners.png")
        result = {"fence": lease["fence"], "payload_hash": lease["payload_hash"], "output": "ok"}
        assert runner.post(f"/v1/steps/{lease['step_id']}/result", json=result).status_code == 200


def test_an_agent_transcript_reads_as_a_conversation_in_the_browser(
    browser: Any, supervisor: Supervisor
) -> None:

    transcript = [
        {"role": "user", "content": "Make the failing test pass."},
        {
            "role": "assistant",
            "turn": 1,
            "content": "Reading the module.",
            "tool_calls": [{"id": "c1", "name": "read_file", "arguments": '{"path": "src/a.py"}'}],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "name": "read_file",
            "ok": True,
            "content": "def answer():\n    return 41\n",
        },
        {
            "role": "assistant",
            "turn": 2,
            "content": "Fixed: answer() returns 42.",
            "finish_reason": "stop",
        },
    ]
    with supervisor.api("operator") as operator, supervisor.api("runner") as runner:
        task = operator.post("/v1/tasks", json=task_body("transcript", 1)).json()
        operator.post(f"/v1/tasks/{task['id']}/approve", json={"plan_hash": task["plan_hash"]})
        lease = claim_for(runner, task["id"], "box-agent")
        output = {"transcript": transcript, "turns": 2}
        result = {"fence": lease["fence"], "payload_hash": lease["payload_hash"], "output": output}
        answer = runner.post(f"/v1/steps/{lease['step_id']}/result", json=result)
        assert answer.status_code == 200, answer.text
        browser.delete_all_cookies()
        sign_in(browser, supervisor, supervisor.secrets["operator"])
        browser.get(f"{supervisor.url}/ui/tasks/{task['id']}")
        wait_for(browser, "SUCCEEDED")
        turns = browser.execute_script(
            'return [...document.querySelectorAll("section.conversation h5")]'
            ".map((h) => h.innerText);"
        )
        assert turns == ["Turn 1", "Turn 2"]
        text = shown(browser, "section.conversation")
        assert text.index("Make the failing test pass.") < text.index("Reading the module.")
        assert "read_file" in text
        assert '{"path": "src/a.py"}' in text
        assert "return 41" in text
        assert text.index("return 41") < text.index("Fixed: answer() returns 42.")
