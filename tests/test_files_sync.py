"""Files in (a folder of .txt/.md/.html/.pdf/.docx read into documents, bad files skipped with their reason),
kept in sync (only new or changed files encoded, in one write), and a PDF passage's page (issue #70)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import twotower as tt
from twotower.data.files import load_files, page_of
from pdf_maker import write_pdf

runner = CliRunner()

LOREM = ("The quick brown fox jumps over the lazy dog near the river bank. ", "Tea leaves are steamed or roasted "
         "before they are dried. ", "A compiler turns source code into machine code for a processor. ")


def _folder(root: Path) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.txt").write_text("Plain notes about tea.\r\nGreen tea is steamed.\r\n", encoding="utf-8")
    (root / "guide.md").write_text("Intro line\n\n# The Guide\n\nMarkdown body on coffee roasting.\n")
    (root / "sub" / "page.html").write_text(
        "<html><head><title>Page Title</title><script>var secretScript = 1;</script></head><body>"
        "<nav>Home | About | Contact</nav><main><h1>Heading</h1><p>The main text of this page explains how "
        "sourdough bread rises with wild yeast over many hours.</p><p>A second paragraph on crust.</p></main>"
        "<footer>Copyright footer</footer></body></html>")
    write_pdf(root / "sub" / "deeper" / "manual.pdf",
              [["Chapter one talks about engines."], ["Chapter two explains the gearbox in detail."],
               ["Chapter three is about brakes and tyres."]], title="Car Manual")
    import docx

    d = docx.Document()
    d.add_heading("Word Heading", level=1)
    d.add_paragraph("A Word document about sailing boats.")
    d.save(str(root / "letter.docx"))
    return root


def _bad_files(root: Path) -> None:
    (root / "binary.txt").write_bytes(b"\x00\x01\x02" * 200)
    (root / "data.csv").write_text("a,b\n1,2\n")
    (root / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not a pdf body")
    (root / "fake.pdf").write_bytes(b"hello, I am not a PDF at all")
    (root / "undecodable.txt").write_bytes(bytes(range(128, 256)) * 4 + b"\x81\x8d\x8f\x90\x9d" * 20)
    (root / "empty.md").write_text("   \n")
    (root / ".hidden.txt").write_text("hidden text")
    os.symlink(root / "nowhere.txt", root / "dangling.txt")
    os.symlink(root, root / "sub" / "loop")
    import pypdf

    writer = pypdf.PdfWriter(clone_from=str(write_pdf(root / "plain.tmp", [["Secret text."]])))
    writer.encrypt("password")
    with open(root / "locked.pdf", "wb") as fh:
        writer.write(fh)
    (root / "plain.tmp").unlink()


def test_a_folder_becomes_one_document_per_file_with_ids_titles_and_metadata(tmp_path):
    loaded = load_files(_folder(tmp_path / "docs"))
    docs = {d.id: d for d in loaded.documents}
    assert sorted(docs) == ["a.txt", "guide.md", "letter.docx", "sub/deeper/manual.pdf", "sub/page.html"]
    assert [d.id for d in loaded.documents] == sorted(docs)
    assert docs["a.txt"].title == "a.txt" and "\r" not in docs["a.txt"].text
    assert docs["guide.md"].title == "The Guide"  # the first heading, not the first line
    assert docs["sub/page.html"].title == "Page Title"
    html = docs["sub/page.html"].text
    assert "sourdough bread rises" in html and "secretScript" not in html and "Copyright footer" not in html
    assert docs["sub/deeper/manual.pdf"].title == "Car Manual"
    assert docs["letter.docx"].title == "Word Heading" and "sailing boats" in docs["letter.docx"].text
    for doc_id, doc in docs.items():
        raw = (tmp_path / "docs" / doc_id).read_bytes()
        import hashlib

        assert doc.metadata["source"] == doc_id and doc.metadata["size"] == len(raw)
        assert doc.metadata["sha256"] == hashlib.sha256(raw).hexdigest()
        assert doc.metadata["mtime"] == pytest.approx((tmp_path / "docs" / doc_id).stat().st_mtime, abs=1e-3)
    pdf = docs["sub/deeper/manual.pdf"]
    starts = pdf.metadata["page_starts"]
    assert pdf.metadata["pages"] == 3 and len(starts) == 3
    for page, phrase in ((1, "engines"), (2, "gearbox"), (3, "brakes")):
        assert page_of(starts, pdf.text.index(phrase)) == page


def test_bad_files_are_skipped_with_their_reason_and_the_rest_go_in(tmp_path):
    root = _folder(tmp_path / "docs")
    _bad_files(root)
    (root / "big.txt").write_text("word " * 20_000)
    loaded = load_files(root, max_bytes=60_000)
    reasons = {s.path: s.reason for s in loaded.skipped}
    assert len(loaded.documents) == 5
    assert reasons["binary.txt"].startswith("binary file")
    assert reasons["data.csv"].startswith("unknown kind of file (.csv)")
    assert reasons["broken.pdf"].startswith("corrupt PDF")
    assert reasons["fake.pdf"].startswith("corrupt PDF")
    assert reasons["locked.pdf"].startswith("encrypted PDF")
    assert reasons["undecodable.txt"].startswith("undecodable") or "undecodable.txt" in {d.id for d in loaded.documents}
    assert reasons["empty.md"] == "no text"
    assert reasons["dangling.txt"] == "broken symbolic link"
    assert reasons["sub/loop"].startswith("symbolic link loop")
    assert reasons["big.txt"].startswith("over the size limit")
    assert ".hidden.txt" not in reasons and ".hidden.txt" not in {d.id for d in loaded.documents}
    summary = loaded.summary()
    assert summary.startswith(f"5 files read, {len(loaded.skipped)} skipped (") and "corrupt PDF" in summary


def test_a_single_file_and_a_glob(tmp_path):
    root = _folder(tmp_path / "docs")
    one = load_files(root / "guide.md")
    assert [d.id for d in one.documents] == ["guide.md"]
    globbed = load_files(str(root) + "/**/*.pdf")
    assert [d.id for d in globbed.documents] == ["sub/deeper/manual.pdf"]
    with pytest.raises(tt.DataError, match="no such file or folder"):
        load_files(root / "missing.txt")
    with pytest.raises(tt.DataError, match="no file in it could be read"):
        load_files(str(root) + "/*.csv")


def _count_encoded(monkeypatch) -> list[int]:
    """The number of texts each call of the encoder's document encoding received."""
    from twotower.encoders.towers import DualEncoder

    calls: list[int] = []
    original = DualEncoder.encode_documents

    def counting(self, texts, *args, **kwargs):
        calls.append(len(texts))
        return original(self, texts, *args, **kwargs)

    monkeypatch.setattr(DualEncoder, "encode_documents", counting)
    return calls


