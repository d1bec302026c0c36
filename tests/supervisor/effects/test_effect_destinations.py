"""Where effects may go (supervisor/ledger/destinations.py, supervisor/effects/addresses.py):
the entries of `effect_allowed_hosts`, internal addresses and their spellings, the check at
create, resolve-once at send, and git held to the address checked.

Nothing here connects anywhere but 127.0.0.1: names are answered by stand-in resolvers."""

from __future__ import annotations

import http.server
import ipaddress
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.plain import plain
from tests.supervisor.ledger.test_ledger_outbox import spec_with
from tether.git import git_env
from tether.settings import SettingsError, load_settings
from tether.supervisor.effects.addresses import (
    DestinationRefused,
    NotResolved,
    checked_address,
    git_pin,
    pinned_environment,
)
from tether.supervisor.ledger import InvalidRequest, SqliteLedger
from tether.supervisor.ledger.destinations import (
    Address,
    Destinations,
    Host,
    HostPattern,
    HostRefused,
    internal_kind,
    read_host,
    remote_destination,
)
from tether.supervisor.ledger.repositories import add_repository
from tether.supervisor.settings import SupervisorSettings

DEFAULT = Destinations()
ip = ipaddress.ip_address


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "a loopback"),
        ("127.8.9.10", "a loopback"),
        ("169.254.169.254", "a link-local"),
        ("10.1.2.3", "a private"),
        ("172.16.0.1", "a private"),
        ("192.168.1.1", "a private"),
        ("100.64.0.1", "a shared"),
        ("0.0.0.0", "the unspecified"),
        ("224.0.0.1", "a multicast"),
        ("255.255.255.255", "a private"),
        ("::1", "a loopback"),
        ("::", "the unspecified"),
        ("fe80::1", "a link-local"),
        ("fd00::1", "a unique-local"),
        ("::ffff:127.0.0.1", "an IPv6 spelling of 127.0.0.1, a loopback"),
        ("::ffff:169.254.169.254", "an IPv6 spelling of 169.254.169.254, a link-local"),
        ("64:ff9b::7f00:1", "an IPv6 spelling of 127.0.0.1, a loopback"),
        ("2002:7f00:1::", "an IPv6 spelling of 127.0.0.1, a loopback"),
        ("::7f00:1", "an IPv6 spelling of 127.0.0.1, a loopback"),
        ("ff02::1", "a multicast"),
    ],
)
def test_internal_addresses_are_named_by_kind(address: str, kind: str) -> None:
    found = internal_kind(ip(address))
    assert found is not None
    assert found.startswith(kind)


@pytest.mark.parametrize("address", ["8.8.8.8", "93.184.216.34", "2001:4860:4860::8888"])
def test_public_addresses_are_not_internal(address: str) -> None:
    assert internal_kind(ip(address)) is None


@pytest.mark.parametrize(
    "text",
    [
        "0x7f000001",
        "2130706433",
        "017700000001",
        "127.1",
        "127.0.0.1.",
        "0177.0.0.1",
        "1.2.3.4.5",
        "localhost",
        "api.localhost",
        "LOCALHOST.",
        "exa mple.com",
        "[::1",
    ],
)
def test_numeric_spellings_and_localhost_are_refused_whatever_the_list(text: str) -> None:
    with pytest.raises(HostRefused):
        read_host(text)
    with pytest.raises(ValueError, match="setting 'effect_allowed_hosts'"):
        Destinations.from_settings(text, {})


