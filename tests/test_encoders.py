"""Encoders on tiny random-weight BERT and T5 models: pooling, normalisation, batching, layouts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from twotower.encoders.backbone import read_layout, resolve_model
from twotower.encoders.inference import encode_texts, resolve_precision
from twotower.encoders.pooling import pool
from twotower.encoders.towers import DualEncoder, EncodeOptions
from twotower.errors import ModelError

TEXTS = ["a short one", "a much longer text that has quite a few more tokens than the others do", "mid length text",
         "x", "another sentence of moderate size here"]


def test_mean_and_cls_pooling_by_hand():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert torch.allclose(pool(hidden, mask, "mean"), torch.tensor([[2.0, 3.0]]))
    assert torch.allclose(pool(hidden, mask, "cls"), torch.tensor([[1.0, 2.0]]))
    assert torch.allclose(pool(hidden, mask, "max"), torch.tensor([[3.0, 4.0]]))
    with pytest.raises(ValueError, match="unknown pooling 'sum'"):
        pool(hidden, mask, "sum")


@pytest.mark.parametrize("fixture", ["tiny_bert_dir", "tiny_t5_dir"])
def test_tiny_models_encode(fixture, request):
    model = DualEncoder.load(request.getfixturevalue(fixture))
    emb = model.encode_documents(TEXTS, EncodeOptions(batch_size=2, precision="fp32", show_progress=False))
    assert emb.shape == (5, 32) and emb.dtype == np.float32
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("fixture", ["tiny_bert_dir", "tiny_t5_dir"])
def test_sorted_batching_keeps_order_and_values(fixture, request):
    """Length-sorted, per-batch padded encoding equals encoding each text alone."""
    model = DualEncoder.load(request.getfixturevalue(fixture))
    batched = encode_texts(model.doc_tower, TEXTS, batch_size=3, precision="fp32", show_progress=False)
    for i, text in enumerate(TEXTS):
        alone = encode_texts(model.doc_tower, [text], batch_size=1, precision="fp32", show_progress=False)
        assert np.allclose(batched[i], alone[0], atol=1e-5)


def test_forward_matches_manual_mean_pooling(tiny_bert_dir):
    model = DualEncoder.load(tiny_bert_dir, normalize=False)
    tower = model.query_tower
    batch = tower.tokenize(["hello world", "hi"])
    with torch.no_grad():
        hidden = tower.backbone(**batch).last_hidden_state
        expected = hidden[1, : int(batch["attention_mask"][1].sum())].mean(0)
        got = tower(batch["input_ids"], batch["attention_mask"])[1]
    assert torch.allclose(got, expected, atol=1e-6)


def test_max_length_truncates(tiny_bert_dir):
    model = DualEncoder.load(tiny_bert_dir, query_max_length=4, doc_max_length=16)
    long = "word " * 50
    q = model.encode_queries([long, "word word"], EncodeOptions(precision="fp32", show_progress=False))
    # with max length 4 ([CLS] word word [SEP]) both texts tokenize identically
    assert np.allclose(q[0], q[1], atol=1e-6)
    d = model.encode_documents([long, "word word"], EncodeOptions(precision="fp32", show_progress=False))
    assert not np.allclose(d[0], d[1], atol=1e-3)


def test_sentence_transformers_layout_is_honoured(tiny_bert_dir, tmp_path):
    """A sentence-transformers directory with CLS pooling and no Normalize loads as such and
    gives the same vectors as sentence-transformers itself."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    word = Transformer(str(tiny_bert_dir), max_seq_length=24)
    pooling = Pooling(word.get_embedding_dimension(), pooling_mode="cls")
    st = SentenceTransformer(modules=[word, pooling], device="cpu")
    st.save(str(tmp_path / "st"))
    layout = read_layout(str(tmp_path / "st"))
    assert layout.pooling == "cls" and layout.normalize is False and layout.max_length == 24
    ours = DualEncoder.load(tmp_path / "st").encode_documents(TEXTS, EncodeOptions(precision="fp32", show_progress=False))
    theirs = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert np.allclose(ours, theirs, atol=1e-5)


def test_default_model_resolves():
    path = resolve_model(None)
    assert (json.loads(open(f"{path}/config.json").read())["model_type"]) == "bert"
    assert resolve_model("sentence-transformers/all-MiniLM-L6-v2") == path


def test_missing_model_directory(tmp_path):
    with pytest.raises(ModelError, match="model directory not found"):
        resolve_model(str(tmp_path / "no" / "such" / "model"))
    with pytest.raises(ModelError, match="cannot read a transformer config"):
        DualEncoder.load(tmp_path)


