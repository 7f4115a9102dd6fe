"""Retrieval choices that travel with a model: the mode (dense | bm25 | hybrid | rrf), the hybrid λ and an optional
cross-encoder re-ranker, as ``twotower fit`` tuned them on held-out dev queries.

They live in the model directory's ``twotower.json`` under ``"retrieval"``::

    "retrieval": {"mode": "hybrid", "lambda": 0.45, "norm": "zscore", "rerank": "reranker", "rerank_depth": 100,
                  "language": "zh"}

``rerank`` is a path relative to the model directory (the re-ranker is copied inside it, so the model
directory moves as one piece). ``eval``, ``index build``, ``search`` and ``serve`` given such a model use these
unless told otherwise (an explicit ``--retriever`` / ``--mode`` / ``--lambda`` / ``--rerank``). ``language``: the
text analysis of the BM25 side (``retrieval.analyzers``; the data's language as fit found it), used by ``eval``
and ``index build`` unless given ``--language``; absent: English, as before. ``norm``: how the hybrid
normalises each side's scores per query (``retrieval.hybrid.NORMS``), used by ``eval``, ``search`` and ``serve``
unless given ``--fusion-norm``; absent: min-max, as before. ``rerank_weight``: the re-ranker's share when its
scores are blended with the first stage's (``retrieval.rerank.blend``), used with the re-ranker by ``eval`` and
``search``; absent: the re-ranker ranks alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from twotower.errors import ModelError
from twotower.io import atomic_write_json

MODES = ("dense", "bm25", "hybrid", "rrf")  # bm25: fit without labels, an encoder that lacks the language
CONFIG_NAME = "twotower.json"  # the dual encoder's own config (encoders/io.py)


@dataclass(frozen=True)
class RetrievalDefaults:
    mode: str = "dense"
    lam: float | None = None  # hybrid λ (dense weight); None outside hybrid
    rerank: str | None = None  # re-ranker directory, relative to the model directory
    rerank_depth: int = 100
    language: str | None = None  # BM25's analysis for hybrid / RRF (None: the commands' default, English)
    norm: str | None = None  # the hybrid's per-query score normalisation (retrieval.hybrid.NORMS; None: minmax)
    rerank_weight: float | None = None  # the re-ranker's share in retrieval.rerank.blend (None: it ranks alone)

    @property
    def needs_bm25(self) -> bool:
        return self.mode in ("bm25", "hybrid", "rrf")

    def rerank_path(self, model_dir: str | Path) -> str | None:
        return str(Path(model_dir) / self.rerank) if self.rerank else None

    def to_json(self) -> dict:
        out = {"mode": self.mode, "lambda": self.lam, "rerank": self.rerank, "rerank_depth": self.rerank_depth,
               "language": self.language, "norm": self.norm, "rerank_weight": self.rerank_weight}
        return {k: v for k, v in out.items() if v is not None}


def _check(raw: object, where: Path) -> RetrievalDefaults:
    if not isinstance(raw, dict):
        raise ModelError(f"{where}: 'retrieval' must be an object like {{\"mode\": \"hybrid\", \"lambda\": 0.5}}")
    mode = raw.get("mode", "dense")
    if mode not in MODES:
        raise ModelError(f"{where}: retrieval mode '{mode}': choose one of {', '.join(MODES)}")
    lam = raw.get("lambda")
    if lam is not None and (isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0 <= lam <= 1):
        raise ModelError(f"{where}: retrieval lambda {lam!r}: a number from 0 to 1")
    rerank = raw.get("rerank")
    if rerank is not None and (not isinstance(rerank, str) or Path(rerank).is_absolute() or ".." in Path(rerank).parts):
        raise ModelError(f"{where}: retrieval rerank {rerank!r}: a folder inside the model directory")
    depth = raw.get("rerank_depth", 100)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ModelError(f"{where}: retrieval rerank_depth {depth!r}: a whole number of at least 1")
    language = raw.get("language")
    if language is not None:
        from twotower.retrieval.analyzers import LANGUAGES

        if not isinstance(language, str) or language not in LANGUAGES:  # a code, not 'auto': fit stores what it found
            raise ModelError(f"{where}: retrieval language {language!r}: a BM25 language code such as en, de, zh "
                             "(or leave it out for English)")
    norm = raw.get("norm")
    if norm is not None:
        from twotower.retrieval.hybrid import NORMS

        if norm not in NORMS:
            raise ModelError(f"{where}: retrieval norm {norm!r}: one of {', '.join(NORMS)} (or leave it out: minmax)")
    weight = raw.get("rerank_weight")
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight <= 1):
        raise ModelError(f"{where}: retrieval rerank_weight {weight!r}: a number from 0 to 1")
    return RetrievalDefaults(mode=mode, lam=None if lam is None else float(lam), rerank=rerank, rerank_depth=depth,
                             language=language, norm=norm, rerank_weight=None if weight is None else float(weight))


def read_defaults(model: str | Path | None) -> RetrievalDefaults | None:
    """The retrieval choices stored with ``model`` (a directory), or None when it stores none (any model that
    ``twotower fit`` did not make: a name, a hub id, a plain directory)."""
    if not model:
        return None
    path = Path(str(model)) / CONFIG_NAME
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None  # encoders.io.read_dual_config reports a malformed config when the model loads
    if not isinstance(config, dict) or "retrieval" not in config:
        return None
    return _check(config["retrieval"], path)


def write_defaults(model_dir: str | Path, defaults: RetrievalDefaults | None) -> None:
    """Store ``defaults`` in ``model_dir``'s twotower.json (None: remove them), atomically."""
    path = Path(model_dir) / CONFIG_NAME
    config = json.loads(path.read_text())
    if defaults is None:
        config.pop("retrieval", None)
    else:
        _check(defaults.to_json(), path)
        config["retrieval"] = defaults.to_json()
    atomic_write_json(path, config)

