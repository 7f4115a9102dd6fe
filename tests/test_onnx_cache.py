"""The default query runtime of an opened index (issue #70 item 6): ONNX Runtime, its export kept on disk so that a
new process encodes its first query without torch; the vectors equal torch's; a damaged entry is not used."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import twotower as tt
from conftest import subprocess_env

pytest.importorskip("onnxruntime", reason="the onnx query runtime needs onnxruntime (a core dependency)")

PROBE = """
import json, sys
import twotower as tt
ix = tt.Index.open(sys.argv[1])
vec = ix._searcher.encode_queries(["how is green tea made", "Kaffee"])
hits = ix.search("green tea", k=2)  # the default: hybrid over passages
print(json.dumps({"torch": "torch" in sys.modules, "kind": type(ix._searcher.onnx_queries).__name__,
                  "vec": vec.tolist(), "ids": [h.id for h in hits]}))
"""


def _probe(path, home) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=600,
                         env=subprocess_env(TWOTOWER_HOME=str(home)))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_new_process_searches_from_the_cached_export_without_torch(tmp_path, tiny_bert_dir, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TWOTOWER_HOME", str(home))
    long = " ".join(f"Sentence {i} tells of kettles and teapots." for i in range(40))  # several passages
    index = tt.Index.build(tmp_path / "idx", ["Green tea is steamed.", "Coffee is roasted.", "Cats purr.", long],
                           encoder=str(tiny_bert_dir), bm25=True, precision="fp32", passage_window=32,
                           show_progress=False)
    assert index.info()["num_vectors"] > 4  # the search groups passages by document: no torch there either
    from twotower.encoders.towers import EncodeOptions

    queries = ["how is green tea made", "Kaffee"]
    reference = index.encoder.model.encode_queries(queries, EncodeOptions(precision="fp32", show_progress=False))
    first = _probe(tmp_path / "idx", home)  # exports the query tower and keeps it
    assert first["kind"] == "_TowerQueries"
    assert len(list((home / "onnx-queries").iterdir())) == 1
    second = _probe(tmp_path / "idx", home)
    assert second["kind"] == "CachedQueries" and second["torch"] is False  # no torch, no weights loaded
    for run in (first, second):
        assert np.abs(np.asarray(run["vec"]) - reference).max() < 1e-4
    assert second["ids"] == first["ids"]
    entry = next((home / "onnx-queries").iterdir())
    np.save(entry / "probes.npy", np.load(entry / "probes.npy") + 0.01)  # no longer what torch made
    damaged = _probe(tmp_path / "idx", home)
    assert damaged["kind"] == "_TowerQueries" and np.abs(np.asarray(damaged["vec"]) - reference).max() < 1e-4


def test_torch_stays_torch_and_an_unwritable_cache_is_no_error(tmp_path, tiny_bert_dir, monkeypatch):
    blocker = tmp_path / "home"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("TWOTOWER_HOME", str(blocker))
    tt.Index.build(tmp_path / "idx", ["Green tea is steamed.", "Coffee."], encoder=str(tiny_bert_dir),
                   bm25=False, show_progress=False)
    opened = tt.Index.open(tmp_path / "idx")
    assert opened.search("tea", k=1, mode="dense")  # exported, not cached: searched all the same
    torch_only = tt.Index.open(tmp_path / "idx", query_runtime="torch")
    assert torch_only.search("tea", k=1, mode="dense") and torch_only._searcher.onnx_queries is None
