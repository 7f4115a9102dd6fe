"""Issue 35 (hardening B), training side: the logged learning rate, what fit reports against what eval runs,
degenerate training data, judged documents without text, stage files against CLI defaults."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import TINY_CORPUS, write_beir
from twotower.cli import app
from twotower.training.trainer import StageConfig, TrainConfig, Trainer

runner = CliRunner()


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture()
def train_beir(tmp_path):
    queries = [{"_id": f"q{i}", "text": f"question about {d['title'] or 'cells'}"} for i, d in enumerate(TINY_CORPUS)]
    qrels = [(f"q{i}", d["_id"], 1) for i, d in enumerate(TINY_CORPUS)]
    return write_beir(tmp_path / "beir", TINY_CORPUS, queries, qrels, split="train")


# ---------------------------------------------------------------- case 9: the learning rate each step used


def test_train_log_records_the_rate_each_step_used(tmp_path, tiny_bert_dir, train_beir):
    """Linear decay without warm-up over 4 steps from 1e-3: step s (1-based) updates at 1e-3·(4 − (s − 1))/4,
    so the log reads 1e-3, 7.5e-4, 5e-4, 2.5e-4 (today's log is one step ahead and ends at 0)."""
    out = tmp_path / "run"
    cfg = TrainConfig(out=str(out), model=str(tiny_bert_dir), precision="fp32", show_progress=False,
                      stages=[StageConfig(data=str(train_beir), batch_size=2, steps=4, lr=1e-3, warmup=0.0)])
    Trainer(cfg).train()
    log = json.loads((out / "train_log.json").read_text())
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    assert [r["lr"] for r in log] == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])


def test_train_log_rate_with_warmup(tmp_path, tiny_bert_dir, train_beir):
    """warmup 0.5 of 4 steps = 2 warm-up steps: the rates used are 0, 5e-4 (rising), 1e-3, 5e-4 (falling)."""
    out = tmp_path / "run"
    cfg = TrainConfig(out=str(out), model=str(tiny_bert_dir), precision="fp32", show_progress=False,
                      stages=[StageConfig(data=str(train_beir), batch_size=2, steps=4, lr=1e-3, warmup=0.5)])
    Trainer(cfg).train()
    log = json.loads((out / "train_log.json").read_text())
    assert [r["lr"] for r in log] == pytest.approx([0.0, 5e-4, 1e-3, 5e-4])


# ---------------------------------------------------------------- the audit gap: what fit reports is what eval runs

WORDS = "cat dog tea rust python cell sun moon river stone tree bird fish apple music train".split()


def test_fit_dev_score_is_what_eval_gives_with_the_stored_choices(tiny_bert_dir, tmp_path):
    """Fit on tiny data, then evaluate the fitted model, with the retrieval it stored and nothing else, on the dev
    queries fit held out, through ``evaluation.pipeline.run_eval`` (what ``twotower eval`` runs): the metrics must be
    the dev scores fit reported for its choice. A λ stored mirrored (1 − λ), a norm or mode other than the one
    scored, would each give another number here."""
    from twotower.evaluation.pipeline import EvalConfig, run_eval
    from twotower.training.fit import FitOptions, FitRecipe, run_fit
    from twotower.training.fit.stages import StageLog

    corpus = [{"_id": f"d{i}", "title": w, "text": f"{w} is about {w} and {WORDS[(i + 3) % len(WORDS)]}"}
              for i, w in enumerate(WORDS)]
    queries = [{"_id": f"q{i}", "text": f"what is {w}"} for i, w in enumerate(WORDS)]
    qrels = [(f"q{i}", f"d{i}", 1) for i in range(len(WORDS))] + [("q0", "d1", 1), ("q2", "d3", 1)]
    data = write_beir(tmp_path / "data", corpus, queries, qrels, split="train")
    recipe = FitRecipe(model=str(tiny_bert_dir), min_dev=6, batch_size=4, epochs=1, mine=False, seed=3,
                       lambdas=(0.1, 0.9), cv_below=0)  # no λ is its own mirror image; one dev split (no folds)
    result = run_fit(data, tmp_path / "out", recipe, FitOptions(show_progress=False, precision="fp32"))
    choices = result.report["choices"]
    # the fusion is where a stored choice can differ from the scored one: this data must make fit choose it
    assert choices["mode"] == "hybrid" and choices["lambda"] not in (None, 0.5), choices
    dev = StageLog(tmp_path / "out").done("split")["dev"]  # the dev query ids fit held out
    rows = [row for row in qrels if row[0] in set(dev)]
    assert rows
    (data / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in rows))
    got = run_eval(EvalConfig(data=data, split="dev", model=str(result.model), top_k=recipe.n_best,
                              metrics=tuple(choices["dev"]), precision="fp32", show_progress=False))
    assert got.num_queries == len(dev)
    for metric, reported in choices["dev"].items():
        assert round(got.metrics[metric], 4) == pytest.approx(reported, abs=1e-4), (metric, got.metrics, choices)
    assert got.retriever == choices["mode"] and got.hybrid_lambda == choices["lambda"]
    # the check has teeth: the mirrored weight scores otherwise on this data
    mirrored = run_eval(EvalConfig(data=data, split="dev", model=str(result.model), top_k=recipe.n_best,
                                   hybrid_lambda=round(1 - choices["lambda"], 2), metrics=tuple(choices["dev"]),
                                   precision="fp32", show_progress=False))
    assert any(round(mirrored.metrics[m], 4) != pytest.approx(v, abs=1e-4) for m, v in choices["dev"].items())