def test_hosts_read_as_sent() -> None:
    assert read_host("Hooks.Example.COM.") == Host(name="hooks.example.com")
    assert read_host("[::FFFF:127.0.0.1]") == Host(address=ip("127.0.0.1"))
    assert read_host("10.0.0.5") == Host(address=ip("10.0.0.5"))


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("[::1]x", "only ':<port>'"),
        ("h:0", "1..65535"),
        ("h:x", "1..65535"),
        ("::1", "in brackets"),
        ("*.10.0.0.1", "a domain name"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(entry: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        HostPattern.parse(entry)


def _refusal(rule: Destinations, url: str, tenant: str = "acme") -> str | None:
    return rule.refuse_url(tenant, url)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8099/hook",
        "http://127.0.0.1:5432/",
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://10.0.0.1/admin",
        "http://[::1]:22/",
        "http://[::ffff:127.0.0.1]/",
        "http://[fd00::1]/",
        "http://0.0.0.0:8080/",
        "http://0x7f000001/",
        "http://2130706433/",
        "http://017700000001/",
        "http://127.1/",
        "http://localhost:8099/",
    ],
)
def test_the_default_refuses_internal_destinations_by_the_plan_text(url: str) -> None:
    problem = _refusal(DEFAULT, url)
    assert problem is not None
    assert (
        "effect_allowed_hosts" in problem
        or "numeric spelling" in problem
        or "loopback" in (problem)
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/deploy/{{ steps.build.output.v }}",
        "http://8.8.8.8/x",
        "https://[2001:4860:4860::8888]:8443/",
        "http://r/x",
    ],
)
def test_the_default_admits_names_and_public_addresses(url: str) -> None:
    assert _refusal(DEFAULT, url) is None


def test_an_internal_address_needs_an_entry_naming_it() -> None:
    rule = Destinations.from_settings("*, 127.0.0.1:8099, [::1]", {"beta": "10.0.0.5"})
    assert _refusal(rule, "http://127.0.0.1:8099/x") is None
    refused = _refusal(rule, "http://127.0.0.1:8100/x")
    assert refused is not None
    assert "127.0.0.1 is a loopback address" in refused
    assert "effect_allowed_hosts (or effect_allowed_hosts_by_tenant.acme)" in refused
    assert _refusal(rule, "http://[::1]:22/") is None  # no port: every port
    assert _refusal(rule, "http://[::ffff:127.0.0.1]:8099/") is None  # the same address
    assert _refusal(rule, "http://10.0.0.5/", tenant="beta") is None
    assert _refusal(rule, "http://10.0.0.5/", tenant="acme") is not None  # beta's only


def test_names_are_admitted_by_entries_and_never_reach_an_internal_address() -> None:
    rule = Destinations.from_settings("*.example.com, hooks.test:8443", {})
    assert _refusal(rule, "https://a.b.example.com/x") is None
    assert _refusal(rule, "https://example.com/x") is not None  # `*.` is below the domain
    assert _refusal(rule, "https://hooks.test:8443/") is None
    assert _refusal(rule, "https://hooks.test/") is not None  # another port
    assert _refusal(rule, "http://8.8.8.8/") is not None  # no `*`: public addresses too
    where = "hooks.test:8443"
    assert rule.refuse_address("acme", where, ip("93.184.216.34"), 8443) is None
    refused = rule.refuse_address("acme", where, ip("169.254.169.254"), 8443)
    assert refused is not None
    assert "link-local" in refused


@pytest.mark.parametrize(
    ("url", "found"),
    [
        ("ssh://git@forge.example:2222/team/app.git", ("ssh", Host(name="forge.example"), 2222)),
        ("git@forge.example:team/app.git", ("ssh", Host(name="forge.example"), 22)),
        ("https://forge.example/team/app.git", ("https", Host(name="forge.example"), 443)),
        ("git://10.0.0.9/app.git", ("git", Host(address=ip("10.0.0.9")), 9418)),
        ("ssh://[::1]/srv/app.git", ("ssh", Host(address=ip("::1")), 22)),
        ("/srv/git/app.git", None),
        ("file:///srv/git/app.git", None),
    ],
)
def test_git_remotes_are_read_for_their_destination(
    url: str, found: tuple[str, Host, int] | None
) -> None:
    assert remote_destination(url) == found


def test_a_local_remote_is_not_judged_and_a_network_one_is() -> None:
    assert DEFAULT.refuse_remote("acme", "/srv/git/app.git") is None
    assert DEFAULT.refuse_remote("acme", "https://forge.example/app.git") is None
    refused = DEFAULT.refuse_remote("acme", "git@192.168.1.20:team/app.git")
    assert refused is not None
    assert "private" in refused


