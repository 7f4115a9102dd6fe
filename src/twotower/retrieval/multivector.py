"""ME-BERT multi-vector documents (Luan et al., "Sparse, Dense, and Attentional Representations").

A document is represented by its first ``m`` contextual token vectors (``[CLS]`` and the next
m − 1 tokens of the document tower's last layer, through the tower's own projection when it has
one, optionally randomly projected to ``k`` dims, L2 normalised when the tower normalises); a
query by its single pooled vector from the query tower. The score of a document is the maximum
over its m inner products with the query. Search puts all m entries of every document into one
(ANN) index, takes the top entries, reduces them to documents and re-scores those candidates
exactly over all of their vectors.

:func:`document_token_vectors` (backbone → :func:`first_token_vectors`) is the one code path that
makes the m vectors, for indexing (:func:`encode_multivector`) and for training with the max score
and in-batch negatives (``twotower.training.multivector``, ``twotower train --multivector M``), so a
model trained that way is evaluated with exactly the vectors it was trained on; :func:`maxsim` is
the differentiable max score the training loss uses. An off-the-shelf mean-pooled model (the
default all-MiniLM-L6-v2) never trained its token vectors to match pooled query vectors, so
zero-shot m > 1 numbers measure that gap.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from twotower.progress import progress_bar
from twotower.retrieval.index.grouped import maxsim_scores, reduce_to_documents  # numpy only: searches load no torch

from twotower.encoders.encoder import TextEncoder
from twotower.encoders.inference import autocast_context, default_batch_size, length_sorted_batches, resolve_precision

log = logging.getLogger(__name__)

ENTRY_BUDGET = 1 << 26  # query × entry scores :func:`exact_multivector_search` holds at once (256 MiB of float32)


def random_projection(in_dim: int, out_dim: int, seed: int = 0) -> np.ndarray:
    """A Gaussian random projection (in_dim, out_dim) scaled by 1/√out_dim (Johnson–Lindenstrauss)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((in_dim, out_dim)) / np.sqrt(out_dim)).astype(np.float32)


