"""One set of headline numbers: the README's table is the one the docs render from the committed results files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _headline():
    spec = importlib.util.spec_from_file_location("headline_hook", ROOT / "docs" / "hooks" / "headline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_holds_the_table_rendered_from_the_results_files():
    table = _headline().table(ROOT)
    assert table in (ROOT / "README.md").read_text(encoding="utf-8"), (
        "README.md's results table differs from the one rendered from benchmarks/results: paste the output of "
        "`python docs/hooks/headline.py` into it")


def test_the_docs_pages_with_headline_numbers_use_the_rendered_table():
    for page in ("docs/index.md", "docs/results/index.md"):
        assert "<!-- headline -->" in (ROOT / page).read_text(encoding="utf-8"), page


def test_every_number_comes_from_its_results_row(tmp_path):
    """The rendered numbers are the results file's: change one there and the table changes (no number is typed)."""
    hook = _headline()
    (tmp_path / "docs" / "hooks").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    spec = json.loads((ROOT / "docs" / "hooks" / "headline.json").read_text(encoding="utf-8"))
    (tmp_path / "docs" / "hooks" / "headline.json").write_text(json.dumps(spec))
    for row in spec["rows"]:
        target = tmp_path / "benchmarks" / "results" / row["source"]
        data = json.loads((target if target.exists() else ROOT / "benchmarks" / "results" / row["source"]).read_text())
        for r in data["rows"]:
            if r.get("system") == row["system"]:
                r["ndcg@10"] = 0.1234
        target.write_text(json.dumps(data))
    table = hook.table(tmp_path)
    assert table.count("0.1234") == len(spec["rows"])
    spec["rows"][0]["system"] = "no such row"
    (tmp_path / "docs" / "hooks" / "headline.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="no such row"):
        hook.table(tmp_path)


def test_the_quickstarts_and_readme_quote_one_zero_shot_number_per_row():
    """Issue #55: the README, both quickstarts and `make demo` showed three dense numbers. Every zero-shot SciFact
    NDCG@10 / Recall@100 they quote is the demo results file's (the headline table's first two rows), and the runtime
    is stated beside the dense one."""
    import re

    demo = {r["system"]: r for r in json.loads((ROOT / "benchmarks" / "results" / "demo_scifact.json").read_text())["rows"]}
    allowed = {f"{demo[s][m]:.4f}" for s in ("bm25", "dense") for m in ("ndcg@10", "recall@100")}
    spec = json.loads((ROOT / "docs" / "hooks" / "headline.json").read_text(encoding="utf-8"))
    assert [(r["source"], r["system"]) for r in spec["rows"][:2]] == [("demo_scifact.json", "bm25"),
                                                                     ("demo_scifact.json", "dense")]
    for page in ("README.md", "docs/getting-started/quickstart-cli.md", "docs/getting-started/quickstart-python.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        quoted = set(re.findall(r"\b0\.6[0-9]{3}\b", text)) | set(re.findall(r"\b0\.9[0-3][0-9]{2}\b", text))
        assert quoted <= allowed, (page, quoted - allowed)
        assert f"{demo['dense']['ndcg@10']:.4f}" in text, page
    cli = (ROOT / "docs/getting-started/quickstart-cli.md").read_text(encoding="utf-8")
    assert demo["dense"]["runtime"] in cli
