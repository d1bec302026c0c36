"""The explorer's planted bugs live outside the ledger: each swaps one ledger function only
while its block lasts, and the production rules hold no switch for it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tether.supervisor.ledger
from tether.sim.plants import PLANTS, planted

LEDGER = Path(tether.supervisor.ledger.__file__).parent


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_a_plant_swaps_its_function_only_inside_its_block(name: str) -> None:
    plant = PLANTS[name]
    original = getattr(plant.module, plant.name)
    seen = []

    def failing_run() -> None:
        with planted(name):
            seen.append(getattr(plant.module, plant.name))
            raise RuntimeError("the run fails")

    with pytest.raises(RuntimeError):
        failing_run()
    assert seen == [plant.replacement] != [original]
    assert getattr(plant.module, plant.name) is original


def test_an_unknown_plant_is_refused_and_swaps_nothing() -> None:
    before = {name: getattr(p.module, p.name) for name, p in PLANTS.items()}
    with pytest.raises(ValueError, match="unknown planted bug 'gremlin'"), planted("gremlin"):
        pass
    assert before == {name: getattr(p.module, p.name) for name, p in PLANTS.items()}


def test_no_ledger_module_knows_the_plants() -> None:
    named = set()
    for path in LEDGER.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name | ast.Attribute):
                named.add(node.id if isinstance(node, ast.Name) else node.attr)
            if isinstance(node, ast.ImportFrom) and node.module:
                named.add(node.module)
    # (`checks` is a word of the wire now, a task's checks; the plants are named below.)
    chaos = {"PLANTS", "Plant", "tether.sim", "tether.sim.plants", "planted"}
    assert chaos & named == set()
