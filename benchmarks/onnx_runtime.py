"""ONNX Runtime as an encoding path, against sentence-transformers and twotower's torch fp32, in one run.

The default model's backbone (all-MiniLM-L6-v2) is exported with ``torch.onnx.export`` (input ids and
attention mask → last hidden state, dynamic batch and length) and run by ONNX Runtime's CPU provider
three ways: the plain export (ORT's own graph optimisations at level ALL), the export after
``onnxruntime.transformers.optimizer`` (BERT attention / LayerNorm / GELU fusions), and the plain
export with int8 dynamic quantization of its MatMul weights. Every system sees the same documents in
interleaved slices (so load from other processes falls on all alike), with twotower's batching
(tokenize once, sort by token count, pad per batch) and mean pooling + L2 normalisation in numpy.

Rows: ``docs_per_s``, ``vs_st`` (docs/s ratio to sentence-transformers fp32), ``max_abs_diff`` of
the embeddings against sentence-transformers', and NDCG@10 / Recall@100 on SciFact test when the
whole corpus is encoded (``--limit 0``; ~25 min here).

    python benchmarks/onnx_runtime.py                 # 512 documents: speed and fidelity (~4 min)
    python benchmarks/onnx_runtime.py --limit 0       # whole corpus: adds NDCG@10
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from _common import (encoding_parser, interleaved, load_average, st_encoder, test_documents, vector_metrics,
                     write_results)
from twotower.encoders.inference import encode_texts, length_sorted_batches
from twotower.encoders.towers import DualEncoder


class _LastHidden(torch.nn.Module):
    def __init__(self, backbone: torch.nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def export_onnx(tower, folder: Path) -> dict[str, Path]:
    """The tower's backbone as ONNX: plain, BERT-fused, and int8 dynamic quantization of the plain graph."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    ids = tower.tokenizer(["a short one", "a slightly longer example text"], padding=True, return_tensors="pt")
    plain = folder / "plain.onnx"
    axes = {"b": 0, "s": 1}
    torch.onnx.export(
        _LastHidden(tower.backbone).eval(), (ids["input_ids"], ids["attention_mask"]), str(plain),
        input_names=["input_ids", "attention_mask"], output_names=["hidden"], opset_version=17, dynamo=False,
        dynamic_axes={n: {v: k for k, v in axes.items()} for n in ("input_ids", "attention_mask", "hidden")},
    )
    cfg = tower.backbone.config
    fused = folder / "fused.onnx"
    optimize_model(str(plain), model_type="bert", num_heads=cfg.num_attention_heads,
                   hidden_size=cfg.hidden_size).save_model_to_file(str(fused))
    int8 = folder / "int8.onnx"  # quantize the plain graph: the fused one's contrib ops defeat shape inference
    quantize_dynamic(str(plain), str(int8), weight_type=QuantType.QInt8)
    return {"plain": plain, "fused": fused, "int8": int8}


def ort_encoder(path: Path, tower, *, batch_size: int, max_length: int):
    """texts -> normalised mean-pooled embeddings, batched as twotower's ``encode_texts``."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}  # the optimizer may drop an unused input
    tok = tower.tokenizer

    def encode(texts: list[str]) -> np.ndarray:
        out = np.empty((len(texts), tower.hidden_size), dtype=np.float32)
        for rows, input_ids, mask in length_sorted_batches(tok, texts, max_length, batch_size):
            feed = {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()}
            hidden = session.run(None, {k: v for k, v in feed.items() if k in names})[0]
            m = feed["attention_mask"][..., None].astype(np.float32)
            emb = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
            out[rows] = emb / np.linalg.norm(emb, axis=1, keepdims=True).clip(1e-12)
        return out

    return encode


def main() -> None:
    args = encoding_parser(__doc__, default_limit=512).parse_args()
    import onnxruntime

    ds, doc_ids, texts = test_documents(args)
    full = len(doc_ids) == len(ds.corpus)
    _, st_encode = st_encoder(args)
    model = DualEncoder.load(query_max_length=args.max_length, doc_max_length=args.max_length)
    tower = model.doc_tower.eval()
    kw = {"batch_size": args.batch_size, "max_length": args.max_length}
    systems = {
        "sentence-transformers fp32": st_encode,
        "twotower fp32 (torch)": lambda items: encode_texts(tower, items, precision="fp32", show_progress=False, **kw),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in export_onnx(tower, Path(tmp)).items():
            systems[f"onnxruntime {name}"] = ort_encoder(path, tower, **kw)
        out = interleaved(systems, texts)

    ref_vecs, ref_s = out["sentence-transformers fp32"]
    qids = list(ds.queries)
    query_vecs = encode_texts(model.query_tower, [ds.queries[i] for i in qids], precision="fp32",
                              show_progress=False, **kw) if full else None  # once: every system shares them
    rows = []
    for name, (vecs, seconds) in out.items():
        row = {"system": name, "docs_per_s": len(texts) / seconds, "vs_st": ref_s / seconds,
               "max_abs_diff": float(np.abs(vecs - ref_vecs).max())}
        if full:
            row.update(vector_metrics(ds.qrels, qids, query_vecs, doc_ids, vecs))  # queries by twotower fp32
        rows.append(row)
        print(row)
    notes = (f"{len(texts)} SciFact documents, max length {args.max_length}, batch {args.batch_size}, "
             f"{torch.get_num_threads()} threads, onnxruntime {onnxruntime.__version__}, interleaved 256-document "
             f"slices. vs_st: docs/s over sentence-transformers' fp32 encode. max_abs_diff: embeddings against "
             f"sentence-transformers'. Load average at the end: {load_average():.1f}.")
    write_results("onnx_runtime", rows, notes=notes)


if __name__ == "__main__":
    main()