def test_the_settings_read_lists_tables_and_inline_tables() -> None:
    settings = load_settings(
        SupervisorSettings,
        environ={
            "TETHER_EFFECT_ALLOWED_HOSTS": "hooks.example.com, 127.0.0.1:8099",
            "TETHER_EFFECT_ALLOWED_HOSTS_BY_TENANT": '{ acme = ["10.0.0.5:443"], b = "[::1]" }',
        },
    )
    rule = settings.effect_destinations
    assert [p.text for p in rule.entries_for("acme")] == [
        "hooks.example.com",
        "127.0.0.1:8099",
        "10.0.0.5:443",
    ]
    assert [p.text for p in rule.entries_for("b")][-1] == "[::1]"
    assert settings.ledger_config.effect_destinations == rule
    with pytest.raises(SettingsError, match=r"effect_allowed_hosts_by_tenant\.acme"):
        SupervisorSettings(effect_allowed_hosts_by_tenant={"acme": "0x7f000001"})
    with pytest.raises(SettingsError, match="TOML inline table"):
        load_settings(
            SupervisorSettings, environ={"TETHER_EFFECT_ALLOWED_HOSTS_BY_TENANT": "acme = x"}
        )


# -- at create --------------------------------------------------------------------------------


async def test_create_refuses_an_internal_http_destination_naming_the_rule(
    ledger: SqliteLedger,
) -> None:
    spec = spec_with(("ping", "http", {"url": "http://169.254.169.254/latest/meta-data/"}))
    with pytest.raises(InvalidRequest) as refused:
        await ledger.create_task(spec)
    detail = refused.value.detail
    assert detail.startswith("'plan.steps[0].payload.url': step 'ping': destination")
    assert "169.254.169.254 is a link-local address" in detail
    assert plain(await ledger.list_tasks("acme", None, None, 10))["tasks"] == []


async def test_create_refuses_a_push_to_an_internal_remote(ledger: SqliteLedger) -> None:
    await ledger.write(lambda tx: add_repository(tx, "acme", "repo", "ssh://10.0.0.9/app.git"))
    spec = spec_with(
        ("code", "chat", {}), ("push", "git.push", {"branch": "main"}), repository="repo"
    )
    with pytest.raises(InvalidRequest, match=r"^'repository': step 'push': .*10\.0\.0\.9 is a"):
        await ledger.create_task(spec)


# -- at send: resolve once --------------------------------------------------------------------


