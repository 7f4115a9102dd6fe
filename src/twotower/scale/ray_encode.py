"""Distributed corpus encoding on Ray: Ray Data ``map_batches`` over a pool of actors holding the model.

The driver tokenizes the corpus once (cheap) only to plan the padded batches exactly as
:func:`twotower.encoders.inference.encode_texts` forms them in one process (per 16k-text chunk,
longest first, ``batch_size`` texts per batch). Each Ray row is one such batch; an actor encodes it
as one padded batch, so every vector is computed from the same tensor as in a single process and
the result equals single-process encoding (the same kernels on the same shapes).

The vectors come back through Ray's object store: nodes need no shared file system. The driver
writes every finished batch as a shard (``<out>.ray-shards/batch-*.npz``, atomically), so a killed
run resumes with the batches it has; when all are there it merges them into one array and
:meth:`IndexStore.build` writes the usual index format. One actor per CPU (or per GPU with
``gpus_per_worker``) by default.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from twotower.checks import given
from twotower.errors import TwoTowerError
from twotower.io import atomic_write_bytes, atomic_write_json

log = logging.getLogger(__name__)


@dataclass
class RayConfig:
    """Where and how wide to run. ``address``: None (join a running ``ray.init`` or start a local
    one), ``"local"`` (always a new local instance), ``"auto"`` (the cluster this machine belongs to)
    or ``"ray://host:10001"`` (Ray Client)."""

    address: str | None = None
    workers: int | None = None  # actors; default: one per GPU (gpus_per_worker > 0) or per CPU
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    batches_per_call: int = 4  # padded batches an actor encodes per call
    # Ray restarts of an actor that died. 0: the run stops with Ray's error, and running it again resumes from the
    # shards written so far. Ray Data's own default (-1, restart forever) makes Ray log an error-level line for
    # every actor ("constructor arguments in the object store and max_restarts > 0", ray-project/ray#57733)
    # that reads like a failure.
    actor_restarts: int = 0
    keep_shards: bool = False


def _import_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise TwoTowerError("distributed encoding needs Ray Data: pip install 'twotower[scale]'") from None
    return ray


def connect(cfg: RayConfig):
    ray = _import_ray()
    if cfg.address == "local":
        if ray.is_initialized():
            ray.shutdown()
        ray.init(include_dashboard=False, num_cpus=int(cfg.workers * cfg.cpus_per_worker) if cfg.workers else None)
    elif not ray.is_initialized():
        ray.init(address=cfg.address, include_dashboard=False) if cfg.address else ray.init(include_dashboard=False)
    return ray


def plan_batches(tokenizer, texts: list[str], *, max_length: int, batch_size: int) -> list[np.ndarray]:
    """Row indices of every padded batch, in the order and grouping ``encode_texts`` uses."""
    from twotower.encoders.inference import length_sorted_rows

    return [rows for rows, _ in length_sorted_rows(tokenizer, texts, max_length, batch_size)]


class _EncodeActor:
    """Holds one document tower; encodes Ray batches whose rows are padded batches of texts."""

    def __init__(self, model: str | None, precision: str, device: str, compile: bool = False) -> None:
        import torch

        from twotower.encoders.towers import DualEncoder

        self.encoder = DualEncoder.load(model, device=torch.device(device))
        self.precision, self.compile = precision, compile

    def __call__(self, batch: dict) -> dict:
        from twotower.encoders.inference import encode_texts

        vectors = []
        for texts in batch["texts"]:
            texts = [str(t) for t in texts]
            vectors.append(encode_texts(self.encoder.doc_tower, texts, max_length=self.encoder.doc_max_length,
                                        batch_size=len(texts), precision=self.precision, show_progress=False,
                                        compile=self.compile))
        return {"batch": np.asarray(batch["batch"]), "vectors": np.array(vectors + [None], dtype=object)[:-1]}


def _fingerprint(ids: list[str], texts: list[str], model: str | None, batch_size: int, precision: str) -> str:
    h = hashlib.sha256()
    for part in (str(model), str(batch_size), precision, str(len(ids))):
        h.update(part.encode() + b"\0")
    for doc_id, text in zip(ids, texts):
        h.update(doc_id.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()


def encode_corpus_ray(
    ids: list[str],
    texts: list[str],
    *,
    model: str | None = None,
    tokenizer,
    max_length: int,
    batch_size: int = 32,
    precision: str = "auto",
    compile: bool = False,
    shard_dir: str | Path,
    cfg: RayConfig | None = None,
    show_progress: bool = True,
) -> np.ndarray:
    """Document vectors (len(texts), dim) for ``texts``, computed by a pool of Ray actors."""
    cfg = cfg or RayConfig()
    shard_dir = Path(shard_dir)
    done = prepare_shard_dir(shard_dir, _fingerprint(ids, texts, model, batch_size, precision), len(texts))
    batches = plan_batches(tokenizer, texts, max_length=max_length, batch_size=batch_size)
    todo = [b for b in range(len(batches)) if b not in done]
    log.info("%d documents in %d batches; %d already encoded in %s", len(texts), len(batches), len(done), shard_dir)

    if todo:
        ray = connect(cfg)
        from ray.data import ActorPoolStrategy, DataContext

        resources = ray.cluster_resources()
        gpus = cfg.gpus_per_worker
        per = gpus if gpus > 0 else cfg.cpus_per_worker
        available = resources.get("GPU" if gpus > 0 else "CPU", 0)
        workers = cfg.workers or max(1, int(available // per))
        if gpus > 0 and available < gpus:
            raise TwoTowerError(f"{given('gpus_per_worker', gpus)}: the Ray cluster has {available} GPUs")
        workers = max(1, min(workers, len(todo)))
        DataContext.get_current().enable_progress_bars = show_progress
        items = [{"batch": b, "texts": [texts[i] for i in batches[b]]} for b in todo]
        ds = ray.data.from_items(items, override_num_blocks=min(len(items), workers * 4))
        device = "cuda" if gpus > 0 else "cpu"
        with warnings.catch_warnings():
            # Ray 2.5x-2.6x names no parameter for max_restarts and warns about any extra remote argument; the
            # extra argument is still the documented way to turn restarts off (ActorPoolMapOperator)
            warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
            out = ds.map_batches(
                _EncodeActor, batch_size=cfg.batches_per_call, batch_format="numpy",
                compute=ActorPoolStrategy(size=workers), num_cpus=cfg.cpus_per_worker, num_gpus=gpus or None,
                fn_constructor_kwargs={"model": model, "precision": precision, "device": device, "compile": compile},
                max_restarts=cfg.actor_restarts,
            )
        t0, n = time.perf_counter(), 0
        log.info("encoding %d batches on %d Ray actors (%s)", len(todo), workers, device)
        for result in out.iter_batches(batch_size=None, batch_format="numpy"):
            for b, vec in zip(result["batch"], result["vectors"]):
                buf = io.BytesIO()
                np.savez(buf, rows=batches[int(b)], vectors=np.asarray(vec, dtype=np.float32))
                atomic_write_bytes(shard_dir / f"batch-{int(b):08d}.npz", buf.getvalue())
                n += 1
        log.info("encoded %d batches in %.1fs", n, time.perf_counter() - t0)

    return merge_shards(shard_dir, len(texts), len(batches))


def prepare_shard_dir(shard_dir: Path, fingerprint: str, n: int) -> set[int]:
    """Create ``shard_dir`` for this corpus and plan; the batch numbers already encoded in it. Shards
    of another corpus, model or batch plan are deleted."""
    plan_file = shard_dir / "plan.json"
    if shard_dir.exists():
        try:
            same = json.loads(plan_file.read_text()).get("fingerprint") == fingerprint
        except (OSError, json.JSONDecodeError):
            same = False
        if not same:
            log.info("%s holds shards of another corpus or plan: starting over", shard_dir)
            shutil.rmtree(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(plan_file, {"fingerprint": fingerprint, "documents": n})
    return {int(p.stem.split("-")[1]) for p in shard_dir.glob("batch-*.npz")}


def merge_shards(shard_dir: Path, n: int, n_batches: int) -> np.ndarray:
    """One (n, dim) array from the shard files; every row must be covered exactly once."""
    files = sorted(Path(shard_dir).glob("batch-*.npz"))
    if len(files) != n_batches:
        raise TwoTowerError(f"{shard_dir}: {len(files)} of {n_batches} batch shards present (run again to resume)")
    out: np.ndarray | None = None
    seen = np.zeros(n, dtype=bool)
    for path in files:
        with np.load(path) as shard:
            rows, vectors = shard["rows"], shard["vectors"]
        if out is None:
            out = np.empty((n, vectors.shape[1]), dtype=np.float32)
        if seen[rows].any() or len(rows) != len(vectors):
            raise TwoTowerError(f"{path}: overlaps other shards or is inconsistent (delete {shard_dir} and run again)")
        out[rows] = vectors
        seen[rows] = True
    if out is None or not seen.all():
        raise TwoTowerError(f"{shard_dir}: shards cover {int(seen.sum())} of {n} documents (delete it and run again)")
    return out


def build_index_ray(
    data: str | Path,
    out: str | Path,
    *,
    model: str | None = None,
    spec=None,
    cfg=None,
    ray_cfg: RayConfig | None = None,
):
    """:func:`twotower.retrieval.indexing.build_index` with the encoding spread over Ray actors."""
    from twotower.data.beir import load_corpus
    from twotower.encoders.towers import DualEncoder
    from twotower.encoders.inference import DEFAULT_BATCH_SIZE
    from twotower.retrieval.indexing import EncodeConfig, check_build, model_info
    from twotower.retrieval.store import IndexSpec, IndexStore, NewDocs

    cfg = cfg or EncodeConfig()
    ray_cfg = ray_cfg or RayConfig()
    data, out = Path(data), Path(out)
    corpus = load_corpus(data / "corpus.jsonl" if data.is_dir() else data)
    encoder = DualEncoder.load(model)  # for the tokenizer and the manifest; actors load their own copy
    info = model_info(model, encoder)
    docs = list(corpus.values())
    check_build(out, spec or IndexSpec(), cfg, dim=encoder.doc_tower.dim, num_docs=len(docs))  # before encoding
    tower = encoder.doc_tower
    shard_dir = out.parent / f"{out.name}.ray-shards"
    vectors = encode_corpus_ray(
        [d.id for d in docs], encoder.document_texts([d.full_text for d in docs]), model=model,
        tokenizer=tower.tokenizer, max_length=encoder.doc_max_length or tower.max_length,
        batch_size=cfg.batch_size or DEFAULT_BATCH_SIZE["cuda" if ray_cfg.gpus_per_worker > 0 else "cpu"],
        precision=cfg.precision,
        compile=cfg.compile, shard_dir=shard_dir, cfg=ray_cfg, show_progress=cfg.show_progress,
    )
    new = NewDocs([d.id for d in docs], [d.title for d in docs], [d.text for d in docs], vectors)
    store = IndexStore.build(out, new, model=info, spec=spec, show_progress=cfg.show_progress)
    if not ray_cfg.keep_shards:
        shutil.rmtree(shard_dir, ignore_errors=True)
    return store
