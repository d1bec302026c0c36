"""What the agent demo (`make demo-agent`) checks and prints about its finished task: the
candidate in the supervisor's own mirror, the check log read back with `artifact get`, and the
review record's fields, each with whether it is an expectation or an observation.

Each function checks what it is about to print (`expect`): a line is printed only once the
supervisor's answer and git's own reading agree with it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx

from examples.demo_repo import FIXED, Repository, inspect_candidate, tests_at
from examples.processes import admin, call, expect, say
from tether.supervisor.repos import Mirrors, candidate_ref

# The review record's twelve fields (docs/design.md, Review record), then the three
# observations issue 12 adds; the first six of the twelve are declared before the run.
TWELVE = (
    "owner",
    "repository",
    "base_commit",
    "requirement_revision",
    "allowed_paths",
    "start_time",
    "stop_time",
    "expected_checks",
    "observed_terminal_state",
    "reviewer_decision",
    "cleanup_proof",
    "unresolved_questions",
)
EXPECTATIONS = frozenset(
    {
        "owner",
        "repository",
        "base_commit",
        "requirement_revision",
        "allowed_paths",
        "expected_checks",
    }
)
ADDED = ("repository_head", "candidate_sha", "observed_checks")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Declared:
    """What the demo's task declared when it was submitted."""

    owner: str
    repository: str
    requirement_revision: str
    allowed_paths: tuple[str, ...]
    checks: tuple[str, ...]


def verified_candidate(final: dict[str, Any], repo: Repository, mirror_root: Path) -> str:
    """Check the candidate the supervisor verified, with git on its mirror and by running the
    tests on its tree; print it. Returns the `tests` check log's digest."""
    step = final["steps"][0]
    expect(final["state"] == "SUCCEEDED", f"task ended {final['state']}: {final.get('reason')}")
    expect(final.get("findings") == [], f"findings: {final.get('findings')}")
    expect(step["problems"] == [], f"the evidence found {step['problems']}")
    candidate = step["candidate_sha"]
    winner = next(a for a in step["attempts"] if a["state"] == "committed")
    expect(bool(candidate), "the committed step names no candidate")
    mirror = Mirrors(mirror_root).path(str(repo.bare))
    ref = candidate_ref(final["id"], step["id"], int(winner["fence"]))
    facts = inspect_candidate(mirror, ref, repo.base, candidate)
    expect(facts.ref_sha == candidate, f"{ref} names {facts.ref_sha or 'nothing'}")
    expect(facts.descends, f"candidate {candidate} does not descend from the base")
    expect(facts.changed == ("src/calc.py",), f"the candidate changed {facts.changed}")
    expect(facts.calc == FIXED, "src/calc.py at the candidate is not the fix")
    runs = {c["name"]: c for c in step["checks"]}
    expect(
        set(runs) == {"tests"} and runs["tests"]["exit_code"] == 0,
        f"check runs at the candidate: {step['checks']}",
    )
    code, last = tests_at(mirror, candidate)
    expect(code == 0, f"the tests fail at the candidate: {last}")
    tests = runs["tests"]
    say("")
    say("== the candidate, verified by the supervisor ==")
    say(f"candidate    {candidate}  (bundle {step['bundle'][:12]}, imported as {ref})")
    say(f"  descends from the base {repo.base[:12]}: yes (git merge-base --is-ancestor)")
    say(f'  changed: {", ".join(facts.changed)} (allowed_paths ["src/"])')
    say(
        f"  check tests: exit code {tests['exit_code']} in {tests['duration_s']:.2f} s,"
        f" log {tests['log']}"
    )
    say(f"  the tests again, run by the demo on the mirror's copy: exit code {code}, {last!r}")
    return str(tests["log"])


def show_check_log(url: str, token_file: Path, digest: str) -> None:
    """`tether-supervisor artifact get DIGEST`'s first lines; the log must say the test passed."""
    done = admin("artifact", "get", digest, "--url", url, "--token-file", str(token_file))
    expect(done.returncode == 0, f"artifact get failed: {done.stderr.strip()}")
    lines = done.stdout.splitlines()
    expect(any("1 passed" in line for line in lines), f"the check log says {lines[-3:]}")
    say(f"$ tether-supervisor artifact get {digest[:12]}…  (first lines)")
    for line in lines[:4]:
        say(f"  | {line}")


def review_record(
    http: httpx.Client, final: dict[str, Any], repo: Repository, declared: Declared, log: str
) -> None:
    """Accept the result (the verdict allows it), then check and print the review record."""
    task_id, candidate = final["id"], final["steps"][0]["candidate_sha"]
    path = f"/v1/tasks/{task_id}/review"
    call(http, "POST", path, json={"decision": "accept", "note": "fix verified"})
    record: dict[str, Any] = call(http, "GET", path)
    for name in TWELVE + ADDED:
        kind = "expectation" if name in EXPECTATIONS else "observation"
        expect(record.get(name, {}).get("kind") == kind, f"review field {name} is not {kind}")
    value = {name: record[name]["value"] for name in TWELVE + ADDED}
    wanted = {
        "owner": declared.owner,
        "repository": declared.repository,
        "base_commit": repo.base,
        "requirement_revision": declared.requirement_revision,
        "allowed_paths": list(declared.allowed_paths),
        "expected_checks": list(declared.checks),
        "observed_terminal_state": "SUCCEEDED",
        "unresolved_questions": [],
        "repository_head": repo.base,
        "candidate_sha": candidate,
        "observed_checks": {"tests": {"log": log, "exit_code": 0}},
    }
    for name, want in wanted.items():
        expect(value[name] == want, f"review {name} is {value[name]!r}, not {want!r}")
    expect(bool(value["start_time"]) and bool(value["stop_time"]), "start or stop time missing")
    expect(value["start_time"] <= value["stop_time"], "the task stopped before it started")
    expect((value["reviewer_decision"] or {}).get("decision") == "accept", "no decision")
    cleanup = value["cleanup_proof"]
    removed = cleanup["removed"]
    expect(cleanup["live_leases"] == 0, f"{cleanup['live_leases']} live leases")
    expect(len(removed) == 1 and removed[0]["gone"] is True, f"removal records: {removed}")
    expect(not Path(removed[0]["path"]).exists(), f"{removed[0]['path']} is still there")
    expect(record["verdict"]["acceptable"] is True, f"verdict {record['verdict']}")
    say("")
    say(f"== the review record (GET {path}), after `accept` ==")
    for name in TWELVE + ADDED:
        if name == ADDED[0]:
            say("  -- what issue 12 adds: the supervisor's own observations --")
        say(f"  {name:<24} {record[name]['kind']:<11}  {_shown(name, value[name])}")
    say(f"  verdict: acceptable {record['verdict']['acceptable']}")


def _shown(name: str, value: Any) -> str:
    if name in ("start_time", "stop_time"):
        return str(value)  # ISO 8601 in UTC, as every time the API sends
    if name == "reviewer_decision":
        return f"{value['decision']} ({value.get('note', '')})"
    if name == "cleanup_proof":
        gone = value["removed"][0]
        return (
            f"live leases {value['live_leases']}; attempts"
            f" {json.dumps(value['attempts_by_state'])}; the runner removed its worktree"
            f" ({gone['files_removed']} files, {gone['bytes_removed']} bytes), gone: {gone['gone']}"
        )
    return value if isinstance(value, str) else json.dumps(value)