# ---------------------------------------------------------------- case 13: judged documents without title or text


def _with_empty_documents(root: Path, empty: tuple[str, ...] = ("d5",)) -> Path:
    corpus = [{"_id": f"d{i}", "title": "" if f"d{i}" in empty else w, "text": "" if f"d{i}" in empty else
               f"{w} is about {w} and {WORDS[(i + 3) % len(WORDS)]}"} for i, w in enumerate(WORDS)]
    queries = [{"_id": f"q{i}", "text": f"what is {w}"} for i, w in enumerate(WORDS)]
    qrels = [(f"q{i}", f"d{i}", 1) for i in range(len(WORDS))]
    return write_beir(root, corpus, queries, qrels, split="train")


def test_pairs_skip_judged_documents_without_text_with_one_warning(tmp_path, caplog):
    from twotower.data.beir import BeirDataset
    from twotower.data.pairs import pairs_from_beir

    data = _with_empty_documents(tmp_path / "d", ("d5", "d9"))
    ds = BeirDataset.load(data, "train")
    with caplog.at_level(logging.WARNING):
        pairs = pairs_from_beir(ds)
    assert sorted(p.pid for p in pairs) == sorted(f"d{i}" for i in range(len(WORDS)) if i not in (5, 9))
    assert all(p.positive.strip() for p in pairs)
    warned = [r.getMessage() for r in caplog.records if "neither title nor text" in r.getMessage()]
    assert len(warned) == 1 and "2 judged pair(s)" in warned[0] and "d5, d9" in warned[0], warned
    assert "d5" in ds.corpus and "d9" in ds.corpus  # still documents of the collection


def test_every_judged_document_empty_is_a_data_error(tmp_path):
    from twotower.data.beir import BeirDataset
    from twotower.data.pairs import pairs_from_beir
    from twotower.errors import DataError

    data = _with_empty_documents(tmp_path / "d", tuple(f"d{i}" for i in range(len(WORDS))))
    with pytest.raises(DataError, match=r"train\.tsv: no training pairs .*every judged document \(16\) is empty"):
        pairs_from_beir(BeirDataset.load(data, "train"))


def test_fit_trains_past_an_empty_judged_document_and_eval_still_judges_it(tiny_bert_dir, tmp_path, caplog):
    """fit stopped at fine-tuning with an error about its own stages/split/train_pairs.jsonl; now the pair is left
    out (one warning naming d5) and the fit finishes. The document stays retrievable: eval's run holds it."""
    from twotower.evaluation.pipeline import EvalConfig, run_eval
    from twotower.training.fit import FitOptions, FitRecipe, run_fit

    data = _with_empty_documents(tmp_path / "d")
    recipe = FitRecipe(model=str(tiny_bert_dir), min_dev=2, dev_fraction=0.1, batch_size=4, epochs=1, mine=False,
                       cv_below=0)  # the single-split fit (its fine-tuning stage)
    with caplog.at_level(logging.WARNING):
        result = run_fit(data, tmp_path / "out", recipe, FitOptions(show_progress=False, precision="fp32"))
    assert result.report["stages"]["finetune"]["model"]
    warned = [r.getMessage() for r in caplog.records if "neither title nor text" in r.getMessage()]
    assert warned and all("d5" in w for w in warned)
    # case 5: two dev queries choose the model and the fusion: said
    assert any("2 dev queries" in r.getMessage() and "says little" in r.getMessage() for r in caplog.records)
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq5\td5\t1\n")
    got = run_eval(EvalConfig(data=data, split="test", model=str(result.model), retriever="dense",
                              precision="fp32", show_progress=False))
    assert "d5" in got.run["q5"]  # judged, retrieved and scored like any document
    assert got.metrics["recall@1000"] == 1.0


