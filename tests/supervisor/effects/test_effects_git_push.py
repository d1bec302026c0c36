"""The `git.push` deliverer (supervisor/effects/git_push.py) on real bare repositories: a
compare-and-swap push of the verified candidate from the supervisor's mirror, a replay found
already done, a moved branch and a non-fast-forward named, and credentials only through git's
environment."""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent_repos import add_commit, make_origin, sh
from tests.effects_fakes import LOOPBACK_ALLOWED, loopback_resolver, outgoing
from tether.supervisor.effects.credentials import Credentials
from tether.supervisor.effects.git_push import GitPushDeliverer, credential_environment
from tether.supervisor.ledger.outbox import Delivered, Undeliverable
from tether.supervisor.repos.mirror import Mirrors

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----"


@dataclasses.dataclass
class World:
    bare: Path
    work: Path
    base: str
    candidate: str
    mirrors: Mirrors
    bundle: Path  # the runner's bundle of the candidate

    def head(self, branch: str = "main") -> str:
        return sh("git", "rev-parse", f"refs/heads/{branch}", cwd=self.bare).strip()

    def move(self, name: str, text: str) -> str:
        """Someone else pushes a commit to main."""
        sha = add_commit(self.work, name, text)
        sh("git", "push", "--quiet", "origin", "HEAD:main", cwd=self.work)
        return sha

    def request(self, **extra: object) -> dict[str, object]:
        request: dict[str, object] = {
            "url": str(self.bare),
            "branch": "main",
            "expected": self.base,
            "candidate": self.candidate,
            "credential": None,
        }
        return request | extra


@pytest.fixture
async def world(tmp_path: Path) -> World:
    seed, base = make_origin(tmp_path / "seed")
    bare = tmp_path / "origin.git"
    sh("git", "clone", "--quiet", "--bare", str(seed), str(bare), cwd=tmp_path)
    work = tmp_path / "work"
    sh("git", "clone", "--quiet", str(bare), str(work), cwd=tmp_path)
    runner = tmp_path / "runner"
    sh("git", "clone", "--quiet", str(bare), str(runner), cwd=tmp_path)
    candidate = add_commit(runner, "src/app.py", "def answer():\n    return 42\n")
    bundle = tmp_path / "c.bundle"
    sh("git", "bundle", "create", "--quiet", str(bundle), "HEAD", f"^{base}", cwd=runner)
    mirrors = Mirrors(tmp_path / "mirrors")
    assert await mirrors.import_bundle(str(bare), bundle, "t1", "s1", 1) == candidate
    return World(bare, work, base, candidate, mirrors, bundle)


@pytest.fixture
def secrets(tmp_path: Path) -> Credentials:
    folder = tmp_path / "credentials"
    folder.mkdir()
    (folder / "deploy-key").write_text(KEY + "\n")
    (folder / "token").write_text("tok-123\n")
    return Credentials(folder)


async def test_the_push_moves_the_branch_and_a_replay_finds_it_done(
    world: World, secrets: Credentials
) -> None:
    deliverer = GitPushDeliverer(world.mirrors)
    out = outgoing(world.request(), kind="git.push")
    first = await deliverer.deliver(out, secrets)
    assert isinstance(first, Delivered)
    assert not first.replayed
    assert world.head() == world.candidate
    again = await deliverer.deliver(out, secrets)
    assert isinstance(again, Delivered)
    assert again.replayed
    assert world.head() == world.candidate


async def test_a_branch_someone_moved_is_never_overwritten(
    world: World, secrets: Credentials
) -> None:
    moved = world.move("other.txt", "theirs\n")
    answer = await GitPushDeliverer(world.mirrors).deliver(
        outgoing(world.request(), kind="git.push"), secrets
    )
    assert isinstance(answer, Undeliverable)
    assert answer.code == "branch_moved"
    assert moved in answer.detail
    assert world.head() == moved


async def test_a_missing_branch_is_a_moved_branch(world: World, secrets: Credentials) -> None:
    answer = await GitPushDeliverer(world.mirrors).deliver(
        outgoing(world.request(branch="release"), kind="git.push"), secrets
    )
    assert isinstance(answer, Undeliverable)
    assert answer.code == "branch_moved"
    with pytest.raises(subprocess.CalledProcessError):
        world.head("release")


async def test_a_candidate_that_does_not_descend_is_not_fast_forward(
    world: World, secrets: Credentials
) -> None:
    moved = world.move("other.txt", "theirs\n")
    await world.mirrors.fetch(str(world.bare))
    answer = await GitPushDeliverer(world.mirrors).deliver(
        outgoing(world.request(expected=moved), kind="git.push"), secrets
    )
    assert isinstance(answer, Undeliverable)
    assert answer.code == "not_fast_forward"
    assert world.head() == moved


async def test_a_lease_found_stale_at_the_push_is_a_moved_branch(
    world: World, secrets: Credentials, monkeypatch: pytest.MonkeyPatch
) -> None:
    moved = world.move("other.txt", "theirs\n")
    reads = iter([world.base, moved])  # the branch moves between the read and the push

    async def racing(url: str, branch: str, *, env: object = None) -> str:
        return next(reads)

    monkeypatch.setattr(world.mirrors, "branch_head", racing)
    answer = await GitPushDeliverer(world.mirrors).deliver(
        outgoing(world.request(), kind="git.push"), secrets
    )
    assert isinstance(answer, Undeliverable)
    assert answer.code == "branch_moved"
    assert "stale" in answer.detail
    assert world.head() == moved


