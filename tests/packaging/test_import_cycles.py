"""No import cycle among the modules of `tether` (issue 25: rules in layers, no cycles).

The walk reads every `.py` file of the installed package `tether` with `ast`, importing none of
them; the folders the package links in (`tether/runner`, `tether/supervisor`, `tether/sim`) are
followed. The edges, from the module a statement is in:

- every `import` and `from ... import` statement counts wherever it is, a function-level import
  as much as one at the top, except those in the body of an `if TYPE_CHECKING:` block (its
  `else:` runs, so it counts);
- `import a.b` is an edge to `a.b`; `from a import b` is an edge to the module `a.b` when there
  is one, else to `a` itself (its `__init__`, which must run to give `b`); relative imports are
  resolved against the module's package;
- a name that is no module of `tether` (the standard library, a dependency) is left out, and so
  are the packages a dotted name passes through on its way (`tether`, `tether.supervisor`, ...),
  which every module of a package imports through;
- `importlib.import_module` at run time is no statement and is not counted, nor is a module's
  import of itself (it finds itself in `sys.modules`).

A cycle is a strongly connected component of more than one module; the failure names each
with one shortest loop through it, file and line per edge.
The check is shown to catch a cycle made by a function-level import and one made by a package
`__init__` that re-exports, in small packages written to a temporary folder.
"""

from __future__ import annotations

import ast
import collections
import itertools
import os
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path

import tether

# An edge: the module imported, and where the statement is (file:line).
Edges = Mapping[str, Mapping[str, str]]


def modules_under(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package`, whose folder is `root`, by dotted name; links followed."""
    found: dict[str, Path] = {}
    for folder, _, files in os.walk(root, followlinks=True):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = Path(folder) / name
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _under_type_checking(tree: ast.Module) -> set[int]:
    """The ids of the nodes in the body of an `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name == "TYPE_CHECKING":
            for statement in node.body:
                skipped.update(id(n) for n in ast.walk(statement))
    return skipped


def _imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The dotted names one statement imports, by the rule in the module's docstring (before
    they are matched against the modules that exist)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([node.module] if node.module else [])])
    for alias in node.names:
        yield f"{base}.{alias.name}"  # the submodule, if there is one; else `base` below


def import_edges(modules: Mapping[str, Path]) -> dict[str, dict[str, str]]:
    """For each module, the modules of `modules` it imports, each with where it does."""
    edges: dict[str, dict[str, str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skipped = _under_type_checking(tree)
        edges[module] = {}
        for node in ast.walk(tree):
            if id(node) in skipped or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _imported(module, path.name == "__init__.py", node):
                target = name
                if isinstance(node, ast.ImportFrom) and target not in modules:
                    target = target.rpartition(".")[0]  # `from pkg import name`: pkg itself
                if target in modules and target != module and target not in edges[module]:
                    edges[module][target] = f"{path}:{node.lineno}"
    return edges


def cycles(edges: Edges) -> list[list[str]]:
    """The strongly connected components that hold a cycle (Tarjan's algorithm, iterative),
    each sorted; sorted by their first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(edges[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def shortest_loop(edges: Edges, component: list[str]) -> list[str]:
    """One shortest path from the component's first module back to it, inside the component."""
    first, inside = component[0], set(component)
    came_from: dict[str, str] = {}
    queue = collections.deque([first])
    while queue:
        node = queue.popleft()
        for target in sorted(edges[node]):
            if target not in inside:
                continue
            if target == first:
                loop = [node]
                while loop[-1] != first:
                    loop.append(came_from[loop[-1]])
                return [*reversed(loop), first]
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"no loop through {first} in {component}")


def described(edges: Edges, found: list[list[str]]) -> str:
    lines = []
    for component in found:
        loop = shortest_loop(edges, component)
        lines.append(f"cycle among {', '.join(component)}:")
        lines += [f"  {a} -> {b}  ({edges[a][b]})" for a, b in itertools.pairwise(loop)]
    return "\n".join(lines)


def cycles_in(root: Path, package: str) -> tuple[dict[str, dict[str, str]], list[list[str]]]:
    edges = import_edges(modules_under(root, package))
    return edges, cycles(edges)


def test_no_module_of_tether_takes_part_in_an_import_cycle() -> None:
    edges, found = cycles_in(Path(tether.__file__).parent, "tether")
    # The walk reads the linked-in folders, and sees function-level imports in them.
    assert {"tether.runner.daemon", "tether.supervisor.ledger.lifecycle", "tether.sim.plants"} <= (
        edges.keys()
    )
    # `open_backend` imports postgres in the function (psycopg is an extra).
    assert "tether.supervisor.ledger.postgres" in edges["tether.supervisor.ledger.backends"]
    assert found == [], described(edges, found)


def write_package(root: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


def test_a_cycle_through_a_function_level_import_is_caught(tmp_path: Path) -> None:
    folder = write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/rules.py": "from pkg.leaf import LIMIT\nfrom pkg import steps\n",
            "pkg/leaf.py": "LIMIT = 3\n",
            "pkg/steps.py": """\
                def fail(x):
                    from pkg.rules import LIMIT  # the lazy import that closes the loop

                    return LIMIT
            """,
        },
    )
    edges, found = cycles_in(folder, "pkg")
    assert found == [["pkg.rules", "pkg.steps"]]
    message = described(edges, found)
    assert "pkg.rules -> pkg.steps" in message
    assert f"pkg.steps -> pkg.rules  ({folder / 'steps.py'}:2)" in message


def test_a_cycle_through_a_package_init_that_re_exports_is_caught(tmp_path: Path) -> None:
    # `from pkg.ledger import Tx`: no module `pkg.ledger.Tx`, so the edge is to the package,
    # whose `__init__` re-exports from the module that asked.
    folder = write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/ledger/__init__.py": "from pkg.ledger.store import Store\nfrom .tx import Tx\n",
            "pkg/ledger/tx.py": "class Tx: ...\n",
            "pkg/ledger/store.py": "from pkg.ledger import Tx\n\nclass Store: ...\n",
        },
    )
    edges, found = cycles_in(folder, "pkg")
    assert found == [["pkg.ledger", "pkg.ledger.store"]]
    assert "pkg.ledger.tx" in edges["pkg.ledger"]  # the relative import, resolved


def test_type_checking_imports_are_left_out_and_their_else_counts(tmp_path: Path) -> None:
    folder = write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": """\
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from pkg.a import A
            """,
        },
    )
    assert cycles_in(folder, "pkg")[1] == []
    (folder / "b.py").write_text(
        "import typing\n\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    from . import a\n"
    )
    assert cycles_in(folder, "pkg")[1] == [["pkg.a", "pkg.b"]]
