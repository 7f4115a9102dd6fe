"""The bodies of fixtures several test files repeated: a small index built once per module and a private copy of it
per test, and the deterministic embedding of your own the tests of ``embedding=`` use. Each file keeps its own
fixture (its name, scope and corpus) and calls these, so that a file still reads whole."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np


def build_small_index(path: Path, corpus, encoder) -> Path:
    """``corpus`` indexed at ``path`` by ``encoder`` (a model directory) in fp32, with BM25; returns ``path``."""
    import twotower as tt

    tt.Index.build(path, corpus, encoder=str(encoder), bm25=True, precision="fp32", show_progress=False)
    return path


def private_copy(built: Path, tmp_path: Path) -> Path:
    """A copy of the index folder ``built`` at ``tmp_path / "index"`` (a test that writes gets its own)."""
    target = tmp_path / "index"
    shutil.copytree(built, target)
    return target


def hash_vectors(texts, dim: int) -> np.ndarray:
    """A deterministic embedding: each text's vector drawn from its SHA-256 (documents and queries alike)."""
    out = []
    for t in texts:
        seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little")
        out.append(np.random.default_rng(seed).normal(size=dim))
    return np.array(out)
