"""BM25 text analysis per language: hand-checked terms for each analyzer, the language saved with an index
and used when it is loaded, old (English) indexes unchanged, unknown languages refused, the wiring through
eval / index build / mine, and Chinese and Thai on real XQuAD-R against English."""

from __future__ import annotations

import json
import re
import time

import bm25s
import numpy as np
import pytest
import Stemmer
from bm25s.tokenization import Tokenizer
from typer.testing import CliRunner

from conftest import SCIFACT, write_beir
from twotower.cli import app
from twotower.errors import TwoTowerError
from twotower.retrieval.analyzers import (
    EN_PATTERN, analyzer_for, check_language, detect_language, split_runs, split_words,
)
from twotower.retrieval.bm25 import BM25, BM25Params

XQUAD = SCIFACT.parent / "xquad-r"
runner = CliRunner()

# Chinese: no spaces, so a whitespace/\w+ tokenizer makes each clause one term that no question repeats.
ZH_CORPUS = [
    {"_id": "d1", "title": "", "text": "北京是中国的首都，也是政治和文化中心。"},
    {"_id": "d2", "title": "", "text": "上海是中国最大的城市，位于长江入海口。"},
    {"_id": "d3", "title": "", "text": "长城是古代中国修建的军事防御工程。"},
    {"_id": "d4", "title": "", "text": "熊猫主要生活在四川的山区，以竹子为食。"},
    {"_id": "d5", "title": "", "text": "竹子可以用来做家具和乐器。"},
]
ZH_QUERIES = [
    {"_id": "q1", "text": "中国的首都是哪里"},
    {"_id": "q2", "text": "熊猫吃竹子吗"},
    {"_id": "q3", "text": "长城是谁修建的"},
]
ZH_QRELS = [("q1", "d1", 1), ("q2", "d4", 1), ("q3", "d3", 1)]
ZH_IDS = [d["_id"] for d in ZH_CORPUS]
ZH_TEXTS = [d["text"] for d in ZH_CORPUS]


# ----------------------------------------------------------------------------- each analyzer, by hand


def test_english_is_the_bm25s_tokenizer_as_before():
    # bm25s' 33 English stopwords drop "the" (not "were"); Snowball english: cats → cat, running → run
    assert analyzer_for("en").analyze(["The cats were running"]) == [["cat", "were", "run"]]


def test_german_nfkc_casefold_stopwords_and_stemmer():
    # "die", "an", "der": German stopwords; Häuser → haus (-er, umlaut), STRASSE → strasse → strass
    assert analyzer_for("de").analyze(["Die Häuser an der STRASSE"]) == [["haus", "strass"]]


def test_chinese_character_unigrams_and_bigrams():
    assert analyzer_for("zh").analyze(["我爱北京"]) == [["我", "爱", "北", "京", "我爱", "爱北", "北京"]]
    # full-width Latin folded by NFKC and lowercased; digits and Latin apart from the Han characters
    assert analyzer_for("zh").analyze(["ＮＦＬ的2015年"]) == [["nfl", "的", "2015", "年"]]


def test_japanese_kana_and_long_vowel_mark():
    assert analyzer_for("ja").analyze(["東京タワー"]) == [
        ["東", "京", "タ", "ワ", "ー", "東京", "京タ", "タワ", "ワー"]]


def test_thai_grapheme_bigrams():
    # สวัสดี = ส | วั | ส | ดี (the vowel marks stay on their consonants): three bigrams
    assert analyzer_for("th").analyze(["สวัสดี"]) == [["สวั", "วัส", "สดี"]]
    assert analyzer_for("th").analyze(["ดี"]) == [["ดี"]]  # one cluster: itself


def test_combining_marks_stay_in_their_words():
    # Python's re \w leaves the vowel signs out, which cut Devanagari words into fragments
    assert re.findall(EN_PATTERN, "भारत की राजधानी") == ["रत", "जध"]
    assert split_words("भारत की राजधानी") == ["भारत", "की", "राजधानी"]
    assert analyzer_for("hi").analyze(["भारत की राजधानी"]) == [["भारत", "क", "राजधान"]]  # Snowball hindi


