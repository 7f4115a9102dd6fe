"""BEIR loading and validation: every bad-input case names file, line and field."""

from __future__ import annotations

import json

import pytest

from conftest import SCIFACT_FILES, TINY_CORPUS, TINY_QRELS, TINY_QUERIES, require_data, write_beir
from twotower.data.beir import BeirDataset, load_corpus, load_qrels, load_queries
from twotower.errors import DataError


def test_loads_tiny_dataset(tiny_beir):
    ds = BeirDataset.load(tiny_beir, "test")
    assert len(ds.corpus) == 6 and set(ds.queries) == {"q1", "q2", "q3"}
    assert ds.qrels["q2"] == {"d4": 1}
    assert ds.corpus["d1"].full_text == "Cats Cats are small domesticated felines that purr."
    assert ds.corpus["d6"].full_text == "The mitochondria is the powerhouse of the cell."


def test_scifact_statistics(scifact):
    test = BeirDataset.load(scifact, "test")
    train = BeirDataset.load(scifact, "train")
    assert len(test.corpus) == 5183 and len(test.queries) == 300
    assert sum(len(r) for r in test.qrels.values()) == 339
    assert len(train.queries) == 809 and sum(len(r) for r in train.qrels.values()) == 919
    assert test.unknown_docs == 0 and test.unknown_queries == 0


def test_missing_real_data_skips_naming_the_path(tmp_path):
    root = write_beir(tmp_path / "scifact", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)  # no qrels/train.tsv
    with pytest.raises(pytest.skip.Exception, match=f"real data missing: {root / 'qrels' / 'train.tsv'} not found"):
        require_data(root, SCIFACT_FILES)
    with pytest.raises(pytest.skip.Exception, match=f"{tmp_path / 'nowhere' / 'corpus.jsonl'} not found"):
        require_data(tmp_path / "nowhere", SCIFACT_FILES)
    write_beir(root, TINY_CORPUS, TINY_QUERIES, TINY_QRELS, split="train")
    assert require_data(root, SCIFACT_FILES) == root


def _corpus(tmp_path, text: str):
    path = tmp_path / "corpus.jsonl"
    path.write_text(text)
    return path


def test_malformed_json(tmp_path):
    path = _corpus(tmp_path, '{"_id": "a", "text": "x"}\n{"_id": "b", "text": \n')
    with pytest.raises(DataError) as err:
        load_corpus(path)
    assert str(err.value) == f"{path}, line 2: malformed JSON: Expecting value at column 22"


def test_missing_id(tmp_path):
    path = _corpus(tmp_path, '{"_id": "a", "text": "x"}\n{"title": "t", "text": "y"}\n')
    with pytest.raises(DataError) as err:
        load_corpus(path)
    assert str(err.value) == f"{path}, line 2, field '_id': missing id (every record needs a string '_id')"


def test_non_string_text(tmp_path):
    path = _corpus(tmp_path, '{"_id": "a", "text": 42}\n')
    with pytest.raises(DataError) as err:
        load_corpus(path)
    assert str(err.value) == f"{path}, line 1, field 'text': text must be a string, got int"


def test_non_string_title(tmp_path):
    path = _corpus(tmp_path, '{"_id": "a", "title": ["x"], "text": "y"}\n')
    with pytest.raises(DataError, match=r"line 1, field 'title': title must be a string, got list"):
        load_corpus(path)


def test_duplicate_ids(tmp_path):
    path = _corpus(tmp_path, '{"_id": "a", "text": "x"}\n{"_id": "b", "text": "y"}\n{"_id": "a", "text": "z"}\n')
    with pytest.raises(DataError) as err:
        load_corpus(path)
    assert str(err.value) == f"{path}, line 3, field '_id': duplicate id 'a' (first seen on line 1)"


def test_duplicate_query_ids(tmp_path):
    path = tmp_path / "queries.jsonl"
    path.write_text('{"_id": "1", "text": "x"}\n{"_id": 1, "text": "y"}\n')
    with pytest.raises(DataError, match=r"line 2, field '_id': duplicate id '1' \(first seen on line 1\)"):
        load_queries(path)


def test_non_utf8(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'{"_id": "a", "text": "ok"}\n{"_id": "b", "text": "caf\xe9"}\n')
    with pytest.raises(DataError) as err:
        load_corpus(path)
    assert str(err.value) == (
        f"{path}, line 2: bytes that are not UTF-8 at column 26 (b'\\xe9\"}}\\n') (re-encode the file as UTF-8)"
    )


def test_json_not_an_object(tmp_path):
    path = _corpus(tmp_path, '["a", "b"]\n')
    with pytest.raises(DataError, match=r"line 1: expected a JSON object, got list"):
        load_corpus(path)


