"""The documentation site cannot rot: it builds strictly, its code blocks run, and every public name has a
reference entry.

- ``test_site_builds_strictly``: ``mkdocs build --strict`` (broken links, missing anchors, a reference entry that
  mkdocstrings cannot collect: each fails the build).
- ``test_every_public_name_has_a_reference_entry``: each name of ``twotower.__all__`` has its own page
  (``reference/api/NAME/``) with the anchor ``#twotower.NAME``, a row on the API index with the same anchor, and a
  docstring of its own; its ``Example::`` blocks show as highlighted Python; a name that takes parameters has a
  parameter table naming each (tests/test_api_reference_params.py checks the tables' cells).
- ``test_code_blocks_run[PAGE]``: every ``python`` and ``bash`` block of PAGE runs, in page order, in a fresh folder
  holding a SciFact sample at ``data/scifact`` (and an XQuAD-R sample at ``data/xquad-r/zh``), with the real
  default model; python blocks share one namespace per page, bash blocks see the venv's ``twotower`` on PATH.
  A block preceded by ``<!-- norun: reason -->`` is shown, not run; a block of another language preceded by
  ``<!-- file: PATH -->`` is written to PATH first. docs/project/contributing.md describes the convention.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import SHARED_DATA, require_data

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RUNNABLE = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>norun|file)\s*(?::\s*(?P<arg>.*?))?\s*-->\s*$")


@dataclass
class Block:
    page: str     # path under docs/
    line: int     # 1-based line of the opening fence
    lang: str
    code: str
    marker: str   # "", "norun" or "file"
    arg: str      # the marker's reason or file path

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUNNABLE and self.marker != "norun"


def pages() -> list[str]:
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "hooks" not in p.parts)


def parse_blocks(page: str, text: str) -> list[Block]:
    """Fenced code blocks of one page with the marker comment above each (blank lines may stand between)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group("indent"), m.group("fence"), m.group("info").strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = _FENCE.match(lines[i])
            if close and close.group("fence")[0] == fence[0] and len(close.group("fence")) >= len(fence) \
                    and not close.group("info").strip():
                break
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1
        above = start - 1
        while above >= 0 and not lines[above].strip():
            above -= 1
        mark = _MARKER.match(lines[above]) if above >= 0 else None
        lang = info.split()[0].lstrip(".{").rstrip("}").lower() if info else ""
        blocks.append(Block(page, start + 1, lang, "\n".join(body) + "\n",
                            mark.group("kind") if mark else "", (mark.group("arg") or "") if mark else ""))
    return blocks


def all_blocks() -> list[Block]:
    return [b for page in pages() for b in parse_blocks(page, (DOCS / page).read_text(encoding="utf-8"))]


# ---------------------------------------------------------------------------------------------- the convention


def test_blocks_follow_the_marker_convention():
    """Every block says its language; markers are spelled right and sit where they mean something."""
    problems = []
    for b in all_blocks():
        if not b.lang:
            problems.append(f"{b.where}: a code block without a language (```python, ```bash, ```text, ...)")
        if b.marker == "norun" and not b.arg:
            problems.append(f"{b.where}: <!-- norun --> without a reason: write <!-- norun: why it cannot run -->")
        if b.marker == "file" and (not b.arg or b.lang in RUNNABLE):
            problems.append(f"{b.where}: <!-- file: PATH --> needs a PATH and a data block (toml, json, text), "
                            f"not {b.lang or 'an unlabelled block'}")
    assert not problems, "\n".join(problems)


def test_each_guide_opens_with_a_runnable_example():
    """The first code block of every guide runs: a reader can try the task before reading about it."""
    problems = []
    for page in pages():
        if not page.startswith("guides/"):
            continue
        blocks = [b for b in parse_blocks(page, (DOCS / page).read_text(encoding="utf-8")) if b.lang in RUNNABLE]
        if not blocks or not blocks[0].runs:
            problems.append(f"docs/{page}: its first python/bash block is "
                            f"{'missing' if not blocks else 'marked norun (' + blocks[0].where + ')'}")
    assert not problems, "\n".join(problems)


