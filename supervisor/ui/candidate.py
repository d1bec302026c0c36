"""The task page's candidate diff: the files the last candidate changes against the approved
base, with their counts and hunks, read from the supervisor's mirror (`repos.diffs`). Every
line is revealed (a bidi control or a zero-width character shows as its escape) before the
template escapes it, and the page shows a bounded part of a large diff, saying so."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final

from starlette.requests import Request

from tether.supervisor.ledger import LedgerStore, Principal
from tether.supervisor.repos import diffs
from tether.supervisor.shown import reveal
from tether.wire.records import TaskDetail

PAGE_FILES: Final = 50
PAGE_LINES: Final = 2000
# Diffs already read, by mirror and candidate: a commit's diff never changes, and the live
# fragment asks again with each event.
CACHED: Final = 64


def _cache(request: Request) -> OrderedDict[tuple[str, diffs.Candidate], diffs.CandidateDiff]:
    state = request.app.state
    if not hasattr(state, "candidate_diffs"):
        state.candidate_diffs = OrderedDict()
    found: OrderedDict[tuple[str, diffs.Candidate], diffs.CandidateDiff] = state.candidate_diffs
    return found


async def shown_diff(request: Request, who: Principal, task: TaskDetail) -> dict[str, Any] | None:
    """The diff as the page lays it out, None for a task without a candidate; `error` says
    why a candidate the ledger names cannot be shown."""
    if not task.repository:
        return None
    try:
        chosen = diffs.pick(task, None)
    except diffs.CandidateError:
        return None
    ledger: LedgerStore = request.app.state.ledger
    binding = await ledger.binding_of_task(who.scope, task.id)
    if binding is None:
        return None
    mirror = request.app.state.mirrors.path(binding.url)
    cache, key = _cache(request), (str(mirror), chosen)
    found = cache.get(key)
    if found is None:
        try:
            found = await diffs.diff(mirror, chosen)
        except diffs.CandidateError as exc:
            return {"candidate": chosen, "error": str(exc)}
        cache[key] = found
        while len(cache) > CACHED:
            cache.popitem(last=False)
    return laid_out(found)


def laid_out(found: diffs.CandidateDiff) -> dict[str, Any]:
    """Files with their counts and hunks, at most `PAGE_FILES` files and `PAGE_LINES` lines."""
    files, budget = [], PAGE_LINES
    for patch in diffs.by_file(found)[:PAGE_FILES]:
        hunks = []
        for hunk in patch.hunks:
            lines = [reveal(line) for line in hunk.lines[: max(budget, 0)]]
            budget -= len(lines)
            hunks.append({"header": reveal(hunk.header), "lines": lines})
        files.append(
            {
                "path": reveal(patch.path),
                "added": patch.added,
                "removed": patch.removed,
                "hunks": hunks,
            }
        )
    shown_lines = PAGE_LINES - budget
    total = sum(len(h.lines) for p in diffs.by_file(found) for h in p.hunks)
    return {
        "candidate": found.candidate,
        "files": files,
        "changed": len(found.files),
        "added": sum(f.added or 0 for f in found.files),
        "removed": sum(f.removed or 0 for f in found.files),
        "cut": found.truncated or len(found.files) > PAGE_FILES or shown_lines < total,
        "branch": diffs.branch_of(found.candidate.task_id),
    }
