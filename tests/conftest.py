"""Fixtures: tiny random-weight BERT and T5 encoders built from a config, tiny BEIR directories."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# `make test` runs pytest-xdist workers side by side: each takes its share of the cores for torch (and OpenVINO and
# ONNX Runtime, which follow torch's count), so two workers' thread pools do not fight over two cores; the child
# processes tests start inherit it through OMP_NUM_THREADS
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _THREADS = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
    import torch

    torch.set_num_threads(_THREADS)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# the shared real data (BEIR SciFact, XQuAD-R): ../shared/data beside the checkout, or $TWOTOWER_TEST_DATA
SHARED_DATA = Path(os.environ.get("TWOTOWER_TEST_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data")
SCIFACT = SHARED_DATA / "scifact"
SCIFACT_FILES = ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "qrels/train.tsv")


def require_data(root: Path, files: tuple[str, ...]) -> Path:
    """``root`` when it holds every one of ``files``; otherwise skip the test, naming the first missing path."""
    for name in files:
        if not (root / name).is_file():
            pytest.skip(f"real data missing: {root / name} not found (shared data folder {SHARED_DATA}; "
                        "TWOTOWER_TEST_DATA=DIR points the tests at another)")
    return root


def lucene_bm25(query_terms, docs_terms, k1: float = 1.2, b: float = 0.75) -> list[float]:
    """Lucene's BM25 (idf log(1 + (N - df + 0.5) / (df + 0.5)), term weight tf / (tf + k1 (1 - b + b dl / avgdl)),
    without the classic (k1 + 1) factor, which scales every score alike), written out here: the reference a passage
    choice by BM25 over a document's passages is checked against (each distinct query term counts once)."""
    import math
    from collections import Counter

    n = len(docs_terms)
    avg = sum(len(d) for d in docs_terms) / n
    df = Counter(t for d in docs_terms for t in set(d))
    out = []
    for d in docs_terms:
        tf = Counter(d)
        out.append(sum(math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) * tf[t]
                       / (tf[t] + k1 * (1 - b + b * len(d) / avg)) for t in set(query_terms) if tf[t]))
    return out


def benchmark_module(name: str):
    """The module ``benchmarks/<name>.py``, imported with ``benchmarks/`` on ``sys.path`` for the import only (its
    scripts import their ``_common`` beside them)."""
    import importlib
    import sys

    bench = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, bench)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(bench)


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a test's child Python process: the twotower this test imported first on
    PYTHONPATH as an absolute path (a relative ``PYTHONPATH=src`` is lost in a child run from another
    directory, which would then import whatever twotower the venv has installed), plus ``extra``."""
    import twotower

    src = str(Path(twotower.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in [src, os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path, **extra}


def _tokenizer():
    from transformers import AutoTokenizer

    from twotower.encoders.backbone import default_model_path

    return AutoTokenizer.from_pretrained(str(default_model_path()))


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A 2-layer, 32-d BERT with random weights and all-MiniLM-L6-v2's tokenizer."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-bert")
    tok = _tokenizer()
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    BertModel(cfg, add_pooling_layer=False).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_t5_dir(tmp_path_factory) -> Path:
    """A 2-layer, 32-d T5 (encoder is what twotower uses) with random weights."""
    import torch
    from transformers import T5Config, T5Model

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-t5")
    tok = _tokenizer()
    cfg = T5Config(vocab_size=tok.vocab_size, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                   pad_token_id=tok.pad_token_id, decoder_start_token_id=tok.pad_token_id)
    T5Model(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_beir(root: Path, corpus: list[dict], queries: list[dict], qrels: list[tuple], split: str = "test") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels").mkdir(exist_ok=True)
    rows = "".join(f"{q}\t{d}\t{s}\n" for q, d, s in qrels)
    (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + rows)
    return root


def flat_index(data: Path, model: Path, out: Path) -> Path:
    """``data`` indexed at ``out`` by ``model`` (fp32), exact FAISS search and BM25: what the search tests query."""
    from twotower.retrieval.indexing import EncodeConfig, build_index
    from twotower.retrieval.store import IndexSpec

    build_index(data, out, model=str(model), spec=IndexSpec(kind="flat", bm25=True),
                cfg=EncodeConfig(precision="fp32", show_progress=False))
    return out


@pytest.fixture(scope="module")
def served_index_built(tmp_path_factory, tiny_bert_dir) -> Path:
    """The tiny corpus indexed by :func:`flat_index`, once a module: what the service's tests serve."""
    root = tmp_path_factory.mktemp("serve")
    return flat_index(write_beir(root / "tiny", TINY_CORPUS, TINY_QUERIES, TINY_QRELS), tiny_bert_dir, root / "index")


@pytest.fixture()
def served_index(served_index_built, tmp_path) -> Path:
    """A private copy of :func:`served_index_built` (tests write to it)."""
    import shutil

    target = tmp_path / "index"
    shutil.copytree(served_index_built, target)
    return target


