"""Exported graphs for the CPU runtimes, cached on disk: a tower's ONNX export (fp32) and its int8 dynamically
quantized copy (ONNX Runtime's ``quantize_dynamic``).

A graph lives at ``$TWOTOWER_HOME/graphs/<key>/<file>.onnx`` (``~/.cache/twotower/graphs`` by default). The key
hashes what decides the graph's numbers: the tower's weights (every parameter and buffer, bytes and shape), its
pooling, normalisation and projection, the shape policy (dynamic batch and length, opset) and the versions of the
software that wrote it (torch's exporter; ONNX Runtime's quantizer for the int8 copy). Change any of them and the
graph is exported again; nothing is ever reused for other weights. Files are written to a temporary name in the same
folder and renamed into place, so a reader never sees half a graph and two processes exporting at once both end
with a whole one. The cache keeps the :data:`KEEP_GRAPHS` most recently used keys and removes older ones (each
all-MiniLM-L6-v2 export is ~90 MB).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from twotower.encoders.encoder import TextEncoder
from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)

OPSET = 17
SHAPE_POLICY = f"dynamic-batch-dynamic-length-opset{OPSET}-eager-attention"
KEEP_GRAPHS = 8  # keys kept in the cache; older ones (least recently used) are removed
FP32_FILE = "model.onnx"  # the plain export: OpenVINO reads it
ORT_FILE = "model_ort_fused.onnx"  # ONNX Runtime's transformer fusions applied: what ORT runs, and int8 quantizes
INT8_FILE = "model_int8.onnx"


def graphs_home() -> Path:
    """``$TWOTOWER_HOME/graphs`` (default ``~/.cache/twotower/graphs``)."""
    from twotower.encoders.catalog import twotower_home

    return twotower_home() / "graphs"


def _weights_key(tower: torch.nn.Module) -> tuple:
    return tuple((id(t), t._version) for t in (*tower.parameters(), *tower.buffers()))


def weights_hash(tower: TextEncoder) -> str:
    """SHA-256 of the tower's tensors (names, shapes, dtypes, bytes) and its pooling / normalisation settings;
    cached on the tower until a tensor changes."""
    key = _weights_key(tower)
    cached = tower.__dict__.get("_weights_hash")
    if cached is not None and cached[0] == key:
        return cached[1]
    h = hashlib.sha256()
    h.update(f"pooling={tower.pooling};normalize={bool(tower.normalize)}".encode())
    for name, t in tower.state_dict().items():
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    digest = h.hexdigest()
    tower.__dict__["_weights_hash"] = (key, digest)
    return digest


def graph_key(tower: TextEncoder) -> str:
    """The cache key of ``tower``'s graphs: weights hash, shape policy, torch and onnx versions."""
    import onnx

    parts = f"{weights_hash(tower)}|{SHAPE_POLICY}|torch={torch.__version__}|onnx={onnx.__version__}"
    return hashlib.sha256(parts.encode()).hexdigest()[:32]


def _atomic_write(path: Path, write) -> None:
    """``write(tmp_path)`` then rename onto ``path`` (same folder, so the rename is atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _touch(folder: Path) -> None:
    try:
        os.utime(folder)
    except OSError:
        pass


def _prune(home: Path, keep: str) -> None:
    """Remove all but the :data:`KEEP_GRAPHS` most recently used keys (never ``keep``)."""
    try:
        folders = sorted((p for p in home.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return
    for old in folders[KEEP_GRAPHS:]:
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)
            log.info("removed the cached runtime graph %s (more than %d cached)", old, KEEP_GRAPHS)


def _writable_home() -> Path:
    home = graphs_home()
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TwoTowerError(f"cannot create the runtime graph cache {home} ({exc.strerror}): point TWOTOWER_HOME at "
                            "a writable folder") from None
    return home


def onnx_graph(tower: TextEncoder) -> Path:
    """The tower's fp32 ONNX graph (dynamic batch and length), exported now or found in the cache."""
    from twotower.encoders.onnx_runtime import export_tower

    home = _writable_home()
    key = graph_key(tower)
    path = home / key / FP32_FILE
    if path.is_file():
        log.info("runtime graph cache hit: %s", path)
        _touch(path.parent)
        return path
    t0 = time.perf_counter()
    try:
        with eager_attention(tower):
            blob = export_tower(tower)
    except Exception as exc:  # the exporter raises many types; say which step failed
        raise TwoTowerError(f"could not export this tower to ONNX ({type(exc).__name__}: {exc})") from exc
    _atomic_write(path, lambda tmp: tmp.write_bytes(blob))
    (path.parent / "key.txt").write_text(f"weights={weights_hash(tower)}\nshape_policy={SHAPE_POLICY}\n"
                                         f"torch={torch.__version__}\n")
    log.info("exported the tower to %s in %.1f s", path, time.perf_counter() - t0)
    _prune(home, key)
    return path


