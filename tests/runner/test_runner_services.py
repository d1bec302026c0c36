"""The supervisor's services for a step (runner/services.py) against the fake supervisor: the
artifact store's round trip and its refusals, checkpoints under the fence, and how a step
stops (SIGTERM, a spent budget) around a checkpoint that is on its way."""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from tenacity import stop_after_attempt, stop_never

from tests.conftest import ApiHarness
from tests.runner.test_runner_fakes import (
    TOKEN,
    FakeSupervisor,
    VirtualClock,
    completion,
    error,
    hang,
    json_response,
    make_lease,
    make_rig,
)
from tether.runner.errors import (
    ArtifactCorrupt,
    ArtifactRefused,
    LeaseLost,
    LostBecause,
    SupervisorRefused,
    SupervisorUnreachable,
)
from tether.runner.kinds.base import StepContext, StepOutput
from tether.runner.kinds.registry import KindRegistry
from tether.runner.lease import Lease
from tether.runner.services import CHUNK_BYTES, SupervisorServices, while_unreachable
from tether.runner.supervisor_client import SupervisorClient
from tether.wire import records as messages
from tether.wire.records import Checkpoint, CheckRun, LeaseRepository, ResumePoint

SHA_A = "a" * 40
SHA_B = "b" * 40


def held(lease: dict[str, Any]) -> Lease:
    return Lease.held(msgspec.convert(lease, messages.Lease), answered_at=0.0)


def services(
    sup: FakeSupervisor,
    lease: dict[str, Any] | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    **options: Any,
) -> SupervisorServices:
    """Services for `lease` (fence 7 by default), its step leased on `sup`."""
    lease = lease or make_lease("s1", fence=7)
    sup.fences[lease["step_id"]] = lease["fence"]
    sup.leases[lease["step_id"]] = lease
    clock = VirtualClock()
    client = SupervisorClient(
        base_url="http://supervisor.test",
        token=TOKEN,
        clock=clock,
        transport=transport or sup.transport,
    )
    return SupervisorServices(client, held(lease), clock=clock, **options)


def checkpoint(fence: int = 7, turn: int = 1) -> Checkpoint:
    return Checkpoint(
        fence=fence,
        turn=turn,
        transcript="c" * 64,
        usage={"total_tokens": 9},
        step_usage={"total_tokens": 9},
    )


# -- the artifact store ------------------------------------------------------------------------


async def test_uploads_of_bytes_and_of_a_file_download_back_to_the_same_bytes(
    tmp_path: Path,
) -> None:
    sup = FakeSupervisor()
    svc = services(sup)
    log = b"2 passed in 0.01s\n"
    bundle = tmp_path / "work.bundle"
    bundle.write_bytes(bytes(range(256)) * 1000)

    log_digest = await svc.upload(log)
    bundle_digest = await svc.upload(bundle)

    assert log_digest == hashlib.sha256(log).hexdigest()
    assert bundle_digest == hashlib.sha256(bundle.read_bytes()).hexdigest()
    assert sup.artifacts == {log_digest: log, bundle_digest: bundle.read_bytes()}
    puts = sup.of("artifact")
    assert [c.headers["authorization"] for c in puts] == [f"Bearer {TOKEN}"] * 2
    assert puts[1].headers["content-length"] == str(256 * 1000)
    assert puts[1].headers["content-type"] == "application/octet-stream"

    into = tmp_path / "cache" / "start.bundle"
    into.parent.mkdir()
    await svc.download(bundle_digest, into)
    assert into.read_bytes() == bundle.read_bytes()
    left = [p.name async for p in anyio.Path(into.parent).iterdir()]
    assert left == ["start.bundle"]  # no partial file


async def test_a_download_whose_bytes_do_not_match_the_digest_writes_nothing(
    tmp_path: Path,
) -> None:
    sup = FakeSupervisor()
    svc = services(sup)
    digest = await svc.upload(b"the real bundle")
    sup.artifacts[digest] = b"a tampered bundle"
    into = tmp_path / "start.bundle"
    into.write_bytes(b"what was here before")

    with pytest.raises(ArtifactCorrupt, match=digest):
        await svc.download(digest, into)

    assert into.read_bytes() == b"what was here before"
    assert [p.name async for p in anyio.Path(tmp_path).iterdir()] == ["start.bundle"]


