"""The v1 wire contract both programs speak: the records (`records`), the one codec (`codec`),
the step kinds' payloads (`payloads`), the placeholders of effect payloads (`templates`), and
the protocol's rules re-exported here (hashes, error codes, outcomes; `protocol`).

Nothing in this package imports the runner or the supervisor.
"""

from tether.wire.protocol import (
    API_PREFIX,
    ERRORS,
    RESULTS_PER_REQUEST_MAX,
    ErrorCode,
    Meaning,
    Outcome,
    ReleaseReason,
    RunnerAction,
    canonical_json,
    content_hash,
    effect_key,
    plan_document,
    plan_hash,
    runner_action,
    sha256_hex,
)

__all__ = [
    "API_PREFIX",
    "ERRORS",
    "RESULTS_PER_REQUEST_MAX",
    "ErrorCode",
    "Meaning",
    "Outcome",
    "ReleaseReason",
    "RunnerAction",
    "canonical_json",
    "content_hash",
    "effect_key",
    "plan_document",
    "plan_hash",
    "runner_action",
    "sha256_hex",
]
