"""Issue 35 (hardening B), training side: the logged learning rate, what fit reports against what eval runs,
degenerate training data, judged documents without text, stage files against CLI defaults."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import TINY_CORPUS, write_beir
from twotower.cli import app
from twotower.training.trainer import StageConfig, TrainConfig, Trainer

runner = CliRunner()


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture()
def train_beir(tmp_path):
    queries = [{"_id": f"q{i}", "text": f"question about {d['title'] or 'cells'}"} for i, d in enumerate(TINY_CORPUS)]
    qrels = [(f"q{i}", d["_id"], 1) for i, d in enumerate(TINY_CORPUS)]
    return write_beir(tmp_path / "beir", TINY_CORPUS, queries, qrels, split="train")


# ---------------------------------------------------------------- case 9: the learning rate each step used


def test_train_log_records_the_rate_each_step_used(tmp_path, tiny_bert_dir, train_beir):
    """Linear decay without warm-up over 4 steps from 1e-3: step s (1-based) updates at 1e-3·(4 − (s − 1))/4,
    so the log reads 1e-3, 7.5e-4, 5e-4, 2.5e-4 (today's log is one step ahead and ends at 0)."""
    out = tmp_path / "run"
    cfg = TrainConfig(out=str(out), model=str(tiny_bert_dir), precision="fp32", show_progress=False,
                      stages=[StageConfig(data=str(train_beir), batch_size=2, steps=4, lr=1e-3, warmup=0.0)])
    Trainer(cfg).train()
    log = json.loads((out / "train_log.json").read_text())
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    assert [r["lr"] for r in log] == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])


def test_train_log_rate_with_warmup(tmp_path, tiny_bert_dir, train_beir):
    """warmup 0.5 of 4 steps = 2 warm-up steps: the rates used are 0, 5e-4 (rising), 1e-3, 5e-4 (falling)."""
    out = tmp_path / "run"
    cfg = TrainConfig(out=str(out), model=str(tiny_bert_dir), precision="fp32", show_progress=False,
                      stages=[StageConfig(data=str(train_beir), batch_size=2, steps=4, lr=1e-3, warmup=0.5)])
    Trainer(cfg).train()
    log = json.loads((out / "train_log.json").read_text())
    assert [r["lr"] for r in log] == pytest.approx([0.0, 5e-4, 1e-3, 5e-4])
