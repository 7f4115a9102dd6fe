"""benchmarks/cpu_backends.py: a system that cannot be produced on this machine (sentence-transformers' int8 export
failing for avx2, a runtime missing) is a row with its reason, and the summary is taken over the rows that ran."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import benchmark_module


@pytest.fixture(scope="module")
def cpu_backends():
    return benchmark_module("cpu_backends")


def _unit(rows: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, 8)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_rows_keep_the_systems_that_could_not_run(cpu_backends):
    ref = _unit(4, 0)
    out = {cpu_backends.ST_TORCH: (ref, 4.0), "sentence-transformers openvino": (ref, 1.0),
           "twotower torch fp32": (ref, 2.0), "auto": (_unit(4, 1), 0.5)}
    precisions = dict.fromkeys(out, "fp32")
    int8 = "sentence-transformers onnx-int8 (avx2)"
    why = "ValueError: Unrecognized model in /tmp/st-model. Should have a model_type key in its config.json"
    rows = cpu_backends.result_rows(out, precisions, {int8: why}, 8, "auto")
    assert [r["system"] for r in rows] == [*out, int8]
    assert rows[-1]["not_run"] == why and rows[-1]["docs_per_s"] is None
    assert rows[1]["ratio_vs_st_torch"] == 4.0 and rows[1]["min_cosine_vs_st_fp32"] == pytest.approx(1.0)
    summary = cpu_backends.summarize(rows, [cpu_backends.ST_TORCH, "sentence-transformers openvino", int8], "auto",
                                     {"runtime": "x"})
    # the fastest ST row that ran and kept cosine 0.99; no int8 ratio without ST's int8 row
    assert summary["fastest_st_backend"] == "sentence-transformers openvino" and summary["auto_vs_fastest_st"] == 2.0
    assert "int8_vs_st_int8" not in summary


def test_without_any_sentence_transformers_row(cpu_backends):
    ref = _unit(3, 0)
    out = {"twotower torch fp32": (ref, 3.0), "auto": (ref, 1.0)}
    rows = cpu_backends.result_rows(out, dict.fromkeys(out, "fp32"), {cpu_backends.ST_TORCH: "worker did not start"},
                                    3, "auto")
    assert rows[1]["reference"] == "twotower torch fp32" and rows[1]["ratio_vs_st_torch"] == 3.0
    summary = cpu_backends.summarize(rows, [], "auto", {})
    assert "auto_vs_fastest_st" not in summary
