"""What the supervisor does for one step beyond its lease
(`tether.runner.kinds.base.StepServices`): the artifact store and the step's checkpoints, over
the runner's one `SupervisorClient` and bound to the lease's step and fence (docs/design.md,
Artifacts; issue 12, item 7).

Files are hashed in a worker thread and sent in chunks of `CHUNK_BYTES`, and downloads are
written as they arrive, so a step never holds a bundle or a log in memory: the runner keeps
within 64 MB with ten agent steps in flight. A supervisor that gives no answer (no reply, a
5xx, 408, 429) is asked again with the step's usual jittered backoff, for a bounded time.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_random_exponential

from tether.clocks import MonotonicClock
from tether.runner.errors import (
    ArtifactCorrupt,
    ArtifactRefused,
    SupervisorRefused,
    SupervisorUnreachable,
    TransientFailure,
)
from tether.runner.lease import Lease
from tether.runner.retry_after import first_then_retrying
from tether.runner.supervisor_client import SupervisorClient
from tether.wire.records import Checkpoint, Checkpointed

T = TypeVar("T")

CHUNK_BYTES = 64 * 1024
# How long an upload or a download is tried again while the supervisor gives no answer. The
# lease's keeper still cancels it sooner if the lease is lost.
TRANSFER_RETRY_S = 60.0
# How long a checkpoint, once started, is tried and shielded from the step's cancellation: it
# holds up a shutdown or budget release by at most this much, and with SHUTDOWN_RELEASE_S
# (5 s) an agent step's stop stays well inside the runner unit's TimeoutStopSec (30 s).
CHECKPOINT_FINISH_S = 10.0
# Stored artifacts' status codes that are the store's answer about the artifact itself, not
# a runner bug: too large, a digest the bytes do not match, no such digest for this pool.
_ARTIFACT_REFUSALS = (404, 413, 422)


async def while_unreachable(
    call: Callable[[], Awaitable[T]],
    *,
    clock: MonotonicClock,
    stop: Callable[[RetryCallState], bool],
    max_wait_s: float,
) -> T:
    """`call()`, asked again with jittered exponential backoff (at most `max_wait_s` apart)
    while it raises `SupervisorUnreachable`, until `stop` says so; then that error. The one
    retry rule of a step's calls to the supervisor (results, releases, artifacts,
    checkpoints). The first try is made before tenacity's loop is built
    (`first_then_retrying`)."""
    return await first_then_retrying(
        call,
        SupervisorUnreachable,
        lambda: AsyncRetrying(
            retry=retry_if_exception_type(SupervisorUnreachable),
            wait=wait_random_exponential(multiplier=0.2, max=max_wait_s),
            stop=stop,
            sleep=clock.sleep,
            reraise=True,
        ),
    )


def file_digest(path: Path) -> tuple[str, int]:
    """The sha256 and size of the file at `path`, read in chunks (run it in a thread)."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


async def file_chunks(path: Path, size: int) -> AsyncIterator[bytes]:
    """The first `size` bytes of the file at `path`, in chunks of at most `CHUNK_BYTES`.

    `TransientFailure` when the file got shorter since it was hashed (a file that changed while
    it was sent; one that grew sends the bytes that were hashed).
    """
    sent = 0
    async with await anyio.open_file(path, "rb") as f:
        while sent < size:
            chunk = await f.read(min(CHUNK_BYTES, size - sent))
            if not chunk:
                raise TransientFailure(f"{path} shrank while it was uploaded")
            sent += len(chunk)
            yield chunk


def _artifact_refused(exc: SupervisorRefused, digest: str) -> ArtifactRefused | SupervisorRefused:
    if exc.status in _ARTIFACT_REFUSALS:
        return ArtifactRefused(exc.status, exc.code, f"artifact {digest}: {exc.detail}")
    return exc


