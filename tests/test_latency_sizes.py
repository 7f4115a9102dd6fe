"""Latency by model size (GTR §8): the per-model and across-model notes of ``analyze latency``."""

from __future__ import annotations

from twotower.analysis.latency import size_notes


def _row(model: str, precision: str, p50: float, docs: float, params: float, dim: int) -> dict:
    return {"model": model, "precision": precision, "resolved_precision": "bf16" if precision == "auto" else "fp32",
            "p50_ms": p50, "docs_per_s": docs, "params_m": params, "dim": dim}


def test_size_notes_compare_models_and_precisions():
    rows = [_row("minilm-l6", "fp32", 10.0, 40.0, 22.6, 384), _row("minilm-l6", "auto", 5.0, 80.0, 22.6, 384),
            _row("mpnet-base", "fp32", 40.0, 8.0, 108.9, 768), _row("mpnet-base", "auto", 15.0, 20.0, 108.9, 768)]
    notes = size_notes(rows)
    assert notes[0].startswith("minilm-l6 (22.6M parameters, 384-d)") and "2.00× fp32" in notes[0]
    assert "mpnet-base (108.9M parameters, 768-d)" in notes[1]
    assert "mpnet-base vs minilm-l6 at fp32: 4.8× the parameters, 4.0× the batch-1 latency, 5.0× fewer" in notes[2]
    assert "at auto" in notes[3]
    assert len(size_notes(rows[:2])) == 1  # one model: no comparison
