"""Static int8 for OpenVINO: the tower's ONNX graph quantized by NNCF, calibrated on the texts it will encode.

Dynamic quantization (``onnx-int8``, :func:`twotower.encoders.runtimes_graph.int8_graph`) quantizes every
activation at run time, once per MatMul per batch; static quantization measures each activation's range once, on a
calibration sample, and bakes the scales into the graph, so OpenVINO runs its int8 kernels (VNNI / AMX) end to end.
NNCF's transformer recipe keeps what int8 hurts in fp32 (LayerNorm, softmax, GELU, the embeddings), applies
SmoothQuant (moves activation outliers into the weights) and bias correction; the ``MIXED`` preset quantizes weights
symmetrically and activations asymmetrically (GELU's and softmax's outputs are one-sided). On 384 SciFact documents
with all-MiniLM-L6-v2 (an Intel Xeon with VNNI) ``MIXED`` kept a smallest cosine to fp32 of 0.9950 against
``PERFORMANCE``'s 0.9922 at the same speed; speed and NDCG@10: benchmarks/results/cpu_backends_*.md.

The calibration sample is :data:`CALIBRATION_TEXTS` texts spread evenly over the texts being encoded (a corpus is
its own best calibration set), tokenized as encoding tokenizes them. The graph is cached next to the fp32 export
(:mod:`twotower.encoders.runtimes_graph`), keyed also by the sample's hash, the length cap and the versions of
OpenVINO and NNCF: the same corpus finds it again, another corpus is calibrated anew.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from twotower.encoders.encoder import TextEncoder
from twotower.encoders.inference import length_sorted_batches
from twotower.encoders.runtimes_graph import _isa, _touch, onnx_graph
from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)

CALIBRATION_TEXTS = 256
CALIBRATION_BATCH = 32
INT8_STATIC_FILE = "model_int8_static.xml"


def calibration_sample(texts: Sequence[str], n: int | None = None) -> list[str]:
    """Up to ``n`` (default :data:`CALIBRATION_TEXTS`) of ``texts``, spread evenly over them (first and last
    included), in their order."""
    n = n or CALIBRATION_TEXTS
    if not len(texts):
        raise TwoTowerError("int8 calibration needs texts: none were given")
    picks = np.unique(np.linspace(0, len(texts) - 1, num=min(n, len(texts))).round().astype(int))
    return [texts[i] for i in picks]


def sample_hash(sample: Sequence[str], max_length: int) -> str:
    h = hashlib.sha256(f"max_length={max_length}".encode())
    for text in sample:
        h.update(len(text).to_bytes(8, "little"))
        h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def openvino_int8_graph(tower: TextEncoder, texts: Sequence[str], max_length: int) -> Path:
    """The OpenVINO IR (``.xml`` + ``.bin``) of ``tower`` statically quantized to int8 with NNCF, calibrated on
    :func:`calibration_sample` of ``texts`` at ``max_length``; quantized now (tens of seconds) or found in the
    cache."""
    try:
        import nncf
        import openvino as ov
    except ImportError as exc:
        from twotower.encoders.runtimes_sessions import _missing

        raise _missing(getattr(exc, "name", None) or "nncf", "openvino-int8", exc) from exc
    fp32 = onnx_graph(tower)
    sample = calibration_sample(texts)
    path = fp32.parent / (f"ov{ov.__version__.split('-')[0]}-nncf{nncf.__version__}-{_isa()}-"
                          f"{sample_hash(sample, max_length)}-{INT8_STATIC_FILE}")
    if path.is_file() and path.with_suffix(".bin").is_file():
        log.info("int8 graph cache hit: %s", path)
        _touch(path.parent)
        return path
    t0 = time.perf_counter()
    model = ov.Core().read_model(str(fp32))
    names = {p.get_any_name() for p in model.inputs}
    batches = [{k: v for k, v in (("input_ids", ids.numpy()), ("attention_mask", mask.numpy())) if k in names}
               for _, ids, mask in length_sorted_batches(tower.tokenizer, sample, max_length, CALIBRATION_BATCH)]
    nncf.set_log_level(logging.ERROR)
    try:
        # NNCF draws its progress bars on a rich console on stdout: stdout belongs to the CLI's results
        with contextlib.redirect_stdout(sys.stderr):
            quantized = nncf.quantize(model, nncf.Dataset(batches), model_type=nncf.ModelType.TRANSFORMER,
                                      preset=nncf.QuantizationPreset.MIXED, subset_size=len(batches),
                                      fast_bias_correction=True)
        _save_ir(quantized, path)
    except TwoTowerError:
        raise
    except Exception as exc:  # noqa: BLE001 - NNCF and OpenVINO raise many types; say which step failed
        raise TwoTowerError(f"could not quantize the tower to int8 with NNCF ({type(exc).__name__}: {exc})") from exc
    log.info("quantized the tower to static int8 on %d calibration texts in %.1f s (%s)", len(sample),
             time.perf_counter() - t0, path)
    return path


def _save_ir(model, path: Path) -> None:
    """``model`` as ``path`` (.xml) + its .bin, written in a temporary folder beside them and renamed into place,
    the .bin first: a reader that finds the .xml finds a whole pair."""
    import openvino as ov

    tmp = Path(tempfile.mkdtemp(prefix=".int8.", dir=path.parent))
    try:
        ov.save_model(model, str(tmp / "model.xml"), compress_to_fp16=False)
        os.replace(tmp / "model.bin", path.with_suffix(".bin"))
        os.replace(tmp / "model.xml", path)
    finally:
        for leftover in tmp.iterdir():
            leftover.unlink(missing_ok=True)
        tmp.rmdir()


def refusal_path(tower: TextEncoder) -> Path:
    """Where ``auto`` remembers that this tower's int8 graph failed its cosine check on this kind of CPU: in the
    tower's graph folder (keyed by its weights), named by the CPU kind and the OpenVINO and NNCF versions (a new
    version of either is tried again)."""
    import nncf
    import openvino as ov

    from twotower.encoders.runtimes_graph import cpu_kind, graph_key, graphs_home

    return (graphs_home() / graph_key(tower) /
            f"auto-int8-refused-{cpu_kind()}-ov{ov.__version__.split('-')[0]}-nncf{nncf.__version__}.json")


def refused(tower: TextEncoder) -> str | None:
    """Why ``auto`` refused this tower's int8 graph on this CPU kind before (the check's message), or None."""
    try:
        return json.loads(refusal_path(tower).read_text())["reason"]
    except (ImportError, OSError, ValueError, KeyError, TypeError):
        return None


def remember_refusal(tower: TextEncoder, reason: str) -> None:
    """Record that the int8 graph failed its check (written atomically; a cache that cannot be written is only
    logged: the next run checks again)."""
    from twotower.io import atomic_write_json

    try:
        path = refusal_path(tower)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"reason": reason, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    except (ImportError, OSError) as exc:
        log.warning("could not remember the int8 refusal (%s); the next encoding checks int8 again", exc)
        return
    log.info("remembered in %s: auto skips int8 for this model on this CPU kind (delete the file to try again)",
             path)
