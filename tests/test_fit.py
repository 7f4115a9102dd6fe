"""twotower fit: the dev split (no leakage), the margin rule, choices travelling with the model, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import write_beir
from twotower.data.pairs import TrainExample, load_pairs
from twotower.errors import TwoTowerError
from twotower.training.fit import FitOptions, FitRecipe, run_fit
from twotower.training.fit.margin import choose_margin, inside_margin, measure_margins, mine_negatives
from twotower.training.fit.recipe import dev_size, split_queries

WORDS = "cat dog tea rust python cell sun moon river stone tree bird fish apple music train".split()


def _data(root: Path, *, test_split: bool = True) -> Path:
    corpus = [{"_id": f"d{i}", "title": w, "text": f"{w} is about {w} and {WORDS[(i + 3) % len(WORDS)]}"}
              for i, w in enumerate(WORDS)]
    queries = [{"_id": f"q{i}", "text": f"what is {w}"} for i, w in enumerate(WORDS)]
    qrels = [(f"q{i}", f"d{i}", 1) for i in range(len(WORDS))] + [("q0", "d1", 1), ("q2", "d3", 1)]
    data = write_beir(root, corpus, queries, qrels, split="train")
    if test_split:  # must never be read: garbage that would fail to parse
        (data / "qrels" / "test.tsv").write_text("this is not a qrels file\n")
    return data


def _recipe(model: Path, **kw) -> FitRecipe:
    base = dict(model=str(model), min_dev=4, batch_size=4, epochs=1, mined_epochs=1, rank_from=1, rank_to=8,
                mined_per_query=2, cv_below=0)  # the single dev split (test_fit_cv.py: cross-validation)
    return FitRecipe(**{**base, **kw})


QUIET = FitOptions(show_progress=False, precision="fp32")


@pytest.fixture(scope="module")
def fitted(tiny_bert_dir, tmp_path_factory):
    """One full fit (with the re-ranker) on tiny data, recording every qrels file read."""
    import twotower.data.beir as beir

    root = tmp_path_factory.mktemp("fit")
    data = _data(root / "data")
    read: list[str] = []
    original = beir.load_qrels

    def spy(path):
        read.append(Path(path).name)
        return original(path)

    mp = pytest.MonkeyPatch()
    mp.setattr(beir, "load_qrels", spy)
    try:
        result = run_fit(data, root / "out", _recipe(tiny_bert_dir, reranker=True), QUIET)
    finally:
        mp.undo()
    return data, result, read


# ---------------------------------------------------------------- the dev split


def test_split_is_seeded_by_query_and_sized():
    ids = [f"q{i}" for i in range(100)]
    dev, train = split_queries(ids, 0.2, 10, seed=7)
    assert (dev, train) == split_queries(list(reversed(ids)), 0.2, 10, seed=7)  # order of input does not matter
    assert set(dev).isdisjoint(train) and set(dev) | set(train) == set(ids)
    assert len(dev) == 20
    assert split_queries(ids, 0.2, 10, seed=8)[0] != dev
    assert dev_size(100, 0.2, 50) == 50  # the minimum
    assert dev_size(60, 0.2, 50) == 30  # at most half
    assert dev_size(1, 0.2, 50) == 0


def test_fit_never_reads_test_and_dev_stays_out_of_training(fitted):
    data, result, read = fitted
    assert read and set(read) == {"train.tsv"}  # qrels/test.tsv (garbage here) was never opened
    out = result.out
    split = json.loads((out / "stages" / "split" / "done.json").read_text())
    dev, train = set(split["dev"]), set(split["train"])
    assert dev and train and dev.isdisjoint(train) and len(dev) == 4
    trained = {p.qid for p in load_pairs(out / "stages" / "split" / "train_pairs.jsonl")}
    mined = load_pairs(out / "stages" / "mine" / "mined_pairs.jsonl")
    assert trained <= train and {p.qid for p in mined} <= train  # neither gradients nor mining see a dev query
    # a dev query's judgements all stay on the dev side (q0 and q2 have two each)
    for ex in mined:
        assert ex.pid not in ex.negative_ids
    # what the trainers actually read: their saved configs point at these pairs files
    for stage, pairs in (("finetune", "split/train_pairs.jsonl"), ("retrain", "mine/mined_pairs.jsonl")):
        cfg = json.loads((out / "stages" / stage / "run" / "train_config.json").read_text())
        assert cfg["stages"][0]["pairs"] == str(out / "stages" / pairs)


def test_fit_report_and_model(fitted):
    _, result, _ = fitted
    report = json.loads((result.out / "fit.json").read_text())
    assert set(report["stages"]) == {"split", "zeroshot", "finetune", "margin", "mine", "retrain", "select", "refine",
                                     "distill", "rerank"}
    for stage in ("zeroshot", "finetune", "retrain"):
        assert "ndcg@10" in report["stages"][stage]["dev_dense"]
    chosen = report["stages"]["select"]["chosen"]
    config = json.loads((result.model / "twotower.json").read_text())
    assert config["retrieval"]["mode"] == chosen["mode"] == report["choices"]["mode"]
    assert config["retrieval"].get("lambda") == chosen["lambda"]
    # the chosen row is the best dev score among all candidates
    best = max(r["dev"]["ndcg@10"] for r in report["stages"]["select"]["candidates"])
    assert chosen["dev"]["ndcg@10"] == best
    rerank = report["stages"]["rerank"]
    assert rerank["kept"] == (rerank["dev_after"]["ndcg@10"] > rerank["dev_before"]["ndcg@10"])
    assert (result.model / "reranker").is_dir() == rerank["kept"]


def test_refine_trains_the_chosen_encoder_on_its_own_top_unjudged_documents(fitted):
    """The third round: each training example's negatives are the select stage's encoder's top unjudged documents
    for its query (recomputed here by brute force from that encoder), no dev query among them, the round trained
    from that encoder on exactly those lists, and the refined encoder in the model only where it raised dev."""
    import numpy as np

    from twotower.encoders.towers import DualEncoder, EncodeOptions

    data, result, _ = fitted
    out, stages = result.out, result.report["stages"]
    chosen, refine = stages["select"]["chosen"], stages["refine"]
    assert refine["started_from"] == chosen["model"] and refine["settings"] == {"refine_candidates": 8,
                                                                                 "refine_epochs": 2.0}
    start = (Path(json.loads((out / "recipe.json").read_text())["recipe"]["model"]) if chosen["model"] == "zeroshot"
             else out / stages[chosen["model"]]["model"])
    lists = load_pairs(out / "stages" / "refine" / "lists.jsonl")
    split = json.loads((out / "stages" / "split" / "done.json").read_text())
    pairs = load_pairs(out / "stages" / "split" / "train_pairs.jsonl")
    assert [(e.qid, e.pid) for e in lists] == [(p.qid, p.pid) for p in pairs] and refine["lists"] == len(lists)
    assert {e.qid for e in lists} <= set(split["train"])
    corpus = {json.loads(x)["_id"]: json.loads(x) for x in (data / "corpus.jsonl").read_text().splitlines()}
    queries = {json.loads(x)["_id"]: json.loads(x)["text"] for x in (data / "queries.jsonl").read_text().splitlines()}
    judged = {}
    for line in (data / "qrels" / "train.tsv").read_text().splitlines()[1:]:
        q, d, _ = line.split("\t")
        judged.setdefault(q, set()).add(d)
    model, opts = DualEncoder.load(start), EncodeOptions(show_progress=False, precision="fp32")
    ids = list(corpus)
    docs = model.encode_documents([f"{corpus[d]['title']} {corpus[d]['text']}" if corpus[d].get("title")
                                   else corpus[d]["text"] for d in ids], opts)
    for ex in lists:
        scores = docs @ model.encode_queries([queries[ex.qid]], opts)[0]
        want = [ids[j] for j in np.argsort(-scores, kind="stable") if ids[j] not in judged[ex.qid]][:8]
        assert ex.negative_ids == want and len(ex.negatives) == 8
    cfg = json.loads((out / "stages" / "refine" / "run" / "train_config.json").read_text())
    assert cfg["stages"][0]["pairs"] == str(out / "stages" / "refine" / "lists.jsonl")
    assert cfg["stages"][0]["hard_negatives"] == 8 and cfg["model"] == (str(start) if chosen["model"] != "zeroshot"
                                                                         else cfg["model"])
    assert refine["kept"] == (refine["dev_best_refined"]["ndcg@10"] > refine["dev_before"]["ndcg@10"]
                              and refine["chosen"]["model"] == "refine")
    distill = stages["distill"]  # the re-ranker's distillation starts from what refine left chosen
    assert distill["dev_before"] == (refine["chosen"]["dev"])
    final = distill["chosen"] if distill["kept"] else refine["chosen"]
    assert result.report["choices"]["model"] == final["model"]


# ---------------------------------------------------------------- the margin rule


def test_margin_rule_by_hand():
    assert inside_margin(0.81, 0.8, 0.0)  # above the positive: always skipped
    assert not inside_margin(0.79, 0.8, 0.0)
    assert inside_margin(0.79, 0.8, 0.05)  # 0.79 ≥ 0.8 − 0.04
    assert not inside_margin(0.75, 0.8, 0.05)  # 0.75 < 0.76
    assert inside_margin(-0.21, -0.2, 0.1)  # negative scores: 0.1·|−0.2| below −0.2 is −0.22
    assert not inside_margin(-0.23, -0.2, 0.1)


def test_measure_and_choose_margin_by_hand():
    # query a: positives p1 (0.9), p2 (0.85, rank 2); negatives n1 0.88, n2 0.6. Ranks 1..3 mined.
    rankings = {"a": [("p1", 0.9), ("n1", 0.88), ("p2", 0.85), ("n2", 0.6)]}
    positives = {"a": {"p1": 0.9, "p2": 0.85}}
    m = measure_margins(rankings, positives, [0.0, 0.1], (1, 3))
    # anchor p1 (0.9): window p1 (itself), n1 (neg), p2 (fn) ; anchor p2 (0.85): p1 (fn), n1 (neg), p2 (itself)
    assert m["pairs"] == 2 and m["candidates"] == 2
    # margin 0: fn caught: p2≥0.9? no; p1≥0.85? yes → 1/2; negs: 0.88≥0.9 no; 0.88≥0.85 yes → 1/2
    assert m["by_margin"][0.0] == {"false_negatives_skipped": 0.5, "negatives_skipped": 0.5}
    # margin 0.1: thresholds 0.81 (anchor p1) and 0.765 (anchor p2): both fn and both negs inside
    assert m["by_margin"][0.1] == {"false_negatives_skipped": 1.0, "negatives_skipped": 1.0}
    assert choose_margin(m)[0] == 0.0  # J equal (0): the smaller margin
    m = measure_margins({"a": [("p1", 0.9), ("p2", 0.86), ("n1", 0.7)]}, {"a": {"p1": 0.9, "p2": 0.86}},
                        [0.0, 0.05, 0.2], (1, 3))
    # margin 0.05: p2 0.86 ≥ 0.855 caught, p1 caught; n1 0.7 < 0.855, < 0.817 → J = 1 (0: J = 0.5; 0.2: n1 ≥ 0.72? no, ≥ 0.688 yes → 0.5)
    assert choose_margin(m)[0] == 0.05
    assert choose_margin(measure_margins({"a": [("p1", 0.9), ("n1", 0.5)]}, {"a": {"p1": 0.9}}, [0.1], (1, 2)))[0] == 0.0


def test_mining_skips_judged_and_inside_margin():
    ex = TrainExample(query="q", positive="P", qid="a", pid="p")
    ranking = {"a": [("x", 0.95), ("p", 0.9), ("y", 0.86), ("j", 0.8), ("z", 0.5), ("w", 0.4)]}
    out, stats = mine_negatives([ex], ranking, {("a", "p"): 0.9}, {"a": {"p": 1, "j": 1}}, lambda d: d.upper(),
                                margin=0.05, rank_range=(1, 6), per_query=10, seed=0)
    assert sorted(out[0].negative_ids) == ["w", "z"]  # x above, y within 0.855, p and j judged
    assert stats["skipped_by_margin"] == 2 and stats["skipped_judged"] == 2
    assert sorted(out[0].negatives) == ["W", "Z"]


# ---------------------------------------------------------------- choices travel with the model


@pytest.fixture(scope="module")
def fitted_to_03(tiny_bert_dir, tmp_path_factory):
    """A model directory carrying hybrid λ 0.3 (as fit writes it), and a BEIR test split."""
    from twotower.encoders.towers import DualEncoder
    from twotower.retrieval.defaults import RetrievalDefaults, write_defaults

    root = tmp_path_factory.mktemp("travel")
    data = _data(root / "data", test_split=False)
    (data / "qrels" / "test.tsv").write_text((data / "qrels" / "train.tsv").read_text())
    model = root / "model"
    DualEncoder.load(str(tiny_bert_dir)).save(model)
    write_defaults(model, RetrievalDefaults(mode="hybrid", lam=0.3))
    return data, model


def test_eval_uses_the_fitted_lambda(fitted_to_03, tiny_bert_dir):
    from twotower.evaluation.pipeline import EvalConfig, run_eval
    from twotower.retrieval.hybrid import interpolate

    data, model = fitted_to_03
    base = dict(data=data, split="test", top_k=10, show_progress=False, precision="fp32")
    got = run_eval(EvalConfig(model=str(model), **base))
    assert got.retriever == "hybrid" and got.hybrid_lambda == 0.3
    dense = run_eval(EvalConfig(model=str(tiny_bert_dir), retriever="dense", top_k=100, **{
        k: v for k, v in base.items() if k != "top_k"})).run
    sparse = run_eval(EvalConfig(retriever="bm25", top_k=100, **{k: v for k, v in base.items() if k != "top_k"})).run
    ref = interpolate(dense, sparse, 0.3, n_best=100, top_k=10)
    assert got.run.keys() == ref.keys()
    for q in ref:
        assert got.run[q] == pytest.approx(ref[q])
    half = interpolate(dense, sparse, 0.5, n_best=100, top_k=10)
    assert any(got.run[q] != pytest.approx(half[q]) for q in ref)  # 0.3 is not the default's result
    # explicit choices override the model's
    explicit = run_eval(EvalConfig(model=str(model), retriever="dense", **base))
    assert explicit.retriever == "dense" and explicit.hybrid_lambda is None
    lam = run_eval(EvalConfig(model=str(model), hybrid_lambda=0.5, **base))
    for q in half:
        assert lam.run[q] == pytest.approx(half[q])


def test_a_fitted_zscore_fusion_travels_with_the_model(fitted_to_03, tiny_bert_dir, tmp_path):
    """norm "zscore" stored with the model: eval and search fuse with it (equal to interpolate(norm="zscore") on
    the two runs, different from min-max) unless given --fusion-norm."""
    import shutil

    from twotower.evaluation.pipeline import EvalConfig, run_eval
    from twotower.retrieval.defaults import RetrievalDefaults, read_defaults, write_defaults
    from twotower.retrieval.hybrid import interpolate
    from twotower.retrieval.indexing import EncodeConfig, build_index
    from twotower.retrieval.searcher import Searcher

    data, plain = fitted_to_03
    model = tmp_path / "model"
    shutil.copytree(plain, model)
    write_defaults(model, RetrievalDefaults(mode="hybrid", lam=0.3, norm="zscore"))
    assert read_defaults(model).norm == "zscore"
    base = dict(data=data, split="test", show_progress=False, precision="fp32")
    got = run_eval(EvalConfig(model=str(model), top_k=10, **base))
    assert got.to_json()["fusion_norm"] == "zscore"
    dense = run_eval(EvalConfig(model=str(tiny_bert_dir), retriever="dense", top_k=100, **base)).run
    sparse = run_eval(EvalConfig(retriever="bm25", top_k=100, **base)).run
    ref = interpolate(dense, sparse, 0.3, n_best=100, top_k=10, norm="zscore")
    for q in ref:
        assert got.run[q] == pytest.approx(ref[q])
    minmax = run_eval(EvalConfig(model=str(model), top_k=10, fusion_norm="minmax", **base))
    assert any(minmax.run[q] != pytest.approx(ref[q]) for q in ref)
    build_index(data, tmp_path / "index", model=str(model), cfg=EncodeConfig(show_progress=False))
    searcher = Searcher(tmp_path / "index")
    asked = {"q1": "what is dog", "q2": "green tea"}
    assert searcher.run(asked, 5) == searcher.run(asked, 5, norm="zscore") != searcher.run(asked, 5, norm="minmax")
    with pytest.raises(TwoTowerError, match="norm normalises the two sides of mode=.hybrid."):
        run_eval(EvalConfig(model=str(model), retriever="dense", fusion_norm="zscore", top_k=10, **base))


def test_select_scores_both_normalisations_and_keeps_the_best():
    """choose_retriever's best row = the maximum over independently fused and scored candidates."""
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.hybrid import interpolate
    from twotower.training.fit.select import choose_retriever

    qrels = {"q1": {"r": 1}, "q2": {"s": 1}}
    dense = {"q1": {"x": 1.0, "r": 0.9, "y": 0.2, "z": 0.1}, "q2": {"s": 0.5, "t": 0.45, "u": 0.44, "v": 0.0}}
    sparse = {"q1": {"r": 3.0, "x": 2.9, "w": 0.1, "v": 0.0}, "q2": {"t": 9.0, "s": 1.0, "u": 0.9, "w": 0.8}}
    best, rows = choose_retriever({"m": dense}, sparse, qrels, lambdas=[0.3, 0.5, 0.7], n_best=10, metric="ndcg@10")
    assert {r["norm"] for r in rows if r["mode"] == "hybrid"} == {"minmax", "zscore"}
    for row in rows:
        if row["mode"] == "hybrid":
            run = interpolate(dense, sparse, row["lambda"], n_best=10, top_k=10, norm=row["norm"])
            assert row["dev"]["ndcg@10"] == pytest.approx(evaluate(qrels, run, ("ndcg@10",))["ndcg@10"], abs=1e-4)
    assert best["dev"]["ndcg@10"] == max(r["dev"]["ndcg@10"] for r in rows)


