"""One tower run by ONNX Runtime: its whole forward (backbone, pooling, projection, normalisation)
exported with ``torch.onnx.export`` and run on ORT's CPU provider, in fp32.

What it is for: small batches, i.e. a search service's queries. At batch 1 ORT's kernels and its lower
per-operator overhead encode a SciFact query about twice as fast as PyTorch eager on a 2-core CPU, with
the same numbers to ~1e-6 (``benchmarks/speed.py``, rows ``twotower onnx``); on 32-document batches of
256 tokens it is no faster than torch (``benchmarks/results/onnx_runtime.md``), so documents stay on
torch. The export is checked against the torch tower on probe texts before it is used.

Runtimes for query encoding: ``torch``; ``onnx`` (fail if it cannot be had); ``auto`` (ONNX Runtime
on CPU when ``onnxruntime`` is installed and the export passes its check, otherwise torch, saying why).
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from twotower.checks import given
from twotower.encoders.encoder import TextEncoder
from twotower.encoders.onnx_cache import PROBE_TEXTS, TOLERANCE
from twotower.encoders.inference import encode_texts, length_sorted_batches
from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "torch", "onnx")


def export_tower(tower: TextEncoder) -> bytes:
    """The tower's forward ``(input_ids, attention_mask) → embedding`` as an ONNX model (bytes), with
    dynamic batch size and length."""
    sample = tower.tokenizer(["a short one", "a slightly longer example text"], padding=True, return_tensors="pt")
    buf = io.BytesIO()
    axes = {0: "batch", 1: "tokens"}
    was_training = tower.training
    tower.eval()
    try:
        with warnings.catch_warnings():  # the TorchScript exporter's tracer warnings are about shapes it handles
            warnings.simplefilter("ignore")
            torch.onnx.export(
                tower, (sample["input_ids"], sample["attention_mask"]), buf, dynamo=False, opset_version=17,
                input_names=["input_ids", "attention_mask"], output_names=["embedding"],
                dynamic_axes={"input_ids": axes, "attention_mask": axes, "embedding": {0: "batch"}},
            )
    finally:
        tower.train(was_training)
    return buf.getvalue()


class OnnxTower:
    """``encode(texts)`` like :func:`encode_texts` for ``tower``, run by an ONNX Runtime session."""

    def __init__(self, tower: TextEncoder, *, max_length: int | None = None, threads: int | None = None) -> None:
        try:
            import onnx  # noqa: F401  (torch.onnx.export writes through it)
            import onnxruntime as ort
        except ImportError as exc:
            raise TwoTowerError(
                f"the onnx query runtime needs onnx and onnxruntime ({exc}): pip install 'twotower[serve]' "
                f"(or use {given('query_runtime', 'torch')})") from exc
        if next(tower.parameters()).device.type != "cpu":
            raise TwoTowerError("the onnx query runtime runs on CPU; this tower is on "
                                f"{next(tower.parameters()).device} (use {given('query_runtime', 'torch')})")
        self.tokenizer = tower.tokenizer
        self.max_length = max_length or tower.max_length
        self.dim = tower.dim
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or torch.get_num_threads()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3  # errors only: ORT warns about every constant it folds
        try:
            self.model_bytes = export_tower(tower)  # kept for the on-disk cache (encoders.onnx_cache)
            self.session = ort.InferenceSession(self.model_bytes, opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # the exporter and ORT raise many types; say which step failed
            raise TwoTowerError(f"could not export this tower to ONNX Runtime ({type(exc).__name__}: {exc}); "
                                f"use {given('query_runtime', 'torch')}") from exc
        self.inputs = {i.name for i in self.session.get_inputs()}
        ref = encode_texts(tower, PROBE_TEXTS, max_length=self.max_length, precision="fp32", show_progress=False)
        self.probes = ref  # torch's embeddings of the probe texts, kept with a cached export
        self.max_abs_diff = float(np.abs(self.encode(PROBE_TEXTS) - ref).max())
        if not self.max_abs_diff <= TOLERANCE:
            raise TwoTowerError(f"the ONNX Runtime export differs from the torch tower by {self.max_abs_diff:.2e} "
                                f"(> {TOLERANCE:g}) on probe texts; use {given('query_runtime', 'torch')}")

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
        """Embeddings (len(texts), dim), float32, in input order."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for rows, input_ids, mask in length_sorted_batches(self.tokenizer, texts, self.max_length, batch_size):
            feed = {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()}
            out[rows] = self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})[0]
        return out


def check_query_runtime(runtime: str) -> None:
    if runtime not in RUNTIMES:
        raise TwoTowerError(f"unknown query runtime '{runtime}': choose one of {', '.join(RUNTIMES)}")


def query_runtime(tower: TextEncoder, runtime: str, *, max_length: int | None = None) -> OnnxTower | None:
    """The ONNX Runtime tower for ``runtime`` (``onnx``, or ``auto`` where it can be had), or None for torch."""
    check_query_runtime(runtime)
    if runtime == "torch":
        return None
    if runtime == "auto" and next(tower.parameters()).device.type != "cpu":
        return None
    try:
        fast = OnnxTower(tower, max_length=max_length)
    except TwoTowerError as exc:
        if runtime == "onnx":
            raise
        log.warning("queries are encoded by torch: %s", exc)
        return None
    log.info("queries are encoded by ONNX Runtime (max |Δ| vs torch on probe texts: %.1e)", fast.max_abs_diff)
    return fast