class SupervisorServices:
    """`StepServices` for one leased attempt: its step id and fence are bound here."""

    def __init__(
        self,
        client: SupervisorClient,
        lease: Lease,
        *,
        clock: MonotonicClock,
        transfer_retry_s: float = TRANSFER_RETRY_S,
        checkpoint_finish_s: float = CHECKPOINT_FINISH_S,
    ) -> None:
        self._client = client
        self._lease = lease
        self._clock = clock
        self._transfer_retry_s = transfer_retry_s
        self._checkpoint_finish_s = checkpoint_finish_s
        self.checkpoints = 0  # accepted by the supervisor

    async def _retried(self, call: Callable[[], Awaitable[T]], within_s: float) -> T:
        """`call()`, asked again while the supervisor gives no answer, until `within_s` has
        passed; then its last `SupervisorUnreachable`."""
        give_up_at = self._clock.now() + within_s

        def out_of_time(_state: RetryCallState) -> bool:
            return self._clock.now() >= give_up_at

        return await while_unreachable(call, clock=self._clock, stop=out_of_time, max_wait_s=5.0)

    @property
    def _for_lease(self) -> tuple[str, int]:
        return self._lease.step_id, self._lease.fence

    async def upload(self, data: bytes | Path) -> str:
        """Store `data` (bytes, or the contents of the file at that path) for this attempt's
        lease, and return its sha256. `ArtifactRefused` when the store refuses it (413: larger
        than its `artifact_max_bytes`, or past the pool's `artifact_quota_bytes`; 422: the
        bytes changed on the way); `LeaseLost` when the lease is no longer this attempt's."""
        if isinstance(data, bytes):
            digest = hashlib.sha256(data).hexdigest()

            async def send() -> object:
                return await self._client.put_artifact(
                    digest, data, size=len(data), lease=self._for_lease
                )

        else:
            path = Path(data)
            digest, size = await anyio.to_thread.run_sync(file_digest, path)

            async def send() -> object:
                return await self._client.put_artifact(
                    digest, file_chunks(path, size), size=size, lease=self._for_lease
                )

        try:
            await self._retried(send, self._transfer_retry_s)
        except SupervisorRefused as exc:
            raise _artifact_refused(exc, digest) from None
        return digest

    async def download(self, digest: str, into: Path) -> None:
        """Write artifact `digest` to `into`: streamed to a temporary file beside it, renamed
        into place only once its sha256 is `digest`. `ArtifactCorrupt` (and nothing written)
        when it is not; `ArtifactRefused` when the store has no such digest for this pool."""
        try:
            await self._retried(lambda: self._download_once(digest, into), self._transfer_retry_s)
        except SupervisorRefused as exc:
            raise _artifact_refused(exc, digest) from None

    async def _download_once(self, digest: str, into: Path) -> None:
        partial = into.with_name(f".{into.name}.{os.getpid()}.{self._lease.fence}.part")
        hashed = hashlib.sha256()
        try:
            async with (
                self._client.artifact(digest) as chunks,
                await anyio.open_file(partial, "wb") as f,
            ):
                async for chunk in chunks:
                    hashed.update(chunk)
                    await f.write(chunk)
            if hashed.hexdigest() != digest:
                raise ArtifactCorrupt(
                    f"artifact {digest}: the bytes received hash to {hashed.hexdigest()}"
                )
            await anyio.Path(partial).rename(into)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.Path(partial).unlink(missing_ok=True)

    async def checkpoint(self, checkpoint: Checkpoint) -> None:
        """Record `checkpoint` for this attempt (its `fence` must be the lease's).

        Once started it is finished even if the step is cancelled meanwhile (a shutdown, a
        spent budget): shielded, and tried for at most `CHECKPOINT_FINISH_S` while the
        supervisor gives no answer, so the release that follows carries a recorded turn.
        `LeaseLost` when the supervisor says the step is no longer this attempt's;
        `SupervisorRefused` for another refusal; `SupervisorUnreachable` when no answer came
        in time.
        """
        if checkpoint.fence != self._lease.fence:
            raise ValueError(
                f"checkpoint under fence {checkpoint.fence}, but this attempt holds"
                f" {self._lease.fence}"
            )
        step_id = self._lease.step_id

        async def send() -> Checkpointed:
            return await self._client.checkpoint(step_id, checkpoint)

        with anyio.CancelScope(shield=True) as shield:
            # The hard bound: a request hanging on its timeout counts too.
            shield.deadline = anyio.current_time() + self._checkpoint_finish_s
            await self._retried(send, self._checkpoint_finish_s)
        if shield.cancelled_caught:
            raise SupervisorUnreachable(
                f"checkpoint of step {step_id} got no answer within {self._checkpoint_finish_s:g}s"
            )
        self.checkpoints += 1
