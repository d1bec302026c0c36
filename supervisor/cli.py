"""`tether-supervisor`: serve the API, administer the ledger file, drive tasks, explore schedules.

The forms in docs/design.md, Command line and settings, are relied on by scripts outside this
repository; keep them exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether.cli import USAGE_EXIT, Parser, fail
from tether.settings import SettingsError, config_file_from, load_settings, read_secret
from tether.supervisor.ledger.states import TaskState

if TYPE_CHECKING:
    from tether.wire.records import TaskDetail

PROG = "tether-supervisor"
LEDGER = "ledger: a file, sqlite:///path or postgresql://..."


def build_parser() -> Parser:  # noqa: PLR0915 - one flat declaration of the CLI
    parser = Parser(prog=PROG, description="tether's supervisor: the ledger on the owned box.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    serve = sub.add_parser("serve", help="serve the HTTP API v1 over the ledger")
    serve.add_argument("--config", help="TOML settings file (default: $TETHER_CONFIG)")
    serve.add_argument(
        "--db",
        help="ledger: a file, sqlite:///path, or postgresql://... shared by any number of"
        " supervisors (default: tether.db)",
    )
    serve.add_argument("--host", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default: 8080)")

    init = sub.add_parser(
        "init",
        help="create a new, empty ledger: a file, or the tables in an empty database"
        " (no other command does)",
    )
    init.add_argument("--db", required=True, help=f"{LEDGER} to create")

    token = sub.add_parser("token", help="create, list and revoke bearer tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True, parser_class=Parser)
    create = token_sub.add_parser("create", help="create a token; prints it alone on stdout")
    create.add_argument("--db", required=True, help=LEDGER)
    create.add_argument(
        "--tenant", required=True, help="tenant (operator), pool (runner) or a label (metrics)"
    )
    create.add_argument("--role", required=True, choices=["operator", "runner", "metrics"])
    create.add_argument("--name", help="a name to tell the token apart by (e.g. box-17)")
    create.add_argument(
        "--init", action="store_true", help="create the ledger file if there is none"
    )
    listing = token_sub.add_parser("list", help="one line per token; never a secret")
    listing.add_argument("--db", required=True, help=LEDGER)
    revoke = token_sub.add_parser("revoke", help="revoke a token by its id or its name")
    revoke.add_argument("--db", required=True, help=LEDGER)
    revoke.add_argument("token", metavar="TOKEN", help="the token's id, or its name")

    check = sub.add_parser("check", help="integrity and ledger invariants; exit 1 on violation")
    check.add_argument("--db", required=True, help=LEDGER)

    backup = sub.add_parser("backup", help="online, consistent copy of the ledger")
    backup.add_argument("--db", required=True, help=LEDGER)
    backup.add_argument("dest", help="where to write the copy (must not exist)")

    budget = sub.add_parser(
        "budget", help="show or set a tenant's token budget (tasks wait past it)"
    )
    budget.add_argument("--db", required=True, help=LEDGER)
    budget.add_argument("--tenant", required=True)
    budget_action = budget.add_mutually_exclusive_group(required=True)
    budget_action.add_argument("--tokens", help="a whole number, or 'none' for unlimited")
    budget_action.add_argument(
        "--show", action="store_true", help="print tokens spent, the budget and what is left"
    )

    tenant = sub.add_parser(
        "tenant", help="set a tenant's default verifier pool (its checks re-run there)"
    )
    tenant.add_argument("--db", required=True, help=LEDGER)
    tenant.add_argument("--tenant", required=True)
    tenant.add_argument(
        "--verify-pool",
        required=True,
        help="the pool whose runners re-run the checks of the tenant's tasks, or 'none'",
    )

    repo = sub.add_parser("repo", help="add, list and remove the repositories tasks may name")
    repo_sub = repo.add_subparsers(dest="repo_command", required=True, parser_class=Parser)
    repo_add = repo_sub.add_parser("add", help="add a repository, once git can read its URL")
    repo_add.add_argument("name", metavar="NAME", help="the name tasks give as `repository`")
    repo_add.add_argument("--url", required=True, help="a path, file://, ssh://, https://, ...")
    repo_add.add_argument("--tenant", required=True, help="the tenant whose tasks may name it")
    repo_add.add_argument(
        "--setup",
        action="append",
        metavar="COMMAND",
        help="a command line each agent step runs in its worktree before the model (with the"
        " network, in the sandbox), e.g. 'uv sync --frozen'; repeat for several, in order;"
        " given again, they replace a known repository's",
    )
    repo_add.add_argument("--db", required=True, help=LEDGER)
    repo_list = repo_sub.add_parser(
        "list", help="one line per repository: TENANT NAME URL ADDED [setup=JSON]"
    )
    repo_list.add_argument("--db", required=True, help=LEDGER)
    repo_remove = repo_sub.add_parser("remove", help="forget a repository no running task names")
    repo_remove.add_argument("name", metavar="NAME")
    repo_remove.add_argument("--tenant", required=True)
    repo_remove.add_argument("--db", required=True, help=LEDGER)

    def operator_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--url", help="the supervisor's base URL (default: $TETHER_URL)")
        p.add_argument(
            "--token-file",
            help="operator token file (default: $TETHER_TOKEN_FILE, else"
            " $CREDENTIALS_DIRECTORY/operator-token)",
        )
        return p

    operator_flags(
        sub.add_parser("status", help="per pool: queued, in flight, oldest wait, runners seen")
    )

    task = sub.add_parser("task", help="submit, approve, cancel, show, list and watch tasks")
    task_sub = task.add_subparsers(dest="task_command", required=True, parser_class=Parser)

    def task_command(name: str, text: str) -> argparse.ArgumentParser:
        return operator_flags(task_sub.add_parser(name, help=text))

    submit = task_command("submit", "submit a task from a JSON file (the POST /v1/tasks body)")
    submit.add_argument("--file", required=True, help="task JSON: idempotency_key, plan, ...")
    submit.add_argument("--approve", action="store_true", help="approve the plan just sent")
    submit.add_argument(
        "--base-sha", help="base SHA to approve with (default: the file's base_sha)"
    )
    submit.add_argument(
        "--wait", action="store_true", help="then watch it to its end, with watch's exit status"
    )
    approve = task_command(
        "approve", "print a task's plan, then approve it (its plan hash and base SHA)"
    )
    approve.add_argument("task_id")
    approve.add_argument("--plan-hash", help="the plan hash to approve (default: the plan printed)")
    approve.add_argument("--base-sha")
    approve.add_argument(
        "--yes", action="store_true", help="approve without asking (read it with show --plan)"
    )
    cancel = task_command("cancel", "cancel a task that has not ended")
    cancel.add_argument("task_id")
    cancel.add_argument("--reason", default="cancelled by operator")
    gate = task_command(
        "gate", "show an effect's request and digest; open its gate; say if it happened"
    )
    gate.add_argument("task_id")
    gate.add_argument("step", metavar="STEP", help="the effect step's name")
    gate_action = gate.add_mutually_exclusive_group()
    gate_action.add_argument(
        "--open", action="store_true", help="open the gate for the request of --digest"
    )
    gate_action.add_argument(
        "--happened", choices=["yes", "no"], help="resolve an uncertain effect"
    )
    gate.add_argument("--digest", help="the digest shown for the request to open the gate for")
    show = task_command("show", "print a task with its steps, attempts and fences")
    show.add_argument("task_id")
    show.add_argument(
        "--plan", action="store_true", help="print its plan as submitted, laid out to read"
    )
    review = task_command("review", "print a task's review record, or record a decision")
    review.add_argument("task_id")
    review.add_argument("--decision", choices=["accept", "reject"], help="record this decision")
    review.add_argument("--note", default="", help="the reviewer's note")
    watch = task_command(
        "watch", "follow a task until it ends; exit 0 SUCCEEDED, 3 FAILED, 4 CANCELLED"
    )
    watch.add_argument("task_id")
    watch.add_argument("--after", type=int, default=0, help="start after this sequence number")
    task_list = task_command("list", "one line per task, newest first")
    task_list.add_argument("--state", choices=[s.value for s in TaskState], help="only these")
    candidate = task_command(
        "candidate", "a step's candidate against the approved base: --stat, --patch, --bundle"
    )
    candidate.add_argument("task_id")
    candidate.add_argument(
        "step", nargs="?", help="step name, id or 0-based position (default: the last with one)"
    )
    shown = candidate.add_mutually_exclusive_group()
    shown.add_argument("--stat", action="store_true", help="each file's counts (the default)")
    shown.add_argument("--patch", action="store_true", help="the patch, as git diff shows it")
    shown.add_argument(
        "--bundle", metavar="FILE", help="write a bundle: git fetch FILE tether/TASK_ID takes it"
    )
    candidate.add_argument("--db", help=f"{LEDGER} to read instead of the API (--url)")
    candidate.add_argument(
        "--mirror-dir", help="with --db: the supervisor's mirrors (default: mirrors/ beside it)"
    )
    output = task_command("output", "print a step's output: a chat step's text, else JSON")
    output.add_argument("task_id")
    output.add_argument(
        "step", nargs="?", help="step name or 0-based position (default: the last committed)"
    )

    logs = operator_flags(
        sub.add_parser(
            "logs",
            help="a task's journal and its runners' lines, merged in the owned box's order",
        )
    )
    logs.add_argument("task_id", metavar="TASK")
    logs.add_argument("--db", help=f"{LEDGER}, read directly instead of through --url")
    logs.add_argument(
        "--follow",
        action="store_true",
        help="go on until the task ends; exit 0 SUCCEEDED, 3 FAILED, 4 CANCELLED",
    )
    logs.add_argument("--json", action="store_true", help="one JSON object per line")

    artifact = sub.add_parser("artifact", help="read the artifact store")
    artifact_sub = artifact.add_subparsers(
        dest="artifact_command", required=True, parser_class=Parser
    )
    artifact_get = operator_flags(
        artifact_sub.add_parser("get", help="print an artifact's bytes to stdout")
    )
    artifact_get.add_argument("digest", metavar="DIGEST", help="the artifact's sha256")

    migrate = sub.add_parser(
        "migrate", help="copy a SQLite ledger into an empty PostgreSQL database, fences included"
    )
    migrate.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="LEDGER",
        help="the SQLite ledger: a path or sqlite:///path (stop its supervisor first)",
    )
    migrate.add_argument(
        "--to",
        dest="target",
        required=True,
        metavar="URL",
        help="the PostgreSQL database (postgresql://...): migrated if empty, refused otherwise",
    )
    migrate.add_argument(
        "--artifact-dir",
        dest="artifact_dir",
        metavar="DIR",
        default=None,
        help="the SQLite ledger's artifact files (default: artifacts/ beside the ledger file)",
    )

    chaos = sub.add_parser(
        "chaos", help="schedule exploration against the real ledger", add_help=False
    )
    chaos.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from tether.supervisor.server import serve

    try:
        from tether.supervisor.settings import SupervisorSettings

        settings = load_settings(
            SupervisorSettings,
            config_file=config_file_from(args.config),
            flags={"db": args.db, "host": args.host, "port": args.port},
        )
    except SettingsError as exc:
        fail(PROG, str(exc), USAGE_EXIT)  # a bad setting is a usage error
    return serve(settings)


def _admin(args: argparse.Namespace) -> int:
    from tether.supervisor import admin

    db = _ledger_arg(args.db)
    try:
        shown = admin.backend_of(db).where  # a database without its password
        if args.command == "init":
            if admin.init_ledger(db):
                print(f"created ledger {shown}", file=sys.stderr)
            else:
                print(f"ledger {shown} exists; left as it was", file=sys.stderr)
        elif args.command == "token":
            if args.token_command == "create":  # noqa: S105
                _create_token(db, args)
            elif args.token_command == "list":  # noqa: S105
                for line in admin.list_tokens(db):
                    print(line)
            else:
                revoked = admin.revoke_token(db, args.token)
                print(f"revoked {_token_label(revoked.id, revoked.name)}", file=sys.stderr)
        elif args.command == "check":
            problems = admin.check(db)
            for problem in problems:
                print(problem)
            if problems:
                return 1
            print(f"ok: {shown} passes integrity and every ledger invariant")
        elif args.command == "backup":
            admin.backup(db, Path(args.dest))
            print(f"backed up {shown} to {args.dest}", file=sys.stderr)
        elif args.command == "repo":
            _repo(db, args)
        elif args.command == "tenant":
            pool = None if args.verify_pool.strip().lower() == "none" else args.verify_pool
            admin.set_tenant_verify_pool(db, args.tenant, pool)
            print(f"tenant={args.tenant} verify_pool={pool or 'none'}", file=sys.stderr)
        elif args.command == "budget" and args.show:
            print(admin.show_budget(db, args.tenant))
        elif args.command == "budget":
            raw = args.tokens.strip().lower()
            if raw != "none" and not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
                fail(
                    PROG, "--tokens must be a whole number (up to 18 digits) or 'none'", USAGE_EXIT
                )
            admin.set_tenant_budget(db, args.tenant, None if raw == "none" else int(raw))
    except admin.AdminError as exc:
        fail(PROG, str(exc))
    return 0


def _migrate(args: argparse.Namespace) -> int:
    """`migrate --from --to`: the copy's summary on stdout; one line and exit 1 otherwise."""
    from tether.supervisor import admin, migrate_command

    try:
        folder = None if args.artifact_dir is None else Path(args.artifact_dir)
        print(migrate_command.run(args.source, args.target, folder))
    except admin.AdminError as exc:
        fail(PROG, str(exc))
    return 0


