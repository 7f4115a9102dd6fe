"""Language-bias removal (``twotower models align-languages``): checked against numpy's SVD done by hand, against
sentence-transformers loading the saved model, and on bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import write_beir
from twotower.errors import TwoTowerError

THINGS = "cat dog tree river stone bird fish apple train house garden window".split()
DINGE = "Katze Hund Baum Fluss Stein Vogel Fisch Apfel Zug Haus Garten Fenster".split()
WU = "猫狗树河石鸟鱼果车房园窗"


def _docs():
    docs, truth = [], []
    for i in range(24):
        a, b = i % 12, (i * 5 + 1) % 12
        docs.append((f"the {THINGS[a]} is in the {THINGS[b]} and it is not with the {THINGS[(a + b) % 12]}", "en"))
        docs.append((f"der {DINGE[a]} ist in dem {DINGE[b]} und er ist nicht bei dem {DINGE[(a + b) % 12]}", "de"))
        docs.append((f"{WU[a]}在{WU[b]}里面，它不和{WU[(a + b) % 12]}在一起的时候很安静", "zh"))
    corpus = [{"_id": f"d{i}", "text": t} for i, (t, _) in enumerate(docs)]
    return corpus, [lang for _, lang in docs]


@pytest.fixture(scope="module")
def aligned(tiny_bert_dir, tmp_path_factory):
    from twotower.encoders.language_bias import align_languages
    from twotower.encoders.towers import EncodeOptions

    root = tmp_path_factory.mktemp("align")
    corpus, truth = _docs()
    data = write_beir(root / "data", corpus, [{"_id": "q", "text": "cat"}], [("q", "d0", 1)], split="test")
    report = align_languages(str(tiny_bert_dir), data, root / "out",
                             opts=EncodeOptions(precision="fp32", show_progress=False))
    return data, root / "out", report, corpus, truth


def test_languages_are_detected_per_document(aligned):
    _, out, report, _, truth = aligned
    assert report["languages"] == {"de": 24, "en": 24, "zh": 24} and report["directions"] == 2
    assert json.loads((out / "language_directions.json").read_text()) == report


def test_removal_matches_a_hand_computed_lir(aligned, tiny_bert_dir):
    """The aligned model's vectors = normalise(v − BᵀBv), B = the top 2 right singular vectors of the matrix of
    per-language means of the original model's unit vectors (numpy, languages from the generator, not detection)."""
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    _, out, _, corpus, truth = aligned
    opts = EncodeOptions(precision="fp32", show_progress=False)
    texts = [d["text"] for d in corpus]
    v = DualEncoder.load(str(tiny_bert_dir)).encode_documents(texts, opts).astype(np.float64)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    labels = np.array(truth)
    means = np.stack([v[labels == lang].mean(0) for lang in ("de", "en", "zh")])
    basis = np.linalg.svd(means, full_matrices=False)[2][:2]
    want = v - (v @ basis.T) @ basis
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    model = DualEncoder.load(str(out))
    got = model.encode_documents(texts, opts)
    assert np.min(np.sum(got * want, axis=1)) > 0.9999
    new = model.encode_queries(["a stone by the river", "树和鸟"], opts)  # queries too, any language
    assert np.abs(new @ basis.T).max() < 1e-4
    raw = DualEncoder.load(str(tiny_bert_dir)).encode_queries(["a stone by the river", "树和鸟"], opts)
    assert np.abs(raw @ basis.T).max() > 0.01  # the original had them


def test_sentence_transformers_loads_the_aligned_model(aligned):
    from sentence_transformers import SentenceTransformer

    from twotower.encoders.towers import DualEncoder, EncodeOptions

    _, out, _, corpus, _ = aligned
    texts = [d["text"] for d in corpus[:12]]
    ours = DualEncoder.load(str(out)).encode_documents(texts, EncodeOptions(precision="fp32", show_progress=False))
    theirs = SentenceTransformer(str(out), device="cpu").encode(texts, normalize_embeddings=False)
    assert np.allclose(ours, theirs, atol=1e-5)


