"""A folder of real files written by others, indexed with one call and the defaults, asked known-item questions
(issue #70's done-when): a sentence from the later half of a file with some words dropped. How often the file is
in the top 5, how often the best passage (and the top 3) holds the sentence, and how often a PDF hit's passage has
the sentence's page — for dense, BM25 and hybrid.

The files are copied from this machine's Debian documentation (/usr/share/doc: HTML manuals, text specs, PDFs) and
npm's bundled Markdown READMEs into a folder with subfolders, and more PDFs are typeset from man pages (their
authors' roff sources in /usr/share/man/man1, by GNU groff: half straight to PDF with gropdf, half through
PostScript and Ghostscript's ps2pdf, two producers whose text extraction differs; needs the groff and ghostscript
packages, else none are made). The sentence's page in a PDF is found from pypdf's page texts, independently of the
index's ``page_starts``. ``--set packages`` gathers a second folder unlike the first: the installed Python packages'
own Markdown, HTML and text files (licences left out) and man pages of sections 8 and 5 typeset alike.

    python benchmarks/experiments/folder_rag.py --work <work-dir> [--set debian|packages] [--files 72] [--questions 2]
"""

from __future__ import annotations

import argparse
import random
import re
import gzip
import json
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import write_results  # noqa: E402

PURELIB = sysconfig.get_paths()["purelib"]  # the running Python's installed packages
# a set: ([(kind, folder, pattern, files of 72)], man pages typeset to PDF (globs), man-page PDFs of 72, skip licences)
SETS = {
    "debian": ([("html", "/usr/share/doc", "*.html", 40), ("txt", "/usr/share/doc", "*.txt", 12),
                ("md", "/usr/lib/node_modules", "README.md", 16), ("pdf", "/usr/share/doc", "*.pdf", 4)],
               ("man1/*.1.gz",), 24, False),
    # a second folder, unlike the first: the installed packages' own Markdown, HTML and text, admin and file-format
    # man pages
    "packages": ([("md", PURELIB, "*.md", 20), ("html", PURELIB, "*.html", 12), ("txt", PURELIB, "*.txt", 25)],
                 ("man8/*.gz", "man5/*.gz"), 16, True),
}


