"""The explorer's planted bugs live outside the ledger: each swaps one ledger function only
while its block lasts, only where its module declares a seam, and the production rules hold no
switch for it."""

from __future__ import annotations

import ast
import dataclasses
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


def called_by_bare_name(module_path: Path) -> set[str]:
    """The names a module's code calls as `name(...)`: a swap of the module's global reaches
    exactly these calls."""
    tree = ast.parse(module_path.read_text())
    return {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }


def test_every_plant_targets_a_declared_seam_that_its_rules_call() -> None:
    for name, plant in PLANTS.items():
        assert plant.name in plant.module.SEAMS, name
    for path in LEDGER.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            declares = isinstance(node, ast.AnnAssign | ast.Assign) and "SEAMS" in ast.unparse(node)
            if declares:
                seams = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)}
                assert seams <= called_by_bare_name(path), path.name


def test_a_plant_on_a_name_its_module_does_not_declare_is_refused() -> None:
    plant = PLANTS["stale-fence"]
    undeclared = dataclasses.replace(plant, name="effect_key")  # imported there, not a seam
    original = plant.module.effect_key
    PLANTS["undeclared"] = undeclared
    try:
        with (
            pytest.raises(ValueError, match=r"effects\.effect_key is not a seam"),
            planted("undeclared"),
        ):
            pass
    finally:
        del PLANTS["undeclared"]
    assert plant.module.effect_key is original
