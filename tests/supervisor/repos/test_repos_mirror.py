"""The supervisor's own mirror (docs/design.md, Repositories and candidates), on real git
repositories: a remote's head as it moves, bundles imported under one ref per attempt that is
never moved, and each named refusal of the evidence check."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import anyio
import pytest

import tether.supervisor.repos as repos_pkg
from tests.agent_repos import add_commit, make_origin, sh
from tether.supervisor.repos import (
    BundleRefused,
    Mirrors,
    NoSuchHead,
    RefTaken,
    RefusalCode,
    RemoteFailed,
    candidate_ref,
    path_allowed,
)


@dataclasses.dataclass
class Origin:
    """A bare remote (`url`), a clone that pushes to it, and the base SHA both started at."""

    url: str
    work: Path
    base: str
    root: Path

    def push(self, name: str, text: str) -> str:
        sha = add_commit(self.work, name, text)
        sh("git", "push", "--quiet", "origin", "HEAD:main", cwd=self.work)
        return sha

    def candidate(self, label: str, changes: dict[str, str], *, on: str | None = None) -> Path:
        """A runner's bundle: a fresh clone at `on` (default: the base), `changes` committed,
        `git bundle create` of base..candidate with the candidate named HEAD."""
        start = on or self.base
        tree = self.root / f"runner-{label}"
        sh("git", "clone", "--quiet", self.url, str(tree), cwd=self.root)
        sh("git", "checkout", "--quiet", "--detach", start, cwd=tree)
        for name, text in changes.items():
            add_commit(tree, name, text)
        bundle = self.root / f"{label}.bundle"
        sh("git", "bundle", "create", "--quiet", str(bundle), "HEAD", f"^{start}", cwd=tree)
        return bundle


def rev(tree: Path, what: str) -> str:
    return sh("git", "rev-parse", what, cwd=tree).strip()


@pytest.fixture
def origin(tmp_path: Path) -> Origin:
    seed, base = make_origin(tmp_path / "seed")
    bare = tmp_path / "origin.git"
    sh("git", "clone", "--quiet", "--bare", str(seed), str(bare), cwd=tmp_path)
    work = tmp_path / "work"
    sh("git", "clone", "--quiet", str(bare), str(work), cwd=tmp_path)
    return Origin(url=str(bare), work=work, base=base, root=tmp_path)


@pytest.fixture
def mirrors(tmp_path: Path) -> Mirrors:
    return Mirrors(tmp_path / "mirrors")


# -- head and fetch -------------------------------------------------------------------------------


async def test_head_follows_a_push(origin: Origin, mirrors: Mirrors) -> None:
    assert await mirrors.head(origin.url) == origin.base
    assert await mirrors.head(f"file://{origin.url}", "main") == origin.base
    moved = origin.push("src/app.py", "def answer():\n    return 42\n")
    assert moved != origin.base
    assert await mirrors.head(origin.url) == moved
    assert await mirrors.head(origin.url, "main") == moved


async def test_head_of_a_missing_branch_or_an_unreadable_remote_is_a_named_error(
    origin: Origin, mirrors: Mirrors, tmp_path: Path
) -> None:
    with pytest.raises(NoSuchHead, match="has no refs/heads/nope"):
        await mirrors.head(origin.url, "nope")
    with pytest.raises(RemoteFailed, match="does not appear to be a git repository"):
        await mirrors.head(str(tmp_path / "missing"))


async def test_a_credential_in_a_url_never_reaches_the_message(mirrors: Mirrors) -> None:
    """Nothing listens on port 1: git fails at once, and neither user nor password is named."""
    with pytest.raises(RemoteFailed) as caught:
        await mirrors.head("https://alice:s3cret-pw@127.0.0.1:1/app.git")
    message = str(caught.value)
    assert "https://***@127.0.0.1:1/app.git" in message
    assert "s3cret-pw" not in message
    assert "alice" not in message


async def test_fetch_mirrors_branches_and_keeps_candidate_refs(
    origin: Origin, mirrors: Mirrors
) -> None:
    bundle = origin.candidate("a", {"src/app.py": "def answer():\n    return 42\n"})
    sha = await mirrors.import_bundle(origin.url, bundle, "task1", "step1", 1)
    moved = origin.push("README.md", "# moved\n")
    mirror = await mirrors.fetch(origin.url)
    assert rev(mirror, "refs/heads/main") == moved
    # --prune of branches and tags only: the candidate, which the remote lacks, stays.
    assert rev(mirror, candidate_ref("task1", "step1", 1)) == sha


# -- import_bundle --------------------------------------------------------------------------------


async def test_import_puts_the_candidate_under_the_attempts_ref(
    origin: Origin, mirrors: Mirrors
) -> None:
    bundle = origin.candidate("a", {"src/app.py": "def answer():\n    return 42\n"})
    expected = rev(origin.root / "runner-a", "HEAD")
    # The mirror does not exist yet: it is created, and fetched for the bundle's base.
    sha = await mirrors.import_bundle(origin.url, bundle, "task1", "step1", 3)
    assert sha == expected
    mirror = mirrors.path(origin.url)
    assert rev(mirror, "refs/tether/task1/step1/3") == expected
    # The same bundle again (a retried upload) returns the same SHA and moves nothing.
    assert await mirrors.import_bundle(origin.url, bundle, "task1", "step1", 3) == expected


async def test_the_same_ref_with_another_commit_is_refused_and_never_moved(
    origin: Origin, mirrors: Mirrors
) -> None:
    first = origin.candidate("a", {"src/app.py": "def answer():\n    return 42\n"})
    late = origin.candidate("b", {"src/app.py": "def answer():\n    return 43\n"})
    sha = await mirrors.import_bundle(origin.url, first, "task1", "step1", 1)
    with pytest.raises(RefTaken, match="refs/tether/task1/step1/1 already names"):
        await mirrors.import_bundle(origin.url, late, "task1", "step1", 1)
    assert rev(mirrors.path(origin.url), "refs/tether/task1/step1/1") == sha
    # Another attempt (a new fence) has a ref of its own.
    other = await mirrors.import_bundle(origin.url, late, "task1", "step1", 2)
    assert other != sha
    assert rev(mirrors.path(origin.url), "refs/tether/task1/step1/2") == other


async def test_two_processes_racing_for_one_ref_leave_it_at_one_commit(
    origin: Origin, tmp_path: Path
) -> None:
    """Two supervisors' mirrors objects (no shared lock) on one folder: one import creates the
    ref, the other is refused, and the ref names the winner's commit."""
    bundles = [origin.candidate(label, {"src/app.py": f"x = {label!r}\n"}) for label in ("a", "b")]
    await Mirrors(tmp_path / "mirrors").fetch(origin.url)
    won: list[str] = []
    refused: list[RefTaken] = []

    async def one(bundle: Path) -> None:
        try:
            won.append(
                await Mirrors(tmp_path / "mirrors").import_bundle(origin.url, bundle, "t", "s", 1)
            )
        except RefTaken as exc:
            refused.append(exc)

    async with anyio.create_task_group() as tg:
        for bundle in bundles:
            tg.start_soon(one, bundle)
    assert (len(won), len(refused)) == (1, 1)
    assert rev(Mirrors(tmp_path / "mirrors").path(origin.url), candidate_ref("t", "s", 1)) == won[0]


