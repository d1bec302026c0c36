"""The runners each pool has seen: who claimed, with which token, serving which step kinds,
first and last seen on the supervisor's clock.

The claim rule records its runner here (`seen`); task creation asks which kinds a pool's
runners serve (`kinds_served`), so a plan naming a kind nobody runs is refused at submit
instead of failing when it runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from tether.supervisor.ledger.tx import Tx, dumps

# last_seen moves only when it is this much older than now: a runner claiming in a busy loop
# costs one index lookup per claim, not a row written.
SEEN_RESOLUTION_S: Final = 1.0


def seen(tx: Tx, pool: str, runner_id: str, token_id: str | None, kinds: Iterable[str]) -> None:
    """Record that `runner_id` claimed in `pool` now, serving `kinds`."""
    kinds_json = dumps(sorted(set(kinds)))
    tx.run(
        "record_runner_seen",
        pool=pool,
        runner_id=runner_id,
        token_id=token_id,
        kinds_json=kinds_json,
        now=tx.now,
        resolution=SEEN_RESOLUTION_S,
    )


def kinds_served(tx: Tx, pool: str, since: float) -> set[str]:
    """The kinds announced by the runners of `pool` seen at or after `since`."""
    return {row["kind"] for row in tx.all("kinds_served", pool=pool, since=since)}