def _ledger_arg(raw: str) -> Path | str:
    """`--db` as the admin commands take it: a URL as given (`sqlite:///`, `postgresql://`,
    or one they refuse in one line), a plain path as a Path."""
    return raw if "://" in raw else Path(raw)


def _repo(db: Path | str, args: argparse.Namespace) -> None:
    """`repo add` and `repo remove` say what they did on stderr; `repo list` prints lines."""
    from tether.supervisor import admin

    if args.repo_command == "add":
        setup = None if args.setup is None else tuple(args.setup)
        added, head, created = admin.add_repository(db, args.tenant, args.name, args.url, setup)
        what = "added" if created else "already known:"
        shown = head or "none (an empty repository)"
        runs = f", setup: {len(added.setup)} command(s)" if added.setup else ""
        print(
            f"{what} repository {added.name} of tenant {added.tenant}, HEAD {shown}{runs}",
            file=sys.stderr,
        )
    elif args.repo_command == "list":
        for line in admin.list_repositories(db):
            print(line)
    else:
        removed = admin.remove_repository(db, args.tenant, args.name)
        print(f"removed repository {removed.name} of tenant {removed.tenant}", file=sys.stderr)


def _token_label(token_id: str, name: str | None) -> str:
    return f"token {token_id}" + (f" name={name}" if name else "")


