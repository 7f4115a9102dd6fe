"""The objects a user prints answer in one line (print(load_beir(...)) printed the whole corpus: 8 MB)."""

from __future__ import annotations

import twotower as tt
from twotower.evaluation.result import EvalResult


def test_dataset_repr_is_one_line_with_counts():
    corpus = {f"d{i}": "a long text " * 200 for i in range(50)}
    ds = tt.Dataset.from_lists(corpus, {"q1": "text"}, {"q1": {"d1": 1, "d2": 2}})
    text = repr(ds)
    assert text == "Dataset('in-memory', split='test', documents=50, queries=1, judgements=2)"
    assert str(ds) == text and "\n" not in text


def test_eval_result_repr_names_the_run_and_its_first_metrics_only():
    res = EvalResult("scifact", "test", "bm25", None, 300, None, {"ndcg@10": 0.68631, "recall@100": 0.9127},
                     {"search_s": 1.0}, run={f"q{i}": {"d": 1.0} for i in range(1000)})
    assert repr(res) == "EvalResult(scifact/test, bm25, 300 queries, ndcg@10=0.6863, recall@100=0.9127)"


def test_index_repr_is_one_line(tmp_path, tiny_bert_dir):
    index = tt.Index.build(tmp_path / "idx", {"d1": "green tea", "d2": "coffee"}, encoder=str(tiny_bert_dir),
                           show_progress=False)
    assert repr(index) == f"Index({str(tmp_path / 'idx')!r}, documents=2)"
