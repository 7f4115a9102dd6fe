"""The API takes back the objects it hands out (issue #58): wherever a ``tt.*`` function asks for a path or a name
of something the API also gives users as an object (an :class:`~twotower.Index`, an :class:`~twotower.Encoder`, a
:class:`~twotower.Dataset`, a :class:`~twotower.FitResult`, an :class:`~twotower.EvalResult`), it takes the object,
or refuses it with a :class:`~twotower.TwoTowerError` naming the parameter (never a ``TypeError`` from pathlib).

Each function is called with the object; where it runs, its answer is compared with the answer to the path form (the
reference), and where the work behind it is long (training, analyses), the work is replaced by a recorder and the
arguments it would have got are compared with those of the path form."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import twotower as tt
from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, write_beir

# the parameter names through which a function takes a path or a name of something the API also hands out
PATH_PARAMETERS = {"path", "root", "data", "dataset", "model", "name_or_dir", "encoder", "index", "retriever", "folder",
                   "app", "run", "qrels", "config", "model_dir", "corpus", "base"}
# every tt function or class method with such a parameter: the test below that calls it with the objects
SWEPT = {
    "create_app": "test_create_app_and_serve_index", "serve_index": "test_create_app_and_serve_index",
    "Index": "test_index", "Index.open": "test_index", "Index.build": "test_index",
    "Index.attach": "path: the folder the replica gets (new or empty): an open Index is not one",
    "Encoder.load": "test_encoder_load", "Encoder": "model: a loaded DualEncoder (most users call Encoder.load)",
    "evaluate": "test_evaluate_and_runs", "score_run": "test_evaluate_and_runs", "read_run": "test_evaluate_and_runs",
    "write_run": "test_evaluate_and_runs", "read_result": "test_evaluate_and_runs",
    "load_beir": "test_load_beir", "Dataset.load": "test_load_beir", "mine": "test_mine",
    "fit": "test_training_entry_points", "train": "test_training_entry_points",
    "train_reranker": "test_training_entry_points", "align_languages": "test_training_entry_points",
    "align_translations": "test_training_entry_points",
    "pretrain": "config: a TrainConfig (its model as in train), pretraining: a PretrainConfig of a corpus file",
    "analyze_fidelity": "test_analyses", "analyze_towers": "test_analyses", "analyze_doclength": "test_analyses",
    "analyze_latency": "test_analyses", "build_report": "test_analyses",
    "Reranker": "model_dir: a cross-encoder's folder; FitResult is path-like (its model), refused as not one",
    "Dataset.from_lists": "corpus: documents in memory, no path", "parse_filter": "obj: a filter, no path",
    "fetch_beir": "name: a BEIR name, no object", "fetch_model": "name: a registry name, no object",
    "TrainConfig.from_toml": "path: a TOML file, no object", "document_id": "text, no path",
    "document_ids": "texts, no path",
}


def public_callables():
    """``{name: callable}`` for every tt function and every class's constructor and public classmethods."""
    found = {}
    for name in tt.__all__:
        obj = getattr(tt, name)
        if inspect.isfunction(obj):
            found[name] = obj
        elif inspect.isclass(obj) and not issubclass(obj, BaseException):
            if "__init__" in vars(obj) and not getattr(obj, "__dataclass_fields__", None):
                found[name] = obj.__init__
            for attr, raw in vars(obj).items():
                if isinstance(raw, classmethod) and not attr.startswith("_"):
                    found[f"{name}.{attr}"] = getattr(obj, attr)
    return found


