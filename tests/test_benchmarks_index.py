"""benchmarks/README.md is the index of the benchmarks: every script, every results file, and for each the docs pages
that show it. Checked against the files, so that a new result or a new link to one cannot go unlisted."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
README = BENCH / "README.md"
HEADLINE_MARKER = "<!-- headline -->"
_RESULT = re.compile(r"`([\w-]+)\.json`")
_PAGE = re.compile(r"\]\(\.\./((?:docs/[\w./-]+|README)\.md)\)")


def index_rows(text: str) -> list[tuple[set[str], set[str]]]:
    """(results, pages) of every table row of the README that names a results file."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and (results := set(_RESULT.findall(line))):
            rows.append((results, set(_PAGE.findall(line))))
    return rows


def pages_showing(name: str, pages: dict[str, str], headline: set[str]) -> set[str]:
    """The pages that link the result ``name``: as a served run, by its path, or through the headline table."""
    link = re.compile(r"(runs/|benchmarks/results/|`results/)" + re.escape(name) + r"\b")
    return {page for page, text in pages.items()
            if link.search(text) or (name in headline and (HEADLINE_MARKER in text or page == "README.md"))}


def site_pages() -> dict[str, str]:
    found = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md")}
    found["README.md"] = (ROOT / "README.md").read_text(encoding="utf-8")
    return found


def headline_sources() -> set[str]:
    rows = json.loads((ROOT / "docs" / "hooks" / "headline.json").read_text())["rows"]
    return {row["source"].removesuffix(".json") for row in rows}


def test_the_checker_reads_rows_and_links():
    text = ("| Script | Results | Shown on |\n|---|---|---|\n"
            "| `a.py` | `a.json`, `a_b.json` (`--name a_b`) | [x](../docs/guides/x.md), [README](../README.md) |\n"
            "| `helper.py` | none | — |\n")
    assert index_rows(text) == [({"a", "a_b"}, {"docs/guides/x.md", "README.md"})]
    pages = {"docs/p.md": "see [run](runs/a.md)", "docs/q.md": "runs/a_b.md and `results/speed.md`",
             "docs/r.md": "the [guide](../results/a.md)", "docs/h.md": HEADLINE_MARKER, "README.md": ""}
    assert pages_showing("a", pages, headline=set()) == {"docs/p.md"}  # runs/a_b is not runs/a; ../results/a.md a page
    assert pages_showing("speed", pages, headline=set()) == {"docs/q.md"}
    assert pages_showing("a", pages, headline={"a"}) == {"docs/p.md", "docs/h.md", "README.md"}


def test_every_result_and_script_is_listed():
    text = README.read_text(encoding="utf-8")
    listed = set(_RESULT.findall(text))
    missing = sorted(p.name for p in (BENCH / "results").glob("*.json") if p.stem not in listed)
    assert missing == [], f"results without an entry in benchmarks/README.md: {missing}"
    scripts = [p.relative_to(BENCH).as_posix() for p in [*BENCH.glob("*.py"), *BENCH.glob("experiments/*.py")]]
    unlisted = sorted(s for s in scripts if f"`{s}`" not in text)
    assert unlisted == [], f"scripts without an entry in benchmarks/README.md: {unlisted}"
    gone = sorted(s for s in re.findall(r"`((?:experiments/)?\w+\.py)`", text) if not (BENCH / s).is_file())
    assert gone == [], f"benchmarks/README.md lists scripts that do not exist: {gone}"


def test_each_row_names_exactly_the_pages_that_show_its_results():
    pages, headline = site_pages(), headline_sources()
    rows = index_rows(README.read_text(encoding="utf-8"))
    assert rows, "no table rows found in benchmarks/README.md"
    wrong = {}
    for results, named in rows:
        for page in named:
            assert (ROOT / page).is_file(), f"benchmarks/README.md links {page}, which does not exist"
        shown = set().union(*(pages_showing(r, pages, headline) for r in results))
        if shown != named:
            wrong[", ".join(sorted(results))] = {"unnamed": sorted(shown - named), "not showing": sorted(named - shown)}
    assert wrong == {}


def test_the_quality_tools_have_their_own_index():
    """tools/quality/ holds the checks of the code itself (not benchmarks): its README lists each script and each
    results file there, and names none that is gone."""
    quality = ROOT / "tools" / "quality"
    text = (quality / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in quality.glob("*.py"))
    results = sorted(p.name for p in (quality / "results").glob("*.*"))
    assert scripts and results
    unlisted = [name for name in scripts + results if f"`{name}`" not in text]
    assert unlisted == [], f"files of tools/quality/ without an entry in its README.md: {unlisted}"
    gone = sorted(s for s in re.findall(r"`(\w+\.(?:py|json|md))`", text)
                  if not (quality / s).is_file() and not (quality / "results" / s).is_file())
    assert gone == [], f"tools/quality/README.md names files that do not exist: {gone}"