def test_train_data_skips_the_empty_pair(tmp_path, tiny_bert_dir):
    data = _with_empty_documents(tmp_path / "d")
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--data", str(data), "--model", str(tiny_bert_dir), "--out", str(out),
                              "--steps", "1", "--batch-size", "2", "--no-progress"])
    assert res.exit_code == 0, res.output
    from twotower.training.objective import stage_examples

    examples = stage_examples(StageConfig(data=str(data)))
    assert len(examples) == len(WORDS) - 1 and "d5" not in {e.pid for e in examples}


# ---------------------------------------------------------------- case 7: mining ranks beyond the collection


def test_mine_refuses_ranks_past_the_collection(tmp_path, tiny_beir):
    out = tmp_path / "mined.jsonl"
    res = runner.invoke(app, ["mine", "--data", str(tiny_beir), "--split", "test", "--out", str(out),
                              "--rank-from", "20", "--rank-to", "50", "--no-progress"])
    assert res.exit_code == 2, res.output
    assert "--rank-from 20: the collection has only 6 documents" in _flat(res.output)
    assert not out.exists()


def test_mine_says_when_examples_get_fewer_negatives(tmp_path, tiny_beir, caplog):
    """BM25 ranks only the documents that match a query: q1 and q3 match their positive alone, q2 matches d4 (its
    positive, 4 shared words) then d3 (2): from rank 2 on, asked for 2 negatives, q2 gets d3 and the others none;
    the file is written, and the shortfall counted in a warning."""
    from twotower.data.beir import BeirDataset
    from twotower.training.mining import add_hard_negatives

    out = tmp_path / "mined.jsonl"
    with caplog.at_level(logging.WARNING):
        res = runner.invoke(app, ["mine", "--data", str(tiny_beir), "--split", "test", "--out", str(out),
                                  "--rank-from", "2", "--rank-to", "50", "--num-negatives", "2", "--no-progress"])
    assert res.exit_code == 0, res.output
    rows = {r["qid"]: r["negative_ids"] for r in map(json.loads, out.read_text().splitlines())}
    assert rows == {"q1": [], "q2": ["d3"], "q3": []}
    assert any("3 of 3 examples got fewer than 2 negatives (2 got none)" in r.getMessage() for r in caplog.records), \
        caplog.text
    # every example without a negative: refused, not written as a file of positives only
    ds = BeirDataset.load(tiny_beir, "test")
    from twotower.data.pairs import pairs_from_beir

    pairs = pairs_from_beir(ds)
    ranked = {p.qid: [p.pid] for p in pairs}  # each ranking holds its positive alone
    with pytest.raises(Exception, match="no example got a negative"):
        add_hard_negatives(pairs, ds, ranked, num_negatives=1, rank_range=(1, 5))


# ---------------------------------------------------------------- kind: settings in a stages file overridden by CLI defaults


def _stages_file(tmp_path, model, data) -> Path:
    path = tmp_path / "stages.toml"
    path.write_text(f'model = "{model}"\nseed = 7\nsimilarity = "dot"\ncheckpoint_every = 3\nprecision = "fp32"\n'
                    f'towers = "ade"\nlayer_norm = false\n'
                    f'[[stage]]\nname = "a"\ndata = "{data}"\nsplit = "train"\nsteps = 1\nbatch_size = 2\n')
    return path