def serve_client(index: Path, api_key: str | None, **kwargs):
    """FastAPI's TestClient over the search service on ``index`` (fp32)."""
    from fastapi.testclient import TestClient

    from twotower.serve.app import create_app

    return TestClient(create_app(index, api_key=api_key, precision="fp32", **kwargs))


TINY_CORPUS = [
    {"_id": "d1", "title": "Cats", "text": "Cats are small domesticated felines that purr."},
    {"_id": "d2", "title": "Dogs", "text": "Dogs are loyal animals that bark at strangers."},
    {"_id": "d3", "title": "Python", "text": "Python is a programming language with dynamic typing."},
    {"_id": "d4", "title": "Rust", "text": "Rust is a systems programming language focused on memory safety."},
    {"_id": "d5", "title": "Tea", "text": "Green tea is brewed from the leaves of Camellia sinensis."},
    {"_id": "d6", "title": "", "text": "The mitochondria is the powerhouse of the cell."},
]
TINY_QUERIES = [
    {"_id": "q1", "text": "which feline purrs"},
    {"_id": "q2", "text": "memory safe systems programming language"},
    {"_id": "q3", "text": "how is green tea made"},
]
TINY_QRELS = [("q1", "d1", 1), ("q2", "d4", 1), ("q3", "d5", 1)]


def copy_without_dropout(tiny_bert_dir: Path, dest: Path) -> Path:
    """The tiny BERT with dropout off (a deterministic forward pass), tokenizer files copied: ``dest``."""
    from transformers import BertModel

    model = BertModel.from_pretrained(tiny_bert_dir)
    model.config.hidden_dropout_prob = model.config.attention_probs_dropout_prob = 0.0
    model.save_pretrained(dest)
    for f in Path(tiny_bert_dir).iterdir():
        if "token" in f.name or f.name == "vocab.txt":
            (dest / f.name).write_bytes(f.read_bytes())
    return dest


@pytest.fixture()
def tiny_beir(tmp_path) -> Path:
    return write_beir(tmp_path / "tiny", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)


@pytest.fixture(scope="session")
def scifact() -> Path:
    """BEIR SciFact (both splits); every test that reads it takes this fixture, so it skips, with the
    missing path as the reason, where the shared data is absent."""
    return require_data(SCIFACT, SCIFACT_FILES)


@pytest.fixture(scope="session")
def tiny_ce_dir(tmp_path_factory):
    """A random-weight 2-layer BERT cross-encoder with one output label (the default model's tokenizer)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from twotower.encoders.backbone import default_model_path

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-ce")
    tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128, num_labels=1)
    BertForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def pytest_terminal_summary(terminalreporter) -> None:
    """Say in the summary how many tests skipped because the real data is missing (a fresh clone without
    ../shared): the count and where the data was looked for, so a green run cannot hide them."""
    missing = [r for r in terminalreporter.stats.get("skipped", [])
               if isinstance(r.longrepr, (tuple, list)) and "real data missing" in str(r.longrepr[-1])]
    if missing:
        terminalreporter.write_line(
            f"{len(missing)} test(s) skipped: real data missing (looked in {SHARED_DATA}; put BEIR SciFact and "
            "XQuAD-R there, or set TWOTOWER_TEST_DATA=DIR)", yellow=True, bold=True)


# `make test` gives each pytest-xdist worker whole test files (--dist loadfile: a file's module fixtures are built once),
# the longest first, so that a long file collected late does not run alone at the end while the other worker idles.
# The order is LONG_FILES' (seconds of tests each on 2 shared cores, `--junitxml` of a full run on 2026-12-03: a few
# rank above the rest), not xdist's own (files with more tests first: test_milvus_server_writes.py's one 85 s test
# came last and ran alone). The docs pages' examples (test_docs.py::test_code_blocks_run, 400 s in all, up to 72 s a
# page) are a unit each, so that one worker does not run all of them.
LONG_FILES = ("test_runtimes.py",  # 185 s
              "test_milvus_writes.py",  # 147 s
              "test_milvus_server.py",  # 116 s: a real Milvus server's round trips
              "test_e5.py",  # 109 s
              "test_milvus_ids.py",  # 97 s
              "test_milvus_server_writes.py",  # 85 s, one test
              "test_docs.py",  # 400 s, split: pages of 72 s and less
              "test_milvus_passages.py", "test_hardening_round4.py", "test_serve.py", "test_milvus_concurrency.py",
              "test_distributed_train.py", "test_scale.py", "test_fit.py")  # 71 s to 41 s
SPLIT_TESTS = ("tests/test_docs.py::test_code_blocks_run[",)  # a unit each (nodeid prefixes)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))  # stable: the rest keep their order


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile in LONG_FILES' order, with SPLIT_TESTS' tests a unit each (None: xdist's own, any other --dist)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if nodeid.startswith(SPLIT_TESTS) else super()._split_scope(nodeid)

    config.option.loadscopereorder = False  # keep the collection's order (above), not the most tests first
    return LongestFirst(config, log)
