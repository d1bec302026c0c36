"""The runner's settings: defaults < TOML `--config` < `TETHER_*` < flags.

Secrets are never settings (docs/design.md, Command line and settings): `token_file` and
`model_key_file` name files, and when they are unset the runner looks in systemd's
`$CREDENTIALS_DIRECTORY` for `runner-token` and `model-key`. A missing runner token stops the
runner at start. A missing model key is an operator problem only when `model_key_file` names
a file; with no file and no credential the runner sends no key, for a local model server.

`supervisor_url` may list several supervisors of one ledger, comma-separated (in the file, the
environment or `--supervisor`); the runner fails over between them in that order
(`tether.runner.failover`). A single URL means what it always did.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Annotated

from tether.runner.agent.confine import CommandLimits
from tether.runner.models import MODEL_APIS
from tether.runner.preemption.notice import PROVIDERS as PREEMPTION_PROVIDERS
from tether.settings import COMMA_LIST, SettingsError, require_positive

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "json", "console")
# The supervisor refuses a claim whose `wait_s` exceeds its `claim_wait_max_s` (30 by default).
MAX_CLAIM_WAIT_S = 60.0
# AWS gives two minutes' notice, GCP and Azure thirty seconds: a longer poll could miss them.
MAX_PREEMPTION_POLL_S = 30.0


def default_runner_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _check_url(name: str, value: str) -> None:
    if not value:
        raise SettingsError(
            f"setting {name!r} is required: give it in the config file,"
            f" as TETHER_{name.upper()} or as a flag"
        )
    if not value.startswith(("http://", "https://")):
        raise SettingsError(f"setting {name!r} must be an http:// or https:// URL, got {value!r}")


def split_urls(value: str) -> tuple[str, ...]:
    """The URLs a comma-separated `supervisor_url` lists, stripped of spaces, in order."""
    return tuple(part.strip() for part in value.split(","))


def _check_urls(name: str, value: str) -> None:
    """`value` lists one URL or several, comma-separated; each is checked as `_check_url`
    does and named when it is wrong; an empty entry or a repeated URL is refused."""
    urls = split_urls(value)
    if len(urls) == 1:
        _check_url(name, value)
        return
    seen: set[str] = set()
    for n, url in enumerate(urls, start=1):
        if not url:
            raise SettingsError(f"setting {name!r}: entry {n} of {value!r} is empty")
        if not url.startswith(("http://", "https://")):
            raise SettingsError(
                f"setting {name!r}: entry {n}, {url!r}, is not an http:// or https:// URL"
            )
        if url.rstrip("/") in seen:
            raise SettingsError(f"setting {name!r} lists {url!r} twice")
        seen.add(url.rstrip("/"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerSettings:
    # One URL, or several supervisors of one ledger in failover order: comma-separated, or in
    # the TOML file a list of strings.
    supervisor_url: Annotated[str, COMMA_LIST] = ""
    token_file: Path | None = None
    model_url: str = ""
    model_key_file: Path | None = None
    model: str = ""
    # The API `model_url` speaks: "chat" ({model_url}/chat/completions), "responses" (OpenAI
    # Responses, {model_url}/responses) or "anthropic" (Anthropic Messages, {model_url}/messages).
    model_api: str = "chat"
    # The `max_tokens` of an Anthropic request whose payload sets none (that API requires one).
    anthropic_max_tokens: int = 8192
    concurrency: int = 4
    shutdown_grace_s: float = 20.0
    runner_id: str = dataclasses.field(default_factory=default_runner_id)
    claim_wait_s: float = 20.0
    # The whole budget for one step's model call, retries and Retry-After waits included.
    model_timeout_s: float = 300.0
    # Timeout of one renew, release or result call (a claim waits `claim_wait_s`, then 10 s).
    request_timeout_s: float = 10.0
    # Claiming pauses after an operator problem, doubling from `pause_initial_s` up to
    # `pause_max_s`; a completed step resets it.
    pause_initial_s: float = 5.0
    pause_max_s: float = 300.0
    log_level: str = "info"
    log_format: str = "auto"
    # Without a working bubblewrap, agent steps that run commands are refused (released
    # `operator`, uncounted) unless this is true: then commands run as the runner's own user and
    # model-written code can read the runner's credentials (runner/agent/sandbox_policy.py).
    commands_without_sandbox: bool = False
    # With tracing on, model and tool spans also carry the prompts, answers, tool arguments and
    # tool results (gen_ai.input.messages, ...): whatever the task's repository and prompts hold.
    trace_content: bool = False
    # Ship every line about a step (after masking; no payload text) to the supervisor, which
    # keeps them beside the task's journal (`tether-supervisor logs TASK`; runner/log_shipping.py).
    ship_logs: bool = True
    # Limits on every agent command (`run`, checks, setup): runner/agent/confine.py.
    command_max_processes: int = 256
    command_max_memory_mb: int = 2048
    command_max_file_mb: int = 1024
    command_max_cpu_s: int = 600
    # The worktree and the command's HOME, measured after each command; past it the step
    # fails `worktree_too_large`.
    worktree_max_mb: int = 4096
    # Where the runner hears that its cloud reclaims the server (runner/preemption/): "none",
    # "aws" (the spot instance-action, IMDSv2), "gcp" (instance/preempted), "azure" (Scheduled
    # Events, Preempt) or "file" (a file whose existence is the notice). On a notice it stops
    # claiming, checkpoints its agent steps' turns and releases every lease `preempted`.
    preemption: str = "none"
    # The metadata service's base URL; empty: the provider's documented address. For "file",
    # the file's absolute path (required).
    preemption_url: str = ""
    preemption_poll_s: float = 2.0
    # Host folders bound read-only into the sandbox (a shared toolchain), comma-separated.
    sandbox_read_only: Annotated[str, COMMA_LIST] = ""

    def __post_init__(self) -> None:
        _check_urls("supervisor_url", self.supervisor_url)
        _check_url("model_url", self.model_url)
        if not self.model:
            raise SettingsError(
                "setting 'model' is required (the model name sent to the provider):"
                " give it in the config file, as TETHER_MODEL or as --model"
            )
        if self.model_api not in MODEL_APIS:
            raise SettingsError(
                f"setting 'model_api' must be one of {', '.join(MODEL_APIS)},"
                f" got {self.model_api!r}"
            )
        if not 1 <= self.anthropic_max_tokens <= 1_000_000:
            raise SettingsError(
                "setting 'anthropic_max_tokens' must be 1..1000000,"
                f" got {self.anthropic_max_tokens}"
            )
        if not 1 <= self.concurrency <= 256:
            raise SettingsError(f"setting 'concurrency' must be 1..256, got {self.concurrency}")
        if not 1 <= len(self.runner_id) <= 200:
            raise SettingsError("setting 'runner_id' must be 1..200 characters")
        for name in (
            "shutdown_grace_s",
            "model_timeout_s",
            "request_timeout_s",
            "pause_initial_s",
            "pause_max_s",
        ):
            require_positive(name, getattr(self, name))
        if not 0 <= self.claim_wait_s <= MAX_CLAIM_WAIT_S:
            raise SettingsError(
                f"setting 'claim_wait_s' must be 0..{MAX_CLAIM_WAIT_S:g} and not above the"
                f" supervisor's claim_wait_max_s, got {self.claim_wait_s}"
            )
        for name in (
            "command_max_processes",
            "command_max_memory_mb",
            "command_max_file_mb",
            "command_max_cpu_s",
            "worktree_max_mb",
        ):
            value = getattr(self, name)
            if value < 1:
                raise SettingsError(f"setting {name!r} must be at least 1, got {value}")
        for folder in self.sandbox_read_only_paths:
            if not folder.is_absolute():
                raise SettingsError(
                    f"setting 'sandbox_read_only': {str(folder)!r} is not an absolute path"
                )
        if self.pause_max_s < self.pause_initial_s:
            raise SettingsError("setting 'pause_max_s' must not be below 'pause_initial_s'")
        self._check_preemption()
        if self.log_level.lower() not in LOG_LEVELS:
            raise SettingsError(f"setting 'log_level' must be one of {', '.join(LOG_LEVELS)}")
        if self.log_format not in LOG_FORMATS:
            raise SettingsError(f"setting 'log_format' must be one of {', '.join(LOG_FORMATS)}")

    def _check_preemption(self) -> None:
        if self.preemption not in PREEMPTION_PROVIDERS:
            raise SettingsError(
                f"setting 'preemption' must be one of {', '.join(PREEMPTION_PROVIDERS)},"
                f" got {self.preemption!r}"
            )
        if not 0.1 <= self.preemption_poll_s <= MAX_PREEMPTION_POLL_S:
            raise SettingsError(
                f"setting 'preemption_poll_s' must be 0.1..{MAX_PREEMPTION_POLL_S:g},"
                f" got {self.preemption_poll_s}"
            )
        url = self.preemption_url
        if self.preemption == "none":
            if url:
                raise SettingsError(
                    "setting 'preemption_url' is set but 'preemption' is \"none\": name the"
                    " provider (aws, gcp, azure, file)"
                )
        elif self.preemption == "file":
            if not Path(url).is_absolute():
                raise SettingsError(
                    "setting 'preemption_url' must be the notice file's absolute path with"
                    f' preemption = "file", got {url!r}'
                )
        elif url:
            _check_url("preemption_url", url)

    @property
    def sandbox_read_only_paths(self) -> tuple[Path, ...]:
        """The folders `sandbox_read_only` lists."""
        return tuple(Path(p.strip()) for p in self.sandbox_read_only.split(",") if p.strip())

    @property
    def command_limits(self) -> CommandLimits:
        """The limits every agent command runs under."""
        return CommandLimits(
            max_processes=self.command_max_processes,
            max_memory_mb=self.command_max_memory_mb,
            max_file_mb=self.command_max_file_mb,
            max_cpu_s=self.command_max_cpu_s,
            worktree_max_mb=self.worktree_max_mb,
        )

    @property
    def supervisor_urls(self) -> tuple[str, ...]:
        """The supervisors `supervisor_url` lists, in failover order."""
        return split_urls(self.supervisor_url)

    @property
    def json_logs(self) -> bool | None:
        """None lets the logging setup decide by whether stdout is a terminal."""
        return {"auto": None, "json": True, "console": False}[self.log_format]