def test_a_stages_file_keeps_its_settings_where_no_option_is_typed(tmp_path, tiny_bert_dir, train_beir):
    """seed, similarity, checkpoint_every, precision and towers from the file; today the options' defaults (42,
    cosine, 100, auto, sde) replaced them."""
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--config", str(_stages_file(tmp_path, tiny_bert_dir, train_beir)),
                              "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    saved = json.loads((out / "train_config.json").read_text())
    assert {k: saved[k] for k in ("seed", "similarity", "checkpoint_every", "precision", "towers")} == \
        {"seed": 7, "similarity": "dot", "checkpoint_every": 3, "precision": "fp32", "towers": "ade"}
    assert saved["show_progress"] is False  # typed: --no-progress


def test_a_typed_option_still_overrides_the_file(tmp_path, tiny_bert_dir, train_beir):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--config", str(_stages_file(tmp_path, tiny_bert_dir, train_beir)),
                              "--out", str(out), "--seed", "42", "--towers", "sde", "--no-progress"])
    assert res.exit_code == 0, res.output
    saved = json.loads((out / "train_config.json").read_text())
    assert (saved["seed"], saved["towers"], saved["similarity"]) == (42, "sde", "dot")


def test_a_stage_option_with_a_stages_file_is_refused(tmp_path, tiny_bert_dir, train_beir):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--config", str(_stages_file(tmp_path, tiny_bert_dir, train_beir)),
                              "--out", str(out), "--lr", "1e-3", "--batch-size", "4", "--no-progress"])
    assert res.exit_code == 2, res.output
    assert "--lr, --batch-size set a stage" in _flat(res.output) and not out.exists()


# ---------------------------------------------------------------- case 4: one kind of artifact per output folder


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_label_free_fit_into_a_training_run_is_refused(tmp_path, tiny_bert_dir, train_beir):
    """It printed 'model saved to RUN/model: zeroshot encoder, hybrid λ 0.5' and left the run's model as it was."""
    run = tmp_path / "run"
    Trainer(TrainConfig(out=str(run), model=str(tiny_bert_dir), precision="fp32", show_progress=False,
                        stages=[StageConfig(data=str(train_beir), batch_size=2, steps=1)])).train()
    before = _listing(run)
    unlabelled = tmp_path / "nolabels"
    unlabelled.mkdir()
    for name in ("corpus.jsonl", "queries.jsonl"):
        (unlabelled / name).write_bytes((train_beir / name).read_bytes())
    res = runner.invoke(app, ["fit", "--data", str(unlabelled), "--out", str(run), "--model", str(tiny_bert_dir),
                              "--no-progress"])
    out = _flat(res.output)
    assert res.exit_code == 2, res.output
    assert f"--out {run} holds a training run" in out and "model saved" not in out, out
    assert _listing(run) == before


def test_a_fit_into_an_index_folder_is_refused(tmp_path, tiny_bert_dir, train_beir):
    from conftest import flat_index

    index = flat_index(train_beir, tiny_bert_dir, tmp_path / "idx")
    before = _listing(index)
    res = runner.invoke(app, ["fit", "--data", str(train_beir), "--out", str(index), "--model", str(tiny_bert_dir),
                              "--epochs", "1", "--no-progress"])
    assert res.exit_code == 2 and f"--out {index} holds an index (CURRENT, versions)" in _flat(res.output), res.output
    assert _listing(index) == before


def test_train_refuses_a_fit_folder_and_analyses_refuse_a_run(tmp_path, tiny_bert_dir, train_beir):
    from twotower.analysis._common import write_json
    from twotower.errors import TwoTowerError

    fitted = tmp_path / "fitted"  # a fit folder from before markers existed: told by its recipe.json
    fitted.mkdir()
    (fitted / "recipe.json").write_text("{}")
    res = runner.invoke(app, ["train", "--data", str(train_beir), "--model", str(tiny_bert_dir), "--out", str(fitted),
                              "--steps", "1", "--batch-size", "2", "--no-progress"])
    assert res.exit_code == 2 and "holds a fit run (recipe.json)" in _flat(res.output), res.output
    assert sorted(p.name for p in fitted.iterdir()) == ["recipe.json"]
    run = tmp_path / "run"
    Trainer(TrainConfig(out=str(run), model=str(tiny_bert_dir), precision="fp32", show_progress=False,
                        stages=[StageConfig(data=str(train_beir), batch_size=2, steps=1)])).train()
    with pytest.raises(TwoTowerError, match="holds a training run .* twotower analyze writes analysis results"):
        write_json(run / "fidelity.json", {"rows": []})
    assert not (run / "fidelity.json").exists()
    # the same kind again is fine: a second analysis into an analysis folder
    write_json(tmp_path / "analysis" / "a.json", {"rows": []})
    write_json(tmp_path / "analysis" / "b.json", {"rows": []})
    assert (tmp_path / "analysis" / "b.json").is_file()