def _create_token(db: Path | str, args: argparse.Namespace) -> None:
    """The secret alone on stdout (scripts pipe it into a file); its id on stderr."""
    from tether.supervisor import admin

    new_ledger = not admin.ledger_exists(db)
    created = admin.create_token(db, args.tenant, args.role, name=args.name, init=args.init)
    print(created.secret)
    where = f" in a new ledger {admin.backend_of(db).where}" if new_ledger else ""
    print(f"created {_token_label(created.id, created.name)}{where}", file=sys.stderr)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


@contextlib.contextmanager
def _operator_session(args: argparse.Namespace) -> Iterator[Any]:
    """An operator client for one command: closed at the end, and a `ClientError` raised
    inside becomes the command's one line on stderr and exit 1."""
    from tether.supervisor import operator_client as oc

    client = _operator_client(args)
    try:
        yield client
    except oc.ClientError as exc:
        fail(PROG, str(exc))
    finally:
        client.close()


def _operator_client(args: argparse.Namespace) -> Any:
    """The client `task`, `status` and `artifact` talk through: flags first, then `TETHER_URL`
    and `TETHER_TOKEN_FILE`, then systemd's `$CREDENTIALS_DIRECTORY/operator-token`."""
    from tether.supervisor import operator_client as oc

    url = args.url or os.environ.get("TETHER_URL")
    if not url:
        fail(PROG, "give the supervisor's URL: --url URL, or set TETHER_URL", USAGE_EXIT)
    token_file = args.token_file or os.environ.get("TETHER_TOKEN_FILE")
    try:
        token = read_secret(Path(token_file) if token_file else None, "operator-token", os.environ)
    except SettingsError as exc:
        fail(PROG, f"{exc} (--token-file F, or TETHER_TOKEN_FILE)" if not token_file else str(exc))
    try:
        return oc.OperatorClient(url, token)
    except oc.ClientError as exc:
        fail(PROG, str(exc))