async def test_a_missing_credential_pushes_nothing(world: World, secrets: Credentials) -> None:
    answer = await GitPushDeliverer(world.mirrors).deliver(
        outgoing(world.request(credential="absent"), kind="git.push"), secrets
    )
    assert isinstance(answer, Undeliverable)
    assert answer.code == "credential_missing"
    assert world.head() == world.base


async def test_an_ssh_key_reaches_ssh_through_the_environment_only(
    world: World, secrets: Credentials, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A stand-in `ssh` on PATH records its arguments and the key file it was given, then runs
    the remote command locally, so the push really happens over the `ssh://` URL."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "ssh-calls"
    fake = bin_dir / "ssh"
    fake.write_text(
        "#!/bin/bash\n"
        f'echo "ARGS $*" >> {record}\n'
        'while [ $# -gt 1 ]; do if [ "$1" = -i ]; then\n'
        f'  stat -c "MODE %a" "$2" >> {record}; echo "KEY $(head -c 40 "$2")" >> {record}\n'
        "fi; shift; done\n"
        'exec sh -c "$1"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("GIT_SSH_COMMAND", raising=False)
    url = f"ssh://fakehost{world.bare}"
    request = world.request(url=url, credential="deploy-key")
    # The mirror is keyed by URL: this URL's mirror imports the candidate too.
    await world.mirrors.import_bundle(url, world.bundle, "t1", "s1", 1)

    deliverer = GitPushDeliverer(
        world.mirrors, destinations=LOOPBACK_ALLOWED, resolver=loopback_resolver
    )
    answer = await deliverer.deliver(outgoing(request, kind="git.push"), secrets)
    assert isinstance(answer, Delivered), answer
    assert world.head() == world.candidate
    calls = record.read_text()
    # ssh is held to the address checked for `fakehost`, its host key still that name's.
    assert "-o HostName=127.0.0.1 -o HostKeyAlias=fakehost" in calls
    assert "MODE 600" in calls
    assert "KEY -----BEGIN OPENSSH PRIVATE KEY-----" in calls
    assert "not-a-real-key" not in "\n".join(x for x in calls.splitlines() if x.startswith("ARGS"))
    key_paths = {word for word in calls.split() if word.endswith("/key")}
    assert key_paths
    assert not existing(key_paths)  # removed after the attempt


def existing(paths: set[str]) -> list[str]:
    return [p for p in paths if Path(p).exists()]


def test_a_token_is_answered_by_the_askpass_script_from_the_environment(tmp_path: Path) -> None:
    with credential_environment("tok-123", tmp_path) as env:
        assert "tok-123" not in env["GIT_ASKPASS"]
        script = Path(env["GIT_ASKPASS"])
        assert stat.S_IMODE(script.parent.stat().st_mode) == 0o700
        assert script.parent.parent == tmp_path
        full = {**os.environ, **env}
        ask = [str(script)]
        password = subprocess.run(
            [*ask, "Password for 'https://x-access-token@example.org': "],
            env=full,
            capture_output=True,
            text=True,
            check=True,
        )
        user = subprocess.run(
            [*ask, "Username for 'https://example.org': "],
            env=full,
            capture_output=True,
            text=True,
            check=True,
        )
        assert password.stdout == "tok-123\n"
        assert user.stdout == "x-access-token\n"
        assert env["GIT_CONFIG_KEY_0"] == "credential.helper"
    assert not script.exists()


def test_no_credential_adds_nothing(tmp_path: Path) -> None:
    with credential_environment(None, tmp_path) as env:
        assert env == {}
    assert list(tmp_path.iterdir()) == []


LEFTOVER = """
import sys
from pathlib import Path
from tether.supervisor.effects.git_push import credential_environment
with credential_environment(sys.argv[2], Path(sys.argv[1])) as env:
    print(env.get("GIT_ASKPASS") or env["GIT_SSH_COMMAND"], flush=True)
    sys.stdin.read()  # a push in flight, until killed
"""


def test_a_push_killed_mid_attempt_leaves_its_key_only_until_the_next_start(
    tmp_path: Path,
) -> None:
    """The credential folder lives in the supervisor's private folder beside the mirrors, not
    the shared temporary folder; SIGKILL leaves it behind, and the next start removes it --
    but never one that a live process is using."""
    mirrors = Mirrors(tmp_path / "state" / "mirrors")
    scratch = GitPushDeliverer(mirrors).scratch
    assert scratch == tmp_path / "state" / "mirrors.push"
    assert stat.S_IMODE(scratch.stat().st_mode) == 0o700

    def hold(value: str) -> subprocess.Popen[str]:
        child = subprocess.Popen(
            [sys.executable, "-c", LEFTOVER, str(scratch), value],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        child.stdout.readline()  # the folder is there
        return child

    def end(child: subprocess.Popen[str]) -> None:
        child.kill()
        child.communicate()

    killed, live = hold(KEY), hold("tok-123")
    try:
        end(killed)
        assert len(list(scratch.glob("tether-push-*"))) == 2
        GitPushDeliverer(mirrors)  # the next start
        [left] = scratch.glob("tether-push-*")
        assert (left / "askpass").exists()  # the live process's folder
        assert not any(scratch.glob("tether-push-*/key"))  # the killed one's key is gone
    finally:
        end(live)
    GitPushDeliverer(mirrors)
    assert list(scratch.glob("tether-push-*")) == []