def test_greek_final_sigma_and_accents_stem_alike():
    a = analyzer_for("el")
    assert a.analyze(["Ο ΔΡΟΜΟΣ", "ο δρόμος"]) == [["ο", "δρομ"], ["ο", "δρομ"]]


def test_vietnamese_words_without_stemmer():
    assert analyzer_for("vi").analyze(["Hà Nội là thủ đô"]) == [["hà", "nội", "là", "thủ", "đô"]]


def test_multi_splits_by_script_and_stems_by_script():
    assert split_runs("Москва is 北京 and ไทย") == ["москва", "is", "北", "京", "北京", "and", "ไท", "ทย"]
    # Cyrillic → Russian stemmer (москва → москв), Latin → English (running → run), Han/Thai untouched
    assert analyzer_for("multi").analyze(["Москва running 北京 ไทย"]) == [
        ["москв", "run", "北", "京", "北京", "ไท", "ทย"]]


def test_overrides_and_bad_overrides():
    assert analyzer_for("de", stopwords="", stemmer="").analyze(["Die Häuser"]) == [["die", "häuser"]]
    with pytest.raises(TwoTowerError, match="no Snowball stemmer 'klingon'"):
        analyzer_for("de", stemmer="klingon")
    with pytest.raises(TwoTowerError, match="no BM25 stopword list 'xx'"):
        analyzer_for("de", stopwords="xx")


def test_english_ngram_terms_equal_bm25s_tokenize(scifact):
    """ngram=2 now takes its unigrams from the analyzer: for English the same as bm25s.tokenize before."""
    from twotower.data.beir import BeirDataset

    ds = BeirDataset.load(scifact, "test")
    texts = [d.full_text for d in list(ds.corpus.values())[:500]] + list(ds.queries.values())
    old = bm25s.tokenize(texts, stopwords="en", stemmer=Stemmer.Stemmer("english"), return_ids=False,
                         show_progress=False)
    assert analyzer_for("en").analyze(texts) == [[t for t in toks if t] for toks in old]


# ----------------------------------------------------------------------------- languages known and unknown


def test_unknown_language_is_refused_with_the_list():
    with pytest.raises(TwoTowerError, match=r"unknown BM25 language 'xx'.*ar, ca, .*zh.*'multi'.*'auto'"):
        BM25Params(language="xx")
    assert check_language("zh") == "zh" and check_language("auto") == "auto"


