"""What a candidate may carry (issue 22, item 3): regular files with the base's modes, unless
the task's agent steps allow more (`allowed_entries`). The supervisor judges the candidate's
entries by their git modes on its own mirror and names what it refuses (`entry_not_allowed`,
`mode_changed`); `apply_patch` refuses the same before anything is written.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.agent_repos import make_origin, sh
from tests.runner.agent.test_hostile_tree import FILES, PYTHON
from tests.runner.test_runner_processes import POOL, Cluster, wait_for
from tests.supervisor.repos.test_repos_mirror import Origin
from tether.runner.agent import RepoCache, ToolBox
from tether.supervisor.repos import Mirrors, RefusalCode
from tether.wire.payloads import check_payload

# What a command the model may run leaves in the tree, per variant.
MAKES = {
    "symlink": "import os; os.symlink('/etc/passwd', 'src/passwd')",
    "gitlink": (
        "import subprocess as s; s.run(['git', 'init', '-q', 'src/sub'], check=True);"
        " s.run(['git', '-C', 'src/sub', '-c', 'user.name=m', '-c', 'user.email=m@x', 'commit',"
        " '-q', '--allow-empty', '-m', 'x'], check=True)"
    ),
    "executable": "import os; os.chmod('src/app.py', 0o755)",
}
REFUSED = {
    "symlink": ("entry_not_allowed", "src/passwd (mode 120000, symlink)"),
    "gitlink": ("entry_not_allowed", "src/sub (mode 160000, submodule)"),
    "executable": ("mode_changed", "src/app.py: 100644 -> 100755"),
}


def command(variant: str) -> str:
    return shlex.join([PYTHON, "-c", MAKES[variant]])


@pytest.fixture
def remote(tmp_path: Path) -> Origin:
    """A bare remote at the origin's files, and a clone of it (as
    tests/supervisor/repos/test_repos_mirror.py)."""
    seed, base = make_origin(tmp_path / "seed", FILES)
    bare = tmp_path / "origin.git"
    sh("git", "clone", "--quiet", "--bare", str(seed), str(bare), cwd=tmp_path)
    work = tmp_path / "work"
    sh("git", "clone", "--quiet", str(bare), str(work), cwd=tmp_path)
    return Origin(url=str(bare), work=work, base=base, root=tmp_path)


def candidate(origin: Origin, label: str, script: str) -> Path:
    """A runner's bundle: a clone at the base, `script` run in it (sh), everything committed."""
    tree = origin.root / f"runner-{label}"
    sh("git", "clone", "--quiet", origin.url, str(tree), cwd=origin.root)
    subprocess.run(["sh", "-c", script], cwd=tree, check=True)
    sh("git", "add", "--all", cwd=tree)
    sh("git", "commit", "--quiet", "-m", label, cwd=tree)
    bundle = origin.root / f"{label}.bundle"
    sh("git", "bundle", "create", "--quiet", str(bundle), "HEAD", f"^{origin.base}", cwd=tree)
    return bundle


GITLINK = (
    "git init -q src/sub && git -C src/sub -c user.name=a -c user.email=b"
    " commit -q --allow-empty -m x"
)


@pytest.mark.parametrize(
    ("script", "allowed", "code", "named"),
    [
        ("ln -s /etc/passwd src/passwd", ["file"], "entry_not_allowed", "src/passwd (mode 120000"),
        ("ln -s /etc/passwd src/passwd", ["symlink"], "entry_not_allowed", "'/etc/passwd' outside"),
        ("ln -s ../../x src/up", ["symlink"], "entry_not_allowed", "'../../x' outside"),
        ("ln -s ../.git/config src/g", ["symlink"], "entry_not_allowed", "'../.git/config'"),
        ("ln -s app.py src/link", ["symlink"], None, None),
        (GITLINK, ["file"], "entry_not_allowed", "src/sub (mode 160000, submodule)"),
        (GITLINK, ["submodule"], None, None),
        ("chmod 755 src/app.py", ["file"], "mode_changed", "src/app.py: 100644 -> 100755"),
        ("chmod 755 src/app.py", ["executable"], None, None),
        (
            "echo x > src/run.sh && chmod 755 src/run.sh",
            ["file"],
            "entry_not_allowed",
            "src/run.sh (mode 100755, executable)",
        ),
        ("echo x > src/new.py && rm tests/test_app.py", ["file"], None, None),
    ],
)
async def test_the_mirror_judges_each_entry_by_its_mode(
    remote: Origin,
    tmp_path: Path,
    script: str,
    allowed: list[str],
    code: str | None,
    named: str | None,
) -> None:
    mirrors = Mirrors(tmp_path / "mirrors")
    bundle = candidate(remote, "c", script)
    sha = await mirrors.import_bundle(remote.url, bundle, "task1", "step1", 1)
    refusals = await mirrors.check_candidate(remote.url, remote.base, sha, [""], allowed)
    if code is None:
        assert refusals == []
    else:
        assert [r.code for r in refusals] == [RefusalCode(code)]
        assert named is not None
        assert named in refusals[0].detail, refusals[0].detail