def _many(root: Path, n: int = 8) -> Path:
    root.mkdir(parents=True)
    for i in range(n):
        sub = root / ("part" if i % 2 else "") / f"f{i}.txt"
        sub.parent.mkdir(parents=True, exist_ok=True)
        sub.write_text(f"File number {i}. " + LOREM[i % 3] * 3)
    return root


def test_sync_adds_updates_and_removes_exactly_and_encodes_only_what_changed(tmp_path, tiny_bert_dir, monkeypatch):
    root = _many(tmp_path / "docs")
    index = tt.Index.build(tmp_path / "idx", root, encoder=str(tiny_bert_dir), bm25=True, show_progress=False)
    assert len(index) == 8 and index.skipped == []
    for name in ("f0.txt", "part/f1.txt", "f2.txt"):  # 3 changed
        (root / name).write_text((root / name).read_text() + " Changed: zebras graze at dawn.")
    (root / "part" / "f3.txt").unlink()
    (root / "f4.txt").unlink()  # 2 removed
    (root / "new1.md").write_text("# New one\nAstronomy of distant quasars.")
    (root / "part" / "new2.txt").write_text("Volcanoes erupt molten rock.")  # 2 added
    before = index.info()["live_version"]
    dry = index.sync(root, dry_run=True)
    assert {k: dry[k] for k in ("added", "updated", "removed", "unchanged")} == \
        {"added": 2, "updated": 3, "removed": 2, "unchanged": 3}
    assert index.info()["live_version"] == before  # a dry run writes nothing
    calls = _count_encoded(monkeypatch)
    result = runner.invoke(tt_cli(), ["index", "sync", "--data", str(root), "--index", str(tmp_path / "idx"),
                                      "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"added": 2, "updated": 3, "removed": 2, "unchanged": 3, "skipped": []}
    assert sum(calls) == 5  # one passage each: only the 5 new or changed files were encoded
    index = tt.Index.open(tmp_path / "idx")
    assert sorted(index.list(limit=None).ids) == sorted(
        ["f0.txt", "part/f1.txt", "f2.txt", "part/f5.txt", "f6.txt", "part/f7.txt", "new1.md", "part/new2.txt"])
    [changed] = index.get(["f2.txt"])
    assert changed.text.endswith("zebras graze at dawn.") and changed.metadata["sha256"] != ""
    assert index.search("volcanoes molten rock", k=8, mode="bm25")[0].id == "part/new2.txt"  # BM25 kept in step
    assert not index.search("zebras graze", k=8, mode="bm25", filter={"source": "f4.txt"})
    again = index.sync(root)
    assert {k: again[k] for k in ("added", "updated", "removed")} == {"added": 0, "updated": 0, "removed": 0}


def tt_cli():
    from twotower.cli import app

    return app


def test_build_over_an_index_refuses_unless_told_and_append_adds(tmp_path, tiny_bert_dir):
    path = tmp_path / "idx"
    tt.Index.build(path, ["alpha", "beta"], ids=["x", "y"], encoder=str(tiny_bert_dir), show_progress=False)
    with pytest.raises(tt.TwoTowerError, match="already holds an index.*mode='overwrite'"):
        tt.Index.build(path, ["epsilon"], ids=["z"], encoder=str(tiny_bert_dir), show_progress=False)
    assert sorted(tt.Index.open(path).list().ids) == ["x", "y"]  # untouched
    appended = tt.Index.build(path, ["gamma"], ids=["w"], mode="append", show_progress=False)
    assert sorted(appended.list().ids) == ["w", "x", "y"]
    replaced = tt.Index.build(path, ["epsilon"], ids=["z"], encoder=str(tiny_bert_dir), mode="overwrite",
                              show_progress=False)
    assert replaced.list().ids == ["z"]
    with pytest.raises(tt.TwoTowerError, match="mode"):
        tt.Index.build(tmp_path / "other", ["x"], mode="replace")
    out = runner.invoke(tt_cli(), ["index", "build", "--data", str(_many(tmp_path / "docs", 2)), "--out", str(path),
                                   "--model", str(tiny_bert_dir), "--no-progress"])
    assert out.exit_code == 2 and "--replace" in out.output and "Traceback" not in out.output


def test_a_pdf_passage_carries_its_page_on_python_cli_and_http(tmp_path, tiny_bert_dir):
    root = tmp_path / "docs"
    root.mkdir()
    pages = [[f"Page {p} sentence {i} about topic{p} words here." for i in range(12)] for p in range(1, 5)]
    write_pdf(root / "book.pdf", pages)
    (root / "note.txt").write_text("A short note without pages.")
    index = tt.Index.build(tmp_path / "idx", root, encoder=str(tiny_bert_dir), passage_window=40, bm25=True,
                           show_progress=False)
    text = index.get(["book.pdf"])[0].text
    hits = index.search("topic3 words", k=2, mode="bm25", passages=50)
    book = next(h for h in hits if h.id == "book.pdf")
    assert len(book.passages) > 4
    for p in book.passages:  # the page of each passage start, found independently from the page texts
        first_line = text[p.start:].lstrip().split("\n")[0]
        expected = next(n for n, lines in enumerate(pages, start=1) if any(first_line in ln or ln.startswith(
            first_line) or first_line.startswith(ln[:10]) for ln in lines))
        assert p.page == expected, (p.start, first_line)
    note = next(h for h in index.search("short note", k=2, mode="bm25") if h.id == "note.txt")
    assert note.passage.page is None
    out = runner.invoke(tt_cli(), ["search", "topic3 words", "--index", str(tmp_path / "idx"), "--mode", "bm25",
                                   "--json", "-k", "1"])
    assert out.exit_code == 0, out.output
    first = json.loads(out.stdout.strip().splitlines()[0])
    assert first["passages"][0]["page"] == book.passage.page
    table = runner.invoke(tt_cli(), ["search", "topic3 words", "--index", str(tmp_path / "idx"), "--mode", "bm25",
                                     "-k", "1"], env={"COLUMNS": "250"})
    assert table.exit_code == 0, table.output
    snippet = " ".join(book.passage.text.split())[:40]  # the table shows the best passage's start, offset and page
    assert snippet in table.output and f"[@{book.passage.start} p.{book.passage.page}]" in table.output


def test_sync_on_milvus_gives_the_same_documents_as_locally(tmp_path, tiny_bert_dir):
    pytest.importorskip("pymilvus", reason="sync on Milvus needs pymilvus (the dev extra)")
    pytest.importorskip("milvus_lite", reason="sync on Milvus needs milvus-lite (the dev extra)")
    root = _many(tmp_path / "docs", 6)
    local = tt.Index.build(tmp_path / "local", root, encoder=str(tiny_bert_dir), bm25=True, show_progress=False)
    remote = tt.Index.build(tmp_path / "remote", root, encoder=str(tiny_bert_dir), bm25=True, show_progress=False,
                            backend="milvus", uri=str(tmp_path / "m.db"), collection="files_sync")
    (root / "f0.txt").write_text("Changed text about glaciers.")
    (root / "part" / "f1.txt").unlink()
    (root / "new.md").write_text("# New\nLighthouses guide ships.")
    reports = [index.sync(root) for index in (local, remote)]
    assert reports[0] == reports[1] == {"added": 1, "updated": 1, "removed": 1, "unchanged": 4, "skipped": []}
    for index in (local, remote):
        docs = {d.id: (d.text, d.metadata["sha256"]) for d in index.get(limit=None)}
        assert docs == {d.id: (d.text, d.metadata["sha256"]) for d in local.get(limit=None)}
        assert index.search("lighthouses ships", k=1, mode="bm25")[0].id == "new.md"


def test_the_cli_builds_a_folder_and_names_the_files_it_skipped(tmp_path, tiny_bert_dir):
    root = _many(tmp_path / "docs", 3)
    (root / "table.csv").write_text("a,b\n")
    (root / "broken.pdf").write_bytes(b"%PDF-1.4 cut short")
    out = runner.invoke(tt_cli(), ["index", "build", "--data", str(root), "--out", str(tmp_path / "idx"), "--model",
                                   str(tiny_bert_dir), "--no-progress"])
    assert out.exit_code == 0, out.output
    assert "3 documents" in out.output and "2 file(s) skipped" in out.output
    assert "table.csv: unknown kind of file" in out.output and "broken.pdf: corrupt PDF" in out.output
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "only.csv").write_text("x")
    refused = runner.invoke(tt_cli(), ["index", "build", "--data", str(empty), "--out", str(tmp_path / "idx2"),
                                       "--model", str(tiny_bert_dir), "--no-progress"])
    assert refused.exit_code == 2 and "no file in it could be read" in refused.output
    assert "Traceback" not in refused.output and not (tmp_path / "idx2").exists()


def _pages_in(passage_text: str, pages: list[list[str]]) -> set[int]:
    """The pages (1-based) any of whose lines (each unique to its page) the passage text shows a part of."""
    words = set(passage_text.split())
    return {n for n, lines in enumerate(pages, start=1) for ln in lines if set(ln.split()) & words - {"about"}}


@pytest.mark.parametrize("own_embedding", [False, True])
def test_no_pdf_passage_crosses_a_page(tmp_path, tiny_bert_dir, own_embedding):
    """A PDF is split page by page (token passages, and character passages of an embedding of your own): every
    passage shows the lines of one page only, found from the page texts the PDF was written with, and a page
    short enough for one passage (page 2: one line) is exactly one passage, with its page."""
    root = tmp_path / "docs"
    root.mkdir()
    pages = [[f"p{p}w{i}a p{p}w{i}b p{p}w{i}c about p{p}w{i}d." for i in range(n)]
             for p, n in ((1, 14), (2, 1), (3, 9), (4, 20))]
    write_pdf(root / "book.pdf", pages)
    if own_embedding:
        from twotower.encoders.text_passages import manifest_entry

        def embed(texts):
            return np.array([[len(t), t.count("p1"), t.count("p3"), 1.0] for t in texts], dtype=np.float32)

        index = tt.Index.build(tmp_path / "idx", root, embedding=embed, passage_window=90, passage_overlap=20,
                               show_progress=False)
        assert index.info()["passages"]["unit"] == manifest_entry()["unit"]
    else:
        index = tt.Index.build(tmp_path / "idx", root, encoder=str(tiny_bert_dir), passage_window=40, bm25=True,
                               show_progress=False)
    hit = index.search("p4w3c about", k=1, mode="bm25" if not own_embedding else None, passages=1000)[0]
    assert len(hit.passages) > 8
    seen = set()
    for p in hit.passages:
        on = _pages_in(p.text, pages)
        assert on == {p.page}, (p.start, p.text[:60], on)
        seen.update(w for w in p.text.split())
    assert all(set(ln.split()) <= seen for lines in pages for ln in lines)  # every line of every page is shown
    assert [p.text.strip() for p in hit.passages if p.page == 2] == [pages[1][0]]