async def test_a_damaged_bundle_or_a_bad_ref_is_refused_and_creates_no_ref(
    origin: Origin, mirrors: Mirrors, tmp_path: Path
) -> None:
    bundle = origin.candidate("a", {"src/app.py": "def answer():\n    return 42\n"})
    damaged = tmp_path / "damaged.bundle"
    damaged.write_bytes(bundle.read_bytes()[:-40])
    # Its header verifies; its truncated pack cannot be unpacked.
    with pytest.raises(BundleRefused, match="cannot be unpacked"):
        await mirrors.import_bundle(origin.url, damaged, "task1", "step1", 1)
    not_a_bundle = tmp_path / "text.bundle"
    not_a_bundle.write_text("hello\n")
    with pytest.raises(BundleRefused, match="does not verify"):
        await mirrors.import_bundle(origin.url, not_a_bundle, "task1", "step1", 1)
    for task_id, step_id, fence in (("a/b", "s", 1), ("t", "..", 1), ("t", "s", -1)):
        with pytest.raises(BundleRefused):
            await mirrors.import_bundle(origin.url, bundle, task_id, step_id, fence)
    assert sh("git", "for-each-ref", "refs/tether/", cwd=mirrors.path(origin.url)) == ""


async def test_a_bundle_with_two_heads_is_refused(origin: Origin, mirrors: Mirrors) -> None:
    origin.candidate("a", {"src/app.py": "x = 1\n"})
    tree = origin.root / "runner-a"
    sh("git", "branch", "candidate", "HEAD", cwd=tree)
    sh("git", "checkout", "--quiet", "-b", "other", origin.base, cwd=tree)
    add_commit(tree, "src/other.py", "y = 2\n")
    two = origin.root / "two.bundle"
    sh(
        "git",
        "bundle",
        "create",
        "--quiet",
        str(two),
        "other",
        "candidate",
        f"^{origin.base}",
        cwd=tree,
    )
    with pytest.raises(BundleRefused, match="exactly one head, it has 2"):
        await mirrors.import_bundle(origin.url, two, "task1", "step1", 1)


# -- check_candidate ------------------------------------------------------------------------------


async def test_a_good_candidate_passes(origin: Origin, mirrors: Mirrors) -> None:
    bundle = origin.candidate("a", {"src/app.py": "def answer():\n    return 42\n"})
    sha = await mirrors.import_bundle(origin.url, bundle, "task1", "step1", 1)
    assert await mirrors.check_candidate(origin.url, origin.base, sha, ["src/"]) == []
    assert await mirrors.check_candidate(origin.url, origin.base, sha, ["./src"]) == []
    assert await mirrors.check_candidate(origin.url, origin.base, sha, [""]) == []