def test_an_unknown_entry_kind_is_refused_naming_the_field() -> None:
    payload = {"messages": [{"role": "user", "content": "x"}], "allowed_commands": []}
    check_payload("agent", {**payload, "allowed_entries": ["file", "symlink"]})
    with pytest.raises(ValueError, match=r"`payload.allowed_entries\[1\]`: 'symlinks' is not"):
        check_payload("agent", {**payload, "allowed_entries": ["file", "symlinks"]})


async def test_apply_patch_refuses_an_executable_unless_allowed(tmp_path: Path) -> None:
    url, base = make_origin(tmp_path / "origin", FILES)
    mode = "diff --git a/src/app.py b/src/app.py\nold mode 100644\nnew mode 100755\n"
    new = (
        "diff --git a/src/run.sh b/src/run.sh\nnew file mode 100755\n--- /dev/null\n"
        "+++ b/src/run.sh\n@@ -0,0 +1 @@\n+echo hi\n"
    )
    async with RepoCache(tmp_path / "cache").attempt(url=str(url), base_sha=base, label="t") as ws:

        def box(*allowed: str) -> ToolBox:
            return ToolBox(
                ws.tree,
                git=ws.git,
                home=ws.home,
                allowed_paths=["src/"],
                allowed_commands=(),
                allowed_entries=allowed,
            )

        strict = box("file")
        for patch, code in ((mode, "mode_changed"), (new, "entry_not_allowed")):
            result = await strict.call("apply_patch", json.dumps({"patch": patch}))
            assert (result.refused, result.code) == (True, code), result.content
        assert not (ws.tree / "src" / "run.sh").exists()
        assert not os.access(ws.tree / "src" / "app.py", os.X_OK)
        loose = box("file", "executable")
        for patch in (mode, new):
            result = await loose.call("apply_patch", json.dumps({"patch": patch}))
            assert result.ok, result.content
        assert os.access(ws.tree / "src" / "run.sh", os.X_OK)


@pytest.fixture
def entries_cluster(tmp_path: Path) -> Iterator[tuple[Cluster, str]]:
    repository, base = make_origin(tmp_path / "origin", FILES)
    cluster = Cluster(tmp_path)
    try:
        cluster.add_repository("app", repository)
        cluster.start_supervisor()
        cluster.start_model()
        yield cluster, base
    finally:
        cluster.stop_all()


def task_body(base: str, variant: str, **payload: object) -> dict[str, object]:
    step = {
        "messages": [{"role": "user", "content": f"variant {variant}"}],
        "allowed_commands": [command(variant)],
        **payload,
    }
    return {
        "idempotency_key": f"entries-{variant}-{os.getpid()}",
        "pool": POOL,
        "plan": {"steps": [{"name": "fix", "kind": "agent", "payload": step}]},
        "repository": "app",
        "base_sha": base,
        "allowed_paths": ["src/"],
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_symlink_a_gitlink_and_a_mode_change_made_by_a_command_are_refused_by_name(
    entries_cluster: tuple[Cluster, str], tmp_path: Path
) -> None:
    cluster, base = entries_cluster
    turns = [
        {
            "name": f"run-{v}",
            "assistant_turns": 0,
            "last_contains": f"variant {v}",
            "tool_calls": [{"name": "run", "arguments": {"command": command(v)}}],
        }
        for v in MAKES
    ]
    turns.append({"name": "done", "assistant_turns": 1, "text": "done"})
    answer = httpx.post(
        f"{cluster.model_url}/_admin/scenario", json={"turns": turns}, trust_env=False
    )
    assert answer.status_code == 200, answer.text
    refused = cluster.http.post("/v1/tasks", json=task_body(base, "symlink", allowed_entries=["x"]))
    assert refused.status_code == 422, refused.text
    assert "allowed_entries[0]" in refused.json()["detail"]

    cluster.start_runner("runner-a", "--concurrency", "3", CACHE_DIRECTORY=str(tmp_path / "cache"))
    tasks = {}
    for variant in MAKES:
        created = cluster.http.post("/v1/tasks", json=task_body(base, variant))
        assert created.status_code == 201, created.text
        approved = cluster.http.post(
            f"/v1/tasks/{created.json()['id']}/approve",
            json={"plan_hash": created.json()["plan_hash"], "base_sha": base},
        )
        assert approved.status_code == 200, approved.text
        tasks[variant] = created.json()["id"]

    def ended() -> bool:
        return all(cluster.state(t) in ("SUCCEEDED", "FAILED") for t in tasks.values())

    wait_for(ended, "the three tasks to end", 240, cluster)
    for variant, task_id in tasks.items():
        view = cluster.task(task_id)
        code, named = REFUSED[variant]
        assert view["steps"][0]["output"]["sandbox"] == "bwrap"
        assert view["state"] == "FAILED", (variant, view.get("reason"), view["steps"][0]["output"])
        assert view["reason"].startswith(f"{code}: "), json.dumps(view["steps"][0]["output"])
        assert named in view["reason"], view["reason"]
        assert [f["code"] for f in view["findings"]] == [code]
    cluster.check_ledger()