def _watch(client: Any, task_id: str, after: int = 0) -> int:
    """Watch `task_id` to its end; its exit status: 0 SUCCEEDED, 3 FAILED, 4 CANCELLED."""
    from tether.supervisor import operator_client as oc

    final = oc.watch(client, task_id, after=after)
    print(f"task {task_id} ended {final}", file=sys.stderr)
    return oc.EXIT_CODES.get(final, 1)


def _candidate(args: argparse.Namespace) -> int:
    """`task candidate`: through the API (`--url`), or from the ledger and its mirrors on the
    owned box (`--db`). The bundle goes to FILE and the command to take it to stderr."""
    import anyio

    from tether.supervisor import admin
    from tether.supervisor import operator_client as oc
    from tether.supervisor.repos import diffs

    if args.db is None and args.mirror_dir is not None:
        fail(PROG, "--mirror-dir goes with --db", USAGE_EXIT)
    if args.db is not None:
        try:
            mirrors = None if args.mirror_dir is None else Path(args.mirror_dir)
            db = _ledger_arg(args.db)
            mirror, chosen = admin.candidate(db, args.task_id, args.step, mirrors)
            if args.bundle:
                data = anyio.run(diffs.bundle, mirror, chosen)
            else:
                view = anyio.run(diffs.diff, mirror, chosen).view()
        except (admin.AdminError, diffs.CandidateError) as exc:
            fail(PROG, str(exc))
        task_id = chosen.task_id
    else:
        with _operator_session(args) as client:
            view = client.candidate(args.task_id, args.step)
            task_id = view.task_id
            if args.bundle:
                data = client.candidate_bundle(task_id, args.step)
    if not args.bundle:
        print(oc.candidate_text(view, patch=args.patch))
        return 0
    try:
        Path(args.bundle).write_bytes(data)
    except OSError as exc:
        fail(PROG, f"cannot write {args.bundle}: {exc.strerror or exc}")
    branch = diffs.branch_of(task_id)
    print(
        f"wrote {args.bundle}: take it with git fetch {args.bundle} {branch}:{branch}",
        file=sys.stderr,
    )
    return 0


