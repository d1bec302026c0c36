"""The supervisor's settings (docs/design.md, Command line and settings): defaults <
`config/supervisor.toml` < `TETHER_*` < flags.

Every key here appears, with its default and a comment, in `config/supervisor.toml`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated

from tether.settings import COMMA_LIST, SettingsError, require_positive
from tether.supervisor.ledger.backends import LedgerUrlError, is_postgres, sqlite_path
from tether.supervisor.ledger.destinations import Destinations
from tether.supervisor.ledger.schema import SYNCHRONOUS_MODES
from tether.supervisor.ledger.tx import LedgerConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class SupervisorSettings:
    # The ledger: a file path or `sqlite:///path` (kept as the file's Path), or
    # `postgresql://...` (kept as given); see `backends.open_backend`.
    db: str | Path = "tether.db"
    host: str = "127.0.0.1"
    port: int = 8080
    lease_ttl_s: float = 30.0
    accept_window_s: float = 10.0
    max_attempts: int = 5
    max_body_bytes: int = 1024 * 1024
    # A connection whose request head (line and headers) is not complete this long after it
    # was made, or after its next request began, is closed (supervisor/head_timeout.py).
    header_read_timeout_s: float = 5.0
    body_read_timeout_s: float = 30.0
    synchronous: str = "FULL"
    claim_wait_max_s: float = 30.0
    events_wait_max_s: float = 60.0
    log_level: str = "info"
    shared_pools: str = "default"
    runner_seen_window_s: float = 3600.0
    artifact_max_bytes: int = 64 * 1024 * 1024
    # The bytes one pool's runners (or one tenant's operators) may keep in the artifact store;
    # an upload past it is 413 `quota_exceeded`.
    artifact_quota_bytes: int = 10 * 1024 * 1024 * 1024
    # An artifact no step names (a result, a check log, a checkpoint) is removed this long
    # after its upload, unless its step is leased; the collector looks every
    # `artifact_collect_every_s` (supervisor/artifacts/collector.py).
    artifact_keep_unreferenced_s: float = 86400.0
    artifact_collect_every_s: float = 3600.0
    # How long a status-page sign-in lasts (its session; sign-out and the token's revocation
    # end it sooner).
    ui_session_ttl_s: float = 28800.0
    artifact_dir: Path | None = None  # None: `artifacts/` beside the ledger file
    mirror_dir: Path | None = None  # None: `mirrors/` beside the ledger file
    # Effects' credentials, one file per name; None: $CREDENTIALS_DIRECTORY (systemd's
    # `LoadCredential=`) when set, else no credentials at all.
    credentials_dir: Path | None = None
    effect_hold_s: float = 60.0  # how long a dispatcher's hold on an effect lasts unrefreshed
    # Where effects may go: `host` or `host:port` entries (`*`, `*.domain`, a name, an
    # address), for every tenant and per tenant; an internal address only when an entry
    # names it (supervisor/ledger/destinations.py).
    effect_allowed_hosts: Annotated[str, COMMA_LIST] = "*"
    effect_allowed_hosts_by_tenant: dict[str, Annotated[str, COMMA_LIST]] = dataclasses.field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        for name in (
            "lease_ttl_s",
            "accept_window_s",
            "claim_wait_max_s",
            "events_wait_max_s",
            "runner_seen_window_s",
            "effect_hold_s",
            "header_read_timeout_s",
            "body_read_timeout_s",
            "artifact_keep_unreferenced_s",
            "artifact_collect_every_s",
            "ui_session_ttl_s",
        ):
            require_positive(name, getattr(self, name))
        require_positive("max_attempts", self.max_attempts)
        require_positive("max_body_bytes", self.max_body_bytes)
        require_positive("artifact_max_bytes", self.artifact_max_bytes)
        require_positive("artifact_quota_bytes", self.artifact_quota_bytes)
        if self.accept_window_s > self.lease_ttl_s:
            raise SettingsError("setting 'accept_window_s' must not exceed 'lease_ttl_s'")
        if not 0 < self.port < 65536:
            raise SettingsError(f"setting 'port' must be 1..65535, got {self.port}")
        if self.synchronous.upper() not in SYNCHRONOUS_MODES:
            raise SettingsError(
                f"setting 'synchronous' must be one of {', '.join(SYNCHRONOUS_MODES)}"
            )
        if any("/" in name for name in self.shared_pool_names):
            raise SettingsError(
                "setting 'shared_pools' names pools without '/' (those are a tenant's)"
            )
        if self.log_level.lower() not in {"debug", "info", "warning", "error"}:
            raise SettingsError("setting 'log_level' must be debug, info, warning or error")
        try:
            self.effect_destinations  # noqa: B018 - parsed here to refuse a bad entry at start
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        if not is_postgres(self.db):  # a file: kept as its Path, `sqlite:///` or not
            try:
                object.__setattr__(self, "db", sqlite_path(self.db))
            except LedgerUrlError as exc:
                raise SettingsError(f"setting 'db': {exc}") from None

    @property
    def ledger_folder(self) -> Path:
        """Where the ledger's neighbours go by default: beside a ledger file; for a database,
        the working directory (give `artifact_dir` and `mirror_dir` there)."""
        return self.db.parent if isinstance(self.db, Path) else Path()

    @property
    def shared_pool_names(self) -> frozenset[str]:
        """The pools any tenant's tasks may name (`shared_pools`, comma-separated)."""
        return frozenset(name.strip() for name in self.shared_pools.split(",") if name.strip())

    @property
    def mirror_root(self) -> Path:
        """Where the supervisor's bare mirrors live (`mirror_dir`, else beside the ledger)."""
        return self.mirror_dir or self.ledger_folder / "mirrors"

    @property
    def artifact_root(self) -> Path:
        """Where the artifact store keeps its files (`artifact_dir`, else beside the ledger)."""
        return self.artifact_dir or self.ledger_folder / "artifacts"

    @property
    def credentials_folder(self) -> Path | None:
        """Where effects' credentials are read (`credentials_dir`, else systemd's
        `$CREDENTIALS_DIRECTORY`, else none)."""
        if self.credentials_dir is not None:
            return self.credentials_dir
        given = os.environ.get("CREDENTIALS_DIRECTORY")
        return Path(given) if given else None

    @property
    def effect_destinations(self) -> Destinations:
        """Where effects may go (`effect_allowed_hosts`, `effect_allowed_hosts_by_tenant`);
        `ValueError` naming the setting and the entry at fault."""
        return Destinations.from_settings(
            self.effect_allowed_hosts, self.effect_allowed_hosts_by_tenant
        )

    @property
    def ledger_config(self) -> LedgerConfig:
        return LedgerConfig(
            lease_ttl_s=self.lease_ttl_s,
            accept_window_s=self.accept_window_s,
            max_attempts=self.max_attempts,
            runner_seen_window_s=self.runner_seen_window_s,
            effect_hold_s=self.effect_hold_s,
            effect_destinations=self.effect_destinations,
        )
