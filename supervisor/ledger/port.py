"""The ledger's port: what the HTTP API, the CLI and the benchmarks may ask of a ledger.

`store.LedgerStore` implements it over either storage (`backends`: SQLite, PostgreSQL);
`SqliteLedger` is that store over a file. Adapters type against `Ledger`, never against a
store class.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from tether.supervisor.ledger.artifacts import ArtifactOwner
from tether.supervisor.ledger.artifacts import Forgotten as ForgottenArtifacts
from tether.supervisor.ledger.artifacts import Upload as ArtifactUpload
from tether.supervisor.ledger.counts import LedgerCounts
from tether.supervisor.ledger.identity import Created, TaskSpec
from tether.supervisor.ledger.outbox import Answer, Outgoing
from tether.supervisor.ledger.repositories import Binding, Candidate
from tether.supervisor.ledger.tokens import NewToken, Principal
from tether.supervisor.ledger.verification import Evidence
from tether.supervisor.ledger.views import RunnerRow, TaskSearch
from tether.wire import Outcome, ReleaseReason
from tether.wire.answers import ReviewRecord
from tether.wire.records import (
    Budget,
    Checkpoint,
    Checkpointed,
    Event,
    Lease,
    LogLine,
    LogLinesKept,
    PoolStatus,
    Renewal,
    Report,
    TaskDetail,
    TaskLogs,
    TaskPage,
)


class Ledger(Protocol):
    counters: LedgerCounts

    @property
    def is_open(self) -> bool: ...

    async def create_task(self, spec: TaskSpec) -> Created: ...
    async def approve(
        self,
        tenant: str,
        task_id: str,
        plan_hash: str,
        base_sha: str | None,
        observed_head: str | None = None,
    ) -> None: ...
    async def binding_of_task(self, tenant: str, task_id: str) -> Binding | None: ...
    async def binding_of_step(self, step_id: str, pool: str | None) -> Binding | None: ...
    async def binding_of_lease(
        self, step_id: str, fence: int, token_id: str | None, pool: str | None
    ) -> Binding | None: ...
    async def committed_candidates(self, url: str) -> list[Candidate]: ...
    async def cancel(self, tenant: str, task_id: str, reason: str) -> None: ...
    async def set_repository_head(self, tenant: str, repository: str, sha: str) -> None: ...
    async def record_review(self, tenant: str, task_id: str, decision: str, note: str) -> None: ...
    async def set_budget(self, tenant: str, tokens_: int | None) -> None: ...
    async def set_verify_pool(self, tenant: str, pool: str | None) -> None: ...
    async def claim(
        self,
        runner_id: str,
        pool: str,
        capacity: int,
        wait_s: float,
        *,
        token_id: str | None = None,
        kinds: Collection[str] = ("chat",),
    ) -> list[Lease]: ...
    async def claim_after(
        self,
        reported: Sequence[tuple[str, int]],
        runner_id: str,
        pool: str,
        want: int,
        *,
        token_id: str | None = None,
        kinds: Collection[str] = ("chat",),
    ) -> list[Lease]: ...
    async def renew(
        self, step_id: str, fence: int, pool: str | None = None, *, token_id: str | None = None
    ) -> Renewal: ...
    async def release(
        self,
        step_id: str,
        fence: int,
        reason: ReleaseReason,
        retryable: bool,
        detail: str,
        pool: str | None = None,
        usage: Mapping[str, int] | None = None,
        *,
        token_id: str | None = None,
    ) -> None: ...
    async def report(
        self,
        rep: Report,
        pool: str | None = None,
        evidence: Evidence | None = None,
        *,
        token_id: str | None = None,
    ) -> Outcome: ...
    async def checkpoint(
        self, step_id: str, cp: Checkpoint, pool: str | None = None, *, token_id: str | None = None
    ) -> Checkpointed: ...
    async def keep_log_lines(
        self, lines: Sequence[LogLine], pool: str, token_id: str
    ) -> LogLinesKept: ...
    async def expire(self) -> int: ...
    # -- effects: the dispatcher's side (docs/design.md, Effects) --
    async def take_effects(self, holder: str, limit: int) -> list[Outgoing]: ...
    async def begin_attempt(self, effect_id: str, holder: str, digest: str) -> int: ...
    async def record_attempt(
        self, effect_id: str, attempt: int, holder: str, answer: Answer
    ) -> None: ...
    async def give_up(self, effect_id: str, holder: str, reason: str) -> None: ...
    async def release_effect(self, effect_id: str, holder: str) -> None: ...
    async def wait_for_effects(self, timeout_s: float) -> None: ...
    # -- effects: the operator's side --
    async def open_gate(
        self, tenant: str, task_id: str, step_name: str, digest: str, by: str
    ) -> None: ...
    async def resolve_effect(
        self, tenant: str, task_id: str, step_name: str, happened: bool, by: str
    ) -> None: ...
    async def next_deadline(self) -> float | None: ...
    async def resolve_task_id(self, tenant: str, given: str) -> str: ...
    async def task(self, task_id: str, tenant: str | None = None) -> TaskDetail: ...
    async def list_tasks(
        self,
        tenant: str,
        state: str | None,
        cursor: int | None,
        limit: int,
        search: TaskSearch | None = None,
    ) -> TaskPage: ...
    async def events(
        self, task_id: str, tenant: str | None, after: int, wait_s: float
    ) -> list[Event]: ...
    async def task_log(
        self, task_id: str, tenant: str | None, after_seq: int, after_line: int
    ) -> TaskLogs: ...
    async def review(self, task_id: str, tenant: str | None = None) -> ReviewRecord: ...
    async def queue_depth(self) -> dict[str, int]: ...
    async def pools(self, also: Collection[str] = ()) -> list[PoolStatus]: ...
    async def runners(self) -> list[RunnerRow]: ...
    async def budget(self, tenant: str) -> Budget: ...
    async def budgets(self) -> list[Budget]: ...
    async def violations(self) -> list[str]: ...
    async def artifact_upload(
        self, who: Principal, lease: tuple[str, int] | None
    ) -> ArtifactUpload: ...
    async def artifact_bytes_kept(self, who: Principal, besides: str) -> int: ...
    async def record_artifact(
        self,
        digest: str,
        size: int,
        who: Principal,
        upload: ArtifactUpload | None = None,
        quota: int | None = None,
    ) -> bool: ...
    async def artifact_owners(self, digest: str) -> list[ArtifactOwner]: ...
    async def artifact_owned(self, digest: str) -> bool: ...
    async def forget_unreferenced_artifacts(
        self, uploaded_before: float, limit: int
    ) -> ForgottenArtifacts: ...
    async def verifies_bundle(self, digest: str, pool: str) -> bool: ...
    async def authenticate(self, secret: str) -> Principal | None: ...
    async def start_ui_session(self, operator: Principal, ttl_s: float) -> str: ...
    async def ui_session(self, session_id: str) -> Principal | None: ...
    async def end_ui_session(self, session_id: str) -> None: ...
    async def create_token(self, scope: str, role: str) -> NewToken: ...
    async def revoke_token(self, token_id: str) -> None: ...