def _task(args: argparse.Namespace) -> int:
    from tether.supervisor import operator_client as oc

    if args.task_command == "candidate":
        return _candidate(args)
    with _operator_session(args) as client:
        if args.task_command == "submit":
            body = oc.load_task_file(Path(args.file))
            answered, created = client.submit(body)
            task = oc.view_of(answered)
            if not created:
                print(f"existing task {task.id} (state {task.state}) returned", file=sys.stderr)
            if args.approve:
                # The base SHA the file declares is the one to approve unless told otherwise.
                base_sha = args.base_sha or body.get("base_sha")
                answered = client.approve(task.id, oc.plan_hash_of(body), base_sha)
                task = oc.view_of(answered)
            if args.wait:
                print(f"task {task.id} is {task.state}", file=sys.stderr)
                return _watch(client, task.id)
            _print_json(answered)
        elif args.task_command == "approve":
            return _approve(client, args)
        elif args.task_command == "cancel":
            _print_json(client.cancel(args.task_id, args.reason))
        elif args.task_command == "review":
            _print_json(client.review(args.task_id, args.decision, args.note))
        elif args.task_command == "gate":
            return _gate(client, args)
        elif args.task_command == "show" and args.plan:
            print(_plan_text(client.view(args.task_id)))
        elif args.task_command == "show":
            shown = client.show(args.task_id)
            _print_json(shown)
            view = oc.view_of(shown)
            if view.waiting_for is not None:
                print(oc.waiting_line(view.waiting_for, view.id), file=sys.stderr)
            if view.checks_standing is not None:
                print(f"checks: {view.checks_standing}", file=sys.stderr)
        elif args.task_command == "list":
            print(oc.TASK_HEADER)
            for summary in client.tasks(args.state):
                print(oc.task_line(summary))
        elif args.task_command == "output":
            print(oc.output_text(oc.pick_step(client.view(args.task_id), args.step)))
        else:
            return _watch(client, args.task_id, args.after)
    return 0


def _plan_text(task: TaskDetail) -> str:
    """A task view's plan laid out to read; one line and exit 1 if the view has none."""
    from tether.supervisor.plan_reading import plan_text, task_plan

    reading = task_plan(task)
    if reading is None:
        fail(PROG, "the supervisor's task view carries no plan (a supervisor older than it)")
    return plan_text(reading)