def test_index_and_search_use_the_fitted_mode(fitted_to_03, tmp_path):
    from twotower.retrieval.indexing import EncodeConfig, build_index
    from twotower.retrieval.searcher import Searcher

    data, model = fitted_to_03
    store = build_index(data, tmp_path / "index", model=str(model), cfg=EncodeConfig(show_progress=False))
    assert store.manifest["bm25"]  # built without --bm25: the fitted hybrid needs it
    searcher = Searcher(tmp_path / "index")
    queries = {"q1": "what is dog", "q2": "green tea"}
    assert searcher.resolve(None, None) == ("hybrid", 0.3)
    default = searcher.run(queries, 5)
    assert default == searcher.run(queries, 5, mode="hybrid", lam=0.3)
    assert default != searcher.run(queries, 5, mode="hybrid", lam=0.9)
    assert searcher.run(queries, 5, mode="dense") == Searcher(tmp_path / "index").run(queries, 5, mode="dense")


def test_serve_uses_the_fitted_mode(fitted_to_03, tmp_path):
    from fastapi.testclient import TestClient

    from twotower.retrieval.indexing import EncodeConfig, build_index
    from twotower.retrieval.searcher import Searcher
    from twotower.serve.app import create_app

    data, model = fitted_to_03
    build_index(data, tmp_path / "index", model=str(model), cfg=EncodeConfig(show_progress=False))
    client = TestClient(create_app(tmp_path / "index", query_runtime="torch"))
    got = client.post("/search", json={"query": "what is dog", "k": 5}).json()
    want = Searcher(tmp_path / "index").run({"q": "what is dog"}, 5, mode="hybrid", lam=0.3)["q"]
    assert [h["id"] for h in got["hits"]] == sorted(want, key=lambda d: -want[d])
    dense = client.post("/search", json={"query": "what is dog", "k": 5, "mode": "dense"}).json()
    assert [h["score"] for h in dense["hits"]] != [h["score"] for h in got["hits"]]