async def test_refusals_of_the_store_are_artifact_refused_naming_the_digest(
    tmp_path: Path,
) -> None:
    sup = FakeSupervisor()
    svc = services(sup)
    sup.script("artifact", error(413, "body_too_large", "the artifact exceeds 10 bytes"))
    with pytest.raises(ArtifactRefused) as too_large:
        await svc.upload(b"more than ten bytes")
    assert (too_large.value.status, too_large.value.code) == (413, "body_too_large")
    assert "exceeds 10 bytes" in too_large.value.detail
    assert too_large.value.retryable is False

    unknown = "d" * 64
    with pytest.raises(ArtifactRefused, match=f"artifact {unknown}") as missing:
        await svc.download(unknown, tmp_path / "x")
    assert missing.value.code == "not_found"
    assert [p async for p in anyio.Path(tmp_path).iterdir()] == []


async def test_transfers_are_retried_while_the_supervisor_gives_no_answer_then_given_up(
    tmp_path: Path,
) -> None:
    sup = FakeSupervisor()
    svc = services(sup, transfer_retry_s=30.0)
    request = httpx.Request("PUT", "http://supervisor.test/")
    sup.script(
        "artifact",
        error(503, "unavailable", "the store is busy"),
        httpx.ReadError("", request=request),
    )
    digest = await svc.upload(b"bytes")
    assert sup.artifacts == {digest: b"bytes"}
    assert len(sup.of("artifact")) == 3

    sup.down = True
    with pytest.raises(SupervisorUnreachable, match="connection refused"):
        await svc.download(digest, tmp_path / "x")
    clock = svc._clock
    assert isinstance(clock, VirtualClock)
    assert 30.0 <= sum(clock.sleeps) < 40.0  # the bound, and not much beyond it


class StreamingStore(httpx.AsyncBaseTransport):
    """An artifact store that reads an upload piece by piece as it arrives, as a server does
    (`httpx.MockTransport` would read the whole body first)."""

    def __init__(self) -> None:
        self.pieces: list[int] = []
        self.headers: httpx.Headers | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.headers = request.headers
        hashed = hashlib.sha256()
        assert isinstance(request.stream, httpx.AsyncByteStream)
        async for piece in request.stream:
            hashed.update(piece)
            self.pieces.append(len(piece))
        digest = request.url.path.rsplit("/", 1)[1]
        assert hashed.hexdigest() == digest
        size = sum(self.pieces)
        return json_response(200, {"digest": digest, "size": size, "created": True})


async def test_a_large_file_is_hashed_and_sent_in_chunks_never_held_whole(
    tmp_path: Path,
) -> None:
    big = tmp_path / "big.bundle"
    with big.open("wb") as f:
        for n in range(256):  # 16 MiB
            f.write(bytes([n]) * 65536)
    store = StreamingStore()
    svc = services(FakeSupervisor(), transport=store)

    tracemalloc.start()
    try:
        digest = await svc.upload(big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert digest == hashlib.sha256(big.read_bytes()).hexdigest()
    assert sum(store.pieces) == 16 * 2**20
    assert max(store.pieces) <= CHUNK_BYTES
    assert store.headers is not None
    assert store.headers["content-length"] == str(16 * 2**20)
    assert peak < 2 * 2**20, f"the upload held {peak} bytes at once"


# -- checkpoints -------------------------------------------------------------------------------


async def test_a_checkpoint_is_put_under_the_step_and_its_fence() -> None:
    sup = FakeSupervisor()
    svc = services(sup)
    await svc.checkpoint(checkpoint(turn=2))
    (call,) = sup.of("checkpoint", "s1")
    assert call.path == "/v1/steps/s1/checkpoint"
    assert call.headers["authorization"] == f"Bearer {TOKEN}"
    assert sup.checkpoints["s1"] == [
        {
            "fence": 7,
            "turn": 2,
            "transcript": "c" * 64,
            "bundle": None,
            "sha": None,
            "usage": {"total_tokens": 9},
            "step_usage": {"total_tokens": 9},
        },
    ]
    assert svc.checkpoints == 1


async def test_a_stale_checkpoint_is_lease_lost_and_other_refusals_are_refused() -> None:
    sup = FakeSupervisor()
    svc = services(sup)
    sup.fences["s1"] = 8  # another attempt holds the step now
    with pytest.raises(LeaseLost) as lost:
        await svc.checkpoint(checkpoint())
    assert lost.value.because is LostBecause.STALE_FENCE

    sup.fences["s1"] = 7
    sup.script("checkpoint", error(409, "terminal", "the task was cancelled"))
    with pytest.raises(LeaseLost) as ended:
        await svc.checkpoint(checkpoint())
    assert ended.value.because is LostBecause.TERMINAL

    sup.script("checkpoint", error(422, "invalid_field", "turn 1 goes back from turn 3"))
    with pytest.raises(SupervisorRefused, match="goes back"):
        await svc.checkpoint(checkpoint())
    assert svc.checkpoints == 0
    assert sup.checkpoints == {}

    with pytest.raises(ValueError, match="fence 6"):
        await svc.checkpoint(checkpoint(fence=6))
    assert len(sup.of("checkpoint")) == 3  # the one under a wrong fence was never sent


async def test_a_checkpoint_on_its_way_is_finished_though_the_step_is_cancelled() -> None:
    sup = FakeSupervisor()
    svc = services(sup)
    gate = anyio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        await gate.wait()
        return json_response(200, {"turn": 1})

    sup.script("checkpoint", slow)
    step = anyio.CancelScope()

    async def run_step() -> None:
        with step:
            await svc.checkpoint(checkpoint())

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_step)
        await sup.until(lambda: bool(sup.of("checkpoint")))
        step.cancel()
        await anyio.sleep(0.05)
        assert svc.checkpoints == 0  # still waiting for its answer, cancelled or not
        gate.set()
    assert step.cancel_called
    assert svc.checkpoints == 1


