"""Language-bias removal for multilingual encoders (LIR: Yang, Yang, Cer & Darve 2021, "A Simple and Effective
Method To Eliminate the Self Language Bias in Multilingual Representations").

A multilingual encoder places texts of one language near each other whatever they say, so a question in Greek
ranks Greek sentences above the right answer in Hindi (XQuAD-R ``pool``: most of multilingual-e5-small's top 10
are in the question's own language). LIR takes the mean vector of each language, finds the directions those
means span (SVD of the languages × dimensions matrix) and projects them out of every vector:
``v ↦ normalise(v − Bᵀ(Bv))``. The languages are needed only to find the directions: they are detected per
document here (``data.language.detect_language``, one text at a time), and the removal itself is a fixed
linear map, stored as the towers' projection (a sentence-transformers ``Dense`` module, composed with any
projection the model already has), so every path that encodes — eval, index, search, serve, train — applies it,
to queries and documents alike, without knowing any text's language.
"""

from __future__ import annotations

import io
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from twotower.checks import flag, given
from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)

MIN_DOCS = 20  # a language needs at least this many documents (and MIN_SHARE of them) to give a mean
MIN_SHARE = 0.01


@dataclass
class LanguageDirections:
    basis: np.ndarray  # (r, dim), orthonormal rows: the directions removed
    languages: dict[str, int]  # language -> documents whose vectors gave its mean
    singular_values: list[float]  # of the language-mean matrix, largest first

    def to_json(self) -> dict:
        return {"directions": int(self.basis.shape[0]), "languages": self.languages,
                "singular_values": [round(float(s), 5) for s in self.singular_values]}


def sample_by_language(texts: Sequence[str], *, per_language: int, seed: int = 0) -> dict[str, list[int]]:
    """Indices of ``texts`` by detected language (languages with at least ``MIN_DOCS`` texts and ``MIN_SHARE`` of
    them; ``multi`` — undetermined — left out), at most ``per_language`` of each, seeded."""
    from twotower.data.language import detect_language

    groups: dict[str, list[int]] = {}
    for i, text in enumerate(texts):
        groups.setdefault(detect_language([text]), []).append(i)
    floor = max(MIN_DOCS, MIN_SHARE * len(texts))
    rng = random.Random(seed)
    kept = {}
    for lang, idx in sorted(groups.items()):
        if lang == "multi" or len(idx) < floor:
            continue
        kept[lang] = sorted(rng.sample(idx, per_language)) if len(idx) > per_language else idx
    return kept


def language_directions(vectors: np.ndarray, groups: dict[str, Sequence[int]],
                        directions: int | None = None) -> LanguageDirections:
    """The top ``directions`` (default: one fewer than the languages) right singular vectors of the matrix of the
    languages' mean (L2-normalised) vectors."""
    if len(groups) < 2:
        found = ", ".join(f"{k} ({len(v)})" for k, v in groups.items()) or "none"
        raise TwoTowerError(f"language-bias removal needs documents in at least two languages; found {found} "
                            f"(a language counts with at least {MIN_DOCS} documents and {MIN_SHARE:.0%} of them)")
    r = len(groups) - 1 if directions is None else directions
    if not 1 <= r <= len(groups):
        raise TwoTowerError(f"{given('directions', directions)}: from 1 to the number of languages found "
                            f"({len(groups)}: {', '.join(groups)})")
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    means = np.stack([unit[list(idx)].mean(axis=0) for idx in groups.values()]).astype(np.float64)
    _, s, vt = np.linalg.svd(means, full_matrices=False)
    return LanguageDirections(basis=vt[:r].astype(np.float32), languages={k: len(v) for k, v in groups.items()},
                              singular_values=s.tolist())


def remove_directions(model, basis: np.ndarray) -> None:
    """Put ``v ↦ v − Bᵀ(Bv)`` after each tower's output (composed into its projection, or as a new one), in place."""
    basis_t = torch.as_tensor(basis, dtype=torch.float64)
    compose_linear(model, torch.eye(basis_t.shape[1], dtype=torch.float64) - basis_t.T @ basis_t)


