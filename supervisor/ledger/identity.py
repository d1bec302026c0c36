"""Step identity: a task's plan becomes durable intents (step id + payload hash) at creation.

Creation is idempotent on `(tenant, idempotency_key)`: the key names one logical execution.
The same key with the same plan returns the existing task; with another plan it is refused,
so a client that retries after a lost reply can never start a second execution.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any, Final

from tether.supervisor.ledger import names, repositories, runners
from tether.supervisor.ledger.decisions import Decision
from tether.supervisor.ledger.errors import IdempotencyConflict, InvalidRequest
from tether.supervisor.ledger.journal import append_event
from tether.supervisor.ledger.records import TaskRow
from tether.supervisor.ledger.states import TaskState
from tether.supervisor.ledger.tx import Tx, dumps
from tether.wire import content_hash, plan_document, templates
from tether.wire.payloads import BUILT_IN_KINDS
from tether.wire.records import CheckSpec

# The names a planted bug of the schedule explorer may swap while a run lasts
# (`tether.sim.plants`): the rules here call each through this module's globals.
SEAMS: Final = frozenset({"existing_task"})

MAX_NAME = names.MAX_NAME


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepSpec:
    name: str
    kind: str
    payload: Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """What an operator asks for. Fields after `steps` are declarations for the review record.

    `checks` are the named commands a runner runs at each candidate; their names are the
    task's expected checks. `expected_checks` alone (no commands) stay allowed: a custom step
    kind may report such a check itself.
    """

    tenant: str
    idempotency_key: str
    steps: tuple[StepSpec, ...]
    repository: str | None = None
    base_sha: str | None = None
    requirement_revision: str | None = None
    allowed_paths: tuple[str, ...] = ()
    expected_checks: tuple[str, ...] = ()
    owner: str | None = None
    pool: str = "default"
    checks: tuple[CheckSpec, ...] = ()
    verify: str | None = None  # the create body's `verify.pool`: bound into the plan hash

    @property
    def expected(self) -> tuple[str, ...]:
        """The expected checks: the checks' names in order, else `expected_checks`."""
        return tuple(c.name for c in self.checks) if self.checks else self.expected_checks

    @property
    def plan(self) -> dict[str, Any]:
        verify = None if self.verify is None else {"pool": self.verify}
        return plan_document((dataclasses.asdict(s) for s in self.steps), verify)

    @property
    def plan_hash(self) -> str:
        return content_hash(self.plan)

    def declared(self) -> dict[str, Any]:
        """Everything but the plan that a duplicate create must repeat to be 'the same task'."""
        return {
            "repository": self.repository,
            "declared_base_sha": self.base_sha,
            "requirement_revision": self.requirement_revision,
            "allowed_paths_json": dumps(list(self.allowed_paths)),
            "expected_checks_json": dumps(list(self.expected)),
            "checks_json": dumps([{"name": c.name, "command": c.command} for c in self.checks]),
            "owner": self.owner,
            "pool": self.pool,
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Created:
    task_id: str
    created: bool  # False: an earlier create with the same key and plan


def step_id_for(task_id: str, position: int) -> str:
    """Stable across every attempt and replay: the step's identity never changes."""
    return f"{task_id}.{position}"


def validate(spec: TaskSpec, max_steps: int, tx: Tx | None = None) -> None:
    for label, value in (("tenant", spec.tenant), ("idempotency_key", spec.idempotency_key)):
        if not value or len(value) > MAX_NAME:
            raise InvalidRequest(f"{label} must be 1..{MAX_NAME} characters")
    if not spec.steps:
        raise InvalidRequest("plan.steps must hold at least one step")
    if len(spec.steps) > max_steps:
        raise InvalidRequest(f"plan.steps holds {len(spec.steps)} steps; at most {max_steps}")
    for i, step in enumerate(spec.steps):
        if not step.name or len(step.name) > MAX_NAME:
            raise InvalidRequest(f"plan.steps[{i}].name must be 1..{MAX_NAME} characters")
        if not step.kind or len(step.kind) > MAX_NAME:
            raise InvalidRequest(f"plan.steps[{i}].kind must be 1..{MAX_NAME} characters")
    names.check_pool_name(spec.pool, tx)
    if spec.repository is not None and not spec.repository.strip():
        raise InvalidRequest("repository must name a repository")
    if (spec.expected_checks or spec.checks) and not spec.repository:
        raise InvalidRequest("checks need a repository to be checked against")
    check_checks(spec)
    if spec.base_sha and not spec.repository:
        raise InvalidRequest("base_sha needs a repository")
    if spec.verify is not None:
        if not spec.checks:
            raise InvalidRequest(
                "'verify': a verifier re-runs the task's checks: name them in 'checks' (and"
                " the repository they run in)"
            )
        check_verify_pool(spec, spec.verify, "'verify.pool'", tx)


def check_verify_pool(spec: TaskSpec, pool: str, where: str, tx: Tx | None) -> None:
    """`InvalidRequest` for a verifier pool that is no pool name, or the task's own pool: the
    verifier is another runner by design, and a pool's runners often share one token."""
    try:
        names.check_pool_name(pool, tx)
    except InvalidRequest as exc:
        raise InvalidRequest(f"{where}: {exc}") from None
    if pool == spec.pool:
        raise InvalidRequest(
            f"{where}: {pool!r} is the task's own pool: a verifier must be a runner of another"
            " pool than the one that makes the candidate"
        )


def check_checks(spec: TaskSpec) -> None:
    """`InvalidRequest` for checks named twice, or `expected_checks` naming another set than
    the checks given beside them."""
    lists = (("checks", [c.name for c in spec.checks]), ("expected_checks", spec.expected_checks))
    for label, named in lists:
        twice = sorted({n for n in named if named.count(n) > 1})
        if twice:
            raise InvalidRequest(f"{label} names {', '.join(map(repr, twice))} more than once")
        if any(not n or len(n) > MAX_NAME for n in named):
            raise InvalidRequest(f"{label} names must be 1..{MAX_NAME} characters")
    if any(not c.command.strip() for c in spec.checks):
        raise InvalidRequest("each check needs a command line")
    if spec.checks and spec.expected_checks:
        given = {c.name for c in spec.checks}
        if set(spec.expected_checks) != given:
            raise InvalidRequest(
                f"expected_checks {sorted(spec.expected_checks)} must name the same checks as"
                f" checks {sorted(given)} (or be left out: the checks' names are expected)"
            )


def check_repository(tx: Tx, spec: TaskSpec) -> None:
    """`InvalidRequest` unless the task's repository is one its tenant added, and no `agent`
    step of it carries `allowed_paths` of its own (the task's apply to every step)."""
    if spec.repository is None:
        return
    if repositories.find_repository(tx, spec.tenant, spec.repository) is None:
        raise InvalidRequest(
            f"'repository': tenant {spec.tenant!r} has no repository {spec.repository!r}:"
            f" add it first with `tether-supervisor repo add {spec.repository} --url URL"
            f" --tenant {spec.tenant}`"
        )
    for i, step in enumerate(spec.steps):
        if (
            step.kind == "agent"
            and isinstance(step.payload, dict)
            and ("allowed_paths" in step.payload)
        ):
            raise InvalidRequest(
                f"'plan.steps[{i}].payload.allowed_paths': step {step.name!r} is an agent step"
                " of a task bound to a repository: the task's allowed_paths apply to it; give"
                " them there and leave them out of the payload"
            )


def check_kinds(tx: Tx, spec: TaskSpec) -> None:
    """`InvalidRequest` for a step whose kind is neither built in nor announced by a runner of
    the task's pool seen within `runner_seen_window_s`: no runner would ever be granted it.

    Only a new task is checked; the retry of a create that succeeded returns its task even if
    the runners serving its kinds have gone since.
    """
    builtin = BUILT_IN_KINDS | tx.config.effect_kinds
    unknown = [(i, s) for i, s in enumerate(spec.steps) if s.kind not in builtin]
    if not unknown:
        return
    window = tx.config.runner_seen_window_s
    served = runners.kinds_served(tx, spec.pool, tx.now - window)
    for i, step in unknown:
        if step.kind not in served:
            known = ", ".join(sorted(builtin | served))
            raise InvalidRequest(
                f"'plan.steps[{i}].kind': unknown kind {step.kind!r} (step {step.name!r}):"
                f" neither built in nor announced by a runner of pool {spec.pool!r} seen in"
                f" the last {window:g} s; known: {known}"
            )


def check_effects(spec: TaskSpec, effect_kinds: Collection[str]) -> None:
    """`InvalidRequest` (docs/design.md, Effects) for an effect step whose placeholders are
    malformed or name a step that is not an earlier step of the plan (or one whose name two
    earlier steps share); an effect step whose name another step also has (the gate and the
    operator's word find an effect by its name); a step placeholder in an `http` URL's scheme
    or authority; a `git.push` in a task without a repository; and a runner step after a
    `git.push` (the push ends the repository work). Whether a path exists in the named
    step's output is known only once that step has committed."""
    pushed: tuple[int, str] | None = None
    for i, step in enumerate(spec.steps):
        if step.kind not in effect_kinds:
            if pushed is not None:
                raise InvalidRequest(
                    f"'plan.steps[{i}]': step {step.name!r} is a {step.kind} step after the"
                    f" git.push step {pushed[1]!r} (plan.steps[{pushed[0]}]): a push ends the"
                    " task's repository work, so only effect steps may follow it; move the"
                    " push after it"
                )
            continue
        where = f"plan.steps[{i}].payload"
        if step.kind == "git.push" and not spec.repository:
            raise InvalidRequest(
                f"'{where}': step {step.name!r} is a git.push: only a task bound to a"
                " repository can push"
            )
        if step.kind == "git.push" and pushed is None:
            pushed = (i, step.name)
        twin = next((j for j, s in enumerate(spec.steps) if s.name == step.name and j != i), None)
        if twin is not None:
            raise InvalidRequest(
                f"'plan.steps[{i}].name': effect step {step.name!r} (plan.steps[{i}]) has the"
                f" name of plan.steps[{twin}]: an operator opens a gate and answers for an"
                " effect by its step's name, so give each effect step a name of its own"
            )
        if step.kind == "http" and isinstance(step.payload, dict):
            check_url_authority(step.payload.get("url"), f"{where}.url")
        before = [s.name for s in spec.steps[:i]]
        payload = step.payload if isinstance(step.payload, dict) else {}
        try:
            for ref in _effect_placeholders(step.kind, payload, where, before):
                if not isinstance(ref, templates.StepRef):
                    continue
                twins = before.count(ref.step)
                if twins > 1:
                    raise templates.TemplateError(
                        f"{where}: placeholder names step {ref.step!r}, and {twins} earlier"
                        " steps have that name"
                    )
        except templates.TemplateError as exc:
            raise InvalidRequest(f"'{str(exc).partition(': ')[0]}': {exc}") from None


def check_url_authority(url: Any, where: str) -> None:
    """`InvalidRequest` for a step placeholder in the scheme or authority of an `http`
    effect's URL (everything before the first `/` after `://`): an earlier step's output (a
    model's words) would choose the host that the request, its credentials and its body go
    to. Placeholders belong in the path, the query or the body."""
    if not isinstance(url, str):
        return
    scheme_end = url.find("://")
    start = 0 if scheme_end < 0 else scheme_end + 3
    slash = url.find("/", start)
    authority = url if slash < 0 else url[:slash]
    if "{{" in authority:
        raise InvalidRequest(
            f"'{where}': a placeholder in the URL's scheme or host ({authority[:80]!r}) would"
            " let an earlier step's output choose where the request (and its credentials) is"
            " sent: write the scheme and host literally; placeholders may fill the path,"
            " query or body"
        )


def check_destinations(tx: Tx, spec: TaskSpec) -> None:
    """`InvalidRequest` for an `http` step whose URL, or a `git.push` whose repository's URL,
    goes where the supervisor's `effect_allowed_hosts` do not allow for the task's tenant
    (docs/design.md, Effects: Destinations). Plan text only: no name is resolved here; the
    dispatcher checks the addresses it connects to at each send."""
    rule = tx.config.effect_destinations
    for i, step in enumerate(spec.steps):
        problem = None
        if step.kind == "http" and isinstance(step.payload, dict):
            where = f"plan.steps[{i}].payload.url"
            problem = rule.refuse_url(spec.tenant, str(step.payload.get("url")))
        elif step.kind == "git.push" and spec.repository is not None:
            where = "repository"
            remote = repositories.find_repository(tx, spec.tenant, spec.repository)
            if remote is not None:
                problem = rule.refuse_remote(spec.tenant, remote.url)
        if problem is not None:
            raise InvalidRequest(f"'{where}': step {step.name!r}: {problem}")


def _effect_placeholders(
    kind: str, payload: dict[str, Any], where: str, before: list[str]
) -> list[templates.Placeholder]:
    """The placeholders of an effect step's payload, checked: credentials only in an `http`
    step's header values (anywhere in a registered kind's payload, for its deliverer)."""
    if kind == "git.push":
        return []
    if kind != "http":
        return templates.check(payload, where, earlier=before, credentials_allowed=True)
    found: list[templates.Placeholder] = []
    for field in ("url", "body"):
        found += templates.check(
            payload.get(field), f"{where}.{field}", earlier=before, credentials_allowed=False
        )
    found += templates.check(
        payload.get("headers"), f"{where}.headers", earlier=before, credentials_allowed=True
    )
    return found


def credentials_named(spec: TaskSpec, effect_kinds: Collection[str]) -> set[str]:
    """Every credential the plan's effect steps name (a push's `credential`, and
    `{{ credential.<name> }}` placeholders), for the API adapter to check against the
    credentials folder at create."""
    named: set[str] = set()
    for step in spec.steps:
        if step.kind not in effect_kinds or not isinstance(step.payload, dict):
            continue
        if step.kind == "git.push":
            credential = step.payload.get("credential")
            if isinstance(credential, str):
                named.add(credential)
            continue
        try:
            named |= templates.credential_names(step.payload)
        except templates.TemplateError:
            continue  # refused by `check_effects`
    return named


def verifier_pool(tx: Tx, spec: TaskSpec) -> str | None:
    """The pool whose runners re-run the task's checks: the body's `verify`, else its
    tenant's default (`tether-supervisor tenant --verify-pool`) for a task that has checks."""
    if spec.verify is not None:
        return spec.verify
    if not spec.checks or not spec.repository:
        return None
    row = tx.one("tenant_verify_pool", tenant=spec.tenant)
    if row is None or row["verify_pool"] is None:
        return None
    pool = str(row["verify_pool"])
    check_verify_pool(spec, pool, f"tenant {spec.tenant!r}'s default verifier pool", tx)
    return pool


def existing_task(tx: Tx, spec: TaskSpec) -> Created | None:
    """The task that `spec`'s idempotency key already names, if it has the same plan and
    declarations; `IdempotencyConflict` if it has others; None for a new key."""
    row = tx.one_as(
        TaskRow,
        "task_by_idempotency_key",
        tenant=spec.tenant,
        idempotency_key=spec.idempotency_key,
    )
    if row is None:
        return None
    declared = spec.declared()  # by column name: the columns a retry must repeat
    same = row.plan_hash == spec.plan_hash and all(
        getattr(row, k) == v for k, v in declared.items()
    )
    if not same:
        raise IdempotencyConflict(
            f"idempotency key {spec.idempotency_key!r} already names task {row.id}"
            " with another plan"
        )
    return Created(task_id=row.id, created=False)


def create_task(tx: Tx, spec: TaskSpec) -> Created:
    """Record the task and every step's intent; return the existing task for a duplicate."""
    validate(spec, tx.config.max_steps, tx)
    existing = existing_task(tx, spec)
    if existing is not None:
        return existing
    check_kinds(tx, spec)
    check_repository(tx, spec)
    check_effects(spec, tx.config.effect_kinds)
    check_destinations(tx, spec)
    plan_hash = spec.plan_hash
    declared = spec.declared()
    verify_pool = verifier_pool(tx, spec)
    task_id = tx.new_id()
    order = tx.one("next_created_order")
    assert order is not None
    tx.run(
        "insert_task",
        task_id=task_id,
        tenant=spec.tenant,
        idempotency_key=spec.idempotency_key,
        plan_hash=plan_hash,
        plan_json=dumps(spec.plan),
        repository=declared["repository"],
        declared_base_sha=declared["declared_base_sha"],
        requirement_revision=declared["requirement_revision"],
        allowed_paths_json=declared["allowed_paths_json"],
        expected_checks_json=declared["expected_checks_json"],
        checks_json=declared["checks_json"],
        owner=declared["owner"],
        pool=declared["pool"],
        verify_pool=verify_pool,
        created_order=order["n"],
        now=tx.now,
    )
    tx.many(
        "insert_planned_step",
        [
            {
                "step_id": step_id_for(task_id, i),
                "task_id": task_id,
                "position": i,
                "task_order": order["n"],
                "name": s.name,
                "kind": s.kind,
                "payload_json": dumps(s.payload),
                "payload_hash": content_hash(s.payload),
            }
            for i, s in enumerate(spec.steps)
        ],
    )
    tx.run("insert_tenant", tenant=spec.tenant)
    append_event(
        tx,
        task_id,
        "state",
        TaskState.PLANNED,
        {"plan_hash": plan_hash, "idempotency_key": spec.idempotency_key},
    )
    tx.note(
        Decision.CREATED,
        task_id=task_id,
        tenant=spec.tenant,
        pool=spec.pool,
        plan_hash=plan_hash,
        steps=len(spec.steps),
    )
    return Created(task_id=task_id, created=True)