def test_cli_refuses_unknown_language_before_work(tmp_path, tiny_bert_dir):
    data = write_beir(tmp_path / "zh", ZH_CORPUS, ZH_QUERIES, ZH_QRELS)
    for args in (["eval", "--data", str(data), "--language", "klingon", "--no-progress"],
                 ["index", "build", "--data", str(data), "--out", str(tmp_path / "idx"), "--model",
                  str(tiny_bert_dir), "--language", "klingon", "--no-progress"],
                 ["mine", "--data", str(data), "--split", "test", "--out", str(tmp_path / "m.jsonl"),
                  "--language", "klingon", "--no-progress"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert "unknown BM25 language 'klingon'" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "idx").exists() and not (tmp_path / "m.jsonl").exists()


# ----------------------------------------------------------------------------- Chinese retrieval


def test_chinese_fails_with_whitespace_tokens_and_works_with_zh():
    queries = [q["text"] for q in ZH_QUERIES]
    scores, _ = BM25().index(ZH_IDS, ZH_TEXTS, show_progress=False).search(queries, k=5, show_progress=False)
    assert np.all(scores == 0)  # the English analyzer: no question term is in any document
    scores, idx = BM25(BM25Params(language="zh")).index(ZH_IDS, ZH_TEXTS, show_progress=False).search(
        queries, k=5, show_progress=False)
    assert [ZH_IDS[row[0]] for row in idx] == ["d1", "d4", "d3"]
    assert np.all(scores[:, 0] > scores[:, 1])


def test_bigram_bm25_in_chinese():
    bm = BM25(BM25Params(language="zh", ngram=2)).index(ZH_IDS, ZH_TEXTS, show_progress=False)
    assert {"首 都", "首都 也"} <= set(bm.index_.vocab_dict)  # pairs of adjacent terms (a run's grams, then the next run's)
    _, idx = bm.search([q["text"] for q in ZH_QUERIES], k=5, show_progress=False)
    assert [ZH_IDS[row[0]] for row in idx] == ["d1", "d4", "d3"]


# ----------------------------------------------------------------------------- saved with the index


def test_language_saved_with_the_index_and_used_on_load(tmp_path):
    BM25(BM25Params(language="zh")).index(ZH_IDS, ZH_TEXTS, show_progress=False).save(tmp_path / "bm")
    assert json.loads((tmp_path / "bm" / "params.json").read_text())["language"] == "zh"
    loaded = BM25.load(tmp_path / "bm", ZH_IDS)
    assert loaded.params.language == "zh"
    _, idx = loaded.search(["熊猫吃竹子吗"], k=2, show_progress=False)
    assert ZH_IDS[idx[0][0]] == "d4"
    with pytest.raises(TwoTowerError, match="built for language 'zh', not 'en'"):
        BM25.load(tmp_path / "bm", ZH_IDS, BM25Params(language="en"))


def test_auto_records_the_detected_language(tmp_path):
    bm = BM25(BM25Params(language="auto")).index(ZH_IDS, ZH_TEXTS, show_progress=False)
    assert bm.params.language == "zh"
    bm.save(tmp_path / "bm")
    assert BM25.load(tmp_path / "bm", ZH_IDS).params.language == "zh"


def test_old_index_without_language_is_english_and_unchanged(tmp_path):
    """An index as the code before languages wrote it (bm25s files, tokenizer vocab, no params.json) and a
    manifest entry without ``language``: loaded as English, scores equal to plain bm25s."""
    docs = ["the cat sat on the mat", "dogs chase cats", "a cat and a cat", "quantum physics lecture notes"]
    ids = ["a", "b", "c", "d"]
    tok = Tokenizer(stopwords="en", stemmer=Stemmer.Stemmer("english"))
    ref = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    ref.index(tok.tokenize(docs, update_vocab=True, return_as="tuple", show_progress=False), show_progress=False)
    ref.save(tmp_path / "old", show_progress=False)
    tok.save_vocab(tmp_path / "old")
    tok.save_stopwords(tmp_path / "old")
    queries = ["cats", "quantum lecture", "dog mats"]
    ref_idx, ref_scores = ref.retrieve(tok.tokenize(queries, update_vocab=False, return_as="ids",
                                                    show_progress=False), k=4, show_progress=False)
    old_manifest = {"k1": 1.5, "b": 0.75, "method": "lucene", "stopwords": "en", "stemmer": "english", "ngram": 1}
    for params in (None, BM25Params.from_dict(old_manifest)):
        bm = BM25.load(tmp_path / "old", ids, params)
        assert bm.params.language == "en"
        scores, idx = bm.search(queries, k=4, show_progress=False)
        np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_allclose(scores, ref_scores, rtol=1e-6)


# ----------------------------------------------------------------------------- wiring: eval, index, mine


def test_eval_language_option(tmp_path):
    data = write_beir(tmp_path / "zh", ZH_CORPUS, ZH_QUERIES, ZH_QRELS)
    p_at_1 = {}
    for language in ("en", "zh"):
        out = tmp_path / f"{language}.json"
        res = runner.invoke(app, ["eval", "--data", str(data), "--language", language, "--out", str(out),
                                  "--no-progress", "--metrics", "p@1"])
        assert res.exit_code == 0, res.output
        p_at_1[language] = json.loads(out.read_text())["metrics"]["p@1"]
    assert p_at_1["zh"] == 1.0 and p_at_1["en"] < 1.0


def test_index_build_records_language_and_searches_with_it(tmp_path, tiny_bert_dir):
    data = write_beir(tmp_path / "zh", ZH_CORPUS, ZH_QUERIES, ZH_QRELS)
    out = tmp_path / "idx"
    res = runner.invoke(app, ["index", "build", "--data", str(data), "--model", str(tiny_bert_dir), "--out", str(out),
                              "--language", "auto", "--precision", "fp32", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert res.output.rstrip().endswith("BM25")  # --language implies --bm25
    info = runner.invoke(app, ["index", "info", "--index", str(out)])
    assert json.loads(info.output)["bm25"]["language"] == "zh"  # auto: resolved and recorded
    res = runner.invoke(app, ["search", "--index", str(out), "熊猫吃竹子吗", "-k", "1", "--mode", "bm25", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.splitlines()[0])["id"] == "d4"
    d6 = {"_id": "d6", "title": "", "text": "大熊猫是中国的国宝。"}
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps(d6, ensure_ascii=False) + "\n")
    res = runner.invoke(app, ["index", "add", "--index", str(out), "--docs", str(new), "--no-progress"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["search", "--index", str(out), "国宝", "-k", "1", "--mode", "bm25", "--json"])
    assert json.loads(res.output.splitlines()[0])["id"] == "d6"  # the rebuilt BM25 kept the language
    grown = write_beir(tmp_path / "zh-grown", ZH_CORPUS + [d6], ZH_QUERIES, ZH_QRELS)  # the index's corpus now
    eval_args = ["eval", "--data", str(grown), "--index", str(out), "--retriever", "bm25", "--no-progress"]
    res = runner.invoke(app, [*eval_args, "--language", "en"])
    assert res.exit_code == 2 and "its BM25 was built for language 'zh', not 'en'" in res.output, res.output
    res = runner.invoke(app, [*eval_args, "--metrics", "p@1", "--out", str(tmp_path / "e.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "e.json").read_text())["metrics"]["p@1"] == 1.0


def test_mine_language_option(tmp_path):
    data = write_beir(tmp_path / "zh", ZH_CORPUS, ZH_QUERIES, ZH_QRELS, split="train")
    out = tmp_path / "mined.jsonl"
    # ranks 1..2 minus the positive: for "熊猫吃竹子吗" (positive d4) the other document about 竹子, d5
    res = runner.invoke(app, ["mine", "--data", str(data), "--out", str(out), "--language", "zh", "--num-negatives",
                              "1", "--rank-from", "1", "--rank-to", "2", "--no-progress"])
    assert res.exit_code == 0, res.output
    rows = {r["query"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["熊猫吃竹子吗"]["negatives"] == ["竹子可以用来做家具和乐器。"]


# ----------------------------------------------------------------------------- real data: XQuAD-R


def _xquad(name: str):
    if not (XQUAD / name / "corpus.jsonl").is_file():
        pytest.skip(f"real data missing: XQuAD-R not found at {XQUAD / name}")
    return XQUAD / name


def _ndcg10(name: str, language: str) -> float:
    from twotower.evaluation.pipeline import EvalConfig, run_eval

    cfg = EvalConfig(data=_xquad(name), language=language, metrics=("ndcg@10",), show_progress=False)
    return run_eval(cfg).metrics["ndcg@10"]


@pytest.fixture(scope="module")
def english_ndcg10() -> float:
    return _ndcg10("en", "en")


@pytest.mark.parametrize("language", ["zh", "th"])
def test_xquad_r_reaches_80_percent_of_english(language, english_ndcg10):
    t0 = time.perf_counter()
    got = _ndcg10(language, language)
    assert english_ndcg10 > 0.8  # measured 0.838
    assert got >= 0.8 * english_ndcg10, (language, got, english_ndcg10)  # measured zh 0.817, th 0.810
    assert time.perf_counter() - t0 < 20


def test_auto_detects_each_xquad_r_language():
    for name in ("ar", "de", "el", "en", "es", "hi", "ru", "th", "tr", "vi", "zh", "pool"):
        texts = [json.loads(line)["text"] for line in (_xquad(name) / "corpus.jsonl").open(encoding="utf-8")]
        assert detect_language(texts) == ("multi" if name == "pool" else name)
