"""The lines runners shipped about a task's attempts (`ledger.logs`), as the task page shows
them under each attempt: when the supervisor received each, its level, event and fields on one
line with every control or hiding character escaped (`shown.one_line`)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Final

from tether.supervisor.ledger import LedgerStore
from tether.supervisor.shown import fields_text, one_line

# Lines a page shows at most, all attempts together; `tether-supervisor logs` prints them all.
PAGE_LINES_MAX: Final = 4_000


async def lines_by_fence(ledger: LedgerStore, task_id: str, tenant: str) -> dict[int, list[Any]]:
    """Each attempt's shipped lines, by its fence, in the order they arrived."""
    found: defaultdict[int, list[Any]] = defaultdict(list)
    after_seq = after_line = shown = 0
    while shown < PAGE_LINES_MAX:
        page = await ledger.task_log(task_id, tenant, after_seq, after_line)
        if not page.entries:
            break
        for entry in page.entries:
            if entry.source != "runner" or entry.fence is None:
                continue
            found[entry.fence].append(
                {
                    "at": entry.at,
                    "level": entry.level,
                    "event": one_line(entry.event),
                    "fields": fields_text(entry.fields),
                }
            )
            shown += 1
        after_seq, after_line = page.next_seq, page.next_line
    return dict(found)
