"""`train --tensorboard`: event files with the logged losses when tensorboard is installed; a clear error (exit 2,
no traceback, nothing written) before training starts when it is not."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from conftest import TINY_CORPUS, write_beir
from twotower.cli import app
from twotower.errors import TwoTowerError
from twotower.training.tensorboard_log import require_tensorboard

runner = CliRunner()
QUERIES = ["cats purr", "dogs bark loudly", "rust is memory safe", "green tea"]


def _train_beir(tmp_path):
    queries = [{"_id": f"q{i}", "text": t} for i, t in enumerate(QUERIES)]
    qrels = [(f"q{i}", f"d{i + 1}", 1) for i in range(len(QUERIES))]
    return write_beir(tmp_path / "train-beir", TINY_CORPUS, queries, qrels, split="train")


def _train_args(tmp_path, model_dir, out):
    return ["train", "--data", str(_train_beir(tmp_path)), "--model", str(model_dir), "--out", str(out),
            "--steps", "2", "--batch-size", "2", "--precision", "fp32", "--no-progress", "--tensorboard"]


@pytest.fixture
def without_tensorboard(monkeypatch):
    """Make `import tensorboard` fail as it does where the package is not installed."""
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # None in sys.modules: ImportError on import
    for name in [m for m in sys.modules if m.startswith("torch.utils.tensorboard")]:
        monkeypatch.delitem(sys.modules, name)


def test_missing_tensorboard_is_a_clear_error_before_training(tmp_path, tiny_bert_dir, without_tensorboard):
    with pytest.raises(TwoTowerError,
                       match=r"tensorboard=True needs the package 'tensorboard'.*twotower\[tensorboard\]"):
        require_tensorboard()
    out = tmp_path / "run"
    res = runner.invoke(app, _train_args(tmp_path, tiny_bert_dir, out))
    assert res.exit_code == 2, res.output
    assert "--tensorboard needs the package 'tensorboard'" in res.output
    assert "leave --tensorboard out" in res.output
    assert "Traceback" not in res.output
    assert not out.exists(), "the run started before the check"


def test_tensorboard_event_files_hold_the_logged_losses(tmp_path, tiny_bert_dir):
    pytest.importorskip("tensorboard", reason="the package 'tensorboard' is not installed (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    res = runner.invoke(app, _train_args(tmp_path, tiny_bert_dir, out))
    assert res.exit_code == 0, res.output
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    losses = [(e.step, e.value) for e in events.Scalars("finetune/loss")]
    log = json.loads((out / "train_log.json").read_text())
    assert [s for s, _ in losses] == [r["step"] for r in log] == [1, 2]
    assert [v for _, v in losses] == pytest.approx([r["loss"] for r in log], rel=1e-6)