# ---------------------------------------------------------------- resume, no labels, CLI


def test_resume_after_a_failed_stage_recomputes_nothing_done(tiny_bert_dir, tmp_path, monkeypatch):
    from twotower.training.fit import run as fit_run

    data = _data(tmp_path / "data")
    out = tmp_path / "out"
    recipe = _recipe(tiny_bert_dir)

    def boom(self):
        raise RuntimeError("killed during mining")

    with monkeypatch.context() as m:
        m.setattr(fit_run._Fit, "stage_mine", boom)
        with pytest.raises(RuntimeError):
            run_fit(data, out, recipe, QUIET)
    done = {s: (out / "stages" / s / "done.json").stat().st_mtime_ns for s in ("split", "zeroshot", "finetune", "margin")}
    assert not (out / "stages" / "mine" / "done.json").exists()
    vectors = (out / "stages" / "finetune" / "doc_vectors.npy").stat().st_mtime_ns
    calls = []
    original = fit_run._Fit.train

    def counting(self, stage, *a, **kw):
        calls.append(stage)
        return original(self, stage, *a, **kw)

    monkeypatch.setattr(fit_run._Fit, "train", counting)
    result = run_fit(data, out, recipe, QUIET)
    assert result.computed == ["mine", "retrain", "select", "refine"]
    assert calls == ["retrain", "refine"]  # fine-tuning was not redone
    assert {s: (out / "stages" / s / "done.json").stat().st_mtime_ns for s in done} == done
    assert (out / "stages" / "finetune" / "doc_vectors.npy").stat().st_mtime_ns == vectors
    assert run_fit(data, out, recipe, QUIET).computed == []  # all done: nothing recomputed
    # a re-ranker can be added to a finished fit (only its stage runs) and dropped again
    with_ce = run_fit(data, out, _recipe(tiny_bert_dir, reranker=True), QUIET)
    assert with_ce.computed == ["distill", "rerank"]
    from twotower.retrieval.defaults import RetrievalDefaults, read_defaults, write_defaults

    fitted = read_defaults(out / "model")  # as if it had improved dev: kept in the model
    (out / "model" / "reranker").mkdir(exist_ok=True)
    write_defaults(out / "model", RetrievalDefaults(mode=fitted.mode, lam=fitted.lam, rerank="reranker"))
    assert run_fit(data, out, recipe, QUIET).computed == []
    assert read_defaults(out / "model").rerank is None and not (out / "model" / "reranker").exists()
    assert run_fit(data, out, _recipe(tiny_bert_dir, reranker=True, rerank_depth=5), QUIET).computed == [
        "distill", "rerank"]
    with pytest.raises(TwoTowerError, match="different recipe.*lr"):
        run_fit(data, out, _recipe(tiny_bert_dir, lr=3e-5), QUIET)  # not the default lr


