"""twotower fit with few labels (choices by cross-validation, fit/cv.py) and its cross-encoder teacher
(fit/distill.py): each checked against an independent recomputation from the files fit leaves, so that dropping
the folds or the teacher's scores fails a test."""

from __future__ import annotations

import json
import random
import statistics

import numpy as np
import pytest
from conftest import copy_without_dropout, write_beir

from twotower.data.pairs import TrainExample, load_pairs
from twotower.evaluation.metrics import evaluate
from twotower.training.fit import FitOptions, FitRecipe, cv, run_fit

WORDS = ["cat", "dog", "tea", "rust", "python", "cell", "sun", "moon", "river", "stone", "tree", "bird", "fish", "apple", "music", "train"]
QUIET = FitOptions(show_progress=False, precision="fp32")


def _data(root, fillers: int = 0):
    corpus = [{"_id": f"d{i}", "title": w, "text": f"{w} is about {w} and {WORDS[(i + 3) % len(WORDS)]}"}
              for i, w in enumerate(WORDS)]
    corpus += [{"_id": f"f{i}", "text": f"filler number {i} of the corpus"} for i in range(fillers)]
    queries = [{"_id": f"q{i}", "text": f"what is {w}"} for i, w in enumerate(WORDS)]
    qrels = [(f"q{i}", f"d{i}", 1) for i in range(len(WORDS))] + [("q0", "d1", 1), ("q2", "d3", 1)]
    data = write_beir(root, corpus, queries, qrels, split="train")
    (data / "qrels" / "test.tsv").write_text("never read\n")
    return data


def _recipe(model, **kw) -> FitRecipe:
    base = dict(model=str(model), batch_size=4, epochs=1, cv_below=100, cv_folds=3, lambdas=(0.0, 0.5, 1.0))
    if kw.get("reranker"):
        base.update(reranker_epochs=1, distill_candidates=4, distill_epochs=1)
    return FitRecipe(**{**base, **kw})


# ---------------------------------------------------------------- pure parts, by hand


def test_folds_partition_the_queries_seeded():
    ids = [f"q{i}" for i in range(10)]
    folds = cv.make_folds(ids, 3, seed=1)
    assert sorted(q for f in folds for q in f) == sorted(ids)
    assert sorted(len(f) for f in folds) == [3, 3, 4]
    assert folds == cv.make_folds(list(reversed(ids)), 3, seed=1) != cv.make_folds(ids, 3, seed=2)
    assert cv.use_cv(225, 300, 3) and not cv.use_cv(809, 300, 3) and not cv.use_cv(5, 300, 3)
    assert not cv.use_cv(50, 0, 3)  # cv_below 0: never


def _row(model, folds, mode="dense"):
    return {"model": model, "mode": mode, "lambda": None, "norm": None, "folds": folds,
            "mean": round(statistics.fmean(folds), 4), "spread": 0.0, "_order": 0 if model == "zeroshot" else 1}


def test_decide_departs_from_what_fit_does_without_labels():
    """The bar is measured from the retrieval fit would use without labels: for a language the encoder does not know
    that is BM25 alone, and a hybrid 0.01 over BM25 (though 0.07 over λ 0.5) is not a departure that pays."""
    bm25 = {**_row("zeroshot", [0.80, 0.81, 0.82], mode="bm25")}
    half = {**_row("zeroshot", [0.74, 0.74, 0.75], mode="hybrid"), "lambda": 0.5}
    low = {**_row("zeroshot", [0.81, 0.82, 0.83], mode="hybrid"), "lambda": 0.1}
    chosen, why = cv.decide([bm25, half, low], default=("bm25", None))
    assert chosen is bm25 and "default bm25" in why["zero_shot_setting"] and "+0.0100" in why["zero_shot_setting"]
    chosen, why = cv.decide([bm25, half, low])  # from the hybrid at λ 0.5 the same λ 0.1 pays
    assert chosen is low and "beats the default hybrid λ 0.5" in why["zero_shot_setting"]


