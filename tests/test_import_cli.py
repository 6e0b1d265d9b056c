"""The CLI layer maps flags to one API call and renders what it returns (issue #41 item 1): a module of cli/ imports
the API, report/, errors, config, the progress display and other modules of cli/, nothing else of posenc_cli
(imports inside functions and under TYPE_CHECKING counted: grimp's graph, the one `lint-imports` reads). The
forbidden contract in pyproject.toml says the same for CI; this test also holds its list whole (every layer but the
allowed ones), so a new package cannot slip under the CLI unnoticed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = "posenc_cli"
CLI = f"{ROOT}.cli"
# What a command may import: the root package (its __version__), the API, rendering, errors, config and the
# progress display. The contract's ignore_imports names the progress display, a module of the forbidden run/.
ALLOWED = (ROOT, CLI, f"{ROOT}.api", f"{ROOT}.report", f"{ROOT}.errors", f"{ROOT}.config", f"{ROOT}.run.progress")
CONTRACT = "A command maps flags to one API call and renders"


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def _allowed(module: str) -> bool:
    return module == ROOT or any(_within(module, a) for a in ALLOWED[1:])


def imports_below_the_api(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    """(importer, imported) for every direct import of a cli/ module into posenc_cli outside `ALLOWED`."""
    found = []
    for module in sorted(m for m in graph.modules if _within(m, CLI)):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if _within(imported, ROOT) and not _allowed(imported):
                found.append((module, imported))
    return found


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(ROOT, cache_dir=None)


def test_an_import_below_the_api_is_found() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in [
        (f"{CLI}.app", f"{ROOT}.api.option_ranges"),
        (f"{CLI}.app", f"{ROOT}.run.progress"),
        (f"{CLI}.app", f"{ROOT}.run.interrupts"),  # below the API
        (f"{CLI}.extend", f"{ROOT}.rope_scaling"),  # below the API
        (f"{CLI}.extend", ROOT),
        (f"{ROOT}.api.extension", f"{ROOT}.rope_scaling"),  # not the CLI's
    ]:
        graph.add_import(importer=importer, imported=imported)
    assert imports_below_the_api(graph) == [
        (f"{CLI}.app", f"{ROOT}.run.interrupts"),
        (f"{CLI}.extend", f"{ROOT}.rope_scaling"),
    ]


def test_the_cli_imports_only_the_api_rendering_errors_and_config(graph: grimp.ImportGraph) -> None:
    below = imports_below_the_api(graph)
    assert not below, "cli/ reaches below the API: " + "; ".join(f"{a} -> {b}" for a, b in below)


def test_the_contract_forbids_every_other_package() -> None:
    """pyproject.toml's forbidden contract names every layer of the layers contract (exhaustive: every child of
    posenc_cli) that `ALLOWED` does not."""
    contracts = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in contracts["contracts"] if c["name"].startswith(CONTRACT))
    layers = next(c for c in contracts["contracts"] if c["type"] == "layers" and c["containers"] == [ROOT])
    children = {f"{ROOT}.{name.strip()}" for layer in layers["layers"] for name in layer.split("|")}
    assert set(contract["forbidden_modules"]) == {m for m in children if not _allowed(m)}
    assert contract["ignore_imports"] == [f"{CLI}.** -> {ROOT}.run.progress"]
