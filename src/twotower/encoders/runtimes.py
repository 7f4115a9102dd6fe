"""Which runtime encodes on a CPU: torch, ONNX Runtime, OpenVINO, or ONNX Runtime on an int8 graph.

Runtimes (``runtime=`` in the API, ``--runtime`` on ``eval`` and ``index build/add``):

- ``torch``: :func:`twotower.encoders.inference.encode_texts` (fp32, or bf16 weights where the CPU has fast bf16).
- ``onnx``: the tower exported to ONNX (dynamic batch and length, eager attention), fused by ONNX Runtime's transformer
  optimizer (Attention, EmbedLayerNormalization, SkipLayerNormalization, BiasGelu), on its CPU provider, fp32.
- ``openvino``: OpenVINO's CPU plugin on the same ONNX graph; bf16 inference precision where the CPU has
  AVX512-BF16 / AMX (precision ``auto`` or ``bf16``), else fp32.
- ``onnx-int8``: ONNX Runtime on the fused graph with int8 MatMul and Attention weights (dynamic quantization);
  checked on probe texts and on a sample of the texts it is asked to encode.
- ``openvino-int8``: OpenVINO on the graph statically quantized to int8 by NNCF, calibrated on a sample of the texts
  it is asked to encode (:mod:`twotower.encoders.runtimes_int8`); checked like ``onnx-int8``.
- ``auto`` (the default): torch on a GPU, for fewer than :data:`AUTO_MIN_TEXTS` texts and with ``compile``;
  otherwise, with precision ``auto``: bf16 where it measures faster than fp32 (:func:`bf16_pays`); then, on a CPU
  with 8-bit dot-product instructions where bf16 does not pay, or on any CPU with AMX, ``openvino-int8`` if it passes
  the int8 check on the probe texts (:data:`~twotower.encoders.runtimes_tower.MIN_COSINE`) and keeps a cosine of at
  least :data:`AUTO_INT8_MIN_COSINE` to torch fp32 on a sample of the texts themselves (a refusal is remembered per
  model and CPU kind); else the first runtime of :data:`AUTO_ORDER` (:data:`AUTO_ORDER_AMX` on AMX) for the
  precision that passes its check, each failure logged with its reason, torch last. A named precision (``fp32``,
  ``bf16``) is kept: ``auto`` never quantizes what the caller pinned.

Every graph runtime is verified against the torch tower (fp32) on probe texts before it is used
(:mod:`twotower.encoders.runtimes_tower`): the smallest cosine between the two embeddings of a text must reach its
precision's bar. An explicit runtime that cannot be had or fails its check is a
:class:`~twotower.errors.TwoTowerError`; ``auto`` logs why and moves on. What was chosen is logged and kept on the
tower (:func:`last_choice`). Graphs are cached on disk (:mod:`twotower.encoders.runtimes_graph`), sessions on the
tower until its weights change.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from twotower.encoders.encoder import TextEncoder
from twotower.encoders.inference import cpu_has_fast_bf16, encode_texts, resolve_precision
from twotower.encoders.runtimes_graph import has_amx
from twotower.encoders.runtimes_tower import (GRAPH_RUNTIMES, INT8_RUNTIMES, INT8_SAMPLE, GraphTower, QualityError,
                                              graph_tower)
from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "torch", *GRAPH_RUNTIMES)
AUTO_MIN_TEXTS = 1000
# auto's order of preference on a CPU, per precision. Precision auto, for a corpus: bf16 where the CPU has bf16
# instructions *and* a bf16 matmul on the encoder's shape measures >= BF16_PAYS x the fp32 one (bf16_pays), else
# fp32. Measured: benchmarks/results/speed.md (AVX512-BF16 EPYC: torch bf16 1.93x sentence-transformers fp32) and
# cpu_backends_avx512bf16.md (an Intel Xeon with AVX512-BF16, no AMX: bf16 matmuls no faster than fp32, OpenVINO
# fp32 the fastest runtime, then ONNX Runtime and torch).
AUTO_ORDER = {"bf16": ("torch",), "fp32": ("openvino", "onnx", "torch")}
# On a CPU with AMX (cpu_backends_amx.md: a 2-core Xeon with AMX-BF16 / AMX-INT8): openvino-int8 first (its
# float parts in bf16, at AMX_BATCH), then OpenVINO bf16, which ran faster than torch's bf16 there.
AUTO_ORDER_AMX = {"bf16": ("openvino", "torch"), "fp32": ("openvino", "onnx", "torch")}
BF16_PAYS = 1.2
# what auto's int8 must keep on the sample of the texts it encodes (INT8_SAMPLE of them): sentence-transformers'
# backends are compared at the same bar in benchmarks/cpu_backends.py
AUTO_INT8_MIN_COSINE = 0.99


_runtime: contextvars.ContextVar[str] = contextvars.ContextVar("twotower_runtime", default="auto")
_used: contextvars.ContextVar[dict | None] = contextvars.ContextVar("twotower_runtime_used", default=None)


def check_runtime(runtime: str, option: str = "runtime") -> str:
    if runtime not in RUNTIMES:
        raise TwoTowerError(f"{option} '{runtime}': choose one of {', '.join(RUNTIMES)}")
    return runtime


@contextlib.contextmanager
def using_runtime(runtime: str | None) -> Iterator[dict]:
    """Encoding inside the block that names no runtime uses ``runtime`` (None: leave the current one). Yields a
    dict that collects what encoded inside the block: ``{"documents" | "queries" | ...: choice}`` (see
    :func:`last_choice`)."""
    used: dict = {}
    tokens = [_used.set(used)]
    if runtime is not None:
        tokens.append(_runtime.set(check_runtime(runtime)))
    try:
        yield used
    finally:
        if runtime is not None:
            _runtime.reset(tokens[1])
        _used.reset(tokens[0])


def current_runtime() -> str:
    """The runtime encoding uses when none is named: ``auto`` unless set by :func:`using_runtime`."""
    return _runtime.get()


def last_choice(tower: TextEncoder) -> dict | None:
    """What encoded ``tower``'s last texts: ``{"runtime", "precision", "reason"}`` and, for a graph runtime, its
    ``min_cosine_vs_torch`` on the probe texts and ``version``."""
    return tower.__dict__.get("_runtime_choice")


def _record(tower: TextEncoder, choice: dict) -> None:
    if tower.__dict__.get("_runtime_choice") != choice:
        log.info("encoding with %s %s (%s)", choice["runtime"], choice["precision"], choice["reason"])
    tower.__dict__["_runtime_choice"] = choice


def graph_for(tower: TextEncoder, runtime: str, precision: str = "auto", *, n_texts: int = 0,
              compile: bool = False, texts: Sequence[str] | None = None,
              max_length: int | None = None) -> GraphTower | None:
    """The graph runtime that encodes ``texts`` (or ``n_texts`` texts) with ``tower`` for ``runtime`` /
    ``precision``, or None for torch; int8 runtimes calibrate on / check against ``texts`` at ``max_length``.
    Explicit runtimes raise :class:`TwoTowerError` when they cannot be had; ``auto`` falls back, logging why."""
    check_runtime(runtime)
    n_texts = len(texts) if texts is not None else n_texts
    device = next(tower.parameters()).device
    if runtime == "torch":
        _record(tower, {"runtime": "torch", "precision": resolve_precision(precision, device), "reason": "asked for"})
        return None
    if runtime == "auto":
        return _auto(tower, precision, device, n_texts, compile, texts, max_length)
    if device.type != "cpu":
        raise TwoTowerError(f"runtime '{runtime}' runs on CPU; this model is on {device}: use device 'cpu' or "
                            "runtime 'torch'")
    if compile:
        raise TwoTowerError(f"compile applies to the torch runtime; drop it for runtime '{runtime}'")
    if runtime == "onnx" and precision == "bf16":
        raise TwoTowerError("runtime 'onnx' runs fp32 on CPU: use precision fp32, or runtime 'openvino' / 'torch' "
                            "for bf16")
    if runtime in INT8_RUNTIMES and precision not in ("auto", "int8"):
        raise TwoTowerError(f"runtime '{runtime}' is int8; precision '{precision}' does not apply (leave it auto)")
    target = "int8" if runtime in INT8_RUNTIMES else "fp32" if runtime == "onnx" else resolve_precision(precision,
                                                                                                        device)
    try:
        graph = graph_tower(tower, runtime, target, texts=texts, max_length=max_length)
    except TwoTowerError as exc:
        raise TwoTowerError(f"{exc} (or use runtime 'torch')") from exc
    _record(tower, _graph_choice(graph, "asked for"))
    return graph


def _graph_choice(graph: GraphTower, reason: str) -> dict:
    choice = {"runtime": graph.runtime, "precision": graph.precision, "reason": reason,
              "min_cosine_vs_torch": round(graph.min_cosine, 6), "version": graph.version}
    if graph.sample_min_cosine is not None:
        choice["min_cosine_on_texts"] = round(graph.sample_min_cosine, 6)
    if graph.float_precision != graph.precision:
        choice["float_precision"] = graph.float_precision  # int8's unquantized operations
    return choice


@functools.cache
def bf16_pays() -> bool:
    """Whether bf16 beats fp32 on this CPU: it has AVX512-BF16 / AMX and a bf16 matmul of the encoder's shape
    (4096×384 by 384×1536) runs ≥ :data:`BF16_PAYS`× the fp32 one (best of 3 each; ~0.3 s, once per process)."""
    import time

    if not cpu_has_fast_bf16():
        return False
    rates = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(4096, 384).to(dtype), torch.randn(384, 1536).to(dtype)
        best = float("inf")
        for _ in range(4):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
        rates[dtype] = 1 / best
    pays = rates[torch.bfloat16] >= BF16_PAYS * rates[torch.float32]
    log.info("bf16 matmul %.2f× fp32 on this CPU: auto encodes corpora in %s", rates[torch.bfloat16] /
             rates[torch.float32], "bf16" if pays else "fp32")
    return pays


def _auto(tower: TextEncoder, precision: str, device: torch.device, n_texts: int, compile: bool,
          texts: Sequence[str] | None, max_length: int | None) -> GraphTower | None:
    target = resolve_precision(precision, device)
    torch_choice = {"runtime": "torch", "precision": target}
    if device.type != "cpu":
        _record(tower, {**torch_choice, "reason": f"auto: the model is on {device.type}"})
        return None
    if precision == "auto":  # measured, not read off the flags: some CPUs with AVX512-BF16 run bf16 no faster
        target = "bf16" if bf16_pays() else "fp32"
        torch_choice["precision"] = target
    if compile:
        _record(tower, {**torch_choice, "reason": "auto: compile asks for torch"})
        return None
    if n_texts < AUTO_MIN_TEXTS:
        _record(tower, {**torch_choice, "reason": f"auto: {n_texts} texts (< {AUTO_MIN_TEXTS}, not worth an export)"})
        return None
    amx = has_amx()
    bf16 = "AMX" if amx else "bf16 faster than fp32" if bf16_pays() else "bf16 no faster than fp32"
    skipped = []
    if precision == "auto" and (target == "fp32" or amx) and texts and _int8_instructions():
        graph, why_not = _auto_int8(tower, texts, max_length)
        if graph is not None:
            return graph
        skipped.append(why_not)
    for candidate in (AUTO_ORDER_AMX if amx else AUTO_ORDER)[target]:
        if candidate == "torch":
            break
        try:
            graph = graph_tower(tower, candidate, target)
        except TwoTowerError as exc:
            log.warning("auto runtime: not %s (%s); trying the next", candidate, exc)
            skipped.append(f"{candidate} unavailable")
            continue
        why = f"auto: fastest {target} runtime measured on CPUs with {bf16}"
        _record(tower, _graph_choice(graph, why if not skipped else f"{why}; {', '.join(skipped)}"))
        return graph
    reason = f"auto: fastest {target} runtime on CPUs with {bf16}" if not skipped else "auto: " + ", ".join(skipped)
    _record(tower, {**torch_choice, "reason": reason})
    return None


def _int8_instructions() -> bool:
    """Whether the CPU has 8-bit dot-product instructions (VNNI / AMX), where int8 pays; logged when not."""
    from twotower.encoders.runtimes_graph import _isa

    if _isa() == "vnni":
        return True
    log.info("auto runtime: no int8 (this CPU has no 8-bit dot-product instructions: VNNI / AMX)")
    return False


def _auto_int8(tower: TextEncoder, texts: Sequence[str], max_length: int | None) -> tuple[GraphTower | None, str]:
    """``(openvino-int8 graph, "")`` calibrated on ``texts`` if the graph passes the int8 check on the probe texts
    and keeps :data:`AUTO_INT8_MIN_COSINE` on :data:`~twotower.encoders.runtimes_tower.INT8_SAMPLE` of ``texts``;
    else ``(None, why)``, logging why. A failed cosine check is remembered for this model on this CPU kind (:func:`runtimes_int8.remember_refusal`):
    later encodings skip int8 instead of calibrating again (minutes each)."""
    from twotower.encoders import runtimes_int8

    before = runtimes_int8.refused(tower)
    if before is not None:
        log.info("auto runtime: not openvino-int8 (refused before for this model on this CPU: %s)", before)
        return None, "openvino-int8 refused before for this model"
    try:
        graph = graph_tower(tower, "openvino-int8", "int8", texts=texts, max_length=max_length,
                             min_cosine=AUTO_INT8_MIN_COSINE)
        graph.check_sample(texts)
    except TwoTowerError as exc:
        log.warning("auto runtime: not openvino-int8 (%s); trying the next", exc)
        if isinstance(exc, QualityError):
            runtimes_int8.remember_refusal(tower, str(exc))
        return None, "openvino-int8 did not pass"
    _record(tower, _graph_choice(graph, f"auto: int8 on a CPU with {'AMX' if has_amx() else 'VNNI'}, cosine to "
                                        f"fp32 ≥ {AUTO_INT8_MIN_COSINE} on {INT8_SAMPLE} of these texts"))
    return graph, ""


def encode_with_runtime(
    tower: TextEncoder, texts: Sequence[str], *, runtime: str | None = None, precision: str = "auto",
    max_length: int | None = None, batch_size: int | None = None, show_progress: bool = True,
    desc: str = "encoding", compile: bool = False, unit: str = "text",
) -> np.ndarray:
    """:func:`~twotower.encoders.inference.encode_texts` through ``runtime`` (None: :func:`current_runtime`);
    ``unit``: what its progress bar counts."""
    runtime = runtime or current_runtime()
    graph = graph_for(tower, runtime, precision, compile=compile, texts=texts, max_length=max_length)
    used = _used.get()
    if used is not None:
        used[desc.removeprefix("encoding ")] = last_choice(tower)
    if graph is None:
        if runtime == "auto":  # torch at the precision auto chose
            precision = last_choice(tower)["precision"]
        return encode_texts(tower, texts, max_length=max_length, batch_size=batch_size, precision=precision,
                            show_progress=show_progress, desc=desc, compile=compile, unit=unit)
    return graph.encode(texts, max_length=max_length, batch_size=batch_size, show_progress=show_progress, desc=desc,
                        unit=unit)
