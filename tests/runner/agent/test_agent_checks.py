"""A repository-bound agent step's delivery (issue 12, item 4): the checks run at the candidate
in a clean checkout with their exit codes and full logs uploaded, and the bundle that carries
exactly the candidate; start_bundle chaining from one step's candidate to the next step."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from tests.agent_repos import make_origin, sh
from tests.agent_services import FakeServices, ScriptedChat, call, lease_repository
from tether.runner.agent import AgentKind, NoSandbox
from tether.runner.agent.checks import TIMED_OUT_EXIT_CODE, CheckLimits
from tether.runner.kinds.base import StepContext
from tether.wire.records import LeaseRepository

ASK = [{"role": "user", "content": "Make the test pass."}]
FIXED = "def answer():\n    return 42\n"


def py(code: str) -> str:
    return shlex.join([sys.executable, "-c", code])


def context(
    chat: ScriptedChat,
    services: FakeServices,
    repo: LeaseRepository,
    *,
    step_id: str = "step-1",
    commands: tuple[str, ...] = (),
    check_timeout_s: float | None = None,
) -> StepContext:
    payload: dict[str, object] = {"messages": ASK, "allowed_commands": list(commands)}
    if check_timeout_s is not None:
        payload["check_timeout_s"] = check_timeout_s
    return StepContext(
        step_id=step_id,
        task_id="task-1",
        name="fix",
        attempt=1,
        fence=1,
        payload=payload,
        outputs=(),
        default_model="m",
        chat=chat,
        repository=repo,
        services=services,
    )


def agent(tmp_path: Path, name: str = "cache", **kw: object) -> AgentKind:
    """An agent kind whose checks run without bubblewrap, as the operator allowed."""
    return AgentKind(
        cache_dir=tmp_path / name,
        sandbox=NoSandbox(),
        commands_without_sandbox=True,
        **kw,  # type: ignore[arg-type]
    )


TESTS = py("import sys; sys.path.insert(0, 'src'); import app; assert app.answer() == 42")
FAILS = py("import sys; print('broken on purpose'); sys.stdout.flush(); sys.exit(3)")


async def test_checks_run_at_the_candidate_with_their_exit_codes_and_logs(
    tmp_path: Path,
) -> None:
    origin, base = make_origin(tmp_path / "origin")
    repo = lease_repository(str(origin), base, checks={"tests": TESTS, "lint": FAILS})
    services = FakeServices()
    chat = ScriptedChat([call("write_file", path="src/app.py", content=FIXED)], "fixed")
    done = await agent(tmp_path)(context(chat, services, repo))

    assert done.candidate_sha is not None
    assert set(done.checks) == {"tests", "lint"}
    tests, lint = done.checks["tests"], done.checks["lint"]
    assert (tests.exit_code, lint.exit_code) == (0, 3)
    assert services.store[lint.log] == b"broken on purpose\n"
    assert services.store[tests.log] == b""
    assert tests.duration_s >= 0
    assert done.output["checks"]["lint"] == {
        "exit_code": 3,
        "duration_s": lint.duration_s,
        "log": lint.log,
    }
    assert done.output["cleanup"]["gone"] is True


async def test_a_check_cannot_see_files_written_outside_the_allowed_paths(
    tmp_path: Path,
) -> None:
    origin, base = make_origin(tmp_path / "origin")
    # The agent's allowed command writes inside and outside src/; the candidate holds only
    # the first, and so does the check's checkout (no leftovers, no ignored files).
    writer = py(
        "open('src/extra.py', 'w').write('E = 1\\n');"
        " open('tests/conftest.py', 'w').write('raise SystemExit(0)\\n');"
        " open('scratch.log', 'w').write('x'); open('README.md', 'w').write('hacked\\n')"
    )
    sees = py(
        "import os, sys;"
        " print(sorted(p for p in ('src/extra.py', 'tests/conftest.py', 'scratch.log')"
        " if os.path.exists(p)), open('README.md').read(), end='')"
    )
    repo = lease_repository(str(origin), base, checks={"sees": sees})
    services = FakeServices()
    chat = ScriptedChat([call("run", command=writer)], "wrote")
    done = await agent(tmp_path)(context(chat, services, repo, commands=(writer,)))

    assert services.store[done.checks["sees"].log] == b"['src/extra.py'] # demo\n"
    assert done.checks["sees"].exit_code == 0


async def test_a_step_without_a_candidate_runs_no_check(tmp_path: Path) -> None:
    origin, base = make_origin(tmp_path / "origin")
    repo = lease_repository(str(origin), base, checks={"lint": FAILS})
    services = FakeServices()
    done = await agent(tmp_path)(context(ScriptedChat("nothing to do"), services, repo))
    assert done.candidate_sha is None
    assert (done.checks, done.bundle) == ({}, None)
    assert services.store == {}


async def test_a_long_log_is_capped_with_a_note_and_a_slow_check_is_killed(
    tmp_path: Path,
) -> None:
    origin, base = make_origin(tmp_path / "origin")
    loud = py("print('a' * 5000); print('b' * 5000)")
    slow = py("import time; print('starting', flush=True); time.sleep(30)")
    repo = lease_repository(str(origin), base, checks={"loud": loud, "slow": slow})
    services = FakeServices()
    chat = ScriptedChat([call("write_file", path="src/app.py", content=FIXED)], "fixed")
    kind = agent(tmp_path, check_limits=CheckLimits(log_max_bytes=1000))
    done = await kind(context(chat, services, repo, check_timeout_s=0.5))

    text = services.store[done.checks["loud"].log].decode()
    assert text.startswith("a" * 500 + "\n[tether: 9002 bytes of the log left out]\n")
    assert text.endswith("b" * 499 + "\n")
    slow_run = done.checks["slow"]
    assert slow_run.exit_code == TIMED_OUT_EXIT_CODE
    assert slow_run.duration_s < 10
    assert services.store[slow_run.log].decode() == (
        "starting\n\n[tether: killed after the check timeout of 0.5 s]\n"
    )


async def test_the_bundle_carries_exactly_the_candidate_and_chains_into_the_next_step(
    tmp_path: Path,
) -> None:
    origin, base = make_origin(tmp_path / "origin")
    services = FakeServices()
    first = ScriptedChat([call("write_file", path="src/app.py", content=FIXED)], "fixed")
    one = await agent(tmp_path, "cache-1")(
        context(first, services, lease_repository(str(origin), base), step_id="s1")
    )
    assert one.candidate_sha is not None
    assert one.bundle is not None

    # Step 2 runs on another runner (its own cache): it starts at step 1's candidate, which
    # only the bundle holds.
    repo = lease_repository(str(origin), base, start=one.candidate_sha, start_bundle=one.bundle)
    more = call("write_file", path="src/more.py", content="M = 1\n")
    second = ScriptedChat([call("read_file", path="src/app.py"), more], "more")
    two = await agent(tmp_path, "cache-2")(context(second, services, repo, step_id="s2"))
    (read, _written) = second.tool_results(1)
    assert read["content"] == FIXED
    assert two.candidate_sha is not None
    assert two.bundle is not None
    assert one.bundle in services.downloads

    # The supervisor's side: a mirror that has the base and nothing else verifies the bundle
    # (its prerequisite is the base), and finds exactly the candidate in it.
    mirror = tmp_path / "supervisor.git"
    sh("git", "clone", "--quiet", "--bare", str(origin), str(mirror), cwd=tmp_path)
    path = tmp_path / "two.bundle"
    path.write_bytes(services.store[two.bundle])
    sh("git", "bundle", "verify", "--quiet", str(path), cwd=mirror)
    (head,) = sh("git", "bundle", "list-heads", str(path), cwd=mirror).splitlines()
    assert head.split()[0] == two.candidate_sha
    sh("git", "fetch", "--quiet", str(path), f"{head.split()[1]}:refs/tether/t/s2/1", cwd=mirror)
    parents = sh("git", "rev-list", "--parents", "-n1", two.candidate_sha, cwd=mirror).split()
    assert parents == [two.candidate_sha, one.candidate_sha]
    changed = sh("git", "diff", "--name-only", base, two.candidate_sha, cwd=mirror).split()
    assert changed == ["src/app.py", "src/more.py"]
