"""The request an effect step's outbox row holds, rendered from its payload and what the
ledger holds when the step falls due (docs/design.md, Effects)."""

from __future__ import annotations

from typing import Any

from tether.supervisor.ledger import repositories
from tether.supervisor.ledger.records import NamedOutput, StepColumns, TaskRow
from tether.supervisor.ledger.tx import Tx, loads
from tether.supervisor.ledger.verification import Finding, candidate_sha
from tether.wire import templates
from tether.wire.payloads import valid_branch
from tether.wire.templates import RenderError


class NoCandidate(ValueError):
    """A push is due, but no step of the task reported a candidate."""


def render_code(exc: Exception) -> str:
    return Finding.NO_CANDIDATE.value if isinstance(exc, NoCandidate) else "effect_render_failed"


def render_request(
    tx: Tx, step: StepColumns, task: TaskRow, payload: dict[str, Any]
) -> dict[str, Any]:
    """The request the dispatcher sends for `step`, from its payload and what the ledger
    holds now. Credentials stay as placeholders (by name).

    `http`: the URL filled by position (`templates.render_url`), the header values as text
    with no control character (`templates.render_headers`), the body as JSON. `git.push`:
    the repository's URL, the branch as the plan wrote it (checked again), the approved base
    and the candidate. A kind a deployment registers is handed its
    payload (less `keyed` and `deadline_s`) filled by `templates.render(..., sealed=True)`:
    a string that is one placeholder becomes the output's JSON value, a placeholder inside
    a longer string its text as it is (not encoded: the deliverer knows where it puts it),
    credential placeholders by name, and no `{{`/`}}` an output built."""
    if step.kind == "git.push":
        remote = repositories.find_repository(tx, task.tenant, task.repository or "")
        if remote is None:
            raise ValueError(f"task {task.id} has no repository to push to")
        candidate = candidate_sha(tx, task.id)
        if candidate is None:
            raise NoCandidate("no step of the task reported a candidate to push")
        check_push(payload.get("branch"))
        return {
            "url": remote.url,
            "branch": payload.get("branch"),
            "expected": task.approved_base_sha,
            "candidate": candidate,
            "credential": payload.get("credential"),
        }
    outputs = {
        r.name: loads(r.output_json)
        for r in tx.all_as(
            NamedOutput, "committed_outputs_before", task_id=task.id, position=step.position
        )
    }
    if step.kind == "http":
        return {
            "method": payload.get("method", "POST"),
            "url": templates.render_url(str(payload.get("url")), outputs, "payload.url"),
            "headers": templates.render_headers(payload.get("headers") or {}, outputs),
            "body": templates.render(payload.get("body"), outputs, "payload.body"),
        }
    # A registered kind's deliverer may fill credentials anywhere in its request: sealed.
    fields = {k: v for k, v in payload.items() if k not in ("keyed", "deadline_s")}
    rendered: dict[str, Any] = templates.render(fields, outputs, "payload", sealed=True)
    return rendered


def check_push(branch: Any) -> None:
    """`RenderError` unless a push's branch is one git accepts (as checked at create: it is
    the plan's text, never an output's, and must not reach git as an option or a refspec of
    another shape). The base and the candidate are the ledger's own; `Mirrors.push` refuses
    any that is not a commit id before git runs."""
    if not isinstance(branch, str) or not valid_branch(branch):
        raise RenderError(f"payload.branch: {branch!r} is not a branch name git accepts")
