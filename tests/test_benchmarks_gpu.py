"""benchmarks/gpu.py's fair timing, on the CPU: every system warmed up and timed over the same texts the same number of
passes (best kept, turns alternating), and the ratios taken against ST fp16's fastest batch."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import benchmark_module


@pytest.fixture(scope="module")
def gpu():
    return benchmark_module("gpu")


def test_timed_passes_same_work_for_every_system(gpu, monkeypatch):
    calls = []
    clock = iter(range(1000))
    monkeypatch.setattr(gpu.time, "perf_counter", lambda: float(next(clock)))

    def system(name, cost):
        def run(texts):
            calls.append((name, len(texts)))
            for _ in range(cost - 1):  # each extra tick: a slower pass
                next(clock)
            return np.ones((len(texts), 2))
        return run

    texts = [f"t{i}" for i in range(10)]
    timed = gpu.timed_passes({"a": system("a", 1), "b": system("b", 3)}, texts, passes=3, warmup=4)
    assert calls[:2] == [("a", 4), ("b", 4)]  # one warm-up call each on the same first texts
    assert calls[2:] == [("a", 10), ("b", 10), ("b", 10), ("a", 10), ("a", 10), ("b", 10)]  # turns alternate
    assert [len(timed[n][2]) for n in "ab"] == [3, 3]
    assert timed["a"][1] == min(timed["a"][2]) == 1.0 and timed["b"][1] == 3.0
    assert timed["a"][0].shape == (10, 2) and timed["a"][0].dtype == np.float32
    with pytest.raises(ValueError):
        gpu.timed_passes({"a": system("a", 1)}, texts, passes=0, warmup=1)


def test_ratios_against_the_fastest_st_fp16_batch(gpu):
    rows = [{"system": "sentence-transformers fp32", "docs_per_s": 100.0}]
    rows += [{"system": f"sentence-transformers fp16 (batch {b})", "docs_per_s": r}
             for b, r in zip(gpu.ST_FP16_BATCHES, (150.0, 200.0, 250.0, 240.0))]
    rows += [{"system": "twotower default", "docs_per_s": 1000.0}, {"system": "tokenizer alone", "docs_per_s": 1250.0}]
    gpu.mark_baselines(rows)
    best = [r for r in rows if r.get("fastest_st_fp16")]
    assert [r["system"] for r in best] == ["sentence-transformers fp16 (batch 256)"]
    tt = rows[-2]
    assert (tt["x_st_fp16_best"], tt["x_st_fp32"], tt["x_tokenizer_alone"]) == (4.0, 10.0, 0.8)
