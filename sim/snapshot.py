"""The ledger as a violation report shows it: the fence counter, repository heads, every
task with its steps, attempts (fence, runner, how each ended) and effects, and every outbox row
with its delivery attempts (gate opening, holder, answer)."""

from __future__ import annotations

from tether.sim.harness import Harness


def ledger_snapshot(harness: Harness) -> list[str]:
    q = harness.query
    lines = [f"fence counter {harness.fence_counter()}"]
    lines += [
        f"repository {r['tenant']}/{r['name']} head {r['head_sha']}"
        for r in q("SELECT * FROM repositories ORDER BY tenant, name")
    ]
    for task in q("SELECT * FROM tasks ORDER BY created_order"):
        lines.append(
            f"task {task['id']} {task['tenant']}/{task['idempotency_key']} {task['state']}"
            f" repository {task['repository'] or '-'} approved base"
            f" {task['approved_base_sha'] or '-'} reason {task['reason'] or '-'}"
        )
        for step in q("SELECT * FROM steps WHERE task_id = ? ORDER BY position", (task["id"],)):
            attempts = " ".join(
                f"a{a['attempt']}:f{a['fence']}:{a['runner_id']}:{a['state']}"
                for a in q(
                    "SELECT * FROM attempts WHERE step_id = ? ORDER BY attempt", (step["id"],)
                )
            )
            effects = [
                e[0] for e in q("SELECT fence FROM effects WHERE step_id = ?", (step["id"],))
            ]
            lines.append(
                f"  step {step['id']} {step['state']} fence {step['fence'] or '-'} candidate"
                f" {step['candidate_sha'] or '-'} attempts [{attempts}] effects under fences"
                f" {effects}"
            )
    for row in q("SELECT * FROM outbox ORDER BY created_at, step_id"):
        attempts = " ".join(
            f"a{d['attempt']}:o{d['opening']}:{d['holder']}:{d['answer'] or 'open'}"
            for d in q(
                "SELECT * FROM deliveries WHERE step_id = ? ORDER BY attempt", (row["step_id"],)
            )
        )
        lines.append(
            f"effect {row['step_id']} {row['kind']} {'keyed' if row['keyed'] else 'unkeyed'}"
            f" {row['state']} holder {row['holder'] or '-'} openings {row['openings']}"
            f" digest {row['digest'][:8]} attempts [{attempts}]"
        )
    return lines
