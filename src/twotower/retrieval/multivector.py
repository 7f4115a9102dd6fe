"""ME-BERT multi-vector documents (Luan et al., "Sparse, Dense, and Attentional Representations").

A document is represented by its first ``m`` contextual token vectors (``[CLS]`` and the next
m − 1 tokens of the document tower's last layer, optionally projected to ``k`` dims and L2
normalised); a query by its single pooled vector from the query tower. The score of a document
is the maximum over its m inner products with the query. Search puts all m entries of every
document into one (ANN) index, takes the top entries, reduces them to documents and re-scores
those candidates exactly over all of their vectors.

Training with the max score and in-batch negatives is not implemented here yet: with an
off-the-shelf mean-pooled model (the default all-MiniLM-L6-v2) the token vectors were never
trained to match pooled query vectors, so zero-shot m > 1 numbers measure that gap.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from twotower.encoders.encoder import TextEncoder
from twotower.encoders.inference import TOKENIZE_CHUNK, _pad_batch, autocast_context, resolve_precision

log = logging.getLogger(__name__)


def random_projection(in_dim: int, out_dim: int, seed: int = 0) -> np.ndarray:
    """A Gaussian random projection (in_dim, out_dim) scaled by 1/√out_dim (Johnson–Lindenstrauss)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((in_dim, out_dim)) / np.sqrt(out_dim)).astype(np.float32)


def encode_multivector(
    encoder: TextEncoder,
    texts: Sequence[str],
    m: int,
    *,
    max_length: int | None = None,
    batch_size: int = 32,
    precision: str = "auto",
    projection: np.ndarray | None = None,
    normalize: bool = True,
    show_progress: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``m`` token vectors of each text: ``(vectors, offsets)``.

    Text ``i`` owns ``vectors[offsets[i]:offsets[i+1]]`` (fewer than m rows when it has fewer
    tokens, counting [CLS] and [SEP]). ``projection`` (hidden, k) maps each token vector to k dims.
    """
    if m < 1:
        raise ValueError(f"m must be at least 1, got {m}")
    device = next(encoder.parameters()).device
    precision = resolve_precision(precision, device)
    max_length = max_length or encoder.max_length
    tok = encoder.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    per_text: list[np.ndarray | None] = [None] * len(texts)
    proj = torch.from_numpy(projection) if projection is not None else None
    was_training = encoder.training
    encoder.eval()
    bar = tqdm(total=len(texts), desc=f"encoding documents (m={m})", unit="text", disable=not show_progress or not texts)
    try:
        with torch.inference_mode(), autocast_context(precision, device):
            for start in range(0, len(texts), TOKENIZE_CHUNK):
                chunk = list(texts[start : start + TOKENIZE_CHUNK])
                ids = tok(chunk, truncation=True, max_length=max_length, padding=False,
                          return_attention_mask=False, return_token_type_ids=False)["input_ids"]
                order = np.argsort([-len(x) for x in ids], kind="stable")
                for b in range(0, len(order), batch_size):
                    rows = order[b : b + batch_size]
                    input_ids, mask = _pad_batch([ids[i] for i in rows], pad_id)
                    hidden = encoder.backbone(input_ids=input_ids.to(device), attention_mask=mask.to(device)).last_hidden_state
                    first = hidden[:, :m].float().cpu()
                    if proj is not None:
                        first = first @ proj
                    if normalize:
                        first = torch.nn.functional.normalize(first, p=2, dim=-1)
                    lengths = mask[:, :m].sum(dim=1)
                    for j, r in enumerate(rows):
                        per_text[start + r] = first[j, : int(lengths[j])].numpy()
                    bar.update(len(rows))
    finally:
        bar.close()
        encoder.train(was_training)
    counts = np.array([len(v) for v in per_text], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    dim = projection.shape[1] if projection is not None else encoder.backbone.config.hidden_size
    vectors = np.concatenate(per_text, axis=0) if per_text else np.empty((0, dim), np.float32)
    return np.ascontiguousarray(vectors, dtype=np.float32), offsets


def maxsim_scores(queries: np.ndarray, vectors: np.ndarray, offsets: np.ndarray, rows: Sequence[int]) -> np.ndarray:
    """Exact ME-BERT scores (n_queries, len(rows)): max over each document's vectors."""
    out = np.full((len(queries), len(rows)), -np.inf, dtype=np.float32)
    for j, r in enumerate(rows):
        block = np.asarray(vectors[offsets[r] : offsets[r + 1]])
        if len(block):
            out[:, j] = (queries @ block.T).max(axis=1)
    return out


def reduce_to_documents(
    queries: np.ndarray, entries: np.ndarray, vectors: np.ndarray, offsets: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Turn entry hits (n_queries, n) into the top-``k`` documents, re-scored exactly.

    ``entries`` are rows of ``vectors`` (−1 for none); the owner of entry e is the document d
    with offsets[d] <= e < offsets[d+1]. Returns ``(scores, doc_rows)``, (n_queries, k), best
    first, padded with −inf / −1.
    """
    scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
    docs = np.full((len(queries), k), -1, dtype=np.int64)
    for qi in range(len(queries)):
        hits = entries[qi][entries[qi] >= 0]
        cand = np.unique(np.searchsorted(offsets, hits, side="right") - 1)
        if len(cand) == 0:
            continue
        s = maxsim_scores(queries[qi : qi + 1], vectors, offsets, cand)[0]
        top = np.argsort(-s, kind="stable")[:k]
        scores[qi, : len(top)] = s[top]
        docs[qi, : len(top)] = cand[top]
    return scores, docs


def exact_multivector_search(
    queries: np.ndarray, vectors: np.ndarray, offsets: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force ME-BERT search: every entry scored, max per document, top-``k`` documents."""
    q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
    v = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32))
    owner = torch.from_numpy(np.repeat(np.arange(len(offsets) - 1), np.diff(offsets)))
    n_docs = len(offsets) - 1
    with torch.inference_mode():
        entry_scores = q @ v.T  # (nq, E)
        doc_scores = torch.full((len(q), n_docs), float("-inf"))
        doc_scores.scatter_reduce_(1, owner.expand(len(q), -1), entry_scores, reduce="amax")
        s, i = torch.topk(doc_scores, min(k, n_docs), dim=1)
    return s.numpy(), i.numpy()