async def test_a_forged_unknown_sha_is_unknown_candidate(origin: Origin, mirrors: Mirrors) -> None:
    await mirrors.fetch(origin.url)
    for forged in ("0" * 40, "not-a-sha", origin.base[:12]):
        refusals = await mirrors.check_candidate(origin.url, origin.base, forged, ["src/"])
        assert [r.code for r in refusals] == [RefusalCode.UNKNOWN_CANDIDATE], forged
    # A repository never mirrored knows no candidate either (and gets no mirror from a check).
    refusals = await mirrors.check_candidate("/nowhere", origin.base, origin.base, ["src/"])
    assert [r.code for r in refusals] == [RefusalCode.UNKNOWN_CANDIDATE]
    assert not mirrors.path("/nowhere").exists()


async def test_a_commit_not_descending_from_the_base_is_not_descendant(
    origin: Origin, mirrors: Mirrors
) -> None:
    """The base moved after the runner started: its candidate is built on the old base."""
    bundle = origin.candidate("a", {"src/app.py": "def answer():\n    return 42\n"})
    sha = await mirrors.import_bundle(origin.url, bundle, "task1", "step1", 1)
    moved = origin.push("src/extra.py", "z = 3\n")
    await mirrors.fetch(origin.url)
    refusals = await mirrors.check_candidate(origin.url, moved, sha, ["src/"])
    assert [r.code for r in refusals] == [RefusalCode.NOT_DESCENDANT]
    assert moved in refusals[0].detail
    # A base the mirror has never seen is refused the same way, by name.
    refusals = await mirrors.check_candidate(origin.url, "1" * 40, sha, ["src/"])
    assert [r.code for r in refusals] == [RefusalCode.NOT_DESCENDANT]


async def test_a_change_outside_allowed_paths_is_path_not_allowed_listing_them(
    origin: Origin, mirrors: Mirrors
) -> None:
    bundle = origin.candidate(
        "a",
        {
            "src/app.py": "def answer():\n    return 42\n",
            "tests/test_app.py": "def test_nothing():\n    pass\n",
            "srcx/evil.py": "x = 1\n",  # shares a prefix with src/, is not under it
        },
    )
    sha = await mirrors.import_bundle(origin.url, bundle, "task1", "step1", 1)
    refusals = await mirrors.check_candidate(origin.url, origin.base, sha, ["src/"])
    assert [r.code for r in refusals] == [RefusalCode.PATH_NOT_ALLOWED]
    assert refusals[0].paths == ("srcx/evil.py", "tests/test_app.py")
    assert "tests/test_app.py" in refusals[0].detail
    # No allowed path at all allows no change.
    refusals = await mirrors.check_candidate(origin.url, origin.base, sha, [])
    assert len(refusals[0].paths) == 3


async def test_both_refusals_are_reported_together(origin: Origin, mirrors: Mirrors) -> None:
    bundle = origin.candidate("a", {"docs/x.md": "x\n"})
    sha = await mirrors.import_bundle(origin.url, bundle, "task1", "step1", 1)
    moved = origin.push("src/extra.py", "z = 3\n")
    await mirrors.fetch(origin.url)
    refusals = await mirrors.check_candidate(origin.url, moved, sha, ["src/"])
    assert {r.code for r in refusals} == {RefusalCode.NOT_DESCENDANT, RefusalCode.PATH_NOT_ALLOWED}


@pytest.mark.parametrize(
    ("path", "allowed", "expected"),
    [
        ("src/app.py", ["src"], True),
        ("src/app.py", ["src/"], True),
        ("src/app.py", ["./src/"], True),
        ("src", ["src"], True),
        ("srcx/app.py", ["src"], False),
        ("README.md", ["src", "docs"], False),
        ("README.md", [""], True),
        ("README.md", ["."], True),
        ("README.md", [], False),
        ("src/app.py", ["../src"], False),
        ("src/app.py", ["/src"], False),
    ],
)
def test_allowed_paths_are_read_as_the_runner_reads_them(
    path: str, allowed: list[str], expected: bool
) -> None:
    assert path_allowed(path, allowed) is expected


PUBLIC = {
    "Mirrors",
    "candidate_ref",
    "ls_remote",
    "remote_head",
    "path_allowed",
    "redact",
    "Refusal",
    "RefusalCode",
    "MirrorError",
    "RemoteFailed",
    "NoSuchHead",
    "BundleRefused",
    "RefTaken",
    "GitError",
    "MirrorDamaged",
}


def test_the_public_surface_is_deliberate() -> None:
    assert set(repos_pkg.__all__) == PUBLIC
    assert all(hasattr(repos_pkg, name) for name in PUBLIC)
    assert {code.value for code in RefusalCode} == {
        "unknown_candidate",
        "not_descendant",
        "path_not_allowed",
        "entry_not_allowed",
        "mode_changed",
    }