def _approve(client: Any, args: argparse.Namespace) -> int:
    """`task approve TASK_ID`: print the plan, ask, approve the hash of the plan printed. The
    question is skipped with `--yes`, or for a script that names the hash (`--plan-hash`, the
    form scripts relied on before the question existed); a script that names neither is
    told to, since nobody can read the plan there."""
    task = client.view(args.task_id)
    interactive = sys.stdin.isatty()
    if not args.yes and not interactive and args.plan_hash is None:
        fail(
            PROG,
            "approving needs an answer and stdin is not a terminal: read the plan"
            f" (task show {args.task_id} --plan), then approve with --yes",
        )
    if not args.yes and interactive:
        print(_plan_text(task))
        try:
            answer = input(f"approve task {task.id} with plan {task.plan_hash}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            fail(PROG, f"not approved: task {task.id} stays {task.state}")
    plan_hash = args.plan_hash or task.plan_hash
    _print_json(client.approve(task.id, plan_hash, args.base_sha))
    return 0


def _gate(client: Any, args: argparse.Namespace) -> int:
    """`task gate TASK_ID STEP`: print the effect's request and digest; with `--open --digest
    D` open its gate for that digest (without `--digest`: the request, then a one-line hint
    and exit 1); with `--happened yes|no` resolve an uncertain effect."""
    from tether.supervisor import operator_client as oc

    if args.digest and not args.open:
        fail(PROG, "--digest goes with --open", USAGE_EXIT)
    if args.happened is not None:
        answered = client.effect_happened(args.task_id, args.step, args.happened == "yes")
        step, effect = oc.effect_of(oc.view_of(answered), args.step)  # the route answers the view
        print(f"effect {step.name!r} of task {args.task_id} is {effect.state}")
        return 0
    step, effect = oc.effect_of(client.view(args.task_id), args.step)
    if args.open and args.digest:
        client.open_gate(args.task_id, args.step, args.digest.strip().lower())
        print(f"gate of effect {step.name!r} opened for digest {args.digest.strip().lower()}")
        return 0
    print(oc.gate_text(step, effect))
    if args.open:
        fail(
            PROG,
            f"read the request above, then open the gate for exactly it: tether-supervisor task"
            f" gate {args.task_id} {args.step} --open --digest {effect.digest}",
        )
    return 0


def _status(args: argparse.Namespace) -> int:
    from tether.supervisor import operator_client as oc

    with _operator_session(args) as client:
        for line in oc.status_lines(client.pools()):
            print(line)
    return 0


def _logs(args: argparse.Namespace) -> int:
    """`logs TASK`: from the ledger with `--db`, else through the API like `task`."""
    from tether.supervisor import admin, task_logs

    options = {"as_json": args.json, "follow": args.follow}
    if args.db is not None:
        if args.url is not None:
            fail(PROG, "give --db or --url, not both", USAGE_EXIT)
        try:
            source = task_logs.LedgerLogs(_ledger_arg(args.db), args.task_id)
            return task_logs.print_log(source, sys.stdout, **options)
        except admin.AdminError as exc:
            fail(PROG, str(exc))
    with _operator_session(args) as client:
        return task_logs.print_log(task_logs.ApiLogs(client, args.task_id), sys.stdout, **options)


def _artifact(args: argparse.Namespace) -> int:
    """`artifact get DIGEST`: the bytes alone on stdout, as they were uploaded."""

    with _operator_session(args) as client:
        data = client.artifact(args.digest.strip().lower())
    sys.stdout.buffer.write(data)
    return 0


def _chaos(argv: list[str]) -> int:
    """`chaos ...` belongs to the schedule explorer, which parses its own arguments. It is
    imported by name so the CLI still replies (with one line) where it is not installed."""
    import importlib

    try:
        explore = importlib.import_module("tether.sim.explore")
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("tether.sim"):
            raise
        fail(PROG, "the schedule explorer (tether.sim.explore) is not installed")
    return int(explore.main(argv))


def _run(argv: list[str]) -> int:
    if argv[:1] == ["chaos"]:
        return _chaos(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "task":
        return _task(args)
    if args.command == "status":
        return _status(args)
    if args.command == "artifact":
        return _artifact(args)
    if args.command == "logs":
        return _logs(args)
    if args.command == "migrate":
        return _migrate(args)
    return _admin(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        code = _run(argv)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then ours to handle
    except BrokenPipeError:
        # `task show | head`: the reader left. No traceback; what is left goes nowhere, and
        # the exit status says the output was cut short (as Python's documentation advises).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


if __name__ == "__main__":
    raise SystemExit(main())