def _weights(folder: Path) -> bytes:
    return (folder / "model.safetensors").read_bytes()


def test_refine_reruns_alone_and_off_puts_the_select_stages_encoder_back(tiny_bert_dir, tmp_path, monkeypatch):
    """The third round comes after the select stage: a rerun with other refine settings redoes it and the stages
    built on it (the cross-encoder kept, not trained again); one with refine off after it was kept writes the select
    stage's encoder and retrieval back into the model."""
    from twotower.retrieval.defaults import read_defaults
    from twotower.training.fit import refine as refine_mod

    data, out = _data(tmp_path / "data"), tmp_path / "out"
    first = run_fit(data, out, _recipe(tiny_bert_dir, refine_epochs=1, reranker=True), QUIET)
    assert first.computed[-4:] == ["select", "refine", "distill", "rerank"]
    ce = out / "stages" / "rerank" / "reranker" / "config.json"
    trained = ce.stat().st_mtime_ns
    original = refine_mod.keep_if_better

    def kept_anyway(fit, stage, before, dense, path):  # as if the refined encoder had raised dev
        best, kept = original(fit, stage, before, dense, path)
        if not kept:
            best = {**before, "model": stage}
            fit.write_model(stage, read_defaults(fit.out / "model"), path=path)
        return best, True

    monkeypatch.setattr(refine_mod, "keep_if_better", kept_anyway)
    again = run_fit(data, out, _recipe(tiny_bert_dir, reranker=True), QUIET)  # refine_epochs 2: refine again
    assert again.computed == ["refine", "distill", "rerank"] and ce.stat().st_mtime_ns == trained  # not retrained
    assert again.report["stages"]["distill"]["dev_before"] == again.report["stages"]["refine"]["chosen"]["dev"]
    again = run_fit(data, out, _recipe(tiny_bert_dir), QUIET)  # the re-ranker dropped: nothing to run
    assert again.computed == [] and again.report["choices"]["model"] == "refine"
    refined = out / again.report["stages"]["refine"]["model"]
    assert _weights(out / "model") == _weights(refined) != _weights(Path(tiny_bert_dir))
    monkeypatch.setattr(refine_mod, "keep_if_better", original)
    off = run_fit(data, out, _recipe(tiny_bert_dir, refine=False), QUIET)
    chosen = off.report["stages"]["select"]["chosen"]
    assert off.computed == [] and "refine" not in off.report["stages"] and not (out / "stages" / "refine").exists()
    assert off.report["choices"]["model"] == chosen["model"]
    start = Path(tiny_bert_dir) if chosen["model"] == "zeroshot" else out / off.report["stages"][chosen["model"]]["model"]
    assert _weights(out / "model") == _weights(start) and ce.stat().st_mtime_ns == trained
    assert (read_defaults(out / "model").mode, read_defaults(out / "model").lam) == (chosen["mode"], chosen["lambda"])