def test_bad_input_stops_before_work(aligned, tiny_bert_dir, tmp_path):
    from typer.testing import CliRunner

    from twotower.cli import app
    from twotower.encoders.language_bias import align_languages

    data = aligned[0]
    one = write_beir(tmp_path / "en", [{"_id": f"d{i}", "text": f"the {w} is in the house"} for i, w in
                                       enumerate(THINGS * 2)], [{"_id": "q", "text": "x"}], [("q", "d0", 1)],
                     split="test")
    with pytest.raises(TwoTowerError, match=r"at least two languages; found en \(24\)"):
        align_languages(str(tiny_bert_dir), one, tmp_path / "o1")
    with pytest.raises(TwoTowerError, match="directions=4: from 1 to the number of languages found"):
        align_languages(str(tiny_bert_dir), data, tmp_path / "o2", directions=4)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    runner = CliRunner()
    res = runner.invoke(app, ["models", "align-languages", "--data", str(data), "--out", str(tmp_path / "full"),
                              "--model", str(tiny_bert_dir), "--no-progress"])
    assert res.exit_code == 2 and "not an empty folder" in res.output and "Traceback" not in res.output
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    (tmp_path / "afile").write_text("mine")
    res = runner.invoke(app, ["models", "align-languages", "--data", str(data), "--out", str(tmp_path / "afile"),
                              "--model", str(tiny_bert_dir), "--no-progress"])
    assert res.exit_code == 2 and "not a directory" in res.output and (tmp_path / "afile").read_text() == "mine"
    res = runner.invoke(app, ["models", "align-languages", "--data", str(tmp_path / "nope"), "--out",
                              str(tmp_path / "o3")])
    assert res.exit_code == 2 and "corpus.jsonl" in res.output
    assert not any((tmp_path / name).exists() for name in ("o1", "o2", "o3"))


def test_fit_without_labels_aligns_a_multilingual_encoder_on_mixed_documents(aligned, tiny_bert_dir, tmp_path):
    """No training labels, documents in three languages, an encoder registered as multilingual: fit keeps dense
    alone and writes the encoder with its language directions removed — the same model `align-languages` writes
    (checked against a hand-computed LIR above) — and a rerun resumes the stage instead of redoing it."""
    import shutil

    from twotower.encoders.registry import MARKER
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.training.fit import FitOptions, FitRecipe, run_fit

    data, aligned_dir, report, corpus, _ = aligned
    encoder = tmp_path / "encoder"
    shutil.copytree(tiny_bert_dir, encoder)
    (encoder / MARKER).write_text(json.dumps({"name": "multilingual-e5-small"}))  # registered as multilingual
    mixed = write_beir(tmp_path / "mixed", corpus, [{"_id": "q1", "text": "cat"}, {"_id": "q2", "text": "der Hund"},
                                                    {"_id": "q3", "text": "猫在"}], [("q1", "d0", 1)], split="test")
    opts = FitOptions(show_progress=False, precision="fp32")
    result = run_fit(mixed, tmp_path / "out", FitRecipe(model=str(encoder)), opts)
    choices = result.report["choices"]
    assert (choices["model"], choices["mode"]) == ("align", "dense")
    assert result.report["stages"]["align"]["languages"] == report["languages"] and "language bias removed" in result.message

    enc = EncodeOptions(precision="fp32", show_progress=False)
    texts = [d["text"] for d in corpus]
    fitted = DualEncoder.load(str(result.model)).encode_documents(texts, enc)
    np.testing.assert_allclose(fitted, DualEncoder.load(str(aligned_dir)).encode_documents(texts, enc), atol=1e-5)
    plain = DualEncoder.load(str(tiny_bert_dir)).encode_documents(texts, enc)
    assert not np.allclose(fitted, plain, atol=1e-3)  # the removal is there

    again = run_fit(mixed, tmp_path / "out", FitRecipe(model=str(encoder)), opts)
    assert "align" not in again.computed and again.report["choices"]["model"] == "align"


def test_fit_without_labels_skips_alignment_for_one_language_documents(tiny_bert_dir, tmp_path):
    """Queries in several languages against English documents only (XQuAD-R to-en's shape): dense alone, and no
    language directions to remove — fit says so and keeps the zero-shot encoder."""
    import shutil

    from twotower.encoders.registry import MARKER
    from twotower.training.fit import FitOptions, FitRecipe, run_fit

    encoder = tmp_path / "encoder"
    shutil.copytree(tiny_bert_dir, encoder)
    (encoder / MARKER).write_text(json.dumps({"name": "multilingual-e5-small"}))
    corpus = [{"_id": d["_id"], "text": d["text"]} for d, lang in zip(*_docs()) if lang == "en"]
    data = write_beir(tmp_path / "en", corpus, [{"_id": "q1", "text": "der Hund"}, {"_id": "q2", "text": "猫在"}],
                      [("q1", corpus[0]["_id"], 1)], split="test")
    result = run_fit(data, tmp_path / "out", FitRecipe(model=str(encoder)), FitOptions(show_progress=False,
                                                                                       precision="fp32"))
    assert (result.report["choices"]["model"], result.report["choices"]["mode"]) == ("zeroshot", "dense")
    assert "language-bias removal skipped" in result.message and "at least two languages" in result.message