def first_token_vectors(
    tower: TextEncoder,
    hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    m: int,
    *,
    projection: torch.Tensor | None = None,
    normalize: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ME-BERT document vectors from the document tower's last hidden states: ``(vectors, mask)``.

    ``hidden`` (B, T, hidden) and ``attention_mask`` (B, T) of a right-padded batch. Positions
    0..m−1 are taken in float32, mapped by the tower's projection (if it has one) and then by
    ``projection`` (tower dim, k) if given, and L2-normalised when ``normalize`` (default:
    the tower's own setting, so they live where its pooled query vectors do). Returns ``vectors``
    (B, m, dim) and ``mask`` (B, m), True for real tokens; a text with fewer than m tokens (counting
    [CLS] and [SEP]) has padding rows there, which must never be scored (:func:`maxsim`).
    Differentiable: training and indexing both call it.
    """
    if m < 1:
        raise ValueError(f"m must be at least 1, got {m}")
    # (meta tensors, used to check device placement without a GPU, carry no values to check)
    if not attention_mask.is_meta and bool((attention_mask[:, 1:] > attention_mask[:, :-1]).any()):
        raise ValueError("the batch is left-padded: the first m token vectors need right padding "
                         "(set tokenizer.padding_side = 'right')")
    x = hidden[:, :m].float()
    mask = attention_mask[:, :m].bool()
    if x.shape[1] < m:  # every text in the batch is shorter than m tokens
        x = torch.nn.functional.pad(x, (0, 0, 0, m - x.shape[1]))
        mask = torch.nn.functional.pad(mask, (0, m - mask.shape[1]), value=False)
    if tower.projection is not None:
        x = tower.projection(x.to(tower.projection.linear.weight.dtype)).float()
    if projection is not None:
        x = (x @ projection.to(device=x.device, dtype=x.dtype)).float()  # float32 under autocast too
    if tower.normalize if normalize is None else normalize:
        x = torch.nn.functional.normalize(x, p=2, dim=-1)
    return x, mask


def document_token_vectors(
    tower: TextEncoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    m: int,
    *,
    projection: torch.Tensor | None = None,
    normalize: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the tower's backbone on a right-padded batch and return :func:`first_token_vectors`."""
    hidden = tower.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return first_token_vectors(tower, hidden, attention_mask, m, projection=projection, normalize=normalize)


def maxsim(queries: torch.Tensor, vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Differentiable ME-BERT scores (n_queries, n_docs): ``max_t ⟨q_i, d_j,t⟩`` over document j's
    real vectors. ``queries`` (n_queries, dim), ``vectors`` (n_docs, m, dim), ``mask`` (n_docs, m)
    True for real tokens: padding rows score −inf, so they never win the max (a document with no
    real vector scores −inf)."""
    entry = torch.einsum("qk,dtk->qdt", queries.float(), vectors.float())
    return entry.masked_fill(~mask.bool()[None], float("-inf")).amax(dim=-1)


def encode_multivector(
    encoder: TextEncoder,
    texts: Sequence[str],
    m: int,
    *,
    max_length: int | None = None,
    batch_size: int | None = None,
    precision: str = "auto",
    projection: np.ndarray | None = None,
    normalize: bool | None = None,
    show_progress: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``m`` token vectors of each text (:func:`document_token_vectors`): ``(vectors, offsets)``.

    Text ``i`` owns ``vectors[offsets[i]:offsets[i+1]]`` (fewer than m rows when it has fewer
    tokens, counting [CLS] and [SEP]). ``projection`` (tower dim, k) maps each token vector to k
    dims; ``normalize`` defaults to the tower's own setting.
    """
    if m < 1:
        raise ValueError(f"m must be at least 1, got {m}")
    device = next(encoder.parameters()).device
    precision = resolve_precision(precision, device)
    batch_size = batch_size or default_batch_size(device)
    max_length = max_length or encoder.max_length
    texts = encoder.with_prompt(texts, "document")  # these are always documents (queries are pooled)
    per_text: list[np.ndarray | None] = [None] * len(texts)
    proj = torch.from_numpy(np.asarray(projection, dtype=np.float32)).to(device) if projection is not None else None
    was_training = encoder.training
    encoder.eval()
    bar = progress_bar(total=len(texts), desc=f"encoding documents (m={m})", unit="text", disable=not show_progress or not texts)
    try:
        with torch.inference_mode(), autocast_context(precision, device):
            for rows, input_ids, mask in length_sorted_batches(encoder.tokenizer, texts, max_length, batch_size):
                vecs, keep = document_token_vectors(encoder, input_ids.to(device), mask.to(device), m,
                                                    projection=proj, normalize=normalize)
                vecs, lengths = vecs.cpu(), keep.sum(dim=1).cpu()
                for j, r in enumerate(rows):
                    per_text[r] = vecs[j, : int(lengths[j])].numpy()
                bar.update(len(rows))
    finally:
        bar.close()
        encoder.train(was_training)
    counts = np.array([len(v) for v in per_text], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    dim = projection.shape[1] if projection is not None else encoder.dim
    vectors = np.concatenate(per_text, axis=0) if per_text else np.empty((0, dim), np.float32)
    return np.ascontiguousarray(vectors, dtype=np.float32), offsets


def exact_multivector_search(
    queries: np.ndarray, vectors: np.ndarray, offsets: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force ME-BERT search (or MaxP over passages): every entry scored, max per document, top-``k``
    documents; queries in runs that hold at most :data:`ENTRY_BUDGET` entry scores at a time."""
    q_all = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
    v = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32))
    owner = torch.from_numpy(np.repeat(np.arange(len(offsets) - 1), np.diff(offsets)))
    n_docs = len(offsets) - 1
    step = max(1, ENTRY_BUDGET // max(1, len(v)))
    parts = []
    with torch.inference_mode():
        for start in range(0, max(1, len(q_all)), step):
            q = q_all[start:start + step]
            entry_scores = q @ v.T  # (nq, E)
            doc_scores = torch.full((len(q), n_docs), float("-inf"))
            doc_scores.scatter_reduce_(1, owner.expand(len(q), -1), entry_scores, reduce="amax")
            parts.append(torch.topk(doc_scores, min(k, n_docs), dim=1))
    return torch.cat([s for s, _ in parts]).numpy(), torch.cat([i for _, i in parts]).numpy()