def test_cv_measures_departures_from_the_label_free_choice(tiny_bert_dir, tmp_path, monkeypatch):
    """cv's default is label_free_choice's (here forced to BM25 alone, as for a language the encoder does not
    know): the recorded reason says so, and a zero-shot choice other than BM25 beat it by the bar."""
    from twotower.training.fit import label_free

    monkeypatch.setattr(label_free, "label_free_choice", lambda *a: ("bm25", None, "forced: BM25 alone", "es"))
    result = run_fit(_data(tmp_path / "data"), tmp_path / "out", _recipe(tiny_bert_dir), QUIET)
    stage = result.report["stages"]["cv"]
    assert stage["why"]["default"] == "forced: BM25 alone"
    rows = [{**r, "_order": 0 if r["model"] == "zeroshot" else 1} for r in stage["candidates"]]
    bm25 = next(r for r in rows if r["mode"] == "bm25")
    zs = stage["why"]["best_zero_shot"]
    if zs["mode"] != "bm25":
        assert "beats the default bm25" in stage["why"]["zero_shot_setting"]
        assert cv._beats(next(r for r in rows if all(r[k] == zs[k] for k in ("model", "mode", "lambda", "norm"))),
                         bm25)[0]
    assert cv.decide(rows, default=("bm25", None))[0]["mode"] == stage["chosen"]["mode"]


def test_decide_keeps_zero_shot_unless_the_gain_beats_its_spread():
    zs = _row("zeroshot", [0.50, 0.40, 0.60])
    # gains 0.10, -0.05, 0.07: mean 0.04 < stdev 0.079 → zero-shot, though the fine-tuned mean is higher
    noisy = _row("finetune", [0.60, 0.35, 0.67])
    chosen, why = cv.decide([zs, noisy])
    assert chosen is zs and why["mean_gain"] == pytest.approx(0.04) and why["gain_spread"] == pytest.approx(0.0794, abs=1e-4)
    assert "kept" in why["rule"]
    steady = _row("finetune", [0.55, 0.46, 0.64])  # gains 0.05, 0.06, 0.04: mean 0.05 > stdev 0.01
    chosen, why = cv.decide([zs, steady])
    assert chosen is steady and why["gain_by_fold"] == [0.05, 0.06, 0.04]
    assert cv.decide([zs, _row("finetune", [0.49, 0.39, 0.59])])[0] is zs  # a steady loss: never below zero-shot


def test_pooled_run_is_brute_force_over_each_pool():
    rng = np.random.default_rng(0)
    vecs = {f"d{i}": rng.normal(size=4).astype(np.float32) for i in range(12)}
    q = rng.normal(size=(2, 4)).astype(np.float32)
    pools = {"a": {"d1", "d3", "d5", "d7"}, "b": {"d0", "d11"}}
    run = cv.pooled_run(q, ["a", "b"], pools, vecs, depth=3)
    for i, name in enumerate(["a", "b"]):
        want = sorted(((float(vecs[d] @ q[i]), d) for d in pools[name]), reverse=True)[:3]
        assert run[name] == pytest.approx({d: s for s, d in want})
    assert cv.candidate_pool([{"a": {"x": 3, "y": 2, "z": 1}}, {"a": {"w": 5, "z": 9}}], "a", 2) == {"x", "y", "w", "z"}


def test_candidates_score_each_fold_independently():
    qrels = {"a": {"r": 1}, "b": {"s": 1}, "c": {"t": 1}, "d": {"u": 1}}
    dense = {"a": {"r": 0.9, "x": 0.1}, "b": {"x": 0.9, "s": 0.1}, "c": {"t": 0.5}, "d": {"x": 0.5, "u": 0.4}}
    sparse = {"a": {"x": 2.0, "r": 1.0}, "b": {"s": 3.0}, "c": {"t": 1.0}, "d": {"u": 4.0}}
    folds = [["a", "b"], ["c", "d"]]
    rows = cv.candidates({"zeroshot": dense}, sparse, qrels, folds, lambdas=[0.5], n_best=10, metric="ndcg@10")
    from twotower.training.fit.select import fused

    for row in rows:
        run = fused(row["mode"], dense, sparse, row["lambda"], 10, row["norm"])
        want = [evaluate({q: qrels[q] for q in f}, {q: run[q] for q in f}, ("ndcg@10",))["ndcg@10"] for f in folds]
        assert row["folds"] == pytest.approx(want, abs=1e-4)
        assert row["mean"] == pytest.approx(statistics.fmean(want), abs=1e-4)