def test_no_train_labels_gives_zero_shot_hybrid(tiny_bert_dir, tmp_path):
    from twotower.retrieval.defaults import read_defaults
    from twotower.retrieval.searcher import DEFAULT_LAMBDA
    from twotower.training.fit.run import ZERO_SHOT_LAMBDA

    assert ZERO_SHOT_LAMBDA == DEFAULT_LAMBDA
    data = write_beir(tmp_path / "data", [{"_id": "d1", "text": "cats purr"}], [{"_id": "q1", "text": "cat"}],
                      [("q1", "d1", 1)], split="test")
    result = run_fit(data, tmp_path / "out", _recipe(tiny_bert_dir), QUIET)
    assert result.message and "no training labels" in result.message and "hybrid" in result.message
    assert "languages are not known" in result.message  # a model directory of no registered model
    fitted = read_defaults(result.model)
    assert (fitted.mode, fitted.lam) == ("hybrid", DEFAULT_LAMBDA)
    assert json.loads((tmp_path / "out" / "fit.json").read_text())["choices"]["note"] == result.message


def test_cli_fit_and_eval(tiny_bert_dir, tmp_path, caplog):
    import logging

    from typer.testing import CliRunner

    from twotower.cli import app

    data = _data(tmp_path / "data", test_split=False)
    (data / "qrels" / "test.tsv").write_text((data / "qrels" / "train.tsv").read_text())
    runner = CliRunner()
    out = tmp_path / "fit"
    args = ["fit", "--data", str(data), "--out", str(out), "--model", str(tiny_bert_dir), "--min-dev", "4",
            "--batch-size", "4", "--epochs", "1", "--no-mine", "--no-progress", "--precision", "fp32"]
    with caplog.at_level(logging.INFO, logger="twotower.encoders.runtimes"):
        res = runner.invoke(app, [*args, "--runtime", "onnx"])
    assert res.exit_code == 0, res.output
    assert "model saved to" in res.output
    assert "encoding with onnx fp32 (asked for)" in caplog.text  # --runtime reached the corpus encoding
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "already done" in res.output
    mode = json.loads((out / "model" / "twotower.json").read_text())["retrieval"]["mode"]
    res = runner.invoke(app, ["eval", "--data", str(data), "--model", str(out / "model"), "--no-progress",
                              "--out", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "r.json").read_text())["retriever"] == mode
    bad = runner.invoke(app, ["fit", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "o2")])
    assert bad.exit_code == 2 and "corpus.jsonl" in bad.output
    bad = runner.invoke(app, ["fit", "--data", str(data), "--out", str(tmp_path / "o3"), "--margins", "0,x"])
    assert bad.exit_code == 2 and "--margins" in bad.output
    bad = runner.invoke(app, ["fit", "--data", str(data), "--out", str(tmp_path / "o4"), "--margins", "1.5"])
    assert bad.exit_code == 2 and "margins" in bad.output and not (tmp_path / "o4").exists()
    bad = runner.invoke(app, ["fit", "--data", str(data), "--out", str(tmp_path / "o5"), "--runtime", "tvm"])
    assert bad.exit_code == 2 and "runtime 'tvm'" in bad.output and not (tmp_path / "o5").exists()


