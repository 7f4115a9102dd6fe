"""User text reaches the terminal literally (issue #35, case 1 and the kind "user text interpreted as terminal
markup"): rich markup (``[/i]``, ``[/]``, ``[in vitro]``), ``:emoji:`` codes, control characters and lone
surrogates in titles, paths, ids and retriever names are printed as text by every printer, never parsed."""

from __future__ import annotations

import io
import json
from contextlib import contextmanager
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import TINY_QRELS, TINY_QUERIES, flat_index, write_beir

runner = CliRunner()

# fragments a new user's data holds: markup tags (closing ones raise MarkupError, others vanish), emoji codes,
# NUL, ESC sequences, carriage returns, lone surrogates (from undecodable file names), spaces
FRAGMENTS = ["[/i]", "[/]", "[in vitro]", "[bold red]", "[link=http://x]", "[", "]", "\\[", ":smile:", " ", "  ",
             "\x00", "\x1b[31m", "\r", "\x08", "\x7f", "\x85", "\ud800", "\udcff", "é", "猫", "a", "Cats"]
texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS),
                           st.text(st.characters(codec="utf-8", exclude_characters="\n\t"), max_size=4)),
                 max_size=6).map("".join)


def squeeze(text: str) -> str:
    """``text`` without whitespace: a table wraps a title wider than itself."""
    return "".join(text.split())


def visible(text: str) -> str:
    """The reference: ``text`` with control characters and lone surrogates as Python's unicode_escape codec
    writes them, every other character itself."""
    import unicodedata

    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in ("Cc", "Cs") else ch
                   for ch in text)


@contextmanager
def strict_utf8(con):
    """Point a console at a strict UTF-8 byte stream (a terminal's encoding: a lone surrogate cannot be written);
    yield a function returning what was written."""
    buffer = io.BytesIO()
    stream = io.TextIOWrapper(buffer, encoding="utf-8", errors="strict")
    saved, saved_width = con._file, con.width  # None (follow sys.stdout/stderr) for the CLI's consoles
    con.file = stream
    con.width = 400
    try:
        yield lambda: (stream.flush(), buffer.getvalue().decode("utf-8"))[1]
    finally:
        con._file, con.width = saved, saved_width


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts)
def test_console_prints_any_user_text_literally(text):
    from twotower.cli.console import console

    with strict_utf8(console) as written:
        console.print(text, soft_wrap=True)
    assert written() == visible(text) + "\n"


@settings(max_examples=100, deadline=None)
@given(texts)
def test_fail_and_warn_print_the_message_literally(text):
    from twotower.cli.console import err_console, fail, warn

    with strict_utf8(err_console) as written:
        warn(f"title {text}")
        with pytest.raises(typer.Exit) as exc:
            fail(f"in {text}")
    assert exc.value.exit_code == 2
    assert written() == f"warning: title {visible(text)}\nerror: in {visible(text)}\n"


@settings(max_examples=100, deadline=None)
@given(texts, texts, texts)
def test_metrics_table_shows_retriever_model_and_title_literally(retriever, model, title):
    from twotower.cli.evaluate import metrics_table
    from twotower.cli.console import console

    row = {"retriever": retriever, "model": model, "metrics": {"ndcg@10": 0.5}, "timings": {"queries_per_s": 2.0}}
    with strict_utf8(console) as written:
        console.print(metrics_table([row], title=title))
    out = squeeze(written())
    for text in (retriever, model, title):
        assert squeeze(visible(text)) in out
    assert "0.5000" in out


@settings(max_examples=50, deadline=None)
@given(texts, texts)
def test_analysis_rows_table_shows_cells_and_title_literally(cell, title):
    from twotower.cli.analyze import rows_table
    from twotower.cli.console import console

    with strict_utf8(console) as written:
        console.print(rows_table({"title": title, "rows": [{"name": cell, "value": 1.5}]}))
    out = squeeze(written())
    assert squeeze(visible(cell)) in out and squeeze(visible(title)) in out


# ---- the listed cases through the real CLI ------------------------------------------------------------------------


def test_table_prints_markup_in_retriever_and_model_names(tmp_path):
    from twotower.cli import app

    path = tmp_path / "r.json"
    path.write_text(json.dumps({"retriever": "bm25 [/i]", "model": "m [in vitro] [/]", "metrics": {"ndcg@10": 0.25},
                                "timings": {"queries_per_s": 3.0}}))
    res = runner.invoke(app, ["table", str(path)])
    assert res.exit_code == 0, res.output
    assert "bm25 [/i]" in res.output and "m [in vitro] [/]" in res.output and "0.2500" in res.output


def test_eval_title_keeps_a_bracketed_data_folder_name(tmp_path):
    from twotower.cli import app

    from conftest import TINY_CORPUS

    data = write_beir(tmp_path / "sci [in vitro] [b]fact", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    res = runner.invoke(app, ["eval", "--data", str(data), "--retriever", "bm25", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "sci [in vitro] [b]fact / test (3 queries)" in res.output


def test_search_table_keeps_bracketed_titles_and_ids(tmp_path, tiny_bert_dir):
    from twotower.cli import app

    corpus = [{"_id": "d[/]1", "title": "Cats [in vitro] purr [/i]", "text": "cats purr"},
              {"_id": "d2", "title": "Dogs", "text": "dogs bark"}]
    data = write_beir(tmp_path / "data", corpus, [{"_id": "q1", "text": "cats"}], [("q1", "d[/]1", 1)])
    index = flat_index(data, tiny_bert_dir, tmp_path / "idx")
    res = runner.invoke(app, ["search", "--index", str(index), "--mode", "bm25", "-k", "2", "cats purr"])
    assert res.exit_code == 0, res.output
    assert "Cats [in vitro] purr [/i]" in res.output and "d[/]1" in res.output


def test_eval_table_shows_a_model_path_holding_markup(tmp_path, tiny_bert_dir, monkeypatch):
    """The model column of eval's table holds the --model path: ``.../m[/i]`` raised MarkupError after the run."""
    import shutil

    from twotower.cli import app

    from conftest import TINY_CORPUS

    data = write_beir(tmp_path / "data", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    monkeypatch.chdir(tmp_path)  # a relative path: a long temporary folder would be cut short in the table
    model = Path("m[") / "i] [in vitro]"
    shutil.copytree(tiny_bert_dir, model)
    res = runner.invoke(app, ["eval", "--data", str(data), "--model", str(model), "--retriever", "dense",
                              "--precision", "fp32", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "MarkupError" not in res.output and squeeze("m[/i] [in vitro]") in squeeze(res.output), res.output


def test_paths_are_not_highlighted_into_other_words(tmp_path):
    """A path printed by a command comes back whole (no markup, no emoji code turned into a picture)."""
    from twotower.cli.console import console

    with strict_utf8(console) as written:
        console.print(f"wrote {Path('/tmp/:thumbs_up:/[b]x[/b]')}", soft_wrap=True)
    assert written() == "wrote /tmp/:thumbs_up:/[b]x[/b]\n"