def man_pdfs(folder: Path, n: int, rng: random.Random, sections: tuple[str, ...] = ("man1/*.1.gz",)) -> list[Path]:
    """``n`` man pages matching ``sections`` (globs under /usr/share/man; of 6-60 kB compressed roff source) typeset
    to PDF by groff, alternately with gropdf and through PostScript and ps2pdf."""
    if not (shutil.which("groff") and shutil.which("gropdf") and shutil.which("ps2pdf")):
        print("groff, gropdf or ps2pdf missing (apt-get install groff ghostscript): no man-page PDFs")
        return []
    pages = sorted(p for pattern in sections for p in Path("/usr/share/man").glob(pattern)
                   if 6_000 < p.stat().st_size < 60_000)
    rng.shuffle(pages)
    made = []
    for src in pages:
        if len(made) == n:
            break
        roff = gzip.decompress(src.read_bytes())
        dest = folder / "man" / (f"sec{len(made) % 2}" if len(made) % 3 else "") / re.sub(r"\.\w+\.gz$", ".pdf", src.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if len(made) % 2:
            ps = subprocess.run(["groff", "-man", "-Tps"], input=roff, capture_output=True).stdout
            pdf = subprocess.run(["ps2pdf", "-", "-"], input=ps, capture_output=True).stdout
        else:
            pdf = subprocess.run(["groff", "-man", "-Tpdf"], input=roff, capture_output=True).stdout
        if len(pdf) > 2_000 and b".so " not in roff[:200]:  # ".so": a page that only points at another
            dest.write_bytes(pdf)
            made.append(dest)
    return made


def collect(folder: Path, total: int, seed: int, which: str = "debian") -> list[Path]:
    rng = random.Random(seed)
    sources, sections, man_n, no_licences = SETS[which]
    picked = []
    for kind, base, pattern, n in sources:
        found = sorted(p for p in Path(base).rglob(pattern) if p.is_file() and 3_000 < p.stat().st_size < 400_000
                       and "RelNotes" not in str(p) and "LICENSE" not in p.name.upper()
                       and not (no_licences and "licen" in str(p).lower()))
        rng.shuffle(found)
        for i, src in enumerate(found[: max(1, n * total // 72)]):
            dest = folder / kind / (f"sub{i % 3}" if i % 2 else "") / f"{src.parent.name}-{src.name}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dest)
            picked.append(dest)
    return picked + man_pdfs(folder, man_n * total // 72, rng, sections)


_SENT = re.compile(r"[^.!?\n]{40,220}[.!?]")


def questions(docs, per_file: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for doc in docs:
        half = len(doc.text) // 2
        cands = [m for m in _SENT.finditer(doc.text, half) if len(m.group().split()) >= 8]
        for m in rng.sample(cands, min(per_file, len(cands))):
            words = m.group().split()
            kept = [w for w in words if rng.random() > 0.2] or words
            out.append({"doc": doc.id, "query": " ".join(kept), "start": m.start(), "end": m.end(),
                        "sentence": m.group().strip()})
    return out


def pdf_page(path: Path, sentence: str) -> int | None:
    import pypdf

    probe = " ".join(sentence.split()[:6])
    for n, page in enumerate(pypdf.PdfReader(str(path)).pages, start=1):
        if probe in " ".join((page.extract_text() or "").split()):
            return n
    return None


def holds(p, q) -> bool:
    """The passage covers at least 80% of the sentence's characters."""
    return min(p.end, q["end"]) - max(p.start, q["start"]) >= 0.8 * (q["end"] - q["start"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--files", type=int, default=72)
    ap.add_argument("--questions", type=int, default=2, help="questions per file")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", default="debian", choices=sorted(SETS), help="which files: debian (the first folder) or "
                                                                          "packages (a second, unlike it)")
    ap.add_argument("--name", default="folder_rag")
    ap.add_argument("--reuse", action="store_true", help="search the index --work holds instead of building again")
    args = ap.parse_args()
    import twotower as tt

    folder = args.work / "files"
    if args.reuse and (args.work / "index" / "CURRENT").exists():  # the same files, index and questions: measure again
        index = tt.Index.open(args.work / "index")
        build_s = json.loads((args.work / "build.json").read_text())["build_s"] if (args.work / "build.json").exists() \
            else None
        from twotower.data.files import load_files

        index.skipped = [s.to_dict() for s in load_files(folder, exclude=[args.work / "index"]).skipped]
    else:
        shutil.rmtree(args.work, ignore_errors=True)
        collect(folder, args.files, args.seed, args.set)
        t0 = time.perf_counter()
        index = tt.Index.build(args.work / "index", folder)  # the defaults: passages, BM25, hybrid search
        build_s = round(time.perf_counter() - t0, 1)
        (args.work / "build.json").write_text(json.dumps({"build_s": build_s}))
    docs = index.get(limit=None)
    qs = questions(docs, args.questions, args.seed)
    kinds = {d.id: d.metadata["format"] for d in docs}
    rows = []
    for mode in ("dense", "bm25", "hybrid"):
        hits = index.search([q["query"] for q in qs], k=5, mode=mode, passages=3)
        found = best = top3 = pdf_n = pdf_ok = 0
        for q, hs in zip(qs, hits):
            hit = next((h for h in hs if h.id == q["doc"]), None)
            if hit is None:
                continue
            found += 1
            best += holds(hit.passages[0], q)
            top3 += any(holds(p, q) for p in hit.passages[:3])
            if kinds[q["doc"]] == "pdf":
                pdf_n += 1
                want = pdf_page(folder / q["doc"], q["sentence"])
                pdf_ok += want is not None and hit.passages[0].page == want
        rows.append({"system": f"twotower {mode}", "questions": len(qs), "file_in_top5": round(found / len(qs), 4),
                     "best_passage_holds": round(best / max(found, 1), 4),
                     "top3_passages_hold": round(top3 / max(found, 1), 4),
                     "pdf_questions_found": pdf_n, "pdf_page_right": round(pdf_ok / max(pdf_n, 1), 4)})
    counts = {k: sum(1 for v in kinds.values() if v == k) for k in sorted(set(kinds.values()))}
    write_results(args.name, rows, extra={"files": counts, "skipped": index.skipped, "build_s": build_s,
                                          "passages": index.info()["num_vectors"]},
                  notes=f"Files: {counts}; skipped {len(index.skipped)}; {index.info()['num_vectors']} passages; "
                        f"build {build_s} s (default model, 2 cores).")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