ZH_DOCS = ["猫喜欢在阳光下睡觉", "狗在公园里追球", "茶叶来自中国南方的山区", "河水流向东边的大海", "鸟在树上唱歌",
           "苹果是一种红色的水果", "火车穿过长长的隧道", "月亮在夜空中很明亮"]


def test_fit_finds_the_bm25_language_and_it_travels_with_the_model(tiny_bert_dir, tmp_path):
    """No labels, Chinese documents: fit detects zh (written without spaces: English analysis would make each
    sentence one token), stores it, and eval / index build use it unless told another language."""
    from twotower.evaluation.pipeline import EvalConfig, run_eval
    from twotower.retrieval.defaults import read_defaults
    from twotower.retrieval.indexing import EncodeConfig, build_index
    from twotower.retrieval.store import IndexSpec

    docs = [{"_id": f"d{i}", "text": t} for i, t in enumerate(ZH_DOCS)]
    queries = [{"_id": f"q{i}", "text": t[1:5]} for i, t in enumerate(ZH_DOCS)]
    data = write_beir(tmp_path / "data", docs, queries, [(f"q{i}", f"d{i}", 1) for i in range(len(ZH_DOCS))],
                      split="test")
    result = run_fit(data, tmp_path / "out", _recipe(tiny_bert_dir), QUIET)
    assert "BM25 language zh" in result.message
    assert read_defaults(result.model).language == "zh"
    assert json.loads((tmp_path / "out" / "fit.json").read_text())["choices"]["language"] == "zh"
    base = dict(data=data, split="test", top_k=8, show_progress=False, precision="fp32")
    fitted = run_eval(EvalConfig(model=str(result.model), **base))
    as_zh = run_eval(EvalConfig(model=str(result.model), language="zh", **base))
    as_en = run_eval(EvalConfig(model=str(result.model), language="en", **base))
    assert fitted.run == as_zh.run and fitted.run != as_en.run
    assert fitted.metrics["ndcg@10"] > as_en.metrics["ndcg@10"]
    idx = build_index(data, tmp_path / "idx", model=str(result.model), cfg=EncodeConfig(show_progress=False))
    assert idx.manifest["bm25"]["language"] == "zh"
    en = build_index(data, tmp_path / "idx-en", model=str(result.model), spec=IndexSpec(bm25=True),
                     cfg=EncodeConfig(show_progress=False))
    assert en.manifest["bm25"]["language"] == "en"  # a spec given with its language keeps it
    # a recipe with an unknown language stops before any work
    with pytest.raises(TwoTowerError, match="unknown BM25 language 'xx'"):
        run_fit(data, tmp_path / "out2", _recipe(tiny_bert_dir, language="xx"), QUIET)
    assert not (tmp_path / "out2").exists()


