""".github/workflows/ci.yml: it parses, and its one job runs `make test` on
Python 3.11 with the Debian packages the suite needs and a pip cache."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "ci.yml"
PACKAGES = {"systemd", "bubblewrap", "chromium", "chromium-driver", "git"}


@pytest.fixture(scope="module")
def job() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")  # PyYAML comes with schemathesis, in the dev extra
    workflow = yaml.safe_load(WORKFLOW.read_text())
    # YAML 1.1 reads the key `on` as True; a forge reads it as `on`.
    assert {"push", "pull_request"} <= set(workflow.get("on") or workflow[True])
    assert list(workflow["jobs"]) == ["test"]
    found: dict[str, Any] = workflow["jobs"]["test"]
    return found


def _runs(job: dict[str, Any]) -> list[str]:
    return [step["run"] for step in job["steps"] if "run" in step]


def test_the_job_runs_make_test_on_python_3_11_on_ubuntu(job: dict[str, Any]) -> None:
    assert job["runs-on"] == "ubuntu-latest"
    assert re.fullmatch(r"python:3\.11-bookworm", job["container"]["image"])
    runs = [run.strip() for run in _runs(job)]
    assert runs[-2:] == ["make test", "make oldest-python"]  # then Debian's own Python 3.11.2
    assert job["timeout-minutes"] <= 60


def test_the_debian_packages_the_tests_need_are_installed_before_the_tests(
    job: dict[str, Any],
) -> None:
    runs = _runs(job)
    installs = [n for n, run in enumerate(runs) if "apt-get install" in run]
    assert installs, runs
    words = set(shlex.split(runs[installs[0]].replace("\\\n", " ")))
    assert words >= PACKAGES, PACKAGES - words
    assert installs[0] < runs.index("make test")


def test_pip_downloads_are_cached_by_the_project_file(job: dict[str, Any]) -> None:
    cache = next(step for step in job["steps"] if step.get("uses", "").startswith("actions/cache"))
    assert cache["with"]["path"] == job["env"]["PIP_CACHE_DIR"]
    assert "hashFiles('pyproject.toml')" in cache["with"]["key"]


def test_every_action_is_pinned_to_a_release(job: dict[str, Any]) -> None:
    used = [step["uses"] for step in job["steps"] if "uses" in step]
    assert used
    assert all(re.fullmatch(r"actions/[\w-]+@v\d+", uses) for uses in used), used


def test_the_postgresql_tests_have_a_server(job: dict[str, Any]) -> None:
    """Under CI the PostgreSQL tests fail rather than skip (tests/pgdb.py): the job must run a
    server and point the tests at it."""
    postgres = job["services"]["postgres"]
    assert postgres["image"].startswith("postgres:15")
    assert postgres["env"]["POSTGRES_HOST_AUTH_METHOD"] == "trust"
    url = job["env"]["TETHER_TEST_PG"]
    assert url.startswith("postgresql://postgres@postgres:5432/")
    assert url.rsplit("/", 1)[1] == postgres["env"]["POSTGRES_DB"]
