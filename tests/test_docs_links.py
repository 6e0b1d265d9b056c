"""The README's map of the docs and mkdocs.yml's nav stay valid without mkdocs installed (CI also runs
`mkdocs build --strict`, which checks the links between the pages themselves)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """Python-Markdown's toc anchor for a heading (its default `slugify`)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # no headings inside code blocks
    return {slug(h) for h in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M)}


def nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for v in node.values() for p in nav_pages(v)]
    if isinstance(node, list):
        return [p for v in node for p in nav_pages(v)]
    return []


def test_readme_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = [t for t in LINK.findall(readme) if not t.startswith(("http://", "https://"))]
    assert targets, "the README links its docs"
    for target in targets:
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README links a missing file: {target}"
        if anchor:
            assert anchor in anchors(ROOT / path), f"README links a missing heading: {target}"


def test_nav_lists_every_page() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["theme"]["name"] == "material"
    listed = nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(listed) == pages, "mkdocs.yml's nav and the pages under docs/ differ"
    assert len(set(listed)) == len(listed), "a page is listed twice"


def test_quick_start_commands_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    for command in ("pip install torch==2.13.0 && pip install -e '.[dev]' && posenc sweep", "pytest -n 2 -q"):
        assert re.search(rf"^{re.escape(command)}(\s|$)", readme, flags=re.M), command
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^pytest -n 2 -q$", ci, flags=re.M), "CI runs the README's test command"
    assert "mkdocs build --strict" in ci
