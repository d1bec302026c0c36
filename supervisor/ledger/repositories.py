"""The repositories the supervisor knows: a tenant's name for a repository, and the git URL it
is read from (`tether-supervisor repo add`). Reachability is checked by the adapter that adds
one (`git ls-remote`), never here: a rule does no I/O.

A URL is handed to the runners of the repository's tasks, on borrowed servers (docs/design.md,
Borrowed servers), so one that holds a password (or an http(s) user, often a token) is refused:
read access belongs in the runner's SSH agent or credential store, never in a URL.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from tether.supervisor.ledger import names
from tether.supervisor.ledger.errors import InvalidRequest, NotFound
from tether.supervisor.ledger.records import CommittedCandidate, RemoteRow, TaskOfStep, TaskRow
from tether.supervisor.ledger.tx import Tx, TypedReads, dumps, loads
from tether.wire.payloads import ENTRY_KINDS, command_line_problem

MAX_URL = 2000
MAX_SETUP_COMMANDS = 20
MAX_SETUP_COMMAND = 2000
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SCHEMES = frozenset({"file", "ssh", "git", "http", "https"})
_SCHEME_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)")
_TRANSPORT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*::")  # git's `ext::cmd`, `fd::`: commands
_SCP_LIKE = re.compile(r"[^/:]+:")  # `[user@]host:path`: a colon before any slash


@dataclasses.dataclass(frozen=True, kw_only=True)
class Repository:
    tenant: str
    name: str
    url: str
    added_at: float
    # Command lines every agent step of its tasks runs first in its worktree (runner/agent/
    # setup.py): with the network, in the sandbox, before the model writes anything.
    setup: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Binding:
    """What a repository-bound task's approval binds, as the adapters need it (to read the
    head at approval, and to gather a report's evidence)."""

    task_id: str
    tenant: str
    pool: str
    repository: str  # the tenant's name for it
    url: str
    approved_base: str | None  # None before approval
    allowed_paths: tuple[str, ...]
    expected_checks: tuple[str, ...]
    verifies: str | None = None  # a verify step's binding: the candidate it re-checks
    # What its agent steps' payloads allow a candidate to hold, together.
    allowed_entries: tuple[str, ...] = ("file",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
    """A committed step's candidate and the bundle it came in: what a mirror made anew gets
    back (`committed_candidates`)."""

    task_id: str
    step_id: str
    fence: int
    sha: str
    bundle: str


def check_repository_name(name: str) -> str:
    """Return `name` if it may name a repository (it appears in a route's path and in lines)."""
    if not _NAME.fullmatch(name):
        raise InvalidRequest(
            f"repository name {name!r} is not allowed: letters, digits and . _ -, starting"
            " with a letter or digit, 1..100"
        )
    return name


def check_url(url: str) -> str:
    """Return `url` if git may be pointed at it: a path (absolute), `file://`, `ssh://`,
    `git://`, `http(s)://`, or scp-like `[user@]host:path`; never one holding a password."""
    if not url or len(url) > MAX_URL or not url.isprintable() or any(c.isspace() for c in url):
        raise InvalidRequest(f"a repository URL is 1..{MAX_URL} printable characters, no spaces")
    if url.startswith("-"):
        raise InvalidRequest("a repository URL must not start with '-'")
    if _TRANSPORT.match(url):
        raise InvalidRequest("a repository URL must not name a git transport ('<name>::')")
    scheme_url = _SCHEME_URL.fullmatch(url)
    scheme = scheme_url["scheme"].lower() if scheme_url else None
    userinfo, at, _ = (scheme_url["rest"] if scheme_url else url).partition("/")[0].rpartition("@")
    # An http(s) user is as often a token (`https://TOKEN@host/...`) as a name.
    if at and (":" in userinfo or scheme in {"http", "https"}):
        # Not echoed: the secret is the one thing this message must not print.
        raise InvalidRequest(
            "a repository URL must not hold a password, nor an http(s) user (it is handed"
            " to runners): give read access through the runner's SSH agent or credential store"
        )
    if scheme is not None:
        if scheme not in _SCHEMES:
            raise InvalidRequest(
                f"a repository URL's scheme is one of {', '.join(sorted(_SCHEMES))}"
            )
        return url
    if url.startswith("/") or _SCP_LIKE.match(url):
        return url
    raise InvalidRequest(f"a repository path must be absolute, got {url!r}")


def check_setup(setup: tuple[str, ...]) -> tuple[str, ...]:
    """`setup` as a repository's setup commands, or `InvalidRequest` naming what is wrong."""
    if len(setup) > MAX_SETUP_COMMANDS:
        raise InvalidRequest(f"at most {MAX_SETUP_COMMANDS} setup commands, got {len(setup)}")
    for i, command in enumerate(setup):
        problem = command_line_problem(command)
        if problem is None and len(command) > MAX_SETUP_COMMAND:
            problem = f"longer than {MAX_SETUP_COMMAND} characters"
        if problem is None and "\0" in command:
            problem = "it holds a NUL"
        if problem is not None:
            raise InvalidRequest(f"setup command {i + 1}: {problem}")
    return setup


def add_repository(
    tx: Tx, tenant: str, name: str, url: str, setup: tuple[str, ...] | None = None
) -> tuple[Repository, bool]:
    """Record that `tenant`'s repository `name` is read from `url`, with `setup` (none when
    None); return it and whether it is new. Adding it again with the same URL changes nothing
    but its setup commands when `setup` is given; with another URL is refused."""
    names.check_tenant_name(tenant, tx)
    check_repository_name(name)
    check_url(url)
    if setup is not None:
        check_setup(setup)
    held = _find(tx, tenant, name)
    if held is not None:
        if held.url != url:
            raise InvalidRequest(
                f"repository {name!r} of tenant {tenant!r} is read from {held.url}:"
                " remove it first to give it another URL"
            )
        if setup is None or setup == held.setup:
            return held, False
        tx.run("update_repository_setup", setup_json=dumps(list(setup)), tenant=tenant, name=name)
        return dataclasses.replace(held, setup=setup), False
    setup = setup or ()
    tx.run(
        "insert_repository_remote",
        tenant=tenant,
        name=name,
        url=url,
        now=tx.now,
        setup_json=dumps(list(setup)),
    )
    return Repository(tenant=tenant, name=name, url=url, added_at=tx.now, setup=setup), True


def remove_repository(tx: Tx, tenant: str, name: str) -> Repository:
    """Forget `tenant`'s repository `name`; refused while a task that has not ended names it."""
    held = _find(tx, tenant, name)
    if held is None:
        raise NotFound(f"tenant {tenant!r} has no repository {name!r}")
    busy = tx.one("task_keeping_repository", tenant=tenant, name=name)
    if busy is not None:
        raise InvalidRequest(
            f"repository {name!r} is named by task {busy['id']}, which has not ended:"
            " cancel it or let it end first"
        )
    tx.run("delete_repository_remote", tenant=tenant, name=name)
    return held


def find_repository(s: TypedReads, tenant: str, name: str) -> Repository | None:
    """`tenant`'s repository `name`, or None when the supervisor does not know it."""
    return _find(s, tenant, name)


def list_repositories(s: TypedReads, tenant: str | None = None) -> list[Repository]:
    """The repositories known, by tenant and name (only `tenant`'s when given)."""
    if tenant is None:
        rows = s.all_as(RemoteRow, "all_repository_remotes")
    else:
        rows = s.all_as(RemoteRow, "repository_remotes_of_tenant", tenant=tenant)
    return [_record(r) for r in rows]


def committed_candidates(s: TypedReads, url: str) -> list[Candidate]:
    """Every committed candidate (with a bundle) of the tasks of repositories read from `url`."""
    return [
        Candidate(
            task_id=r.task_id,
            step_id=r.step_id,
            fence=r.fence,
            sha=r.candidate_sha,
            bundle=r.bundle,
        )
        for r in s.all_as(CommittedCandidate, "committed_candidates_of_url", url=url)
    ]


def _find(s: TypedReads, tenant: str, name: str) -> Repository | None:
    row = s.one_as(RemoteRow, "repository_remote", tenant=tenant, name=name)
    return None if row is None else _record(row)


def _record(row: RemoteRow) -> Repository:
    return Repository(
        tenant=row.tenant,
        name=row.name,
        url=row.url,
        added_at=row.added_at,
        setup=tuple(loads(row.setup_json)),
    )


def binding_of_task(s: TypedReads, tenant: str | None, task_id: str) -> Binding | None:
    """The binding of `tenant`'s task `task_id` (None: any tenant's, for commands on the
    ledger itself); None when it names no repository. `NotFound` when there is no such task."""
    if tenant is None:
        task = s.one_as(TaskRow, "task_by_id", task_id=task_id)
    else:
        task = s.one_as(TaskRow, "owned_task", task_id=task_id, tenant=tenant)
    if task is None:
        raise NotFound(f"no task {task_id}")
    return _binding(s, task)


def binding_of_step(s: TypedReads, step_id: str, pool: str | None) -> Binding | None:
    """The binding of the task of step `step_id`; None when it names no repository. `NotFound`
    when there is no such step, or it is not of `pool` (a runner's, when given)."""
    task = s.one_as(TaskOfStep, "task_row_of_step", step_id=step_id)
    if task is None or (pool is not None and task.step_pool != pool):
        raise NotFound(f"no step {step_id}")
    binding = _binding(s, task)
    if binding is None:
        return None
    # The step's own pool (a verify step's is the verifier pool): its runners' uploads count.
    return dataclasses.replace(binding, pool=task.step_pool, verifies=task.verifies)


def _binding(s: TypedReads, task: TaskRow) -> Binding | None:
    if not task.repository:
        return None
    held = _find(s, task.tenant, task.repository)
    if held is None:  # `repo remove` is refused while a task that has not ended names it
        raise NotFound(f"task {task.id}'s repository {task.repository!r} is no longer known")
    return Binding(
        task_id=task.id,
        tenant=task.tenant,
        pool=task.pool,
        repository=task.repository,
        url=held.url,
        approved_base=task.approved_base_sha,
        allowed_paths=tuple(loads(task.allowed_paths_json)),
        expected_checks=tuple(loads(task.expected_checks_json)),
        allowed_entries=allowed_entries(loads(task.plan_json)),
    )


def allowed_entries(plan: Any) -> tuple[str, ...]:
    """The kinds of entry the plan's agent steps allow (`AgentPayload.allowed_entries`, its
    default when left out), in `ENTRY_KINDS` order."""
    allowed = {"file"}
    for step in plan["steps"]:
        if step.get("kind") == "agent":
            allowed.update(step.get("payload", {}).get("allowed_entries", ("file",)))
    return tuple(kind for kind in ENTRY_KINDS if kind in allowed)
