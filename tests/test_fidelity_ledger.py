"""docs/fidelity.md cannot rot: every cited test exists (file and function), every docs link names an existing page
and heading, every row has a verdict, and the page is in the docs' table of contents."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LEDGER = DOCS / "fidelity.md"
PAPERS = ("[Zhao2026]", "[Zhao2023]", "[Zhao2024]", "[Ziyin2024]", "[Gluch2021]")
CITED_TEST = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
CITED_EXAMPLE = re.compile(r"`(examples/[\w/]+\.py)`")
LINK = re.compile(r"\]\(([^)\s]*)\)")


def slug(title: str) -> str:
    """myst-parser's GitHub-style heading anchor (``myst_heading_anchors``): lower case, spaces to ``-``, every
    character that is not a word character, ``-`` or a space dropped."""
    return re.sub(r"[^\w\- ]", "", title.lower().replace(" ", "-"))


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings of levels 1–3 (the depth ``docs/conf.py`` gives anchors to), outside code
    fences."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"(#{1,3}) (.+)", line)
        if match:
            found.add(slug(match.group(2).strip()))
    return found


def rows() -> list[tuple[int, list[str]]]:
    """``(line number, cells)`` of every ledger table row (header and separator rows excluded)."""
    out = []
    for number, line in enumerate(LEDGER.read_text().splitlines(), 1):
        if not line.startswith("|") or set(line) <= set("|-: ") or line.startswith("| item |"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        out.append((number, cells))
    return out


def test_slug_matches_the_anchors_sphinx_builds():
    assert slug("Theory checks (`tests/test_teleport.py`)") == "theory-checks-teststest_teleportpy"
    assert slug("The paper's claims") == "the-papers-claims"


def test_every_row_has_four_cells_a_verdict_and_a_backing():
    table = rows()
    assert len(table) > 150
    for number, cells in table:
        assert len(cells) == 4, f"line {number}: {len(cells)} cells"
        item, verdict, backing, _ = cells
        assert item and verdict, f"line {number}: empty item or verdict"
        cited = CITED_TEST.findall(backing) or CITED_EXAMPLE.findall(backing)
        assert cited or backing.startswith("no test yet") or backing == "—", f"line {number}: backing {backing!r}"
        if backing == "—":   # only rows without a claim go without a check
            assert "no claim" in verdict or "background" in verdict, f"line {number}: a claim without a check"


def test_every_cited_test_exists():
    cited = [(n, f, name) for n, cells in rows() for f, name in CITED_TEST.findall(cells[2])]
    assert len(cited) > 100
    missing = [f"line {n}: {f}::{name}" for n, f, name in cited
               if not (ROOT / f).is_file() or not re.search(rf"^def {name}\(", (ROOT / f).read_text(), re.M)]
    assert not missing, missing


def test_every_cited_example_exists():
    for number, cells in rows():
        for path in CITED_EXAMPLE.findall(cells[2]):
            assert (ROOT / path).is_file(), f"line {number}: {path}"


def test_every_docs_link_resolves_to_a_heading():
    own = anchors(LEDGER)
    links = [(n, target) for n, cells in rows() for target in LINK.findall(cells[3])]
    assert len(links) > 150
    for number, target in links:
        page, _, anchor = target.partition("#")
        assert anchor, f"line {number}: {target} names no section"
        headings = own if not page else anchors(DOCS / page) if (DOCS / page).is_file() else None
        assert headings is not None, f"line {number}: no page {page}"
        assert anchor in headings, f"line {number}: no heading #{anchor} in {page or 'fidelity.md'}"


def test_every_paper_has_a_table_and_the_page_is_in_the_toctree():
    text = LEDGER.read_text()
    for key in PAPERS:
        assert re.search(rf"^## {re.escape(key)}", text, re.M), key
    assert re.search(r"^fidelity$", (DOCS / "index.md").read_text(), re.M)