def test_parser_reads_markers_languages_and_indented_fences():
    text = ("Intro\n\n<!-- norun: needs a GPU -->\n```bash\ntwotower train --device cuda\n```\n\n"
            "```python\nx = 1\n```\n<!-- file: stages.toml -->\n\n```toml\na = 1\n```\n"
            '!!! note\n    ```python title="x"\n    y = 2\n    ```\n')
    got = [(b.line, b.lang, b.marker, b.arg, b.code, b.runs) for b in parse_blocks("p.md", text)]
    assert got == [(4, "bash", "norun", "needs a GPU", "twotower train --device cuda\n", False),
                   (8, "python", "", "", "x = 1\n", True),
                   (13, "toml", "file", "stages.toml", "a = 1\n", False),
                   (17, "python", "", "", "y = 2\n", True)]


# ------------------------------------------------------------------------------------------------ the build


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return out


def test_site_builds_strictly(site):
    for page in ("index.html", "reference/python/index.html", "reference/cli/index.html", "results/runs/index.html"):
        assert (site / page).is_file(), f"{page} missing from the built site"


def _own_docstring(obj) -> str:
    doc = (obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)) or ""
    name = getattr(obj, "__name__", "")
    if isinstance(obj, type) and doc.startswith(f"{name}("):  # a dataclass's generated signature, not prose
        return ""
    return doc.strip()


def test_every_public_name_has_a_reference_entry(site):
    import twotower

    index = (site / "reference" / "python" / "index.html").read_text(encoding="utf-8")
    names = list(twotower.__all__)
    assert names, "twotower.__all__ is empty"
    missing = [n for n in names if f'id="twotower.{n}"' not in index or f'href="../api/{n}/"' not in index]
    assert not missing, f"no row on the API index for: {', '.join(missing)} (docs/hooks/api_reference.py)"
    pages = {n: site / "reference" / "api" / n / "index.html" for n in names}
    no_page = [n for n, page in pages.items() if not page.is_file()
               or f'id="twotower.{n}"' not in (html := page.read_text(encoding="utf-8")) or "doc-contents" not in html]
    assert not no_page, f"no API reference page for: {', '.join(no_page)} (docs/hooks/api_reference.py)"
    undocumented = [n for n in names if not _own_docstring(getattr(twotower, n))]
    assert not undocumented, f"public names without a docstring of their own: {', '.join(undocumented)}"
    # examples: fenced and highlighted as Python (docs/hooks/griffe_examples.py), never a bare "Example::"
    highlighted = re.compile(r'<summary>Examples?</summary>\s*<div class="highlight"><pre><span></span><code>'
                             r'<span class="(?:kn|n|k|nb)">')  # pygments' Python tokens, not a bare <pre><code>
    plain = [n for n in names if "Example::" in _own_docstring(getattr(twotower, n))
             and not highlighted.search(pages[n].read_text(encoding="utf-8"))]
    assert not plain, f"API pages whose examples are not highlighted as Python: {', '.join(plain)}"
    assert not [n for n, page in pages.items() if "Example::" in page.read_text(encoding="utf-8")]
    # parameter tables (docs/hooks/griffe_params.py): every parameter of the signature has its row
    untabled = {}
    for n in names:
        try:
            signature = inspect.signature(getattr(twotower, n))
        except (TypeError, ValueError):  # no signature to list (an exception class's C-level __init__)
            continue
        wanted = [p.name for p in signature.parameters.values() if p.name not in ("self", "cls")]
        table = re.search(r'<div class="doc-param-table">\s*<table>(.*?)</table>',
                          pages[n].read_text(encoding="utf-8"), re.DOTALL)
        missing = [p for p in wanted if not table or not re.search(rf"<code>\**{p}</code>", table.group(1))]
        if missing:
            untabled[n] = missing
    assert not untabled, f"API pages whose parameter table lacks parameters: {untabled}"


