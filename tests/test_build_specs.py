"""``Index.build`` with fewer knobs (issue #73 item 2): the option groups as specs (``tt.ANN``, ``tt.Compression``,
``tt.Passages``, ``tt.Ray``, ``tt.Milvus``), checked when made; the old keywords still build the same index, with a
``DeprecationWarning`` naming the new form; an old keyword beside its spec is an error naming both.

Indexes are built with a deterministic embedding (no model): an old call and a new call give the same manifest and
the same hits. Ray and Milvus are compared by what reaches the writer (``write_index``): the same arguments."""

from __future__ import annotations

import inspect
import warnings

import pytest
from typer.testing import CliRunner

import twotower as tt
from _fixtures import hash_vectors

DIM = 16
TEXTS = [f"document number {i} about {w}. " * (1 + i % 4) for i, w in enumerate(
    "tea coffee cats dogs rain sun moon bones genes stars rivers bread".split())]
QUERIES = ["a query about tea", "dogs and cats", "moon and stars"]


def embed(texts):
    """A deterministic embedding: a vector drawn from the text's hash."""
    return hash_vectors(texts, DIM)


def _build(path, **options):
    return tt.Index.build(path, TEXTS, embedding=embed, bm25=False, show_progress=False, **options)


def _new(path, **options):
    """A build in the new form: no warning at all."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        return _build(path, **options)


def _old(path, needle: str, **options):
    """A build with old keywords: one DeprecationWarning naming the new form, pointing at this file."""
    with pytest.warns(DeprecationWarning, match=needle) as caught:
        index = _build(path, **options)
    assert {w.filename for w in caught if issubclass(w.category, DeprecationWarning)} == {__file__}
    return index


def _same(a: tt.Index, b: tt.Index) -> None:
    skip = {"path", "created", "created_at", "live_version", "version", "index_id", "sha256", "files"}
    ia, ib = ({k: v for k, v in i.info().items() if k not in skip and not k.endswith("_s")} for i in (a, b))
    assert ia == ib
    for q in QUERIES:
        ha, hb = (i.search(q, k=5) for i in (a, b))
        assert [(h.id, round(h.score, 6)) for h in ha] == [(h.id, round(h.score, 6)) for h in hb]
        assert [h.passages for h in ha] == [h.passages for h in hb]


# ------------------------------------------------------------------ each group: old and new build the same index
@pytest.mark.parametrize("old, new, needle", [
    ({"kind": "hnsw", "hnsw_m": 16, "ef_construction": 64}, {"kind": "hnsw", "ann": tt.ANN(m=16, ef_construction=64)},
     r"Index\.build\(hnsw_m=…, ef_construction=…\) is deprecated: pass ann=tt\.ANN\(m=…, ef_construction=…\)"),
    ({"kind": "ivf", "nlist": 2, "train_size": 100}, {"kind": "ivf", "ann": tt.ANN(nlist=2, train_size=100)},
     r"pass ann=tt\.ANN\(nlist=…, train_size=…\)"),
    ({"vectors": "int8", "dim": 8}, {"compression": tt.Compression("int8", dim=8)},
     r"Index\.build\(vectors=…, dim=…\) is deprecated: pass compression=tt\.Compression\(vectors=…, dim=…\)"),
    ({"vectors": "binary", "rescore": "fp32", "rescore_factor": 2},
     {"compression": tt.Compression("binary", rescore="fp32", rescore_factor=2)},
     r"pass compression=tt\.Compression\(vectors=…, rescore=…, rescore_factor=…\)"),
    ({"passage_window": 40, "passage_overlap": 8, "max_passages": 50},
     {"passages": tt.Passages(window=40, overlap=8, max_passages=50)},
     r"Index\.build\(passage_window=…, passage_overlap=…, max_passages=…\) is deprecated: pass "
     r"passages=tt\.Passages\(window=…, overlap=…, max_passages=…\)"),
    ({"passages": True, "passage_window": 60}, {"passages": tt.Passages(window=60)},
     r"pass passages=tt\.Passages\(window=…\)"),
], ids=["hnsw", "ivf", "int8-dim", "binary", "passages", "passages-on"])
def test_old_keywords_and_specs_build_the_same_index(tmp_path, old, new, needle):
    a = _old(tmp_path / "old", needle, **old)
    b = _new(tmp_path / "new", **new)
    _same(a, b)


def test_the_specs_reach_the_index(tmp_path):
    index = _new(tmp_path / "ix", kind="hnsw", ann=tt.ANN(m=12), compression=tt.Compression("fp16", dim=8),
                 passages=tt.Passages(window=40, overlap=4))
    info = index.info()
    assert info["factory"] == "HNSW12,SQfp16" and info["dim"] == 8
    assert info["num_vectors"] > info["num_docs"]  # the long texts made passages
    assert _new(tmp_path / "no", passages=False).info()["num_vectors"] == len(TEXTS)


@pytest.fixture()
def writes(monkeypatch):
    """What reaches the writer: the arguments of every ``write_index`` call (nothing is written)."""
    import twotower.api.index_build as build

    calls = []

    def fake(path, corpus, spec, cfg, **kwargs):
        calls.append({"spec": spec, **{k: v for k, v in kwargs.items() if k not in ("encoder", "embedding")}})
        raise _Stop

    monkeypatch.setattr(build, "write_index", fake)
    return calls


class _Stop(Exception):
    pass


def _reach(tmp_path, name, **options):
    with pytest.raises(_Stop):
        tt.Index.build(tmp_path / name, "corpus.jsonl", encoder="some-model", show_progress=False, **options)


@pytest.mark.parametrize("old, new, needle", [
    ({"ray": True, "ray_address": "auto", "workers": 3, "gpus_per_worker": 0.5},
     {"ray": tt.Ray(address="auto", workers=3, gpus_per_worker=0.5)},
     r"Index\.build\(ray_address=…, workers=…, gpus_per_worker=…\) is deprecated: pass "
     r"ray=tt\.Ray\(address=…, workers=…, gpus_per_worker=…\)"),
    ({"backend": "milvus", "uri": "http://milvus.internal:19530", "collection": "docs"},
     {"backend": tt.Milvus("http://milvus.internal:19530", collection="docs")},
     r"Index\.build\(uri=…, collection=…\) is deprecated: pass backend=tt\.Milvus\(uri=…, collection=…\)"),
], ids=["ray", "milvus"])
def test_ray_and_milvus_old_and_new_reach_the_writer_alike(tmp_path, writes, old, new, needle):
    with pytest.warns(DeprecationWarning, match=needle):
        _reach(tmp_path, "old", **old)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        _reach(tmp_path, "new", **new)
    assert len(writes) == 2 and writes[0] == writes[1]
    if "ray" in old:
        assert (writes[0]["ray"], writes[0]["ray_address"], writes[0]["workers"], writes[0]["gpus_per_worker"]) == (
            True, "auto", 3, 0.5)
    else:
        assert (writes[0]["backend"], writes[0]["uri"], writes[0]["collection"]) == (
            "milvus", "http://milvus.internal:19530", "docs")


def test_plain_ray_and_milvus_still_work_without_a_warning(tmp_path, writes):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        _reach(tmp_path, "a", ray=True)
        _reach(tmp_path, "b", backend="milvus")
    assert writes[0]["ray"] is True and writes[0]["workers"] is None and writes[1]["backend"] == "milvus"
    assert writes[1]["uri"] is None  # refused by the Milvus build: it names uri


def test_a_milvus_lite_build_old_and_new(tmp_path):
    pytest.importorskip("milvus_lite")
    from twotower.retrieval.milvus.client import forget_client

    uri = str(tmp_path / "m.db")
    try:
        a = _old(tmp_path / "old", r"pass backend=tt\.Milvus\(uri=…, collection=…\)", backend="milvus", uri=uri,
                 collection="old_docs", passages=False)
        b = _new(tmp_path / "new", backend=tt.Milvus(uri, collection="new_docs"), passages=False)
        assert a.info()["milvus"]["collection"] == "old_docs" and b.info()["milvus"]["collection"] == "new_docs"
        for q in QUERIES:
            assert [(h.id, round(h.score, 5)) for h in a.search(q, k=5)] == [
                (h.id, round(h.score, 5)) for h in b.search(q, k=5)]
    finally:
        forget_client(uri)


# ------------------------------------------------------------------ mixing, checks, names
@pytest.mark.parametrize("options, needle", [
    ({"hnsw_m": 16, "ann": tt.ANN()}, r"hnsw_m and ann= both set ANN: pass ann=tt\.ANN\(m=…\) alone"),
    ({"vectors": "int8", "compression": tt.Compression()}, r"vectors and compression= both set Compression"),
    ({"dim": 8, "compression": tt.Compression()}, r"dim and compression= both set Compression"),
    ({"passage_window": 40, "passages": tt.Passages()}, r"passage_window and passages= both set Passages"),
    ({"workers": 2, "ray": tt.Ray()}, r"workers and ray= both set Ray"),
    ({"uri": "m.db", "backend": tt.Milvus("m.db")}, r"uri and backend= both set Milvus"),
])
def test_an_old_keyword_beside_its_spec_is_an_error_naming_both(tmp_path, options, needle):
    with pytest.raises(tt.TwoTowerError, match=needle):
        _build(tmp_path / "ix", **options)
    assert not (tmp_path / "ix").exists()


@pytest.mark.parametrize("make, needle", [
    (lambda: tt.ANN(m="32"), r"^ANN\.m='32': a whole number at least 2"),
    (lambda: tt.ANN(nlist=0), r"^ANN\.nlist=0: a whole number at least 1"),
    (lambda: tt.ANN(ef_construction=2.5), r"^ANN\.ef_construction=2\.5"),
    (lambda: tt.Compression("int4"), r"^Compression\.vectors='int4': choose one of fp32, fp16, int8, binary"),
    (lambda: tt.Compression(dim="8"), r"^Compression\.dim='8'"),
    (lambda: tt.Compression("int8", rescore="fp32"), r"^Compression\.rescore applies to Compression\.vectors="),
    (lambda: tt.Compression(rescore_factor=8), r"^Compression\.rescore_factor applies to binary vectors"),
    (lambda: tt.Passages(window=-1), r"^Passages\.window=-1"),
    (lambda: tt.Passages(max_passages=None), r"^Passages\.max_passages=None"),
    (lambda: tt.Passages(score="mean"), r"^Passages\.score is one of max, first, not 'mean'"),
    (lambda: tt.Ray(workers=0), r"^Ray\.workers=0"),
    (lambda: tt.Ray(gpus_per_worker="1"), r"^Ray\.gpus_per_worker='1'"),
    (lambda: tt.Ray(address=5), r"^Ray\.address: auto, local or ray://host:port, not int"),
    (lambda: tt.Milvus(None), r"^Milvus\.uri: give a Milvus Lite file"),
    (lambda: tt.Milvus("m.db", collection=3), r"^Milvus\.collection: a collection name"),
])
def test_a_wrong_field_is_refused_when_the_spec_is_made_naming_it(make, needle):
    with pytest.raises(tt.TwoTowerError, match=needle):
        make()


def test_old_keywords_are_named_as_written_in_their_errors(tmp_path):
    with pytest.raises(tt.TwoTowerError, match=r"^hnsw_m=1: a whole number at least 2"):
        _build(tmp_path / "ix", hnsw_m=1)
    with pytest.raises(tt.TwoTowerError, match=r"^passage_score is one of max, first, not 'mean'"):
        _build(tmp_path / "ix", passage_score="mean")
    with pytest.raises(tt.TwoTowerError, match=r"passage_window tune passages, which passages=False turns off"):
        _build(tmp_path / "ix", passages=False, passage_window=40)
    with pytest.raises(tt.TwoTowerError, match=r"uri name a Milvus location: pass backend=tt\.Milvus\(uri=…\)"):
        _build(tmp_path / "ix", uri="m.db")


@pytest.mark.parametrize("options, needle", [
    ({"ann": {"m": 16}}, r"ann: a tt\.ANN\(\.\.\.\), not dict"),
    ({"compression": "int8"}, r"compression: a tt\.Compression\(\.\.\.\), not str"),
    ({"passages": "yes"}, r"passages: True, False or a tt\.Passages\(\.\.\.\)"),
    ({"ray": "yes"}, r"ray: True, False or a tt\.Ray\(\.\.\.\), not 'yes'"),
    ({"bigrams": "no"}, r"bigrams: True or False is needed"),
    ({"frobnicate": 1}, r"unknown option\(s\) frobnicate"),
])
def test_a_wrong_parameter_is_refused_naming_it(tmp_path, options, needle):
    with pytest.raises(tt.TwoTowerError, match=needle):
        _build(tmp_path / "ix", **options)


def test_the_signature_is_short_and_the_specs_are_public():
    params = [p for p in inspect.signature(tt.Index.build).parameters.values() if p.kind is not p.VAR_KEYWORD]
    assert len(params) <= 17
    assert {"ann", "compression", "passages", "ray", "backend"} <= {p.name for p in params}
    assert not {"hnsw_m", "ray_address", "passage_window", "uri", "dim"} & {p.name for p in params}
    from twotower.encoders.passages import MAX_PASSAGES

    assert tt.Passages().max_passages == MAX_PASSAGES
    for name in ("ANN", "Compression", "Passages", "Ray", "Milvus"):
        cls = getattr(tt, name)
        assert name in tt.__all__ and cls.__module__ == "twotower.api.build_specs" and "Example" in cls.__doc__
        with pytest.raises(Exception):  # frozen
            setattr(cls("m.db") if name == "Milvus" else cls(), "x", 1)


# ------------------------------------------------------------------ the CLI builds the specs: no warning
def test_the_cli_keeps_its_flags_and_warns_nothing(tmp_path, tiny_bert_dir, tiny_beir):
    from twotower.cli import app

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        res = CliRunner().invoke(app, [str(a) for a in (
            "index", "build", "--data", tiny_beir, "--out", tmp_path / "ix", "--model", tiny_bert_dir,
            "--no-progress", "--precision", "fp32", "--kind", "hnsw", "--hnsw-m", "12", "--ef-construction", "50",
            "--vectors", "fp16", "--passage-window", "32", "--passage-overlap", "4")])
    assert res.exit_code == 0, res.output
    info = tt.Index.open(tmp_path / "ix").info()
    assert info["factory"] == "HNSW12,SQfp16" and info["passages"]["window"] == 32


@pytest.mark.parametrize("argv, needle", [
    (["--dim", "0"], "--dim 0: a whole number at least 1"),
    (["--vectors", "int4"], "--vectors int4: choose one of"),
    (["--rescore", "fp32"], "--rescore applies to --vectors binary"),
    (["--passage-score", "mean"], "--passage-score is one of max, first, not 'mean'"),
    (["--no-passages", "--passage-window", "40"], "--passage-window tune passages, which --no-passages turns off"),
    (["--ray-address", "auto"], "--ray-address set how Ray encodes; without --ray"),
    (["--uri", "m.db"], "--uri name a Milvus location: pass --backend milvus"),
])
def test_the_cli_names_its_flags(tmp_path, tiny_beir, argv, needle):
    from twotower.cli import app

    res = CliRunner().invoke(app, [str(a) for a in ("index", "build", "--data", tiny_beir, "--out", tmp_path / "ix",
                                                    "--no-progress", *argv)])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and needle in text, text
    assert not (tmp_path / "ix").exists()