# ---------------------------------------------------------------- a fit with few labels


@pytest.fixture(scope="module")
def cv_fit(tiny_bert_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("fitcv")
    data = _data(root / "data", fillers=300)  # each fold's pool (n_best 10) well under half the corpus
    return data, run_fit(data, root / "out", _recipe(tiny_bert_dir, n_best=10), QUIET)


def test_cv_fit_folds_are_out_of_fold_and_recorded(cv_fit):
    data, result = cv_fit
    out, report = result.out, result.report
    split = report["stages"]["split"]
    assert split["dev_queries"] == 0 and split["train_queries"] == 16 and len(split["folds"]) == 3
    assert "margin" not in report["stages"] and "retrain" not in report["stages"]
    stage = report["stages"]["cv"]
    qrels = {}
    for line in (data / "qrels" / "train.tsv").read_text().splitlines()[1:]:
        q, d, s = line.split("\t")
        qrels.setdefault(q, {})[d] = int(s)
    oof = {}
    for i, held in enumerate(split["folds"]):
        folder = out / "stages" / "cv" / f"fold{i}"
        trained = {p.qid for p in load_pairs(folder / "pairs.jsonl")}
        assert trained and trained.isdisjoint(held) and trained | set(held) == set(qrels)  # never its own queries
        cfg = json.loads((folder / "run" / "train_config.json").read_text())
        assert cfg["stages"][0]["pairs"] == str(folder / "pairs.jsonl")  # what the trainer read
        run = json.loads((folder / "dev_run.json").read_text())
        assert set(run) == set(held)
        oof.update(run)
        assert stage["folds"][i]["held_out"] == held
        assert stage["folds"][i]["pool_documents"] < 316 // 2  # the pooled ranking, not the whole corpus
    # the fine-tuned dense row's fold scores: recomputed here from the saved out-of-fold runs
    row = next(r for r in stage["candidates"] if r["model"] == "finetune" and r["mode"] == "dense")
    want = [evaluate({q: qrels[q] for q in f}, {q: oof[q] for q in f}, ("ndcg@10",))["ndcg@10"] for f in split["folds"]]
    assert row["folds"] == pytest.approx(want, abs=1e-4)
    assert len(stage["candidates"]) == 2 * (1 + 2 * 3 + 1) + 1  # 2 models × (dense, 3 λ × 2 norms, rrf), BM25
    assert [r["model"] for r in stage["candidates"] if r["mode"] == "bm25"] == ["zeroshot"]
    # an encoder of unknown languages (this tiny one): without labels fit would use the hybrid at λ 0.5, the default
    assert "default λ 0.5" in stage["why"]["default"]
    # the choice is decide() over the recorded rows, and it is what the model carries
    rows = [{**r, "_order": 0 if r["model"] == "zeroshot" else 1} for r in stage["candidates"]]
    chosen, _ = cv.decide(rows)
    assert {k: chosen[k] for k in ("model", "mode", "lambda", "norm")} == {
        k: stage["chosen"][k] for k in ("model", "mode", "lambda", "norm")}
    config = json.loads((result.model / "twotower.json").read_text())
    assert config["retrieval"]["mode"] == report["choices"]["mode"] == chosen["mode"]
    assert report["choices"]["dev"]["folds"] == chosen["folds"]
    assert "finetune" in report["stages"] or chosen["model"] == "zeroshot"


def test_cv_choosing_the_fine_tune_trains_it_on_every_judged_query(tiny_bert_dir, tmp_path, monkeypatch):
    """When cv picks the fine-tuned model, the final one trains on all judged queries (no dev held out)."""
    def fitted_wins(rows, zero_shot="zeroshot", default=None):
        best = max((r for r in rows if r["model"] != zero_shot), key=lambda r: r["mean"])
        return best, {"rule": "forced by the test"}

    monkeypatch.setattr(cv, "decide", fitted_wins)
    data = _data(tmp_path / "data")
    result = run_fit(data, tmp_path / "out", _recipe(tiny_bert_dir), QUIET)
    stages = result.report["stages"]
    assert stages["select"]["chosen"]["model"] == "finetune"
    assert {p.qid for p in load_pairs(result.out / "stages" / "split" / "train_pairs.jsonl")} == {
        f"q{i}" for i in range(16)}
    cfg = json.loads((result.out / "stages" / "finetune" / "run" / "train_config.json").read_text())
    assert cfg["stages"][0]["pairs"] == str(result.out / "stages" / "split" / "train_pairs.jsonl")
    from twotower.encoders.towers import DualEncoder

    got = DualEncoder.load(result.model).encode_queries(["what is cat"])
    want = DualEncoder.load(result.out / "stages" / "finetune" / "run" / "model").encode_queries(["what is cat"])
    assert np.allclose(got, want)


def test_held_out_gain_by_hand():
    """The re-ranker's bar on one fold: mean per-query gain at least MIN_GAIN and above MIN_T standard errors,
    from per-query NDCG@10 computed here by hand (one relevant document: 1/log2(1 + rank))."""
    qrels = {f"q{i}": {"a": 1} for i in range(4)}
    base = {q: {"b": 2.0, "a": 1.0} for q in qrels}  # the relevant document second: NDCG 1/log2(3)
    up = {q: {"a": 2.0, "b": 1.0} for q in qrels}  # first on every query: 1.0
    pays, why = cv.held_out_gain(qrels, up, base, "ndcg@10")
    assert pays and "+0.3691" in why and "inf standard errors" in why  # 1 - 1/log2(3), the same on every query
    mixed = {**base, "q0": up["q0"], "q1": up["q1"]}  # two of four queries move up
    gains = [1 - 1 / np.log2(3)] * 2 + [0.0, 0.0]
    t = np.mean(gains) / (np.std(gains, ddof=1) / 2)
    pays, why = cv.held_out_gain(qrels, mixed, base, "ndcg@10")
    assert not pays and f"{np.mean(gains):+.4f}" in why and f"{t:.1f} standard errors" in why and "left out" in why
    assert t < cv.MIN_T < float("inf")  # a gain of 0.18 on half the queries is no proof on four
    pays, _ = cv.held_out_gain(qrels, base, base, "ndcg@10")
    assert not pays


def test_cv_with_the_reranker_weighs_it_on_the_first_fold(tiny_bert_dir, tmp_path, monkeypatch):
    """The re-ranker is weighed on the first fold and kept only where cross-validation's bar says so
    (cv.held_out_gain): forced to pass, the model holds it; forced to fail, it does not, whatever dev says."""
    data = _data(tmp_path / "data")
    seen = []

    def bar(qrels, run, base, metric, pays):
        seen.append(sorted(qrels))
        return pays, "forced"

    for pays in (True, False):
        monkeypatch.setattr(cv, "held_out_gain", lambda *a, pays=pays: bar(*a, pays))
        result = run_fit(data, tmp_path / f"out{pays}", _recipe(tiny_bert_dir, reranker=True), QUIET)
        stages = result.report["stages"]
        folds = stages["split"]["folds"]
        assert "distill" not in stages  # no dev split to keep a distilled model by
        assert stages["rerank"]["dev_queries"] == len(folds[0]) and seen[-1] == sorted(folds[0])
        assert stages["rerank"]["trained_on_queries"] == 16 - len(folds[0])
        assert stages["rerank"]["kept"] is pays and stages["rerank"]["why"] == "forced"
        assert (result.model / "reranker").is_dir() is pays
        assert (result.report["choices"]["rerank"] == "reranker") is pays


# ---------------------------------------------------------------- the teacher


def _kl(student: np.ndarray, teacher: np.ndarray) -> float:
    def log_softmax(x):
        x = x - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))

    p = np.exp(log_softmax(teacher))
    return float((p * (log_softmax(teacher) - log_softmax(student))).sum(axis=1).mean())


