"""Unique prefixes: an operator may give a task id or a plan hash by its first characters, at
least `MIN_PREFIX` of them, wherever a full one is taken (the API's task routes, `--plan-hash`,
the CLI's `--db` commands). The rule is here once: a full value is itself; a prefix names the
one value it begins. One that several begin with is refused naming them; one too short names
nothing, and its refusal says how long a prefix must be."""

from __future__ import annotations

from typing import Final

from tether.supervisor.ledger.errors import InvalidRequest, NotFound, PlanMismatch
from tether.supervisor.ledger.tx import Statements

MIN_PREFIX: Final = 8
# The matches an ambiguous prefix names in its refusal.
SHOWN_MATCHES: Final = 3


def _too_short(given: str) -> str:
    return f" (a prefix needs at least {MIN_PREFIX} characters)" if len(given) < MIN_PREFIX else ""


def resolve_task_id(s: Statements, tenant: str | None, given: str) -> str:
    """The id of the task `given` names for `tenant` (None: any tenant): the task whose id it
    is, else the one task whose id begins with it. `NotFound` when none does (another
    tenant's task is not found either, nor any for a prefix too short); `InvalidRequest` for a
    prefix several begin with."""
    if tenant is None:
        exact = s.one("task_by_id", task_id=given)
    else:
        exact = s.one("owned_task", task_id=given, tenant=tenant)
    if exact is not None:
        return str(exact["id"])
    if len(given) < MIN_PREFIX:
        raise NotFound(f"no task {given[:80]}{_too_short(given)}")
    bound = {"length": len(given), "prefix": given, "limit": SHOWN_MATCHES}
    if tenant is None:
        found = s.all("task_ids_with_prefix", **bound)
    else:
        found = s.all("tenant_task_ids_with_prefix", tenant=tenant, **bound)
    if not found:
        raise NotFound(f"no task {given[:80]}")
    if len(found) > 1:
        shown = ", ".join(str(r["id"]) for r in found[: SHOWN_MATCHES - 1])
        raise InvalidRequest(
            f"task id prefix {given!r} is ambiguous: it begins {shown}"
            f"{' and more' if len(found) >= SHOWN_MATCHES else ''}; give more characters"
        )
    return str(found[0]["id"])


def resolve_plan_hash(task_id: str, plan_hash: str, given: str) -> str:
    """`plan_hash`, the task's own, when `given` is it or a prefix of it; `PlanMismatch`
    naming both otherwise (and how long a prefix must be, for one too short)."""
    if given == plan_hash or (len(given) >= MIN_PREFIX and plan_hash.startswith(given)):
        return plan_hash
    raise PlanMismatch(f"task {task_id} has plan hash {plan_hash}, not {given}{_too_short(given)}")
