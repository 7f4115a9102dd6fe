"""Inference sessions over an exported graph: ONNX Runtime (fp32, or the int8 graph) and OpenVINO (fp32 or bf16).

Each session takes padded ``input_ids`` / ``attention_mask`` arrays (int64, any batch size and length) and returns
the tower's embeddings (float32, pooled, projected and normalised as the tower does). Threads: as many as torch uses.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from twotower.errors import TwoTowerError


def _missing(package: str, runtime: str, exc: Exception) -> TwoTowerError:
    return TwoTowerError(f"runtime '{runtime}' needs {package} ({type(exc).__name__}: {exc}): pip install "
                         "'twotower[cpu]', or use runtime 'torch'")


class OrtSession:
    """ONNX Runtime's CPU provider, every graph optimisation on (LayerNorm, GELU, bias and skip fusions)."""

    def __init__(self, graph: Path, *, runtime: str = "onnx") -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise _missing("onnxruntime", runtime, exc) from exc
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = torch.get_num_threads()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3  # errors only
        try:
            self.session = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            raise TwoTowerError(f"ONNX Runtime could not load {graph} ({type(exc).__name__}: {exc})") from exc
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.version = f"onnxruntime {ort.__version__}"

    def __call__(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feed = {"input_ids": input_ids, "attention_mask": mask}
        return self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})[0]


class OpenVinoSession:
    """OpenVINO's CPU plugin reading the ONNX graph, with ``INFERENCE_PRECISION_HINT`` f32 or bf16 (bf16: its
    AVX512-BF16 / AMX kernels; the hint is what makes it bf16, not the graph).

    One call (:meth:`__call__`) runs on a model compiled for latency: every thread on one batch. Many batches
    (:meth:`run_many`, a corpus) run on a second model, compiled on first use for throughput: OpenVINO's streams,
    each a share of the threads working on its own batch, fed by an asynchronous queue (on 2 cores, two streams of
    one thread: fewer waits at each layer's barrier than two threads on one batch)."""

    def __init__(self, graph: Path, *, precision: str) -> None:
        try:
            import openvino as ov
        except ImportError as exc:
            raise _missing("openvino", "openvino", exc) from exc
        self.core, self.graph, self.ov = ov.Core(), graph, ov
        self.config = {"INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32",
                       "INFERENCE_NUM_THREADS": torch.get_num_threads()}
        self.compiled = self._compile("LATENCY")
        self.request = self.compiled.create_infer_request()
        self.inputs = {p.get_any_name() for p in self.compiled.inputs}
        self.version = f"openvino {ov.__version__}"
        self._throughput = None

    def _compile(self, hint: str):
        try:
            return self.core.compile_model(self.core.read_model(str(self.graph)), "CPU",
                                           {**self.config, "PERFORMANCE_HINT": hint})
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises RuntimeError and its own types
            raise TwoTowerError(f"OpenVINO could not compile {self.graph} ({type(exc).__name__}: {exc})") from exc

    def _feed(self, input_ids: np.ndarray, mask: np.ndarray) -> dict:
        return {k: v for k, v in {"input_ids": input_ids, "attention_mask": mask}.items() if k in self.inputs}

    def __call__(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        result = self.request.infer(self._feed(input_ids, mask))
        return np.array(result[self.compiled.outputs[0]], dtype=np.float32, copy=True)

    def run_many(self, batches, out: np.ndarray, progress=lambda n: None) -> None:
        """``out[rows] = embeddings`` for every ``(rows, input_ids, mask)`` of ``batches`` (numpy arrays), on the
        throughput model, as many batches in flight as it has streams; ``progress(n)`` after each batch."""
        if self._throughput is None:
            self._throughput = self._compile("THROUGHPUT")
        compiled = self._throughput
        queue = self.ov.AsyncInferQueue(compiled, max(1, compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        errors: list[BaseException] = []

        def done(request, rows) -> None:
            try:
                out[rows] = request.get_output_tensor(0).data
                progress(len(rows))
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
                errors.append(exc)

        queue.set_callback(done)
        for rows, input_ids, mask in batches:
            queue.start_async(self._feed(input_ids, mask), rows)
            if errors:
                break
        queue.wait_all()
        if errors:
            raise errors[0]