# ---------------------------------------------------------------- case 5: degenerate training runs


def _pairs(tmp_path, rows) -> Path:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("rows, what", [
    ([{"query": "a cat", "positive": "cats purr"}], "1 training pair:"),
    ([{"query": f"question {i}", "positive": "the one document", "pid": "d1"} for i in range(6)],
     "6 training pairs, all judged on one document"),
    ([{"query": "one question", "qid": "q1", "positive": f"document {i}"} for i in range(6)],
     "6 training pairs, all of one query"),
])
def test_training_that_cannot_learn_is_refused_before_writing(tmp_path, tiny_bert_dir, rows, what):
    """Every step's loss was exactly 0 (one candidate per query once copies are masked) and the run 'succeeded'."""
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--pairs", str(_pairs(tmp_path, rows)), "--model", str(tiny_bert_dir),
                              "--out", str(out), "--steps", "2", "--batch-size", "4", "--no-progress"])
    text = _flat(res.output)
    assert res.exit_code == 2, res.output
    assert what in text and "nothing is learned" in text and "at least 2 different queries and 2 different" in text
    assert not out.exists()


def test_two_distinct_pairs_learn_with_a_warning(tmp_path, tiny_bert_dir, caplog):
    """The smallest data that can learn: 2 pairs of different queries and documents. The first step's loss is
    that of a 2-way softmax, above 0 (at most log 2 + the score gap / temperature), and a warning says a batch
    of 4 needs at least 4 pairs."""
    rows = [{"query": "which feline purrs", "positive": "Cats purr."},
            {"query": "green tea", "positive": "Tea is brewed from leaves."}]
    out = tmp_path / "run"
    cfg = TrainConfig(out=str(out), model=str(tiny_bert_dir), precision="fp32", show_progress=False,
                      stages=[StageConfig(pairs=str(_pairs(tmp_path, rows)), batch_size=4, steps=2, lr=1e-3)])
    with caplog.at_level(logging.WARNING):
        Trainer(cfg).train()
    losses = [r["loss"] for r in json.loads((out / "train_log.json").read_text())]
    assert all(loss > 0 for loss in losses), losses
    assert any("2 training pairs, fewer than a batch (4)" in r.getMessage() for r in caplog.records), caplog.text


def test_pretraining_on_one_chunk_is_refused(tmp_path, tiny_bert_dir):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "only", "title": "Only", "text": "Cats purr when they are content. "
                                  "Dogs bark at strangers on the street. Tea is brewed from leaves."}) + "\n")
    out = tmp_path / "run"
    res = runner.invoke(app, ["pretrain", "--corpus", str(corpus), "--model", str(tiny_bert_dir), "--out", str(out),
                              "--steps", "2", "--batch-size", "4", "--no-progress"])
    text = _flat(res.output)
    assert res.exit_code == 2, res.output
    assert "1 chunk to pre-train on (1 document)" in text and "nothing is learned" in text, text
    assert not (out / "model").exists() and not (out / "train_log.json").exists()
    assert not out.exists()  # no half-started run folder (its pretrain_config.json) is left behind


def test_fit_refuses_before_zero_shot_when_training_cannot_learn(tmp_path, tiny_bert_dir):
    """Two judged queries: one goes to dev, one pair is left to fine-tune on: refused at the split, before the
    zero-shot stage encodes anything (it ran, then fine-tuning learned nothing and dev NDCG read 1.0)."""
    data = write_beir(tmp_path / "d", TINY_CORPUS, [{"_id": "q0", "text": "feline"}, {"_id": "q1", "text": "dogs"}],
                      [("q0", "d1", 1), ("q1", "d2", 1)], split="train")
    out = tmp_path / "fit"
    res = runner.invoke(app, ["fit", "--data", str(data), "--out", str(out), "--model", str(tiny_bert_dir),
                              "--epochs", "1", "--no-progress"])
    assert res.exit_code == 2 and "1 training pair:" in _flat(res.output), res.output
    assert not (out / "stages" / "zeroshot").exists() and not (out / "model").exists()