def _cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo's first ``flags`` line (empty where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return set()
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def test_precision_resolution(monkeypatch):
    """``auto`` on a CPU is bf16 exactly where the CPU has AMX-BF16 or AVX512-BF16 (this machine's
    answer, read from its flags here), fp32 elsewhere; explicit choices are kept."""
    from twotower.encoders import inference

    cpu = torch.device("cpu")
    assert resolve_precision("fp32", cpu) == "fp32" and resolve_precision("bf16", cpu) == "bf16"
    flags = _cpu_flags()
    expected = "bf16" if {"amx_bf16", "avx512_bf16"} & flags else "fp32"
    assert resolve_precision("auto", cpu) == expected, sorted(f for f in flags if "bf16" in f or "amx" in f)
    for fast, answer in ((True, "bf16"), (False, "fp32")):  # both branches, whatever this machine has
        monkeypatch.setattr(inference, "cpu_has_fast_bf16", lambda fast=fast: fast)
        assert resolve_precision("auto", cpu) == answer
        assert resolve_precision("fp32", cpu) == "fp32"
    for supported, answer in ((True, "bf16"), (False, "fp32")):  # a GPU: what CUDA says
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda supported=supported: supported)
        assert resolve_precision("auto", torch.device("cuda")) == answer
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        resolve_precision("fp8", cpu)


def test_hub_id_with_downloads_off_says_how_to_turn_them_on(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what the CLI (and conftest) set: HF_HUB_OFFLINE=1
    with pytest.raises(ModelError) as err:
        DualEncoder.load("some-org/no-such-model")
    message = str(err.value)
    assert message.startswith("some-org/no-such-model: not a local model directory or a registered model name")
    assert "to download it from the hub set HF_HUB_OFFLINE=0" in message
    assert "internet" not in message


@pytest.mark.parametrize("flags,fast", [("fpu avx2 avx512f avx512_bf16", True), ("fpu avx2 amx_tile amx_bf16", True),
                                        ("fpu avx2 avx512f avx512_vnni amx_int8", False), (None, False)])
def test_fast_bf16_flags(flags, fast, monkeypatch, tmp_path):
    """Either AVX512-BF16 or AMX-BF16 is enough; AVX-512 without bf16 is not; no /proc/cpuinfo: fp32."""
    from twotower.encoders import inference

    cpuinfo = tmp_path / "cpuinfo"
    if flags is not None:
        cpuinfo.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: {flags}\n\n")
    monkeypatch.setattr(inference, "Path", lambda _: cpuinfo)
    assert inference.cpu_has_fast_bf16.__wrapped__() is fast  # uncached: the real answer stays cached


@pytest.mark.slow
def test_default_model_equals_sentence_transformers(scifact):
    """fp32 embeddings of the real default model match sentence-transformers' to 1e-4."""
    from sentence_transformers import SentenceTransformer

    from twotower.data.beir import load_corpus
    from twotower.encoders.backbone import default_model_path

    docs = list(load_corpus(scifact / "corpus.jsonl").values())[:48]
    texts = [d.full_text for d in docs]
    st = SentenceTransformer(str(default_model_path()), device="cpu")
    theirs = st.encode(texts, batch_size=16, convert_to_numpy=True, normalize_embeddings=True)
    ours = DualEncoder.load().encode_documents(texts, EncodeOptions(batch_size=16, precision="fp32", show_progress=False))
    assert st.max_seq_length == 256
    assert np.abs(ours - theirs).max() < 1e-4
    fast = DualEncoder.load().encode_documents(texts, EncodeOptions(batch_size=16, precision="bf16", show_progress=False))
    assert (fast * theirs).sum(1).min() > 0.999


@pytest.mark.parametrize("side", ["right", "left"])
def test_fast_token_ids_equal_the_hf_call(scifact, side):
    """The pipeline's tokenization (the backend's encode_batch_fast, issue #47) gives the HF call's ids, special
    tokens and truncation included, on real documents and odd texts; a tokenizer without a fast backend takes the
    HF call."""
    from transformers import AutoTokenizer

    from twotower.data.beir import load_corpus
    from twotower.encoders.backbone import default_model_path
    from twotower.encoders.inference import token_ids

    tok = AutoTokenizer.from_pretrained(str(default_model_path()), truncation_side=side)
    texts = [d.full_text for d in list(load_corpus(scifact / "corpus.jsonl").values())[:200]]
    texts += ["", " ", "a", "Größere Städte – São Paulo, 東京", "word " * 400, "\u200b\t\n", "[SEP] [CLS] x"]
    for max_length in (256, 16):
        ours = token_ids(tok, texts, max_length)
        assert ours == tok(texts, truncation=True, max_length=max_length, padding=False)["input_ids"]
        assert tok.__dict__["_twotower_fast_backends"][max_length] is not None  # the fast path was taken
    assert max(len(x) for x in ours) == 16 and ours[-3][0] == tok.cls_token_id

    class Slow:  # a tokenizer with no fast backend (e.g. a Python-only one): the HF call
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, *args, **kwargs):
            return self.inner(*args, **kwargs)

    assert token_ids(Slow(tok), texts[:5], 32) == tok(texts[:5], truncation=True, max_length=32)["input_ids"]
