"""Schedule seeds: one run seed names every schedule of the run, and one schedule seed names
exactly one schedule.

Schedule 0 of a run uses the run seed itself; schedule i > 0 uses a seed derived from the run
seed and i. So `--schedules 1 --seed X` replays exactly the schedule whose seed is X, whichever
run it came from, and `--schedules N --seed X` starts with that same schedule.
"""

from __future__ import annotations

import hashlib
import secrets

SEED_BITS = 63


def schedule_seed(run_seed: int, index: int) -> int:
    if index == 0:
        return run_seed
    digest = hashlib.sha256(f"tether-chaos:{run_seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)


def parse_seed(text: str) -> int:
    """A decimal or `0x` hexadecimal seed in 0 .. 2**63-1; `ValueError` with a clear message."""
    try:
        value = int(text, 0)
    except ValueError:
        raise ValueError(f"seed must be an integer, not {text!r}") from None
    if not 0 <= value < 2**SEED_BITS:
        raise ValueError(f"seed must be in 0..{2**SEED_BITS - 1}, not {text}")
    return value


def fresh_seed() -> int:
    return secrets.randbits(SEED_BITS)