def test_a_bad_language_in_twotower_json_is_named(tmp_path):
    from twotower.errors import ModelError
    from twotower.retrieval.defaults import read_defaults

    (tmp_path / "twotower.json").write_text(json.dumps({"retrieval": {"mode": "hybrid", "lambda": 0.5,
                                                                       "language": "klingon"}}))
    with pytest.raises(ModelError, match="retrieval language 'klingon'"):
        read_defaults(tmp_path)


@pytest.mark.parametrize("docs, queries, encoder, expected", [
    ("en", "en", ("en",), "hybrid"),
    ("zh", "zh", ("en",), "bm25"),  # XQuAD-R zh, all-MiniLM-L6-v2: hybrid 0.757 < BM25 0.817
    ("de", "de", ("en",), "bm25"),
    ("en", "de", ("en",), "bm25"),
    ("multi", "multi", ("en",), "hybrid"),  # languages not told apart: no basis to drop either side
    ("zh", "zh", ("multi",), "hybrid"),  # at λ 0.6: XQuAD-R de, e5: 0.8561 vs dense 0.8477 (0.5: 0.8462)
    ("en", "multi", ("multi",), "dense"),  # XQuAD-R to-en, multilingual-e5-small: hybrid 0.595 < dense 0.730 mAP
    ("multi", "multi", ("multi",), "dense"),  # XQuAD-R pool: hybrid 0.187 < dense 0.299 mAP
    ("en", "zh", ("multi",), "dense"),
    ("zh", "zh", None, "hybrid"),  # an encoder of unknown languages
    ("en", "zh", None, "hybrid"),
])
def test_label_free_rule(docs, queries, encoder, expected):
    from twotower.training.fit.label_free import label_free_retriever

    from twotower.training.fit.label_free import MULTILINGUAL_LAMBDA

    mode, lam, why = label_free_retriever(docs, queries, encoder, 0.5)
    assert mode == expected and why
    want = (MULTILINGUAL_LAMBDA if encoder == ("multi",) else 0.5) if mode == "hybrid" else None
    assert lam == want and MULTILINGUAL_LAMBDA == 0.6


def test_model_languages_of_registered_models(tmp_path):
    from twotower.encoders.registry import MARKER, model_languages

    assert model_languages(None) == model_languages("all-MiniLM-L6-v2") == model_languages("mpnet-base") == ("en",)
    assert model_languages("multilingual-e5-small") == ("multi",)
    (tmp_path / MARKER).write_text(json.dumps({"name": "multilingual-e5-small"}))  # an install directory
    assert model_languages(tmp_path) == ("multi",)
    assert model_languages(tmp_path / "elsewhere") is None