async def test_a_checkpoint_that_gets_no_answer_is_given_up_after_its_bound() -> None:
    sup = FakeSupervisor()
    svc = services(sup, checkpoint_finish_s=0.2)
    sup.script("checkpoint", hang)
    with anyio.fail_after(2.0), pytest.raises(SupervisorUnreachable, match=r"within 0\.2s"):
        await svc.checkpoint(checkpoint())
    assert svc.checkpoints == 0


# -- the step around them ----------------------------------------------------------------------


async def test_the_context_carries_what_the_lease_bound_and_the_result_its_bundle_and_checks(
    tmp_path: Path,
) -> None:
    seen: list[StepContext] = []

    async def repo_work(ctx: StepContext) -> StepOutput:
        seen.append(ctx)
        assert ctx.services is not None
        log = await ctx.services.upload(b"1 passed\n")
        bundle = await ctx.services.upload(b"a bundle")
        check = CheckRun(log=log, exit_code=0, duration_s=1.5)
        return StepOutput(
            output={"done": True},
            usage={"total_tokens": 4},
            candidate_sha=SHA_B,
            bundle=bundle,
            checks={"tests": check},
        )

    rig = make_rig(tmp_path, kinds=KindRegistry([("repo-work", repo_work)]))
    sup = rig.supervisor
    repository = {
        "name": "app",
        "url": "/srv/git/app.git",
        "base_sha": SHA_A,
        "start_sha": SHA_A,
        "start_bundle": None,
        "allowed_paths": ["src/"],
        "checks": [{"name": "tests", "command": "python -m pytest -q"}],
    }
    resume = {"turn": 2, "fence": 40, "transcript": "e" * 64, "usage": {"total_tokens": 7}}
    sup.offer(make_lease("s1", kind="repo-work", fence=41, repository=repository, resume=resume))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await sup.until(lambda: bool(sup.of("result", "s1")))
        rig.runner.request_shutdown()

    (ctx,) = seen
    assert ctx.fence == 41
    assert ctx.repository == msgspec.convert(repository, LeaseRepository)
    assert ctx.resume == msgspec.convert(resume, ResumePoint)
    (result,) = sup.of("result", "s1")
    log_digest = hashlib.sha256(b"1 passed\n").hexdigest()
    assert result.body["candidate_sha"] == SHA_B
    assert result.body["bundle"] == hashlib.sha256(b"a bundle").hexdigest()
    assert result.body["checks"] == {
        "tests": {"log": log_digest, "exit_code": 0, "duration_s": 1.5}
    }
    assert set(sup.artifacts) == {log_digest, result.body["bundle"]}


class SlowCheckpointer:
    """An `agent` kind that makes one model call, checkpoints the turn (the supervisor holds
    its answer until the test opens `gate`), then waits for a next turn that never comes."""

    def __init__(self) -> None:
        self.gate = anyio.Event()
        self.answered_at: float | None = None
        self.cancelled = False

    async def answer(self, request: httpx.Request) -> httpx.Response:
        await self.gate.wait()
        self.answered_at = anyio.current_time()
        return json_response(200, {"turn": json.loads(request.content)["turn"]})

    async def __call__(self, ctx: StepContext) -> StepOutput:
        assert ctx.services is not None
        completion = await ctx.chat({"model": "m", "messages": []})
        await ctx.services.checkpoint(
            Checkpoint(
                fence=ctx.fence,
                turn=1,
                transcript="f" * 64,
                usage=completion.usage,
                step_usage=completion.usage,
            )
        )
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