def test_every_function_taking_a_path_is_swept():
    """A new ``tt`` function with a path parameter fails here until this file calls it with the objects."""
    taking = sorted(n for n, f in public_callables().items()
                    if PATH_PARAMETERS & set(inspect.signature(f).parameters) - {"self", "cls"})
    missing = [n for n in taking if n not in SWEPT]
    assert not missing, f"call these with the API's objects in tests/test_api_objects.py: {missing}"
    tests = {v for v in SWEPT.values() if v.startswith("test_")}
    assert tests <= set(globals()), tests - set(globals())


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_bert_dir):
    """A BEIR folder (test and train splits), its Datasets, an Index built from it, that Index's Encoder, a
    FitResult whose model is the tiny encoder, an EvalResult."""
    root = tmp_path_factory.mktemp("objects")
    data = write_beir(root / "data", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    write_beir(root / "data", TINY_CORPUS, TINY_QUERIES, TINY_QRELS, split="train")
    ds = tt.load_beir(data)
    ix = tt.Index.build(root / "ix", ds, encoder=str(tiny_bert_dir), bm25=True, precision="fp32", show_progress=False)
    fr = tt.FitResult(out=root / "fit", model=Path(tiny_bert_dir), report={"choices": {}})
    return {"root": root, "data": data, "ds": ds, "train": tt.load_beir(data, split="train"), "ix": ix,
            "enc": ix.encoder, "fr": fr, "model": Path(tiny_bert_dir), "result": tt.evaluate(ix, ds)}


def refused(call, parameter: str, *words: str) -> str:
    with pytest.raises(tt.TwoTowerError) as err:
        call()
    message = str(err.value)
    assert message.startswith(f"{parameter}: "), message
    for word in words:
        assert word in message, (word, message)
    return message


def ranked(hits):
    return [(h.id, round(h.score, 5)) for h in hits]


def test_create_app_and_serve_index(world):
    from fastapi.testclient import TestClient

    ix, enc = world["ix"], world["enc"]
    query = {"query": "cats purr", "k": 3, "mode": "dense"}
    served = TestClient(tt.create_app(ix.path, query_runtime="torch", precision="fp32"))
    want = served.post("/search", json=query).json()
    for app in (tt.create_app(ix), tt.create_app(ix.path, model=enc, query_runtime="torch", precision="fp32"),
                tt.create_app(ix.path, model=world["fr"], query_runtime="torch", precision="fp32")):
        assert TestClient(app).post("/search", json=query).json()["hits"] == want["hits"]
    refused(lambda: tt.create_app(enc), "index", "not Encoder")
    refused(lambda: tt.create_app(ix, model=world["ds"]), "model", "tt.Encoder", "not Dataset")
    # an Index or a folder is no app: refused before uvicorn starts (it would answer every request with a 500)
    for thing in (ix, ix.path, str(ix.path)):
        refused(lambda: tt.serve_index(thing, port=0), "app", "tt.create_app(index)")


def test_index(world):
    ix, enc, fr = world["ix"], world["enc"], world["fr"]
    want = ranked(ix.search("green tea", k=3))
    again = tt.Index.open(ix, precision="fp32")  # another Index over the open one's folder
    assert again.path == ix.path and ranked(again.search("green tea", k=3)) == want
    assert ranked(tt.Index(ix, precision="fp32").search("green tea", k=3)) == want
    for model in (enc, fr):  # the model the index was built with, as an Encoder or as a FitResult
        assert ranked(tt.Index.open(ix.path, model=model, precision="fp32").search("green tea", k=3)) == want
    refused(lambda: tt.Index.open(world["ds"]), "path", "tt.Index", "not Dataset")
    refused(lambda: tt.Index.open(ix.path, model=world["ds"]), "model", "not Dataset")

    root = world["root"]
    by_fit = tt.Index.build(root / "by-fit", ["Green tea.", "Coffee."], encoder=fr, precision="fp32",
                            show_progress=False)
    by_path = tt.Index.build(root / "by-path", ["Green tea.", "Coffee."], encoder=world["model"], precision="fp32",
                             show_progress=False)
    assert ranked(by_fit.search("tea", k=2)) == ranked(by_path.search("tea", k=2))
    assert by_fit.info()["model"]["path"] == by_path.info()["model"]["path"]
    grown = tt.Index.build(by_fit, ["Oolong."], encoder=fr, precision="fp32", show_progress=False,
                           mode="overwrite")  # a new version
    assert grown.path == by_fit.path and len(grown) == 1 and grown.info()["live_version"] == "v000002"
    refused(lambda: tt.Index.build(root / "x", ["a"], encoder=world["ds"], show_progress=False), "encoder",
            "not Dataset")
    with pytest.raises(tt.DataError, match="^corpus: .*Index"):  # an Index is no corpus: named, not a TypeError
        tt.Index.build(root / "y", ix, encoder=fr, show_progress=False)


def test_encoder_load(world):
    import numpy as np

    enc, fr = world["enc"], world["fr"]
    want = tt.Encoder.load(world["model"], precision="fp32").encode_queries(["green tea"])
    for source in (enc, fr):
        again = tt.Encoder.load(source, precision="fp32")
        assert again.source == str(world["model"])
        np.testing.assert_allclose(again.encode_queries(["green tea"]), want, rtol=1e-5, atol=1e-6)
    refused(lambda: tt.Encoder.load(world["ix"]), "name_or_dir", "tt.Encoder", "not Index")


def test_evaluate_and_runs(world, tmp_path):
    ix, ds, enc, fr, result = world["ix"], world["ds"], world["enc"], world["fr"], world["result"]
    want = tt.evaluate(str(world["model"]), ds, precision="fp32").metrics
    assert tt.evaluate(fr, ds, precision="fp32").metrics == want
    assert tt.evaluate("dense", ds, model=enc, precision="fp32").metrics == want
    assert tt.evaluate("dense", ds, model=fr, precision="fp32").metrics == want
    refused(lambda: tt.evaluate("dense", ds, model=ix), "model", "not Index")

    # the EvalResult where a run or a result file is taken, the Dataset where qrels are
    assert tt.score_run(result, ds, ["ndcg@10"]) == tt.score_run(result.run, ds.qrels, ["ndcg@10"])
    assert tt.score_run(result, ds)["ndcg@10"] == pytest.approx(result.metrics["ndcg@10"])
    tt.write_run(result, tmp_path / "a.trec")
    tt.write_run(result.run, tmp_path / "b.trec")
    assert (tmp_path / "a.trec").read_text() == (tmp_path / "b.trec").read_text()
    assert tt.read_run(result) == result.run and tt.read_run(result) is not result.run
    from_file = tt.read_run(tmp_path / "a.trec")  # scores written to 9 decimals
    assert {q: {d: round(s, 6) for d, s in docs.items()} for q, docs in from_file.items()} == {
        q: {d: round(s, 6) for d, s in docs.items()} for q, docs in result.run.items()}
    result.save(tmp_path / "r.json")
    assert tt.read_result(result) == tt.read_result(tmp_path / "r.json")
    refused(lambda: tt.read_run(ix), "path", "EvalResult", "not Index")
    refused(lambda: tt.read_result(ds), "path", "EvalResult", "not Dataset")


def test_load_beir(world):
    ds = tt.load_beir(world["train"], split="test")  # a Dataset: the named split of its folder
    assert (ds.split, ds.qrels, ds.root) == ("test", world["ds"].qrels, world["ds"].root)
    assert tt.Dataset.load(world["ds"], "train").qrels == world["train"].qrels
    made = tt.Dataset.from_lists(corpus={"d1": "tea"}, queries={"q1": "tea"}, qrels={"q1": {"d1": 1}})
    refused(lambda: tt.load_beir(made), "root", "in memory", "ds.save(folder)")
    refused(lambda: tt.load_beir(world["ix"]), "root", "tt.Dataset", "not Index")


def test_mine(world, tmp_path):
    kw = {"rank_from": 1, "rank_to": 5, "num_negatives": 1, "show_progress": False}
    n = tt.mine(world["data"], tmp_path / "a.jsonl", **kw)
    assert tt.mine(world["train"], tmp_path / "b.jsonl", **kw) == n
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    dense = dict(kw, retriever="model", precision="fp32")
    tt.mine(world["data"], tmp_path / "c.jsonl", model=world["model"], **dense)
    tt.mine(world["data"], tmp_path / "d.jsonl", model=world["enc"], **dense)
    assert (tmp_path / "c.jsonl").read_text() == (tmp_path / "d.jsonl").read_text()
    # a Dataset of another split than the one mined: refused, naming both
    refused(lambda: tt.mine(world["ds"], tmp_path / "e.jsonl", **kw), "data", "split 'test'", "split='test'")


class Recorder:
    """Stands in for a long computation: keeps the arguments it got, returns ``value``."""

    def __init__(self, value=None):
        self.calls, self.value = [], value

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.value


def test_training_entry_points(world, tmp_path, monkeypatch):
    import twotower.encoders.language_bias as language_bias
    import twotower.retrieval.rerank as rerank
    import twotower.training.fit as fit_module
    import twotower.training.pipeline as pipeline

    data, model = world["data"], world["model"]

    # fit: the model as an Encoder or a FitResult reaches the recipe as its directory
    fitted = Recorder(type("R", (), {"out": tmp_path, "model": model, "report": {}, "computed": [], "message": None}))
    monkeypatch.setattr(fit_module, "run_fit", fitted)
    for given in (str(model), world["enc"], world["fr"]):
        tt.fit(world["train"], tmp_path / "fit", model=given, show_progress=False)
    folders = {args[0] for args, _ in fitted.calls}
    models = {str(args[2].model) for args, _ in fitted.calls}
    assert folders == {Path(data)} and models == {str(model)}
    refused(lambda: tt.fit(data, tmp_path / "fit", model=world["ix"]), "model", "not Index")

    # train: TrainConfig(model=Encoder), a stage's data and the mining data as Datasets
    trained = Recorder(tmp_path / "model")
    monkeypatch.setattr(pipeline, "run_training", trained)
    for given_model, stage_data in ((str(model), str(data)), (world["enc"], world["train"]), (world["fr"], data)):
        cfg = tt.TrainConfig(out=str(tmp_path / "run"), model=given_model,
                             stages=[tt.StageConfig(data=stage_data, steps=1)])
        tt.train(cfg, hard_negatives="bm25", data=world["train"])
    requests = [args[0] for args, _ in trained.calls]
    assert {str(r.config.model) for r in requests} == {str(model)}
    assert {str(r.config.stages[0].data) for r in requests} == {str(data)} and {r.data for r in requests} == {data}
    refused(lambda: tt.train(tt.TrainConfig(out=str(tmp_path / "run"), stages=[tt.StageConfig(data=str(data))]),
                             data=world["ds"]), "data", "split 'test'")

    # train_reranker: the data as a Dataset of the split it trains on
    reranked = Recorder({})
    monkeypatch.setattr(rerank, "train_reranker", reranked)
    tt.train_reranker(data, tmp_path / "rr1")
    tt.train_reranker(world["train"], tmp_path / "rr2")
    assert reranked.calls[0][0][0] == reranked.calls[1][0][0] == Path(data)
    refused(lambda: tt.train_reranker(world["ix"], tmp_path / "rr3"), "data", "not Index")

    # align_languages: the model as an Encoder, the data as a Dataset (any split: it reads the corpus)
    aligned = Recorder({})
    monkeypatch.setattr(language_bias, "align_languages", aligned)
    tt.align_languages(str(model), data, tmp_path / "al1")
    tt.align_languages(world["enc"], world["ds"], tmp_path / "al2")
    assert [c[0][:2] for c in aligned.calls] == [(str(model), Path(data)), (str(model), Path(data))]
    refused(lambda: tt.align_languages(world["ix"], data, tmp_path / "al3"), "model", "not Index")

    # align_translations: the model as an Encoder (the pairs are a TSV path)
    import twotower.encoders.translation_align as translation_align

    mapped = Recorder({})
    monkeypatch.setattr(translation_align, "align_translations", mapped)
    tt.align_translations(str(model), tmp_path / "pairs.tsv", tmp_path / "at1")
    tt.align_translations(world["enc"], tmp_path / "pairs.tsv", tmp_path / "at2")
    assert [c[0][0] for c in mapped.calls] == [str(model), str(model)]
    refused(lambda: tt.align_translations(world["ix"], tmp_path / "pairs.tsv", tmp_path / "at3"), "model",
            "not Index")


def test_analyses(world, tmp_path, monkeypatch):
    import twotower.analysis.doclength as doclength
    import twotower.analysis.embedding_space as embedding_space

    seen = []

    def run(cfg):
        seen.append(cfg)
        return {"rows": [], "notes": []}

    monkeypatch.setattr(embedding_space, "run_towers", run)
    monkeypatch.setattr(doclength, "run_doclength", run)
    tt.analyze_towers(tt.TowersConfig(data=world["ds"], models=[world["enc"], world["fr"], None]))
    tt.analyze_doclength(tt.DocLengthConfig(data=world["ds"], models=[world["enc"]]))
    assert [c.data for c in seen] == [Path(world["data"])] * 2
    assert seen[0].models == [str(world["model"]), world["model"], None] and seen[1].models == [str(world["model"])]
    refused(lambda: tt.analyze_doclength(tt.DocLengthConfig(data=world["train"])), "data", "split 'train'")
    refused(lambda: tt.analyze_towers(tt.TowersConfig(data=world["ix"])), "data", "not Index")
    refused(lambda: tt.build_report(world["result"]), "folder", "not EvalResult")