def test_no_labels_english_only_encoder_on_chinese_gives_bm25(tmp_path):
    """The default encoder (English-only) without labels on Chinese data: fit stores BM25 alone in zh, and eval of
    the fitted model gives exactly ``--retriever bm25 --language zh`` (the hybrid would mix in the encoder)."""
    from twotower.evaluation.pipeline import EvalConfig, run_eval
    from twotower.retrieval.defaults import read_defaults

    docs = [{"_id": f"d{i}", "text": t} for i, t in enumerate(ZH_DOCS)]
    queries = [{"_id": f"q{i}", "text": t[1:5]} for i, t in enumerate(ZH_DOCS)]
    data = write_beir(tmp_path / "data", docs, queries, [(f"q{i}", f"d{i}", 1) for i in range(len(ZH_DOCS))],
                      split="test")
    result = run_fit(data, tmp_path / "out", FitRecipe(), QUIET)
    assert "BM25 alone" in result.message and "multilingual-e5-small" in result.message
    fitted = read_defaults(result.model)
    assert (fitted.mode, fitted.language) == ("bm25", "zh")
    choices = json.loads((tmp_path / "out" / "fit.json").read_text())["choices"]
    assert (choices["mode"], choices["query_language"]) == ("bm25", "zh")
    base = dict(data=data, split="test", top_k=8, show_progress=False)
    got = run_eval(EvalConfig(model=str(result.model), **base))
    bm25 = run_eval(EvalConfig(retriever="bm25", language="zh", **base))
    assert got.retriever == "bm25" and got.run == bm25.run and got.metrics == bm25.metrics
    hybrid = run_eval(EvalConfig(model=str(result.model), retriever="hybrid", precision="fp32", **base))
    assert hybrid.run != bm25.run  # the hybrid would have used the encoder
    from twotower.retrieval.indexing import EncodeConfig, build_index
    from twotower.retrieval.searcher import Searcher

    build_index(data, tmp_path / "index", model=str(result.model), cfg=EncodeConfig(show_progress=False))
    searcher = Searcher(tmp_path / "index")
    assert searcher.resolve(None, None)[0] == "bm25" and searcher.store.manifest["bm25"]["language"] == "zh"
    asked = {q: t for q, t in ((x["_id"], x["text"]) for x in queries)}
    assert searcher.run(asked, 5) == searcher.run(asked, 5, mode="bm25") != searcher.run(asked, 5, mode="dense")


def test_cache_chunk_reaches_both_training_rounds(tiny_bert_dir, tmp_path, monkeypatch):
    """--cache-chunk is a run option: both rounds train with GradCache in chunks of that size (the retraining with
    its mined negatives as a third group), and it is checked before any work."""
    import twotower as tt
    from twotower.training import trainer as trainer_mod

    seen = []
    original = trainer_mod.cached_backward

    def spy(groups, loss_of, chunk, **kw):
        seen.append((len(groups), chunk))
        return original(groups, loss_of, chunk, **kw)

    monkeypatch.setattr(trainer_mod, "cached_backward", spy)
    data, out = _data(tmp_path / "data"), tmp_path / "out"
    run_fit(data, out, _recipe(tiny_bert_dir), FitOptions(show_progress=False, precision="fp32", cache_chunk=3))
    configs = {s: json.loads((out / "stages" / s / "run" / "train_config.json").read_text())["stages"][0]
               for s in ("finetune", "retrain")}
    assert {s: c["cache_chunk"] for s, c in configs.items()} == {"finetune": 3, "retrain": 3}
    assert {2, 3} == {g for g, _ in seen} and {c for _, c in seen} == {3}  # queries + positives (+ negatives)
    with pytest.raises(TwoTowerError, match="cache_chunk 0"):
        tt.fit(data, tmp_path / "other", model=str(tiny_bert_dir), cache_chunk=0)
    assert not (tmp_path / "other").exists()


def test_a_round_that_finished_training_is_not_trained_again(tiny_bert_dir, tmp_path, monkeypatch):
    """Killed in the retraining stage's dev encoding, after its model was written: the rerun keeps that model
    (trains nothing) and finishes the stage; a model made with other settings than the fit's is refused."""
    from twotower.training import trainer as trainer_mod
    from twotower.training.fit import run as fit_run

    data, out, recipe = _data(tmp_path / "data"), tmp_path / "out", _recipe(tiny_bert_dir)
    original_dev = fit_run._Fit.dense_dev

    def killed_in_retrain(self, stage, model):
        if stage == "retrain":
            raise RuntimeError("killed while encoding dev")
        return original_dev(self, stage, model)

    with monkeypatch.context() as m:
        m.setattr(fit_run._Fit, "dense_dev", killed_in_retrain)
        with pytest.raises(RuntimeError):
            run_fit(data, out, recipe, QUIET)
    run = out / "stages" / "retrain" / "run"
    weights = {p: p.stat().st_mtime_ns for p in (run / "model").rglob("*") if p.is_file()}
    assert weights and not (out / "stages" / "retrain" / "done.json").exists()
    trained = []
    original_train = trainer_mod.Trainer.train
    monkeypatch.setattr(trainer_mod.Trainer, "train", lambda self, **kw: trained.append(1) or original_train(self, **kw))
    config = json.loads((run / "train_config.json").read_text())
    (run / "train_config.json").write_text(json.dumps({**config, "seed": 7}))
    with pytest.raises(TwoTowerError, match="retrain/run.*seed: 7 -> 42"):
        run_fit(data, out, recipe, QUIET)
    (run / "train_config.json").write_text(json.dumps(config))
    result = run_fit(data, out, recipe, QUIET)
    assert result.computed == ["retrain", "select", "refine"] and trained == [1]  # only refine's round
    assert {p: p.stat().st_mtime_ns for p in weights} == weights
    done = json.loads((out / "stages" / "retrain" / "done.json").read_text())
    assert done["model"] == "stages/retrain/run/model" and 0 <= done["dev_dense"]["ndcg@10"] <= 1