def _hook(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_hook", DOCS / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_literal_blocks_become_fenced_python_or_text():
    fence = _hook("griffe_examples").fence_literal_blocks
    doc = ("Load it.\n\nExample::\n\n    import twotower as tt\n\n    if tt:\n        print(1)\n\nAfter it.\n\n"
           "A layout::\n\n    DIR/\n      a.json   one\n\nNo block here::")
    assert fence(doc) == (
        "Load it.\n\nExample:\n    ```python\n    import twotower as tt\n\n    if tt:\n        print(1)\n    ```\n\n"
        "After it.\n\nA layout:\n\n```text\nDIR/\n  a.json   one\n```\n\nNo block here::")


def test_index_summaries_stop_at_the_first_sentence_outside_code_and_brackets():
    hook = _hook("api_reference")

    class Short:
        """Score a run ``{q: {d: s}}`` (one read with :func:`~twotower.read_run`, e.g. TREC). More text."""

    class Long:
        """Everything ``fit`` does, as settings: the model, the fine-tuning, the mining and retraining, the candidates
        and the re-ranker, each with its default and the checks it makes."""

    assert hook.summary(Short) == "Score a run `{q: {d: s}}` (one read with `read_run`, e.g. TREC)."
    assert hook.summary(Long) == "Everything `fit` does, as settings"


def test_cli_reference_covers_every_command(site):
    import typer

    from twotower.cli import app

    def paths(cmd, prefix: list[str]):  # typer may vendor its own click: groups are what have .commands
        yield prefix
        if hasattr(cmd, "list_commands"):
            for name, sub in cmd.commands.items():
                if not sub.hidden:
                    yield from paths(sub, [*prefix, name])

    html = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    root = typer.main.get_command(app)
    missing = [" ".join(p) for p in paths(root, ["twotower"]) if f'id="{"-".join(p)}"' not in html]
    assert not missing, f"commands without a CLI reference section: {missing}"
    # every option of eval is listed, spelled as --help spells it
    for param in root.commands["eval"].params:
        for opt in getattr(param, "opts", []):
            if opt.startswith("--"):
                assert f"<code>{opt}</code>" in html, f"eval's {opt} missing from the CLI reference"


# ------------------------------------------------------------------------------------------- the tiny data


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _read_qrels(path: Path) -> list[tuple[str, str, str]]:
    rows = [line.rstrip("\n").split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    return [(q, d, s) for q, d, s in rows]


def _write_sample(dest: Path, corpus: list[dict], queries: list[dict], qrels: dict[str, list]) -> None:
    (dest / "qrels").mkdir(parents=True)
    (dest / "corpus.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in corpus),
                                       encoding="utf-8")
    (dest / "queries.jsonl").write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in queries),
                                        encoding="utf-8")
    for split, rows in qrels.items():
        (dest / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in rows), encoding="utf-8")


def scifact_sample(src: Path, dest: Path, n_test: int = 12, n_train: int = 30, n_docs: int = 60,
                   words: int = 40) -> Path:
    """SciFact cut to ``n_test`` test and ``n_train`` train queries, their judged documents and the first other
    documents up to ``n_docs``, each abstract cut to its first ``words`` words: a real BEIR folder every command
    accepts, small enough to encode in a second or two."""
    test, train = _read_qrels(src / "qrels" / "test.tsv"), _read_qrels(src / "qrels" / "train.tsv")
    keep_test = list(dict.fromkeys(q for q, _, _ in test))[:n_test]
    keep_train = list(dict.fromkeys(q for q, _, _ in train))[:n_train]
    test = [r for r in test if r[0] in keep_test]
    train = [r for r in train if r[0] in keep_train]
    judged = {d for _, d, _ in test + train}
    corpus = _read_jsonl(src / "corpus.jsonl")
    docs = [d for d in corpus if d["_id"] in judged]
    docs += [d for d in corpus if d["_id"] not in judged][: max(0, n_docs - len(docs))]
    docs = [{**d, "text": " ".join(d["text"].split()[:words])} for d in docs]
    wanted = set(keep_test) | set(keep_train)
    queries = [q for q in _read_jsonl(src / "queries.jsonl") if q["_id"] in wanted]
    _write_sample(dest, docs, queries, {"test": test, "train": train})
    return dest