class Swapping:
    """A resolver whose answer changes after the first question (a DNS rebinding)."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = [[ip(a) for a in answer] for answer in answers]
        self.asked: list[str] = []

    async def __call__(self, name: str, port: int) -> list[Address]:
        self.asked.append(name)
        return self.answers[min(len(self.asked), len(self.answers)) - 1]


ALLOWS_ONE = Destinations.from_settings("*, 127.0.0.1:8099", {})


async def test_the_address_connected_to_is_the_one_checked() -> None:
    swapping = Swapping(["127.0.0.1"], ["127.0.0.2"])
    host = Host(name="hook.test")
    found = await checked_address(ALLOWS_ONE, "acme", host, 8099, swapping)
    assert found == ip("127.0.0.1")
    assert swapping.asked == ["hook.test"]  # once: nothing asks again before connecting
    with pytest.raises(DestinationRefused, match=r"hook\.test resolved to 127\.0\.0\.2"):
        await checked_address(ALLOWS_ONE, "acme", host, 8099, swapping)


async def test_an_answer_mixing_allowed_and_internal_addresses_is_refused_whole() -> None:
    mixed = Swapping(["93.184.216.34", "169.254.169.254"])
    with pytest.raises(DestinationRefused, match="link-local"):
        await checked_address(DEFAULT, "acme", Host(name="hook.test"), 443, mixed)


async def test_a_name_that_does_not_resolve_in_time_sends_nothing() -> None:
    async def slow(name: str, port: int) -> list[Address]:
        await anyio.sleep(5)
        return []

    async def failing(name: str, port: int) -> list[Address]:
        raise OSError(-2, "Name or service not known")

    with pytest.raises(NotResolved, match=r"within 0\.05 s"):
        await checked_address(DEFAULT, "acme", Host(name="h.test"), 443, slow, timeout_s=0.05)
    with pytest.raises(NotResolved, match="Name or service not known"):
        await checked_address(DEFAULT, "acme", Host(name="h.test"), 443, failing)


async def test_an_address_host_is_not_resolved() -> None:
    never = Swapping()
    found = await checked_address(ALLOWS_ONE, "acme", Host(address=ip("127.0.0.1")), 8099, never)
    assert found == ip("127.0.0.1")
    assert never.asked == []


# -- git held to the address checked ----------------------------------------------------------


def test_the_pin_adds_to_the_credential_s_environment() -> None:
    credential_env = {
        "GIT_ASKPASS": "/x/askpass",
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "credential.helper",
        "GIT_CONFIG_VALUE_0": "",
    }
    pin = git_pin("https", Host(name="forge.example"), 443, ip("2001:db8::7"))
    env = pinned_environment(credential_env, pin)
    assert env["GIT_CONFIG_COUNT"] == "4"
    config = {env[f"GIT_CONFIG_KEY_{i}"]: env[f"GIT_CONFIG_VALUE_{i}"] for i in range(4)}
    assert config == {
        "credential.helper": "",
        "http.followRedirects": "false",
        "http.proxy": "",
        "http.curloptResolve": "forge.example:443:[2001:db8::7]",
    }
    ssh = pinned_environment(
        {"GIT_SSH_COMMAND": "ssh -o BatchMode=yes -i /k -o IdentitiesOnly=yes"},
        git_pin("ssh", Host(name="forge.example"), 22, ip("192.0.2.9")),
    )
    assert ssh["GIT_SSH_COMMAND"] == (
        "ssh -o BatchMode=yes -i /k -o IdentitiesOnly=yes"
        " -o HostName=192.0.2.9 -o HostKeyAlias=forge.example"
    )


class Recording(http.server.BaseHTTPRequestHandler):
    """Records each request's Host header; answers 302 to `redirect`, else 404."""

    seen: list[str]
    redirect: str | None = None

    def do_GET(self) -> None:
        self.seen.append(f"{self.headers['Host']} {self.path}")
        if self.redirect:
            self.send_response(302)
            self.send_header("Location", self.redirect)
        else:
            self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[int, type[Recording]]]:
    handler = type("Handler", (Recording,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()
        server.server_close()


def ls_remote(url: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "ls-remote", url],
        env=git_env(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_git_is_held_to_the_checked_address_and_follows_no_redirect(
    recorder: tuple[int, type[Recording]], tmp_path: Path
) -> None:
    """A name no DNS knows (`git.test`) reaches our receiver on 127.0.0.1 only through the
    pin; a redirect it answers is not followed."""
    port, handler = recorder
    url = f"http://git.test:{port}/app.git"
    unpinned = ls_remote(url, {}, tmp_path)
    assert unpinned.returncode != 0
    assert handler.seen == []  # git resolved `git.test` itself, and found nothing
    pin = git_pin("http", Host(name="git.test"), port, ip("127.0.0.1"))
    pinned = ls_remote(url, pinned_environment({}, pin), tmp_path)
    assert pinned.returncode != 0  # a 404: no repository there
    assert handler.seen == [f"git.test:{port} /app.git/info/refs?service=git-upload-pack"]
    handler.seen.clear()
    handler.redirect = f"http://127.0.0.1:{port}/elsewhere"  # followed, it would come back
    redirected = ls_remote(url, pinned_environment({}, pin), tmp_path)
    assert redirected.returncode != 0
    assert handler.seen == [f"git.test:{port} /app.git/info/refs?service=git-upload-pack"]
