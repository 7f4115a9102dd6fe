"""The ONNX query tower kept on disk, so that an index opened in a new process encodes its first query without
loading PyTorch or the model's weights: an ONNX Runtime session over the exported query tower
(:mod:`twotower.encoders.onnx_runtime`), the model's fast tokenizer (the ``tokenizers`` library alone) and its query
prefix.

The cache lives in ``$TWOTOWER_HOME/onnx-queries`` (default ``~/.cache/twotower``), one entry per model: its key is
the SHA-256 of the model directory's path, each file's name, size and modification time, the query length and the
versions of torch, onnx and ONNX Runtime that made it. An entry holds the exported graph, optimized once by ONNX Runtime, and the
torch tower's embeddings of a few probe texts; on load the session encodes the probes again and is used only if every value is
within :data:`TOLERANCE` of torch's (a tokenizer or runtime that reads the model
otherwise is caught there, and the query tower is exported anew). Entries are written atomically; a cache that
cannot be written is skipped with a log line, never an error.

One query at a time is what it is for: the session runs on one thread (a busy machine's other work does not slow a
batch-1 query down as it slows many threads), so batches of thousands are better encoded by torch.

Example::

    from twotower.encoders.onnx_cache import load_cached

    fast = load_cached(model_dir, query_max_length=256)   # None when nothing usable is cached
    vectors = fast.encode_queries(["what is green tea"]) if fast else None
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

CACHE_VERSION = 1
TOLERANCE = 1e-4  # max |Δ| between ORT and torch embeddings (unit vectors) on the probe texts
PROBE_TEXTS = (
    "what is the effect of vitamin d on bone density?",
    "a",
    "Mean pooling averages the token vectors of a text; padding must not count. " * 3,
)


def cache_dir() -> Path:
    return Path(os.environ.get("TWOTOWER_HOME") or Path.home() / ".cache" / "twotower") / "onnx-queries"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def cache_key(model_dir: str | Path, query_max_length: int) -> str | None:
    """The cache key of the model in ``model_dir`` (None: not a local directory)."""
    root = Path(model_dir)
    if not root.is_dir():
        return None
    parts = [f"v{CACHE_VERSION}", str(root.resolve()), str(int(query_max_length))]
    parts += [f"{p}={_version(p)}" for p in ("torch", "onnx", "onnxruntime", "tokenizers")]
    for path in sorted(root.rglob("*")):
        if path.is_file():
            st = path.stat()
            parts.append(f"{path.relative_to(root).as_posix()}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()[:32]


class CachedQueries:
    """``encode_queries(queries)``: the query tower on ONNX Runtime behind the model's fast tokenizer and prefix."""

    def __init__(self, session, tokenizer, *, prefix: str, dim: int) -> None:
        self.session, self.tokenizer, self.prefix, self.dim = session, tokenizer, prefix, dim
        self.inputs = {i.name for i in session.get_inputs()}

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):  # one at a time: no padding, nothing to mask
            enc = self.tokenizer.encode(text)
            ids = np.asarray([enc.ids], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": np.asarray([enc.attention_mask], dtype=np.int64),
                    "token_type_ids": np.zeros_like(ids)}
            out[i] = self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})[0][0]
        return out

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self.encode([self.prefix + q for q in queries] if self.prefix else list(queries))


def _session(model: bytes | str, *, optimized_to: str | None = None):
    """A one-thread CPU session over ``model``: a graph optimized already (the cache's ``query.opt.onnx``) loads
    with no optimization pass; ``optimized_to``: optimize (ORT's extended level: no layouts of one CPU kind) and
    write the optimized graph there."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    level = ort.GraphOptimizationLevel
    opts.graph_optimization_level = level.ORT_ENABLE_EXTENDED if optimized_to else level.ORT_DISABLE_ALL
    if optimized_to:
        opts.optimized_model_filepath = optimized_to
    opts.log_severity_level = 3
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def _tokenizer(model_dir: Path, max_length: int):
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    return tok


def load_cached(model_dir: str | Path, *, query_max_length: int) -> CachedQueries | None:
    """The cached query encoder of the model in ``model_dir``, checked on the probe texts; None when there is
    none, it cannot be read, or it no longer matches what torch made."""
    key = cache_key(model_dir, query_max_length)
    if key is None:
        return None
    entry = cache_dir() / key
    try:
        info = json.loads((entry / "info.json").read_text(encoding="utf-8"))
        probes = np.load(entry / "probes.npy")
        tok = _tokenizer(Path(model_dir), query_max_length)
        if tok is None:
            return None
        fast = CachedQueries(_session(str(entry / "query.opt.onnx")), tok, prefix=info["prefix"],
                             dim=int(info["dim"]))
        diff = float(np.abs(fast.encode(list(PROBE_TEXTS)) - probes).max())
    except FileNotFoundError:
        return None
    except Exception as exc:  # a damaged entry, a runtime that cannot read it: torch it is, and a new export
        log.info("cached ONNX query tower at %s not used: %s", entry, exc)
        return None
    if not diff <= TOLERANCE:
        log.info("cached ONNX query tower at %s differs from torch by %.1e: exported again", entry, diff)
        return None
    return fast


def save_cached(model_dir: str | Path, *, query_max_length: int, model_bytes: bytes, prefix: str, dim: int,
                probes: np.ndarray) -> None:
    """Keep an exported query tower (``model_bytes``) and torch's ``probes`` embeddings (of
    :data:`PROBE_TEXTS` as they are, no prefix) for the model in ``model_dir``;
    nothing when the cache cannot be written."""
    import tempfile

    key = cache_key(model_dir, query_max_length)
    if key is None:
        return
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
        _session(model_bytes, optimized_to=str(tmp / "query.opt.onnx"))  # optimized once, loaded as it is
        np.save(tmp / "probes.npy", np.asarray(probes, dtype=np.float32))
        (tmp / "info.json").write_text(json.dumps({"prefix": prefix, "dim": int(dim), "model": str(model_dir),
                                                   "query_max_length": int(query_max_length)}), encoding="utf-8")
        try:
            os.replace(tmp, root / key)  # atomic; another process that won the race keeps its own
        except OSError:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    except Exception as exc:  # a full disk, a read-only home, ORT refusing to write: not cached, nothing else
        log.info("ONNX query tower not cached (%s): the next process exports it again", exc)


__all__ = ["CachedQueries", "cache_dir", "cache_key", "load_cached", "save_cached"]
