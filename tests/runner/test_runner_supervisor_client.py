"""The supervisor client: each reply of docs/design.md, Runner API, becomes the runner's own type
or error."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.runner.test_runner_fakes import error, json_response, make_lease, make_rig
from tests.runner.test_runner_steps import run_until, step_outcomes
from tether.clocks import LoopClock
from tether.runner.errors import (
    LeaseLost,
    LostBecause,
    SupervisorRefused,
    SupervisorUnreachable,
    TokenRejected,
)
from tether.runner.supervisor_client import ResultReport, SupervisorClient

REPORT = ResultReport(fence=1, payload_hash="h", output={"text": "x"}, usage={})


def client_answering(*answers: httpx.Response | Exception) -> SupervisorClient:
    queue = list(answers)

    def handle(request: httpx.Request) -> httpx.Response:
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return SupervisorClient(
        base_url="http://sup",
        token="t",
        clock=LoopClock(),
        transport=httpx.MockTransport(handle),
    )


async def test_a_claim_answers_leases_or_nothing() -> None:
    lease = make_lease("s1", fence=4, outputs=[{"step_id": "s0", "name": "a", "output": 1}])
    client = client_answering(json_response(200, {"leases": [lease]}), httpx.Response(204))
    (got,) = await client.claim("r", 2, 0)
    assert (got.step_id, got.fence, got.outputs[0].output) == ("s1", 4, 1)
    assert await client.claim("r", 2, 0) == []


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, content=b"not json"),
        json_response(200, {"nope": []}),
        json_response(200, {"leases": [{"step_id": "s1"}]}),
        json_response(200, {"leases": [dict(make_lease("s1"), fence="7")]}),
        json_response(200, {"leases": [dict(make_lease("s1"), renew_every_s=0)]}),
        error(400, "invalid_field", "wait_s too long"),
    ],
)
async def test_a_malformed_claim_answer_is_refused(answer: httpx.Response) -> None:
    with pytest.raises(SupervisorRefused):
        await client_answering(answer).claim("r", 1, 0)


@pytest.mark.parametrize(
    ("answer", "because"),
    [
        (error(409, "stale_fence"), LostBecause.STALE_FENCE),
        (error(409, "payload_drift"), LostBecause.PAYLOAD_DRIFT),
        (error(409, "terminal"), LostBecause.TERMINAL),
        (error(404, "not_found"), LostBecause.NOT_FOUND),
    ],
)
async def test_answers_saying_the_step_is_not_ours_are_lease_lost(
    answer: httpx.Response, because: LostBecause
) -> None:
    with pytest.raises(LeaseLost) as caught:
        await client_answering(answer).report("s1", REPORT)
    assert caught.value.because is because


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (error(401, "unauthorized"), TokenRejected),
        (error(403, "forbidden"), TokenRejected),
        (error(503, "unavailable"), SupervisorUnreachable),
        (httpx.ConnectError("refused"), SupervisorUnreachable),
        (error(413, "body_too_large"), SupervisorRefused),
        (
            json_response(200, {"ttl_s": 3, "renew_every_s": 0, "cancelled": False}),
            SupervisorRefused,
        ),
    ],
)
async def test_other_answers_map_to_what_the_runner_does(
    answer: httpx.Response | Exception, kind: type[Exception]
) -> None:
    with pytest.raises(kind):
        await client_answering(answer).renew("s1", 1)


async def test_a_result_the_supervisor_will_never_take_fails_the_step(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.supervisor.script("result", error(413, "body_too_large", "output too large"))
    rig.supervisor.offer(make_lease("s1"))
    await run_until(rig, lambda: step_outcomes(rig) == ["released: invalid"])
    body = rig.supervisor.of("release", "s1")[0].body
    assert (body["reason"], body["retryable"]) == ("invalid", False)
    assert "body_too_large" in body["detail"]
