"""No import cycle anywhere in posenc_cli, counting imports inside functions and under TYPE_CHECKING (grimp's graph,
the one `lint-imports` reads). Its `acyclic_siblings` contract in pyproject.toml checks packages' children; this test
checks single modules, parents and children included, and names every cycle it finds."""

from __future__ import annotations

import grimp
import pytest

ATTENTION = "posenc_cli.attention"


@pytest.fixture(scope="module")
def cycles() -> list[list[str]]:
    return import_cycles(grimp.build_graph("posenc_cli", cache_dir=None))


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every set of modules that import each other (directly or through others), each sorted: the strongly connected
    components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, imported = work[-1]
            step = next(imported, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.find_modules_directly_imported_by(step)))))
                elif step in on_stack:
                    low[module] = min(low[module], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _in_attention(cycle: list[str]) -> bool:
    return all(m.startswith(f"{ATTENTION}.") for m in cycle)


def test_import_cycles_are_found() -> None:
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"), ("p.d", "p.e"), ("p.e", "p.d")]:
        graph.add_import(importer=a, imported=b)
    assert import_cycles(graph) == [["p.a", "p.b", "p.c"], ["p.d", "p.e"]]


def test_no_import_cycle(cycles: list[list[str]]) -> None:
    outside = [cycle for cycle in cycles if not _in_attention(cycle)]
    assert not outside, "import cycles: " + "; ".join(" <-> ".join(cycle) for cycle in outside)


def test_no_import_cycle_in_attention(cycles: list[list[str]]) -> None:
    inside = [cycle for cycle in cycles if _in_attention(cycle)]
    assert not inside, "import cycles: " + "; ".join(" <-> ".join(cycle) for cycle in inside)