def compose_linear(model, matrix) -> None:
    """Put ``v ↦ Mv`` (``M``: dim × dim) after each tower's output (composed into its projection, or as a new
    one), in place: language-direction removal, a translation map (``encoders.translation_align``)."""
    from twotower.encoders.encoder import Projection

    keep = torch.as_tensor(np.asarray(matrix), dtype=torch.float64)
    done: set[int] = set()
    for tower in (model.query_tower, model.doc_tower):
        if id(tower) in done:
            continue
        done.add(id(tower))
        proj = tower.projection
        if proj is None:
            if keep.shape != (tower.hidden_size, tower.hidden_size):
                raise TwoTowerError(f"a {tuple(keep.shape)} map cannot follow the model's {tower.hidden_size}-"
                                    "dimensional vectors")
            new = Projection(tower.hidden_size, tower.hidden_size, bias=False)
            with torch.no_grad():
                new.linear.weight.copy_(keep.to(new.linear.weight.dtype))
            tower.projection = new.to(next(tower.backbone.parameters()).device)
            continue
        if id(proj) in done:  # towers sharing one projection (ade-spl): composed once
            continue
        done.add(id(proj))
        if proj.layer_norm is not None:
            raise TwoTowerError("the model's projection ends in a layer norm: the removal cannot be composed into it")
        if proj.out_features != keep.shape[1]:
            raise TwoTowerError(f"the directions have {keep.shape[1]} dimensions, the model's vectors "
                                f"{proj.out_features}")
        with torch.no_grad():
            w = proj.linear.weight
            w.copy_((keep @ w.double().cpu()).to(w.dtype).to(w.device))
            if proj.linear.bias is not None:
                b = proj.linear.bias
                b.copy_((keep @ b.double().cpu()).to(b.dtype).to(b.device))


def align_languages(model: str | None, data: str | Path, out: str | Path, *, per_language: int = 1000,
                    directions: int | None = None, seed: int = 0, opts=None) -> dict:
    """Write ``model`` with the language directions of ``data``'s documents removed to ``out`` (a new or empty
    folder), and ``out/language_directions.json`` (languages found, documents used, singular values); returns it."""
    from twotower.data.beir import load_corpus
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.io import atomic_write_bytes, atomic_write_json, check_output_dir

    data, out = Path(data), Path(out)
    if per_language < MIN_DOCS:
        raise TwoTowerError(f"{given('per_language', per_language)}: at least {MIN_DOCS}")
    if directions is not None and directions < 1:
        raise TwoTowerError(f"{given('directions', directions)}: at least 1")
    if not (data / "corpus.jsonl").is_file():
        raise TwoTowerError(f"{given('data', data)}: no corpus.jsonl (pass a BEIR-format directory)")
    check_output_dir(out, flag("out"))  # a folder path, its parent writable
    if out.is_dir() and any(out.iterdir()):
        raise TwoTowerError(f"{given('out', out)}: exists and is not an empty folder; give a new one")
    texts = [doc.full_text for doc in load_corpus(data / "corpus.jsonl").values()]
    groups = sample_by_language(texts, per_language=per_language, seed=seed)
    if len(groups) < 2 or (directions is not None and directions > len(groups)):
        language_directions(np.zeros((0, 1)), groups, directions)  # raises, naming the languages found
    encoder = DualEncoder.load(model)
    order = [i for idx in groups.values() for i in idx]
    vecs = encoder.encode_documents([texts[i] for i in order], opts or EncodeOptions())
    row = {i: n for n, i in enumerate(order)}
    found = language_directions(vecs, {k: [row[i] for i in v] for k, v in groups.items()}, directions)
    remove_directions(encoder, found.basis)
    encoder.save(out)
    report = {"model": model or "all-MiniLM-L6-v2", "data": str(data), **found.to_json()}
    buf = io.BytesIO()
    np.save(buf, found.basis)
    atomic_write_bytes(out / "language_directions.npy", buf.getvalue())
    atomic_write_json(out / "language_directions.json", report)
    return report
