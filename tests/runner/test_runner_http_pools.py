"""The runner's sharded connection pools: requests spread over small pools, and httpx's own
transport whenever the environment names a proxy."""

from __future__ import annotations

import httpx
import pytest

from tether.runner.http import CONNECTIONS_PER_POOL, ShardedPools, make_client, pooled_transport


async def test_requests_go_round_robin_over_the_pools() -> None:
    seen: list[int] = []

    def pool(number: int) -> httpx.MockTransport:
        def answer(request: httpx.Request) -> httpx.Response:
            seen.append(number)
            return httpx.Response(200, json={"pool": number})

        return httpx.MockTransport(answer)

    numbers = iter(range(3))
    transport = ShardedPools(3, make_pool=lambda: pool(next(numbers)))
    async with make_client(transport=transport, base_url="http://supervisor.test") as client:
        for _ in range(6):
            assert (await client.get("/healthz")).status_code == 200
    assert seen == [0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "http_proxy", "ALL_PROXY"])
def test_a_proxy_in_the_environment_keeps_httpx_own_transport(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    assert isinstance(pooled_transport(16), ShardedPools)
    monkeypatch.setenv(variable, "http://proxy.invalid:3128")
    assert pooled_transport(16) is None


def test_pools_hold_a_few_connections_each(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    for concurrency, pools in [(1, 1), (CONNECTIONS_PER_POOL, 1), (17, 9), (100, 50)]:
        transport = pooled_transport(concurrency)
        assert isinstance(transport, ShardedPools)
        assert len(transport._pools) == pools


async def test_an_answers_cookies_are_neither_read_nor_kept_nor_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_urllib_request(*_args: object) -> None:
        raise AssertionError("httpx built a urllib request to read cookies")

    monkeypatch.setattr(httpx.Cookies, "_CookieCompatRequest", no_urllib_request)
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, headers={"Set-Cookie": "session=abc; Path=/"})

    transport = httpx.MockTransport(answer)
    async with make_client(transport=transport, base_url="http://supervisor.test") as client:
        await client.get("/a")
        await client.get("/b")
        assert not client.cookies
        with pytest.raises(TypeError):
            client.cookies = {"session": "abc"}
    assert all("cookie" not in r.headers for r in sent)
