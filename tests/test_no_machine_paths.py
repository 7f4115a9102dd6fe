"""The user-facing text names no folder of one machine: a command in the README, a docs page or a results table
must work in a fresh clone, so it names a path relative to the repository (``.cache/fs``, ``../shared/data``) or a
placeholder (``<work>``, ``<tmp>``), never ``/work/cache/fs``, ``/root/...``, ``/home/<user>/...`` or ``/tmp/...``.

Scanned: README.md, benchmarks/README.md, docs/**/*.md, benchmarks/results/**/*.md and tools/quality/ (README and
results/*.md). Not scanned: the results' JSON records (their ``"command"`` is the command as it was typed;
``benchmarks/_common.write_results`` writes the markdown twin with ``portable`` paths) and tools/gpu-run/ (the record
of one session's scripts: its paths are the lent machine's, by design). Not machine paths:
URLs (``http://host/tmp/x``), paths under the repository or the home folder written relatively (``../tmp/x``,
``~/x``, ``$PWD/x``), system files every machine has (``/dev/null``, ``/proc/self/statm``), HTTP routes
(``/search``) and placeholders (``/path/to/scifact``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# an absolute path starts a token: not after a letter, digit, '.', '~', '$', ':', '-' or '/' (so neither a URL's
# path, nor ../tmp, ~/x, $PWD/x); its first folder is one where one machine keeps its own files
_MACHINE_PATH = re.compile(
    r"(?<![\w.~$:/-])(?:"
    r"/(?:work|root|tmp|var/tmp|opt|mnt|media|scratch|srv)(?![\w.-])"  # /work/cache/fs, /tmp/x, /root
    r"|/(?:home|Users)/[\w.-]+"  # /home/alice, /Users/bob
    r"|\b[A-Za-z]:\\Users\\"  # C:\Users\...
    r")[^\s`'\")\]|,;]*"
)


def user_facing_pages() -> list[Path]:
    quality = ROOT / "tools" / "quality"
    pages = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "benchmarks" / "results").rglob("*.md")), quality / "README.md",
             *sorted((quality / "results").glob("*.md"))]
    return [p for p in dict.fromkeys(pages) if p.is_file()]


def machine_paths(text: str) -> list[tuple[int, str]]:
    """``(line number, path)`` of every absolute path of one machine in ``text``."""
    return [(n, m.group(0)) for n, line in enumerate(text.splitlines(), start=1)
            for m in _MACHINE_PATH.finditer(line)]


def test_the_scan_finds_machine_paths_and_only_them():
    found = machine_paths(
        "python benchmarks/fit_scifact.py --work /work/cache/fs --name x\n"
        "Command: `python cpu_backends.py --st-python /tmp/stbench/bin/python --work=/tmp/ttcpu`\n"
        "models kept in /root/.cache/m and (/home/alice/data), `C:\\Users\\bob\\x`\n"
        "the cache: /tmp\n")
    assert found == [(1, "/work/cache/fs"), (2, "/tmp/stbench/bin/python"), (2, "/tmp/ttcpu"),
                     (3, "/root/.cache/m"), (3, "/home/alice/data"), (3, "C:\\Users\\bob\\x"), (4, "/tmp")]
    assert machine_paths(
        "see https://example.org/work/x and http://localhost:8000/tmp/a, file:///tmp/b\n"
        "--work .cache/fs --data ../shared/data/scifact ../tmp/x ~/work/x $PWD/.venv/lib $HOME/x\n"
        "curl -o /dev/null; /proc/self/statm; POST /search and GET /documents/{id}; DATA=/path/to/scifact\n"
        "`error: <work>/nope: not found`, --st-python <tmp>/stbench/bin/python, /home/<user>/x, a/work/b\n"
        "/workshop /tmpfs /rooted /optional\n") == []


def test_portable_writes_repository_home_and_temporary_paths_relatively(tmp_path, monkeypatch):
    """benchmarks/_common.portable, as write_results applies it to a result's markdown: what it writes passes the
    scan, and the JSON keeps the command as typed."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _common
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    repo, home, tmp = Path("/work/main"), Path("/root"), Path("/tmp")
    text = ("python benchmarks/x.py --work /work/cache/fs --start /work/main/.cache/a --data=/work/shared/data "
            "--model /root/models/m --scratch /tmp/x1 in /work/main; /work/main2/y /workshop/z /dev/null")
    assert _common.portable(text, repo=repo, home=home, tmp=tmp) == (
        "python benchmarks/x.py --work ../cache/fs --start .cache/a --data=../shared/data "
        "--model ~/models/m --scratch <tmp>/x1 in .; ../main2/y /workshop/z /dev/null")
    assert machine_paths(text) != [] and machine_paths(_common.portable(text, repo=repo, home=home, tmp=tmp)) == []
    monkeypatch.setattr(_common, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["benchmarks/x.py", "--work", str(_common.ROOT.parent / "cache" / "fs")])
    monkeypatch.setattr(_common, "machine", lambda: {"cpu": "cpu", "cores": 2, "torch": "2"})
    _common.write_results("x", [{"system": "a", "path": str(_common.ROOT / ".cache" / "a")}],
                          notes=f"models kept in {_common.ROOT / '.cache' / 'm'}")
    md = (tmp_path / "x.md").read_text()
    assert "--work ../cache/fs" in md and "| a | .cache/a |" in md and "models kept in .cache/m" in md, md
    assert machine_paths(md) == []
    assert str(_common.ROOT.parent / "cache" / "fs") in (tmp_path / "x.json").read_text()  # the record as typed


def test_user_facing_text_names_no_machine_path():
    pages = user_facing_pages()
    assert len(pages) > 20 and ROOT / "README.md" in pages
    found = [f"{page.relative_to(ROOT)}:{n}: {path}" for page in pages
             for n, path in machine_paths(page.read_text(encoding="utf-8"))]
    assert found == [], ("absolute paths of one machine (write them relative to the repository, or as a "
                         "placeholder such as <work-dir>):\n" + "\n".join(found))
