"""A tower on a graph runtime (``onnx``, ``openvino``, ``onnx-int8``, ``openvino-int8``), verified before it is used:
the smallest cosine between its embedding of each of :data:`PROBE_TEXTS` and torch's (fp32) must reach
:data:`MIN_COSINE` for its precision, and an int8 graph must also keep its bar on :data:`INT8_SAMPLE` of the texts it
is first asked to encode (a :class:`QualityError` otherwise). Encodes in length-sorted batches as torch does (on
OpenVINO's throughput streams for a corpus). Kept per tower (:func:`graph_tower`) until its weights or torch's thread
count change. Which runtime encodes: :mod:`twotower.encoders.runtimes`.

Example::

    graph = graph_tower(model.doc_tower, "onnx", "fp32")  # exported, checked on the probe texts, cached
    vecs = graph.encode(texts)  # as encode_texts(model.doc_tower, texts, precision="fp32"), to a cosine ≥ 0.999
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence

import numpy as np
import torch
from twotower.progress import progress_bar

from twotower.encoders.encoder import TextEncoder
from twotower.encoders.inference import default_batch_size, encode_texts, length_sorted_batches
from twotower.encoders.runtimes_graph import has_amx
from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)

GRAPH_RUNTIMES = ("onnx", "openvino", "onnx-int8", "openvino-int8")
INT8_RUNTIMES = ("onnx-int8", "openvino-int8")
# Batches from which OpenVINO encodes on its throughput model (streams: two at least, one each) rather than one at a time
MANY_BATCHES = 2
AMX_BATCH = 32  # texts per graph batch on AMX: 64 was 10-15% faster on one request of 2 threads, 32 is faster on two streams of one (issue #47)
# smallest cosine (graph vs torch fp32, per text) a runtime must reach on the probe texts
MIN_COSINE = {"fp32": 0.999, "bf16": 0.999, "int8": 0.98}
INT8_SAMPLE = 64  # texts of the corpus itself, spread over it, that int8 must also encode within its bar
PROBE_TEXTS = (
    "what is the effect of vitamin d on bone density?",
    "a",
    "Mean pooling averages the token vectors of a text; padding must not count. " * 3,
    "Dendritic cells present antigen to naive T cells in the lymph node, which then proliferate and differentiate.",
    "Größere Städte – São Paulo, Zürich, 東京 – haben höhere Mieten.",
    "Randomized controlled trial of aspirin for primary prevention of cardiovascular events in older adults. " * 12,
    "COVID-19 mRNA vaccines: efficacy 95% (CI 90.3-97.6) after two doses.",
    "The mitochondrion is the powerhouse of the cell.",
)


class QualityError(TwoTowerError):
    """A graph runtime's vectors are further from torch fp32's than its bar allows."""


def _weights_key(tower: torch.nn.Module) -> tuple:
    return tuple((id(p), p._version) for p in tower.parameters())


class GraphTower:
    """``tower`` on a graph runtime (``onnx``, ``openvino``, ``onnx-int8`` or ``openvino-int8``) at ``precision``,
    verified against the torch tower on :data:`PROBE_TEXTS` (each text's cosine ≥ :data:`MIN_COSINE` of the
    precision) and, for int8, on a sample of the first texts it encodes (≥ ``min_cosine``, by default the same bar).
    ``openvino-int8`` is calibrated on ``texts`` (at ``max_length``)."""

    def __init__(self, tower: TextEncoder, runtime: str, precision: str, *, texts: Sequence[str] | None = None,
                 max_length: int | None = None, min_cosine: float | None = None) -> None:
        from twotower.encoders.runtimes_graph import int8_graph, onnx_graph, ort_graph
        from twotower.encoders.runtimes_sessions import OpenVinoSession, OrtSession

        if runtime not in GRAPH_RUNTIMES:
            raise ValueError(runtime)
        # the runtime's package first: a missing one is named before anything is exported
        _import_runtime(runtime)
        self.tower, self.runtime, self.precision = tower, runtime, precision
        self.need = min_cosine or MIN_COSINE[precision]  # on the texts themselves
        if runtime == "openvino-int8":
            from twotower.encoders.runtimes_int8 import openvino_int8_graph

            if not texts:
                raise TwoTowerError("runtime 'openvino-int8' calibrates on the texts it encodes: none were given")
            self.graph = openvino_int8_graph(tower, texts, max_length or tower.max_length)
        else:
            self.graph = {"onnx-int8": int8_graph, "onnx": ort_graph, "openvino": onnx_graph}[runtime](tower)
        # int8: what stays in floating point (attention, LayerNorm, softmax, GELU) runs in bf16 on AMX
        self.float_precision = "bf16" if runtime == "openvino-int8" and has_amx() else precision
        self.session = (OpenVinoSession(self.graph, precision=self.float_precision) if runtime.startswith("openvino")
                        else OrtSession(self.graph, runtime=runtime))
        self.sample_min_cosine: float | None = None  # int8: on the sample of the texts, once checked
        self.sample_checked = True  # the probe check encodes through encode(), which must not sample yet
        self.min_cosine = self.check(PROBE_TEXTS, "probe texts", MIN_COSINE[precision])
        self.sample_checked = runtime not in INT8_RUNTIMES

    def check(self, texts: Sequence[str], what: str, need: float) -> float:
        """The smallest cosine between this runtime's and torch's (fp32) embeddings of ``texts``; a
        :class:`TwoTowerError` below ``need``."""
        ref = encode_texts(self.tower, texts, precision="fp32", show_progress=False)
        got = self.encode(texts, show_progress=False)
        cos = (got * ref).sum(1) / np.maximum(np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1), 1e-12)
        worst = float(cos.min()) if len(cos) else 1.0
        if not worst >= need:  # NaN fails too
            raise QualityError(f"runtime '{self.runtime}' ({self.precision}) differs from torch on {what}: smallest "
                                f"cosine {worst:.5f} < {need} (graph {self.graph})")
        return worst

    @property
    def version(self) -> str:
        return self.session.version

    def check_sample(self, texts: Sequence[str]) -> None:
        """An int8 graph's check on :data:`INT8_SAMPLE` of ``texts``, spread over them (once per graph)."""
        if self.sample_checked or not len(texts):
            return
        picks = np.unique(np.linspace(0, len(texts) - 1, num=min(INT8_SAMPLE, len(texts))).round().astype(int))
        self.sample_checked = True  # before check(), which encodes through encode()
        try:
            worst = self.check([texts[i] for i in picks], f"{len(picks)} of the texts", self.need)
        except QualityError:
            self.sample_checked = False
            raise
        self.sample_min_cosine = worst
        log.info("int8 check on the texts: smallest cosine to torch fp32 %.4f (needs ≥ %s)", worst, self.need)

    def encode(self, texts: Sequence[str], *, max_length: int | None = None, batch_size: int | None = None,
               show_progress: bool = False, desc: str = "encoding", unit: str = "text") -> np.ndarray:
        """Embeddings (len(texts), dim), float32, in input order: length-sorted batches as torch encodes them."""
        self.check_sample(texts)
        max_length = max_length or self.tower.max_length
        batch_size = batch_size or (AMX_BATCH if self.runtime.startswith("openvino") and has_amx()
                                    else default_batch_size(torch.device("cpu")))
        out = np.empty((len(texts), self.tower.dim), dtype=np.float32)
        bar = progress_bar(total=len(texts), desc=desc, unit=unit, disable=not show_progress or len(texts) == 0)
        batches = ((rows, ids.numpy(), mask.numpy())
                   for rows, ids, mask in length_sorted_batches(self.tower.tokenizer, texts, max_length, batch_size))
        try:
            if hasattr(self.session, "run_many") and len(texts) >= MANY_BATCHES * batch_size:
                self.session.run_many(batches, out, bar.update)  # a corpus: OpenVINO's throughput streams
            else:
                for rows, input_ids, mask in batches:
                    out[rows] = self.session(input_ids, mask)
                    bar.update(len(rows))
        finally:
            bar.close()
        return out


