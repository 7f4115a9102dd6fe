"""Issue #46, retrieval and serving: a message raised in Python names the Python parameter (``nlist=50``,
``mode='bm25'``, ``port=8000``); the CLI, which runs its commands under command-line names, shows the flag
(``--nlist 50``, ``--retriever bm25``, ``--port 8000``). Each case gives the same bad input through ``tt`` and through
``twotower`` (the style of tests/test_messages_name_parameters.py)."""

from __future__ import annotations

import socket

import pytest

import twotower as tt
from surfaces import cli_message, python_message


def _build(tmp_path, tiny_beir, tiny_bert_dir, **options):
    return lambda: tt.Index.build(tmp_path / "py", tiny_beir, encoder=str(tiny_bert_dir), device="cpu",
                                  show_progress=False, **options)


def _cli_build(tmp_path, tiny_beir, tiny_bert_dir, *options) -> str:
    return cli_message("index", "build", "--data", tiny_beir, "--out", tmp_path / "cli", "--model", tiny_bert_dir,
                        "--device", "cpu", "--no-progress", *options)


def test_index_nlist_for_a_kind_without_lists(tiny_beir, tiny_bert_dir, tmp_path):
    text = python_message(_build(tmp_path, tiny_beir, tiny_bert_dir, kind="flat", nlist=2))
    assert "nlist applies to kind ivf | ivfpq, not 'flat': drop it or change kind" in text
    text = _cli_build(tmp_path, tiny_beir, tiny_bert_dir, "--kind", "flat", "--nlist", "2")
    assert "--nlist applies to --kind ivf | ivfpq, not 'flat': drop it or change --kind" in text
    assert not (tmp_path / "py").exists() and not (tmp_path / "cli").exists()


def test_index_more_lists_than_documents(tiny_beir, tiny_bert_dir, tmp_path):
    text = python_message(_build(tmp_path, tiny_beir, tiny_bert_dir, kind="ivf", nlist=50))
    assert "nlist=50 is more than the 6 vectors to index" in text
    assert "(use nlist=6 or fewer, or kind='flat')" in text
    text = _cli_build(tmp_path, tiny_beir, tiny_bert_dir, "--kind", "ivf", "--nlist", "50")
    assert "--nlist 50 is more than the 6 vectors to index" in text
    assert "(use --nlist 6 or fewer, or --kind flat)" in text


def test_index_hnsw_degree_for_another_kind(tiny_beir, tiny_bert_dir, tmp_path):
    text = python_message(_build(tmp_path, tiny_beir, tiny_bert_dir, kind="flat", hnsw_m=16))
    assert "hnsw_m applies to kind hnsw, not 'flat': drop it or change kind" in text
    text = _cli_build(tmp_path, tiny_beir, tiny_bert_dir, "--kind", "flat", "--hnsw-m", "16")
    assert "--hnsw-m applies to --kind hnsw, not 'flat': drop it or change --kind" in text


def test_bm25_b_out_of_range(tiny_beir):
    text = python_message(lambda: tt.evaluate("bm25", tiny_beir, b=1.5))
    assert "BM25 b must lie in [0, 1]" in text and "got 1.5" in text
    text = cli_message("eval", "--data", tiny_beir, "--retriever", "bm25", "--b", "1.5", "--no-progress")
    assert "BM25 --b must lie in [0, 1]" in text


def test_feedback_for_a_retriever_without_a_dense_query(tiny_beir):
    text = python_message(lambda: tt.evaluate("bm25", tiny_beir, prf_depth=3))
    assert text.startswith("prf_depth feeds the top documents' vectors back into a dense query")
    assert "mode='bm25' has none: drop it or pass mode='dense' | 'hybrid' | 'rrf'" in text
    text = cli_message("eval", "--data", tiny_beir, "--retriever", "bm25", "--prf-depth", "3", "--no-progress")
    assert "--prf-depth feeds the top documents' vectors back into a dense query" in text
    assert "--retriever bm25 has none: drop it or pass --retriever dense | hybrid | rrf" in text


def test_feedback_weight_without_depth(tiny_beir):
    text = python_message(lambda: tt.evaluate("bm25", tiny_beir, prf_weight=2.0))
    assert "prf_weight needs prf_depth (how many top documents feed back)" in text
    text = cli_message("eval", "--data", tiny_beir, "--prf-weight", "2", "--no-progress")
    assert "--prf-weight needs --prf-depth (how many top documents feed back)" in text


def test_reranker_never_trains_on_the_test_split(tiny_beir, tiny_bert_dir, tmp_path):
    text = python_message(lambda: tt.train_reranker(tiny_beir, tmp_path / "py", base=str(tiny_bert_dir),
                                                     split="test"))
    assert text.startswith("split='test': a re-ranker trained on the test judgements")
    text = cli_message("train-reranker", "--data", tiny_beir, "--out", tmp_path / "cli", "--base", tiny_bert_dir,
                        "--split", "test", "--device", "cpu", "--no-progress")
    assert "--split test: a re-ranker trained on the test judgements" in text
    assert not (tmp_path / "py").exists() and not (tmp_path / "cli").exists()


def test_serve_on_a_busy_port(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        text = python_message(lambda: tt.serve_index(None, host="127.0.0.1", port=port))
        assert f"port={port}: 127.0.0.1:{port} is already in use (another server?): stop it or choose another port" \
            in text
        text = cli_message("serve", "--index", tmp_path / "missing", "--host", "127.0.0.1", "--port", port)
        assert f"--port {port}: 127.0.0.1:{port} is already in use (another server?): stop it or choose another " \
            "--port" in text


def test_serve_on_an_unknown_host(tmp_path):
    text = python_message(lambda: tt.serve_index(None, host="no-such-host.invalid", port=0))
    assert text.startswith("host='no-such-host.invalid': not an address this machine can listen on")
    text = cli_message("serve", "--index", tmp_path / "missing", "--host", "no-such-host.invalid", "--port", "0")
    assert "--host no-such-host.invalid: not an address this machine can listen on" in text


def test_serve_keyed_reads_without_a_key(tmp_path):
    text = python_message(lambda: tt.create_app(tmp_path / "missing", keyed_reads=True))
    assert "keyed reads (keyed_reads=True) need an API key (api_key)" in text
    text = cli_message("serve", "--index", tmp_path / "missing", "--keyed-reads", "--port", "0")
    assert "keyed reads (--keyed-reads) need an API key (--api-key-file)" in text


def test_milvus_filter_refusal_names_the_backend():
    """A filter Milvus would answer differently points to the local backend: ``backend='faiss'`` from Python,
    ``--backend faiss`` under the CLI's names (a search of a Milvus index reaches it from either)."""
    from twotower.checks import cli_names
    from twotower.errors import DataError
    from twotower.retrieval.milvus.filtering import metadata_kinds, milvus_filter

    kinds = metadata_kinds([{"ok": True}, {"tags": [1, 2]}])
    for flt, why in (({"ok": 1}, "equals true with 1"), ({"tags": {"$gt": 1}}, "compares a list")):
        text = python_message(lambda: milvus_filter(flt, kinds))
        assert why in text and "backend='faiss'" in text
        with cli_names(), pytest.raises(DataError) as info:
            milvus_filter(flt, kinds)
        assert "--backend faiss" in str(info.value)
