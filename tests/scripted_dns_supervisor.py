"""`tether-supervisor serve` whose effects' names are answered by a script: a DNS server an
attacker controls, for tests/supervisor/effects/test_effects_owned_side.py.

Run as a program, never imported by the tests: the same `serve` the command line runs, its
settings read the same way (defaults < `TETHER_*` < flags), with the resolver `serve` takes
injected. `--answers FILE` is JSON `{"name": [[address, ...], ...]}`: the n-th question
about a name gets its n-th answer (the last one again once they run out); a name not in the
file gets no address. Each question is appended to `--asked FILE` as a JSON line
`{"name", "answer"}`.

    python tests/scripted_dns_supervisor.py --answers a.json --asked asked.jsonl \
        --db ledger.db --port 8080
"""

from __future__ import annotations

import argparse
import ipaddress
import json
from pathlib import Path

from tether.settings import load_settings
from tether.supervisor.ledger.destinations import Address
from tether.supervisor.server import serve
from tether.supervisor.settings import SupervisorSettings


class ScriptedResolver:
    def __init__(self, answers: Path, asked: Path) -> None:
        self.answers = answers
        self.asked = asked
        self.questions: dict[str, int] = {}

    async def __call__(self, name: str, port: int) -> list[Address]:
        script: dict[str, list[list[str]]] = json.loads(self.answers.read_text())
        answers = script.get(name) or [[]]
        n = self.questions.get(name, 0)
        self.questions[name] = n + 1
        answer = answers[min(n, len(answers) - 1)]
        with self.asked.open("a") as out:
            out.write(json.dumps({"name": name, "answer": answer}) + "\n")
        return [ipaddress.ip_address(a) for a in answer]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--answers", type=Path, required=True)
    parser.add_argument("--asked", type=Path, required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    flags = {"db": args.db, "host": args.host, "port": args.port}
    settings = load_settings(SupervisorSettings, flags=flags)
    return serve(settings, resolver=ScriptedResolver(args.answers, args.asked))


if __name__ == "__main__":
    raise SystemExit(main())
