"""A damaged mirror heals itself (docs/design.md, Power loss and the disk): the mirror a power
cut left with an empty `HEAD` and `config` is moved aside at its next first use, logged with
both paths, and made anew from the remote, with the ledger's committed candidates brought back
from their bundles; a mirror damaged while in use is named as the problem, never the remote."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from tests.conftest import FakeClock, open_api
from tests.supervisor.api.test_api_repository_tasks import add_app, make_remote, queued, view, work
from tests.supervisor.repos.test_repos_mirror import Origin, rev
from tether.supervisor.repos import MirrorDamaged, Mirrors, RemoteFailed, candidate_ref

FIX = {"src/app.py": "def answer():\n    return 42\n"}


def damage(mirror: Path) -> None:
    """What the power cut of issue 24 left: `HEAD` and `config` 0 bytes."""
    for name in ("HEAD", "config"):
        (mirror / name).write_bytes(b"")


@pytest.fixture
def origin(tmp_path: Path) -> Origin:
    return make_remote(tmp_path)


async def test_a_damaged_mirror_is_moved_aside_and_made_anew_at_its_first_use(
    origin: Origin, tmp_path: Path
) -> None:
    root = tmp_path / "mirrors"
    first = Mirrors(root)
    sha = await first.import_bundle(origin.url, origin.candidate("a", FIX), "t1", "s1", 1)
    mirror = first.path(origin.url)
    damage(mirror)

    made: list[str] = []
    again = Mirrors(root)  # the supervisor restarted

    async def refill(url: str) -> None:
        made.append(url)

    again.on_new_mirror = refill
    with capture_logs() as logs:
        other = await again.import_bundle(
            origin.url, origin.candidate("b", {"src/app.py": "answer = 42\n"}), "t2", "s1", 1
        )
    [aside] = [p for p in root.iterdir() if ".damaged-" in p.name]
    assert aside.name.startswith(f"{mirror.name}.damaged-")
    assert (aside / "HEAD").read_bytes() == b""  # kept as it was, for the operator
    [warned] = [e for e in logs if e["log_level"] == "warning"]
    assert (warned["mirror"], warned["moved_to"]) == (str(mirror), str(aside))
    assert warned["damage"] == "its HEAD is empty"
    assert made == [origin.url]  # a new mirror: the ledger's candidates are brought back
    assert rev(mirror, candidate_ref("t2", "s1", 1)) == other
    # The first candidate came from the damaged mirror only: it is for `on_new_mirror` to
    # bring back (the next test), not there by itself.
    assert await again.is_ancestor(origin.url, origin.base, sha) is None
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".git")) == [aside.name]


async def test_a_mirror_damaged_in_use_is_named_as_the_problem_and_healed_next(
    origin: Origin, tmp_path: Path
) -> None:
    mirrors = Mirrors(tmp_path / "mirrors")
    mirror = await mirrors.fetch(origin.url)
    damage(mirror)
    with pytest.raises(MirrorDamaged) as caught:
        await mirrors.fetch(origin.url)
    assert not isinstance(caught.value, RemoteFailed)
    assert str(caught.value) == (
        f"the supervisor's mirror {mirror} of {origin.url} is damaged (its HEAD is empty):"
        " it is made anew at its next use"
    )
    assert rev(await mirrors.fetch(origin.url), "refs/heads/main") == origin.base


async def test_a_restarted_supervisor_heals_a_mirror_and_brings_its_candidates_back(
    origin: Origin, tmp_path: Path, clock: FakeClock
) -> None:
    db = tmp_path / "api.db"
    async with open_api(db, clock, synchronous="OFF") as api:
        await add_app(api, origin)
        task_id = await queued(api, origin)
        [lease] = await api.claim()
        fields = await work(api, origin, lease)
        assert (await api.report(lease, **fields)).json() == {"outcome": "applied"}
        assert (await view(api, task_id))["state"] == "SUCCEEDED"
        mirror = api.app.state.mirrors.path(origin.url)
    damage(mirror)
    ref = candidate_ref(task_id, lease["step_id"], lease["fence"])

    with capture_logs() as logs:
        async with open_api(db, clock, synchronous="OFF"):
            # The start's check of every known repository's mirror runs beside serving.
            with anyio.fail_after(60):
                while True:
                    if any(e["event"].startswith("candidates brought back") for e in logs):
                        break
                    await anyio.sleep(0.05)
    assert rev(mirror, ref) == fields["candidate_sha"]
    assert any(e["log_level"] == "warning" and e["mirror"] == str(mirror) for e in logs)
    assert [p for p in mirror.parent.iterdir() if ".damaged-" in p.name]


async def test_a_half_made_mirror_left_by_a_cut_is_removed_when_the_mirror_is_made(
    origin: Origin, tmp_path: Path
) -> None:
    root = tmp_path / "mirrors"
    mirrors = Mirrors(root)
    mirror = mirrors.path(origin.url)
    root.mkdir()
    left = mirror.with_name(f"{mirror.name}.0badc0de.partial")  # a cut inside `_create`
    (left / "objects").mkdir(parents=True)
    other = root / "elsewhere.git.0badc0de.partial"  # another mirror's, not this one's to touch
    other.mkdir()
    with capture_logs() as logs:
        await mirrors.import_bundle(origin.url, origin.candidate("a", FIX), "t1", "s1", 1)
    assert not left.exists()
    assert other.exists()
    assert [e["partial"] for e in logs if e["log_level"] == "warning"] == [str(left)]
