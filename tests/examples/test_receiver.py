"""The local receiver (examples/receiver.py): each Idempotency-Key applied once, duplicates
answered with the first answer and `Idempotent-Replayed: true`, its counts surviving a restart."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

from examples.processes import child_environment, free_port
from examples.receiver import create_app


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://receiver")


async def counts(client: httpx.AsyncClient) -> dict[str, Any]:
    answer = await client.get("/counts")
    assert answer.status_code == 200
    result: dict[str, Any] = answer.json()
    return result


async def test_a_key_is_applied_once_and_its_duplicate_replays_the_first_answer(
    tmp_path: Path,
) -> None:
    async with client_for(create_app(tmp_path / "r.db")) as client:
        first = await client.post("/deploy", json={"v": 1}, headers={"Idempotency-Key": "k1"})
        again = await client.post("/deploy", json={"v": 1}, headers={"Idempotency-Key": "k1"})
        other = await client.post("/deploy", json={"v": 2}, headers={"Idempotency-Key": "k2"})
        assert first.status_code == 201
        assert "Idempotent-Replayed" not in first.headers
        assert (again.status_code, again.json()) == (201, first.json())
        assert again.headers["Idempotent-Replayed"] == "true"
        assert other.json()["applied"] == 2
        assert await counts(client) == {
            "requests": 3,
            "applied": 2,
            "replayed": 1,
            "unkeyed": 0,
            "failed": 0,
            "by_key": {"k1": 2, "k2": 1},
        }


async def test_a_delivery_without_a_key_is_applied_every_time(tmp_path: Path) -> None:
    async with client_for(create_app(tmp_path / "r.db")) as client:
        for _ in range(2):
            assert (await client.post("/hook", json={})).status_code == 201
        seen = await counts(client)
        assert (seen["applied"], seen["unkeyed"], seen["replayed"]) == (2, 2, 0)


async def test_the_state_survives_a_restart_of_the_receiver(tmp_path: Path) -> None:
    async with client_for(create_app(tmp_path / "r.db")) as client:
        await client.post("/deploy", json={}, headers={"Idempotency-Key": "k1"})
    async with client_for(create_app(tmp_path / "r.db")) as client:
        again = await client.post("/deploy", json={}, headers={"Idempotency-Key": "k1"})
        assert again.headers.get("Idempotent-Replayed") == "true"
        assert (await counts(client))["applied"] == 1


async def test_concurrent_deliveries_of_one_key_apply_it_once(tmp_path: Path) -> None:
    answers: list[httpx.Response] = []
    async with client_for(create_app(tmp_path / "r.db")) as client:

        async def send() -> None:
            answers.append(
                await client.post("/deploy", json={}, headers={"Idempotency-Key": "same"})
            )

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(send)
        seen = await counts(client)
    assert (seen["applied"], seen["replayed"], seen["requests"]) == (1, 7, 8)
    assert sum(a.headers.get("Idempotent-Replayed") == "true" for a in answers) == 7


async def test_fail_first_answers_503_without_applying(tmp_path: Path) -> None:
    async with client_for(create_app(tmp_path / "r.db", fail_first=2)) as client:
        statuses = [
            (await client.post("/d", json={}, headers={"Idempotency-Key": "k"})).status_code
            for _ in range(3)
        ]
        assert statuses == [503, 503, 201]
        seen = await counts(client)
        assert (seen["applied"], seen["failed"]) == (1, 2)


def test_the_receiver_runs_as_a_process(tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "examples.receiver", "--port", str(port)]
    command += ["--state", str(tmp_path / "r.db")]
    with (tmp_path / "receiver.log").open("wb") as log:
        process = subprocess.Popen(
            command, env=child_environment(), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        url = f"http://127.0.0.1:{port}"
        give_up = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"{url}/counts", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < give_up, "the receiver never answered"
                time.sleep(0.1)
        sent = httpx.post(f"{url}/x", json={}, headers={"Idempotency-Key": "k"}, timeout=5)
        assert sent.status_code == 201
        assert httpx.get(f"{url}/counts", timeout=5).json()["applied"] == 1
    finally:
        process.terminate()
        process.wait(timeout=10)