async def test_sigterm_releases_an_agent_step_at_once_after_its_checkpoint_on_the_way(
    tmp_path: Path,
) -> None:
    """No grace period for a step that checkpoints: it is cancelled at once, its checkpoint on
    the way is finished, and only then is it released uncounted with the attempt's usage."""
    agent = SlowCheckpointer()
    rig = make_rig(tmp_path, kinds=KindRegistry([("agent", agent)]), shutdown_grace_s=60.0)
    sup = rig.supervisor
    sup.script("checkpoint", agent.answer)
    sup.offer(make_lease("s1", kind="agent", fence=41))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await sup.until(lambda: bool(sup.of("checkpoint", "s1")))
        rig.runner.request_shutdown()
        await anyio.sleep(0.1)
        assert sup.of("release") == []  # not while the checkpoint is on its way
        agent.gate.set()
        with anyio.fail_after(5.0):  # far less than the 60 s grace
            await sup.until(lambda: bool(sup.of("release", "s1")))

    assert rig.exit_code == 0
    assert agent.cancelled
    (release,) = sup.of("release", "s1")
    assert agent.answered_at is not None
    assert release.at >= agent.answered_at
    assert release.body["reason"] == "shutdown"
    assert release.body["retryable"] is True
    assert release.body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert [s.outcome for s in rig.runner.recent_steps] == ["released: shutdown"]


