"""Distributed encoding on a local Ray instance (2 worker actors) equals single-process encoding."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, write_beir

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

CORPUS = TINY_CORPUS + [
    {"_id": f"x{i}", "title": f"Note {i}", "text": " ".join(["word"] * (3 + 7 * i)) + f" number {i}"}
    for i in range(9)
]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_plan_batches_matches_encode_texts_grouping(tiny_bert_dir):
    from twotower.encoders.towers import DualEncoder
    from twotower.scale.ray_encode import plan_batches

    enc = DualEncoder.load(str(tiny_bert_dir))
    texts = [d["text"] for d in CORPUS]
    batches = plan_batches(enc.doc_tower.tokenizer, texts, max_length=enc.doc_max_length, batch_size=4)
    assert [len(b) for b in batches] == [4, 4, 4, 3]
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(texts)))
    lengths = [len(enc.doc_tower.tokenizer(t)["input_ids"]) for t in texts]
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat, reverse=True)  # longest first, as encode_texts pads


def test_ray_build_equals_single_process(local_ray, tiny_bert_dir, tmp_path):
    from twotower.retrieval.indexing import EncodeConfig, build_index
    from twotower.retrieval.searcher import Searcher
    from twotower.retrieval.store import IndexSpec, IndexStore
    from typer.testing import CliRunner

    from twotower.cli import app

    data = write_beir(tmp_path / "tiny", CORPUS, TINY_QUERIES, TINY_QRELS)
    cfg = EncodeConfig(batch_size=4, precision="fp32", show_progress=False)
    single = build_index(data, tmp_path / "single", model=str(tiny_bert_dir), spec=IndexSpec(bm25=True), cfg=cfg)
    # through the CLI, on the Ray instance this process already joined
    r = CliRunner().invoke(app, ["index", "build", "--data", str(data), "--out", str(tmp_path / "ray"), "--model",
                                 str(tiny_bert_dir), "--bm25", "--batch-size", "4", "--precision", "fp32",
                                 "--no-progress", "--ray", "--workers", "2"])
    assert r.exit_code == 0, r.output
    dist = IndexStore.open(tmp_path / "ray")
    assert dist.doc_ids == single.doc_ids
    np.testing.assert_allclose(np.asarray(dist.vectors), np.asarray(single.vectors), atol=1e-5, rtol=0)
    assert dist.manifest["model"] == single.manifest["model"] and dist.manifest["num_docs"] == len(CORPUS)
    assert not (tmp_path / "ray.ray-shards").exists()  # merged, then cleaned up
    reopened = IndexStore.open(tmp_path / "ray", verify=True)
    s1, s2 = Searcher(single), Searcher(reopened)
    for q in ("which feline purrs", "word number 3"):
        assert [h.doc_id for h in s1.search(q, 5)] == [h.doc_id for h in s2.search(q, 5)]


def test_ray_resumes_from_shards(local_ray, tiny_bert_dir, tmp_path, capfd):
    """A killed run left all but one batch: only that one is encoded again, the rest are re-used. Ray prints no
    error-level line on the way (its actors are created without restarts: see RayConfig.actor_restarts)."""
    from twotower.encoders.inference import encode_texts
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.scale.ray_encode import RayConfig, _fingerprint, encode_corpus_ray, plan_batches, prepare_shard_dir

    enc = DualEncoder.load(str(tiny_bert_dir))
    tok, length = enc.doc_tower.tokenizer, enc.doc_max_length
    ids, texts = [d["_id"] for d in CORPUS], [d["text"] for d in CORPUS]
    shard_dir = tmp_path / "shards"
    prepare_shard_dir(shard_dir, _fingerprint(ids, texts, str(tiny_bert_dir), 4, "fp32"), len(texts))
    batches = plan_batches(tok, texts, max_length=length, batch_size=4)
    for b, rows in enumerate(batches[:-1]):  # marked: a shard holds what this run says, not recomputed
        vec = encode_texts(enc.doc_tower, [texts[i] for i in rows], max_length=length, batch_size=4, precision="fp32",
                           show_progress=False) + (1.0 if b == 0 else 0.0)
        np.savez(shard_dir / f"batch-{b:08d}.npz", rows=rows, vectors=vec)
    got = encode_corpus_ray(ids, texts, model=str(tiny_bert_dir), tokenizer=tok, max_length=length, batch_size=4,
                            precision="fp32", shard_dir=shard_dir, show_progress=False, cfg=RayConfig(workers=2))
    expected = enc.encode_documents(texts, EncodeOptions(batch_size=4, precision="fp32", show_progress=False))
    first = batches[0]
    np.testing.assert_allclose(got[first], expected[first] + 1.0, atol=1e-5)  # re-used as it was
    rest = np.setdiff1d(np.arange(len(texts)), first)
    np.testing.assert_allclose(got[rest], expected[rest], atol=1e-5, rtol=0)  # incl. the missing batch
    assert (shard_dir / f"batch-{len(batches) - 1:08d}.npz").is_file()
    err = capfd.readouterr().err
    assert "constructor arguments in the object store" not in err, err


def test_shards_of_another_corpus_are_dropped(tmp_path):
    from twotower.scale.ray_encode import _fingerprint, merge_shards, prepare_shard_dir

    shard_dir = tmp_path / "shards"
    assert prepare_shard_dir(shard_dir, _fingerprint(["a"], ["x"], None, 4, "fp32"), 1) == set()
    np.savez(shard_dir / "batch-00000000.npz", rows=np.array([0]), vectors=np.ones((1, 3), np.float32))
    assert prepare_shard_dir(shard_dir, _fingerprint(["a"], ["x"], None, 4, "fp32"), 1) == {0}
    np.testing.assert_array_equal(merge_shards(shard_dir, 1, 1), np.ones((1, 3)))
    assert prepare_shard_dir(shard_dir, _fingerprint(["a"], ["y"], None, 4, "fp32"), 1) == set()
    with pytest.raises(Exception, match="0 of 1 batch shards"):
        merge_shards(shard_dir, 1, 1)