def _import_runtime(runtime: str) -> None:
    from twotower.encoders.runtimes_sessions import _missing

    package = "openvino" if runtime.startswith("openvino") else "onnxruntime"
    try:
        import onnx  # noqa: F401  (torch.onnx.export writes through it)

        __import__(package)
    except ImportError as exc:
        raise _missing(getattr(exc, "name", None) or package, runtime, exc) from exc


# verified graph runtimes per tower (not on the tower: sessions cannot be deep-copied or pickled with it)
_SESSIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def graph_tower(tower: TextEncoder, runtime: str, precision: str, *, texts: Sequence[str] | None = None,
                 max_length: int | None = None, min_cosine: float | None = None) -> GraphTower:
    """The verified :class:`GraphTower`, cached on ``tower`` until its weights or torch's thread count change (an
    ``openvino-int8`` one per calibration sample of ``texts``)."""
    cache = _SESSIONS.setdefault(tower, {})
    key = (runtime, precision, torch.get_num_threads(), min_cosine)
    if runtime == "openvino-int8" and texts:
        from twotower.encoders.runtimes_int8 import calibration_sample, sample_hash

        key += (sample_hash(calibration_sample(texts), max_length or tower.max_length),)
    hit = cache.get(key)
    if hit is not None and hit[0] == _weights_key(tower):
        return hit[1]
    graph = GraphTower(tower, runtime, precision, texts=texts, max_length=max_length, min_cosine=min_cosine)
    cache[key] = (_weights_key(tower), graph)
    return graph