def xquad_sample(src: Path, dest: Path, n_docs: int = 60) -> Path:
    """The first ``n_docs`` sentences of one XQuAD-R language and the questions they answer."""
    corpus = _read_jsonl(src / "corpus.jsonl")[:n_docs]
    ids = {d["_id"] for d in corpus}
    test = [r for r in _read_qrels(src / "qrels" / "test.tsv") if r[1] in ids]
    qids = {q for q, _, _ in test}
    queries = [q for q in _read_jsonl(src / "queries.jsonl") if q["_id"] in qids]
    _write_sample(dest, corpus, queries, {"test": test})
    return dest


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> Path:
    scifact = require_data(SHARED_DATA / "scifact", ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv",
                                                     "qrels/train.tsv"))
    xquad = require_data(SHARED_DATA / "xquad-r" / "zh", ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"))
    root = tmp_path_factory.mktemp("doc-data")
    scifact_sample(scifact, root / "data" / "scifact")
    xquad_sample(xquad, root / "data" / "xquad-r" / "zh")
    return root


def test_scifact_sample_is_a_closed_beir_folder(tmp_path):
    """The sample keeps every judged document of its queries and only queries that are judged."""
    src = require_data(SHARED_DATA / "scifact", ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv",
                                                 "qrels/train.tsv"))
    out = scifact_sample(src, tmp_path / "s")
    ids = {d["_id"] for d in _read_jsonl(out / "corpus.jsonl")}
    qids = {q["_id"] for q in _read_jsonl(out / "queries.jsonl")}
    for split, n in (("test", 12), ("train", 30)):
        rows = _read_qrels(out / "qrels" / f"{split}.tsv")
        assert len({q for q, _, _ in rows}) == n
        assert all(d in ids and q in qids for q, d, _ in rows)
    assert len(ids) == 60


# -------------------------------------------------------------------------------------------- running blocks


def _runnable_pages() -> list[str]:
    return [p for p in pages() if any(b.runs for b in parse_blocks(p, (DOCS / p).read_text(encoding="utf-8")))]


def _run_python(block: Block, namespace: dict) -> None:
    code = compile("\n" * block.line + block.code, str(DOCS / block.page), "exec")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(code, namespace)
    except BaseException as exc:  # SystemExit included: a block must not exit
        pytest.fail(f"{block.where}: python block failed: {type(exc).__name__}: {exc}\n"
                    f"--- its output ---\n{out.getvalue()[-3000:]}\n--- the block ---\n{block.code}")


def _run_bash(block: Block, cwd: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "COLUMNS": "120", "NO_COLOR": "1"}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (f"{block.where}: bash block exited {proc.returncode}\n--- the block ---\n"
                                  f"{block.code}--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n"
                                  f"{proc.stderr[-3000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("page", _runnable_pages())
def test_code_blocks_run(page, samples, tmp_path, monkeypatch):
    work = tmp_path / "work"
    shutil.copytree(samples, work)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict = {"__name__": "__main__"}
    for block in parse_blocks(page, (DOCS / page).read_text(encoding="utf-8")):
        if block.marker == "file":
            target = work / block.arg
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code, encoding="utf-8")
        elif not block.runs:
            continue
        elif RUNNABLE[block.lang] == "python":
            _run_python(block, namespace)
        else:
            _run_bash(block, work)