def test_qrels_non_integer_score(tmp_path):
    path = tmp_path / "test.tsv"
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\thigh\n")
    with pytest.raises(DataError) as err:
        load_qrels(path)
    assert str(err.value) == f"{path}, line 3, field 'score': score must be an integer, got 'high'"


def test_qrels_wrong_column_count(tmp_path):
    path = tmp_path / "test.tsv"
    path.write_text("q1 d1 1\n")
    with pytest.raises(DataError, match=r"line 1: expected 3 tab-separated columns .* got 1"):
        load_qrels(path)


def test_unknown_queries_and_docs_are_counted(tmp_path):
    qrels = TINY_QRELS + [("q9", "d1", 1), ("q1", "missing-doc", 1), ("q2", "gone", 1)]
    root = write_beir(tmp_path / "ds", TINY_CORPUS, TINY_QUERIES, qrels)
    ds = BeirDataset.load(root, "test")
    assert ds.unknown_queries == 1 and ds.unknown_docs == 2
    assert ds.warnings == [
        f"{root / 'qrels' / 'test.tsv'}: 1 judged queries are not in queries.jsonl (e.g. 'q9')",
        f"{root / 'qrels' / 'test.tsv'}: 2 judgements name documents not in corpus.jsonl",
    ]
    assert ds.qrels["q1"] == {"d1": 1} and "q9" not in ds.qrels
    with pytest.raises(DataError) as err:
        BeirDataset.load(root, "test", strict=True)
    assert str(err.value) == (
        f"{root / 'qrels' / 'test.tsv'}: 1 judged queries are not in queries.jsonl (e.g. 'q9'); "
        "2 judgements name documents not in corpus.jsonl (fix the qrels or drop strict=True)"
    )
    from twotower.checks import cli_names

    with cli_names(), pytest.raises(DataError, match=r"fix the qrels or drop --strict\)"):
        BeirDataset.load(root, "test", strict=True)


def test_missing_split_lists_available(tiny_beir):
    with pytest.raises(DataError, match=r"qrels file not found \(available splits: test\)"):
        BeirDataset.load(tiny_beir, "dev")


def test_missing_directory(tmp_path):
    with pytest.raises(DataError, match="data directory not found"):
        BeirDataset.load(tmp_path / "nope", "test")


def test_streams_blank_lines_and_bom(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_bytes("\ufeff".encode() + json.dumps({"_id": 7, "text": "x"}).encode() + b"\n\n")
    assert list(load_corpus(path)) == ["7"]


def test_empty_queries_file_is_an_error(tmp_path):
    root = write_beir(tmp_path / "ds", TINY_CORPUS, [], TINY_QRELS)
    with pytest.raises(DataError) as err:
        BeirDataset.load(root, "test")
    assert str(err.value).startswith(f"{root / 'queries.jsonl'}: no queries (")
    assert "add one JSON object per line with '_id' and 'text'" in str(err.value)


def test_empty_qrels_split_is_an_error(tmp_path):
    root = write_beir(tmp_path / "ds", TINY_CORPUS, TINY_QUERIES, [])
    with pytest.raises(DataError, match=r"test\.tsv: no judgements in split 'test' \(add rows"):
        BeirDataset.load(root, "test")


def test_split_without_a_usable_judged_query_is_an_error(tmp_path):
    # q9 is not a query; q1 judges only a document the corpus lacks
    root = write_beir(tmp_path / "ds", TINY_CORPUS, TINY_QUERIES, [("q9", "d1", 1), ("q1", "gone", 1)])
    with pytest.raises(DataError) as err:
        BeirDataset.load(root, "test")
    assert str(err.value).startswith(
        f"{root / 'qrels' / 'test.tsv'}: none of the 2 judged queries of split 'test' is usable "
        "(1 not in queries.jsonl, 1 judging only documents not in corpus.jsonl)"
    )


def test_pairs_from_a_split_without_relevant_judgements_is_an_error(tmp_path):
    from twotower.data.pairs import pairs_from_beir

    root = write_beir(tmp_path / "ds", TINY_CORPUS, TINY_QUERIES, [(q, d, 0) for q, d, _ in TINY_QRELS], split="train")
    ds = BeirDataset.load(root, "train")  # judged, but nothing relevant: fine to evaluate, nothing to train on
    with pytest.raises(DataError) as err:
        pairs_from_beir(ds)
    assert str(err.value).startswith(
        f"{root / 'qrels' / 'train.tsv'}: no training pairs in split 'train': none of its judgements has a score > 0"
    )