class eager_attention:
    """Export with the backbone's plain (eager) attention: matmul, mask add, softmax, matmul, a pattern ONNX Runtime
    fuses into its Attention kernel (the SDPA export's mask arithmetic it does not); restored afterwards."""

    def __init__(self, tower: TextEncoder) -> None:
        self.backbone = tower.backbone
        self.before = getattr(getattr(self.backbone, "config", None), "_attn_implementation", None)

    def __enter__(self):
        if self.before not in (None, "eager") and hasattr(self.backbone, "set_attn_implementation"):
            try:
                self.backbone.set_attn_implementation("eager")
            except Exception as exc:  # noqa: BLE001 - a model without eager attention exports as it is
                log.info("exporting with %s attention (%s)", self.before, exc)
                self.before = None
        else:
            self.before = None
        return self

    def __exit__(self, *exc) -> None:
        if self.before is not None:
            self.backbone.set_attn_implementation(self.before)


def ort_graph(tower: TextEncoder) -> Path:
    """The fp32 graph with ONNX Runtime's transformer fusions (Attention, EmbedLayerNormalization,
    SkipLayerNormalization, BiasGelu) where the optimizer finds them, cached next to the plain graph and keyed also by
    ONNX Runtime's version; the plain graph when the optimizer fails (said in the log)."""
    import onnxruntime as ort

    fp32 = onnx_graph(tower)
    path = fp32.parent / f"ort{ort.__version__}-{ORT_FILE}"
    if path.is_file():
        return path
    cfg = getattr(tower.backbone, "config", None)
    heads, hidden = getattr(cfg, "num_attention_heads", 0) or 0, getattr(cfg, "hidden_size", 0) or 0
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        optimized = optimize_model(str(fp32), model_type="bert", num_heads=heads, hidden_size=hidden)
        _atomic_write(path, lambda tmp: optimized.save_model_to_file(str(tmp)))
    except Exception as exc:  # noqa: BLE001 - the optimizer raises many types; the plain graph still runs
        log.warning("ONNX Runtime's transformer optimizer failed on this tower (%s: %s); running the plain graph",
                    type(exc).__name__, exc)
        return fp32
    fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    log.info("fused the graph for ONNX Runtime: %s", fused or "nothing fused")
    return path


def int8_graph(tower: TextEncoder) -> Path:
    """The fused graph (:func:`ort_graph`) with its MatMul and Attention weights quantized to int8 (ONNX Runtime
    dynamic quantization: per-channel int8 weights, activations quantized per batch at run time; the embeddings,
    LayerNorms and softmax stay fp32), cached next to the fp32 graph, keyed also by ONNX Runtime's version and the
    CPU's int8 instructions."""
    import onnxruntime as ort

    import onnx

    fp32 = ort_graph(tower)
    path = fp32.parent / f"ort{ort.__version__}-{_isa()}-{INT8_FILE}"
    if path.is_file():
        return path
    from onnxruntime.quantization import QuantType, quantize_dynamic

    def write(tmp: Path) -> None:
        quantize_dynamic(fp32, tmp, weight_type=QuantType.QInt8, per_channel=True, reduce_range=_isa() != "vnni",
                         op_types_to_quantize=["MatMul", "Attention"],
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})

    t0 = time.perf_counter()
    try:
        _atomic_write(path, write)
    except TwoTowerError:
        raise
    except Exception as exc:  # noqa: BLE001 - the quantizer raises many types
        raise TwoTowerError(f"could not quantize the ONNX graph to int8 ({type(exc).__name__}: {exc})") from exc
    log.info("quantized the graph to int8 (%s) in %.1f s", path, time.perf_counter() - t0)
    return path


def _isa() -> str:
    """``vnni`` where the CPU has 8-bit dot-product instructions (full-range int8 is safe), else ``avx2``
    (weights quantized to 7 bits, ONNX Runtime's advice against u8s8 overflow without VNNI)."""
    return "vnni" if _cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"} else "avx2"


def _cpu_flags() -> set[str]:
    try:
        return set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return set()


def has_amx() -> bool:
    """Whether the CPU has AMX tiles for bf16 and int8 (Sapphire Rapids and later Xeons): OpenVINO's bf16 and int8
    kernels run on them."""
    return {"amx_bf16", "amx_int8"} <= _cpu_flags()


def cpu_kind() -> str:
    """``amx``, ``vnni`` or ``avx2``: what decides which runtime ``auto`` takes and keys its remembered refusals."""
    return "amx" if has_amx() else _isa()
