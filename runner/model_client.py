"""The runner's model client under its first name: `tether.runner.models` holds it now, with
one module per model API (Chat Completions, Responses, Anthropic Messages)."""

from __future__ import annotations

from tether.runner.models import USAGE_KEYS, Completion, ModelClient, RetryHook

__all__ = ["USAGE_KEYS", "Completion", "ModelClient", "RetryHook"]