async def test_sigterm_cancels_the_agent_step_at_once_and_lets_a_chat_step_finish(
    tmp_path: Path,
) -> None:
    agent = SlowCheckpointer()
    agent.gate.set()
    kinds = KindRegistry.default(entry_points=False)
    kinds.register("agent", agent)
    rig = make_rig(tmp_path, kinds=kinds, shutdown_grace_s=60.0)
    sup, model = rig.supervisor, rig.model
    chat_gate = anyio.Event()

    async def slow_chat(request: httpx.Request) -> httpx.Response:
        await chat_gate.wait()
        return completion("done")

    model.script(slow_chat)  # the chat step's call; the agent's gets the default answer
    sup.offer(make_lease("chat-1", task_id="t1"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await model.until(lambda: len(model.requests) == 1)
        sup.offer(make_lease("agent-1", task_id="t2", kind="agent"))
        await sup.until(lambda: bool(sup.checkpoints["agent-1"]))
        rig.runner.request_shutdown()
        await sup.until(lambda: bool(sup.of("release", "agent-1")))
        assert sup.of("result", "chat-1") == []  # the chat step is still at work, in its grace
        chat_gate.set()
        await sup.until(lambda: bool(sup.of("result", "chat-1")))

    assert rig.exit_code == 0
    assert sup.of("release", "chat-1") == []
    assert sup.of("release", "agent-1")[0].body["reason"] == "shutdown"


async def test_a_spent_budget_releases_uncounted_after_the_checkpoint_on_the_way(
    tmp_path: Path,
) -> None:
    agent = SlowCheckpointer()
    rig = make_rig(tmp_path, kinds=KindRegistry([("agent", agent)]))
    sup = rig.supervisor
    sup.requeue_released = False
    sup.script("checkpoint", agent.answer)
    sup.offer(make_lease("s1", kind="agent", fence=41, renew_every_s=0.02))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await sup.until(lambda: bool(sup.of("checkpoint", "s1")))
        sup.budget_exhausted = True
        renews = len(sup.of("renew", "s1"))
        await sup.until(lambda: len(sup.of("renew", "s1")) > renews)
        await anyio.sleep(0.05)
        assert sup.of("release") == []
        agent.gate.set()
        await sup.until(lambda: bool(sup.of("release", "s1")))
        rig.runner.request_shutdown()

    (release,) = sup.of("release", "s1")
    assert agent.answered_at is not None
    assert release.at >= agent.answered_at
    assert (release.body["reason"], release.body["retryable"]) == ("operator", True)
    assert release.body["usage"]["total_tokens"] == 5
    assert agent.cancelled


async def test_a_checkpoint_refused_as_stale_drops_the_step_without_a_word_more(
    tmp_path: Path,
) -> None:
    agent = SlowCheckpointer()
    rig = make_rig(tmp_path, kinds=KindRegistry([("agent", agent)]))
    sup = rig.supervisor
    sup.script("checkpoint", error(409, "stale_fence", "not the current fence"))
    sup.offer(make_lease("s1", kind="agent", fence=41))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.runner.wait_until(
            lambda: bool(rig.runner.recent_steps) and not rig.runner.in_flight
        )
        rig.runner.request_shutdown()

    assert [s.outcome for s in rig.runner.recent_steps] == ["dropped: stale_fence"]
    assert sup.of("release") == []
    assert sup.of("result") == []


# -- against a real supervisor app -------------------------------------------------------------


def real_services(api: ApiHarness, lease: dict[str, Any]) -> SupervisorServices:
    """Services for `lease` over the app's own routes, with the runner's token."""
    client = SupervisorClient(
        base_url="http://supervisor.test",
        token=api.secrets["runner"],
        clock=VirtualClock(),
        transport=httpx.ASGITransport(app=api.app),
    )
    return SupervisorServices(client, held(lease), clock=VirtualClock())


async def test_the_real_store_takes_an_upload_and_gives_it_back_checked(
    api: ApiHarness, tmp_path: Path
) -> None:
    await api.queued()
    (lease,) = await api.claim()
    svc = real_services(api, lease)
    bundle = tmp_path / "work.bundle"
    bundle.write_bytes(b"# v2 git bundle\n" + bytes(range(256)) * 300)

    digest = await svc.upload(bundle)
    into = tmp_path / "copy.bundle"
    await svc.download(digest, into)

    assert digest == hashlib.sha256(bundle.read_bytes()).hexdigest()
    assert into.read_bytes() == bundle.read_bytes()
    with pytest.raises(ArtifactRefused) as unknown:
        await svc.download("0" * 64, tmp_path / "nothing")
    assert (unknown.value.status, unknown.value.code) == (404, "not_found")


async def test_the_real_supervisor_takes_a_checkpoint_and_refuses_a_stale_one(
    api: ApiHarness,
) -> None:
    await api.queued()
    (lease,) = await api.claim()
    svc = real_services(api, lease)
    transcript = await svc.upload(b'[{"role": "user", "content": "fix the test"}]')
    turn = Checkpoint(fence=lease["fence"], turn=1, transcript=transcript)
    await svc.checkpoint(turn)
    assert svc.checkpoints == 1

    api.clock.advance(31)  # past the TTL: the lease lapsed, its fence is stale
    with pytest.raises(LeaseLost) as lost:
        await svc.checkpoint(Checkpoint(fence=lease["fence"], turn=2, transcript=transcript))
    assert lost.value.because is LostBecause.STALE_FENCE
    guessed = real_services(api, dict(lease, fence=lease["fence"] - 1))
    with pytest.raises(LeaseLost) as lost:  # a fence the step never had: no such lease
        await guessed.checkpoint(
            Checkpoint(fence=lease["fence"] - 1, turn=2, transcript=transcript)
        )
    assert lost.value.because is LostBecause.NOT_FOUND


async def test_a_kind_that_reports_no_usage_is_charged_what_its_model_calls_spent(
    tmp_path: Path,
) -> None:
    async def quiet(ctx: StepContext) -> StepOutput:
        await ctx.chat({"model": "m", "messages": []})
        await ctx.chat({"model": "m", "messages": []})
        return StepOutput(output="done")

    rig = make_rig(tmp_path, kinds=KindRegistry([("quiet", quiet)]))
    sup = rig.supervisor
    sup.offer(make_lease("s1", kind="quiet"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await sup.until(lambda: bool(sup.of("result", "s1")))
        rig.runner.request_shutdown()
    (result,) = sup.of("result", "s1")
    assert result.body["usage"] == {"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10}


async def test_a_call_unanswered_is_asked_again_after_a_wait_and_a_stop_ends_it() -> None:
    clock = VirtualClock()
    calls: list[float] = []
    answers: list[str | None] = [None, None, "yes"]

    async def call() -> str:
        calls.append(clock.now())
        answer = answers.pop(0)
        if answer is None:
            raise SupervisorUnreachable("no answer")
        return answer

    got = await while_unreachable(call, clock=clock, stop=stop_never, max_wait_s=5.0)
    assert got == "yes"
    assert len(calls) == 3
    assert len(clock.sleeps) == 2  # a wait before each try again, none before the first
    assert calls[1] - calls[0] == pytest.approx(clock.sleeps[0])

    tries: list[float] = []

    async def never() -> str:
        tries.append(clock.now())
        raise SupervisorUnreachable("no answer")

    with pytest.raises(SupervisorUnreachable):
        await while_unreachable(never, clock=clock, stop=stop_after_attempt(2), max_wait_s=5.0)
    assert len(tries) == 2