def test_listwise_kl_by_hand():
    import torch

    from twotower.training.fit.distill import listwise_kl

    s, t = np.array([[1.0, 0.0, -1.0], [0.2, 0.3, 0.1]]), np.array([[3.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert float(listwise_kl(torch.tensor(s), torch.tensor(t))) == pytest.approx(_kl(s, t), abs=1e-6)
    assert float(listwise_kl(torch.tensor(t), torch.tensor(t))) == pytest.approx(0.0, abs=1e-7)


def test_distill_step_loss_moves_with_the_teacher_exactly_by_its_kl(tiny_bert_dir, tmp_path):
    """Two teachers, the same batch: the losses differ by exactly the difference of the KL terms, computed here from
    the model's own encodings (the contrastive part is the same). A step that ignored the teacher would not."""
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.training.config import StageConfig, TrainConfig
    from twotower.training.fit.distill import DistillObjective
    from twotower.training.trainer import Trainer

    model_dir = copy_without_dropout(tiny_bert_dir, tmp_path / "m")
    examples = [TrainExample(query="what is cat", positive="cat is a pet", negatives=["tea is a drink", "rust"]),
                TrainExample(query="green tea", positive="tea leaves", negatives=["a cat", "the moon and sun"])]
    stage = StageConfig(name="d", pairs=str(tmp_path / "unused.jsonl"), batch_size=2, temperature=0.05)
    trainer = Trainer(TrainConfig(out=str(tmp_path / "run"), model=str(model_dir), precision="fp32", device="cpu",
                                  show_progress=False, stages=[stage]))
    teachers = (np.array([[5.0, 0.0, -2.0], [4.0, 1.0, 0.0]]), np.array([[0.0, 3.0, 1.0], [-1.0, 2.0, 2.0]]))
    losses = []
    for teacher in teachers:
        objective = DistillObjective([(e, t.tolist()) for e, t in zip(examples, teacher)])
        trainer.model.zero_grad()
        losses.append(float(objective.step_loss(trainer, objective.items, stage, trainer.loss_for(stage),
                                                random.Random(0))))
        assert objective.last_teacher.tolist() == teacher.tolist()
    model = DualEncoder.load(str(model_dir))
    opts = EncodeOptions(show_progress=False, precision="fp32")
    q = model.encode_queries([e.query for e in examples], opts)
    d = model.encode_documents([x for e in examples for x in [e.positive, *e.negatives]], opts).reshape(2, 3, -1)
    student = np.einsum("bh,bch->bc", q, d) / 0.05
    assert losses[0] != pytest.approx(losses[1])
    assert losses[0] - losses[1] == pytest.approx(_kl(student, teachers[0]) - _kl(student, teachers[1]), abs=2e-3)


def test_reranker_fit_distils_the_cross_encoders_scores(tiny_bert_dir, tmp_path):
    """The single-split fit with --reranker: the teacher's saved scores are the cross-encoder's own scores of the
    saved lists (recomputed here), the lists hold training queries only, and the student trained on them."""
    from twotower.retrieval.rerank import Reranker

    data = _data(tmp_path / "data")
    result = run_fit(data, tmp_path / "out", _recipe(tiny_bert_dir, cv_below=0, min_dev=4, reranker=True), QUIET)
    stages, out = result.report["stages"], result.out
    distill = stages["distill"]
    lists = load_pairs(out / "stages" / "distill" / "lists.jsonl")
    teacher = json.loads((out / "stages" / "distill" / "teacher.json").read_text())
    assert len(lists) == len(teacher) == distill["lists"] > 0
    split = json.loads((out / "stages" / "split" / "done.json").read_text())
    assert {e.qid for e in lists} <= set(split["train"]) and set(split["train"]).isdisjoint(split["dev"])
    ce = Reranker(out / "stages" / "rerank" / "reranker", precision="fp32")
    for ex, scores in zip(lists, teacher):
        assert len(scores) == 1 + 4 and len(ex.negative_ids) == 4
        assert not set(ex.negative_ids) & {ex.pid}
        want = ce.score([(ex.query, d) for d in [ex.positive, *ex.negatives]])
        assert scores == pytest.approx(want.tolist(), abs=1e-3)
    cfg = json.loads((out / "stages" / "distill" / "run" / "train_config.json").read_text())
    assert cfg["stages"][0]["pairs"] == str(out / "stages" / "distill" / "lists.jsonl")
    assert distill["kept"] == (distill["dev_best_distilled"]["ndcg@10"] > distill["dev_before"]["ndcg@10"]
                               and distill["chosen"]["model"] == "distill")
    assert result.report["choices"]["model"] == ("distill" if distill["kept"] else stages["select"]["chosen"]["model"])


def test_cli_passes_the_cv_and_distill_options(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import twotower as tt
    from twotower.cli import app
    from twotower.errors import TwoTowerError

    seen = {}

    def fake_fit(data, out, **kw):
        seen.update(kw)
        raise TwoTowerError("stopped by the test")

    monkeypatch.setattr(tt, "fit", fake_fit)
    res = CliRunner().invoke(app, ["fit", "--data", str(tmp_path), "--out", str(tmp_path / "o"), "--cv-below", "50",
                                   "--cv-folds", "4", "--reranker", "--no-distill", "--no-refine"])
    assert res.exit_code == 2 and "stopped by the test" in res.output
    assert (seen["cv_below"], seen["cv_folds"], seen["distill"], seen["reranker"], seen["refine"]) == (
        50, 4, False, True, False)
    seen.clear()
    CliRunner().invoke(app, ["fit", "--data", str(tmp_path), "--out", str(tmp_path / "o")])
    assert (seen["cv_below"], seen["cv_folds"]) == (FitRecipe().cv_below, FitRecipe().cv_folds)
    assert "distill" not in seen or seen["distill"] is FitRecipe().distill
    assert "refine" not in seen or seen["refine"] is FitRecipe().refine is True


def test_decide_keeps_the_default_zero_shot_hybrid_unless_another_setting_pays():
    def hybrid(lam, norm, folds):
        return {**_row("zeroshot", folds, "hybrid"), "lambda": lam, "norm": norm}

    default = hybrid(0.5, "minmax", [0.80, 0.90, 0.85])
    noisy = hybrid(0.65, "zscore", [0.83, 0.88, 0.87])  # gains 0.03, -0.02, 0.02: mean 0.01 < stdev 0.026
    chosen, why = cv.decide([default, noisy])
    assert chosen is default and "default is kept" in why["zero_shot_setting"]
    steady = hybrid(0.65, "zscore", [0.82, 0.92, 0.87])  # gains 0.02 each: spread 0
    assert cv.decide([default, steady])[0] is steady
    # a fine-tuned row is then measured against the zero-shot choice, not against the best zero-shot mean
    fitted = {**hybrid(0.5, "minmax", [0.84, 0.92, 0.88]), "model": "finetune", "_order": 1}
    chosen, why = cv.decide([default, noisy, fitted])  # gains over the default 0.04, 0.02, 0.03: mean 0.03 > 0.01
    assert chosen is fitted and why["gain_by_fold"] == [0.04, 0.02, 0.03]


def test_decide_never_leaves_the_default_zero_shot_for_a_gain_under_the_spread_or_the_least_gain():
    def hybrid(lam, norm, folds, model="zeroshot"):
        return {**_row(model, folds, "hybrid"), "lambda": lam, "norm": norm, "_order": 0 if model == "zeroshot" else 1}

    # XQuAD-R en, 60 training queries (results/fit_collections): z-score λ 0.65 won every fold, gains 0.0053,
    # 0.0184, 0.0066 (mean 0.0101 > spread 0.0072), and lost 0.0023 on the 1130 test queries: under the least gain
    default = hybrid(0.5, "minmax", [0.8172, 0.9162, 0.8946])
    lucky = hybrid(0.65, "zscore", [0.8225, 0.9346, 0.9012])
    chosen, why = cv.decide([default, lucky])
    assert chosen is default and "default is kept" in why["zero_shot_setting"]
    # a gain above the least gain but under its spread: kept out too
    noisy = hybrid(0.7, "zscore", [0.8700, 0.9000, 0.9300])  # gains 0.0528, -0.0162, 0.0354: mean 0.024 < 0.036
    assert cv.decide([default, noisy])[0] is default
    # a property over random folds, checked against the gains recomputed here with numpy: a zero-shot row other
    # than the default is chosen only where its mean gain is >= MIN_GAIN and above the sample spread
    rng = np.random.default_rng(7)
    departures = 0
    for _ in range(300):
        base = rng.uniform(0.3, 0.9, 3).round(4)
        rows = [hybrid(0.5, "minmax", list(base))]
        for lam in (0.3, 0.65, 0.8):
            rows.append(hybrid(lam, "zscore", list((base + rng.normal(0.02, 0.03, 3)).round(4))))
        chosen, _ = cv.decide(rows)
        if chosen is not rows[0]:
            departures += 1
            gains = np.round(np.array(chosen["folds"]) - base, 4)
            assert gains.mean() >= cv.MIN_GAIN - 1e-9 and gains.mean() > gains.std(ddof=1)
    assert 0 < departures < 300  # both sides of the rule were exercised


def test_the_default_grid_holds_the_default_zero_shot_row():
    """decide() can keep the default only if candidates() over fit's own λ grid contains it (hybrid λ 0.5, min-max)."""
    from twotower.retrieval.searcher import DEFAULT_LAMBDA

    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}}
    dense = {"q1": {"a": 0.9, "b": 0.1}, "q2": {"a": 0.8, "b": 0.2}, "q3": {"c": 0.5, "a": 0.4}}
    sparse = {"q1": {"b": 3.0, "a": 1.0}, "q2": {"b": 2.0}, "q3": {"a": 2.0, "c": 1.0}}
    rows = cv.candidates({"zeroshot": dense}, sparse, qrels, [["q1"], ["q2"], ["q3"]],
                         lambdas=FitRecipe().lambdas, n_best=10, metric="ndcg@10")
    base = cv.default_row(rows)
    assert base is not None and base["lambda"] == DEFAULT_LAMBDA and base["norm"] == "minmax"


def test_decide_asks_a_gain_of_several_standard_errors_over_the_queries():
    """Fold means can agree by luck (3 of them); the per-query gains cannot: a departure that gains >= 0.02 on every
    fold is still refused where its mean per-query gain is under MIN_T standard errors (recomputed here)."""
    folds = [[f"q{i}" for i in range(j, 30, 3)] for j in range(3)]

    def row(lam, by_query):
        scores = [round(statistics.fmean(by_query[q] for q in f), 4) for f in folds]
        return {"model": "zeroshot", "mode": "hybrid", "lambda": lam, "norm": "minmax", "folds": scores,
                "mean": round(statistics.fmean(scores), 4), "spread": 0.0, "_order": 0, "_queries": by_query}

    base = {f"q{i}": 0.5 for i in range(30)}
    # +0.3 on one query of each fold (0.03 a fold: no spread at all), 0 elsewhere: t = 0.03 / (0.0915 / √30) ≈ 1.8
    lumpy = {q: v + (0.3 if int(q[1:]) < 3 else 0.0) for q, v in base.items()}  # q0, q1, q2: one a fold
    gains = np.array([lumpy[q] - base[q] for q in base])
    t = gains.mean() / (gains.std(ddof=1) / np.sqrt(len(gains)))
    assert t < cv.MIN_T
    chosen, why = cv.decide([row(0.5, base), row(0.2, lumpy)])
    assert chosen["lambda"] == 0.5 and "default is kept" in why["zero_shot_setting"]
    # the same mean gain spread evenly over the queries: many standard errors, so it wins
    even = {q: v + 0.03 + (0.001 if int(q[1:]) % 2 else -0.001) for q, v in base.items()}
    assert cv.decide([row(0.5, base), row(0.2, even)])[0]["lambda"] == 0.2
