"""Matryoshka training (issue #33): the loss is the in-batch softmax written out by hand
(``test_trainer_wiring.gtr_loss``) on every re-normalised prefix, weighted and summed, both for
:class:`MatryoshkaLoss` alone and for the first logged step of a ``train()`` run (hard negatives, in-batch
duplicates, GradCache, both tower variants); dropping any prefix would move the loss beyond the tolerance."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from test_trainer_wiring import DUPLICATES, HARD, ROWS, TAU, _embed, _examples, gtr_loss
from twotower.data.pairs import save_pairs
from twotower.errors import TwoTowerError
from twotower.training.losses import InBatchSoftmaxLoss, MatryoshkaLoss
from twotower.training.trainer import StageConfig, TrainConfig, Trainer


def mrl_by_hand(q, d, h, dims, weights, duplicates) -> torch.Tensor:
    total = torch.zeros(())
    for m, w in zip(dims, weights):
        cut = [F.normalize(x[:, :m], dim=1) for x in (q, d, h)]
        total = total + w * gtr_loss(*cut, duplicates, TAU)
    return total


def _dropped(q, d, h, dims, weights, duplicates) -> list[float]:
    """The hand loss with each prefix left out in turn."""
    return [mrl_by_hand(q, d, h, dims[:i] + dims[i + 1:], weights[:i] + weights[i + 1:], duplicates).item()
            for i in range(len(dims))]


def test_matryoshka_loss_equals_the_weighted_sum_over_prefixes():
    torch.manual_seed(0)
    q, d, h = (F.normalize(torch.randn(n, 16), dim=1) for n in (6, 6, 4))
    dims, weights = (16, 8, 4), (1.0, 0.5, 2.0)
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[0, 1] = mask[1, 0] = True
    loss = MatryoshkaLoss(InBatchSoftmaxLoss(TAU), dims, weights)(q, d, h, false_negative_mask=mask)
    expected = mrl_by_hand(q, d, h, dims, weights, {(0, 1), (1, 0)})
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    for other in _dropped(q, d, h, dims, weights, {(0, 1), (1, 0)}):
        assert abs(other - expected.item()) > 0.05
    with pytest.raises(ValueError, match="Matryoshka dimension 32 is more than the embeddings' 16"):
        MatryoshkaLoss(InBatchSoftmaxLoss(TAU), (32, 8))(q, d)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_bert_dir):
    from conftest import copy_without_dropout

    return copy_without_dropout(tiny_bert_dir, tmp_path_factory.mktemp("mrl") / "model")


@pytest.mark.parametrize("towers,cache_chunk", [("sde", None), ("ade", 2)])
def test_first_logged_step_of_a_matryoshka_run_sums_every_prefix(model_dir, tmp_path, towers, cache_chunk):
    dims, weights = [16, 8, 4], [1.0, 1.0, 0.5]
    pairs = tmp_path / "pairs.jsonl"
    save_pairs(_examples(True), pairs)
    stage = StageConfig(hard_negatives=HARD, temperature=TAU, batch_size=len(ROWS), warmup=0.0, pairs=str(pairs),
                        steps=1, lr=1e-4, cache_chunk=cache_chunk)
    trainer = Trainer(TrainConfig(out=str(tmp_path / "run"), model=str(model_dir), towers=towers, dim=16,
                                  precision="fp32", show_progress=False, checkpoint_every=1000, stages=[stage],
                                  matryoshka=dims, matryoshka_weights=weights))
    with torch.no_grad():
        q, d, h = _embed(trainer.model, _examples(True))
        expected = mrl_by_hand(q, d, h, dims, weights, DUPLICATES).item()
        dropped = _dropped(q, d, h, dims, weights, DUPLICATES)
    trainer.train()
    log = json.loads((tmp_path / "run" / "train_log.json").read_text())
    assert len(log) == 1 and log[0]["loss"] == pytest.approx(expected, rel=1e-5)
    for other in dropped:  # a run that silently skipped a prefix would log one of these instead
        assert log[0]["loss"] != pytest.approx(other, rel=1e-3)


@pytest.mark.parametrize("settings, message", [
    ({"matryoshka": [16, 0]}, "matryoshka=0: a whole number at least 1"),
    ({"matryoshka": [8, 8]}, "give distinct dimensions of at least 1"),
    ({"matryoshka": [16, 8], "matryoshka_weights": [1.0]}, "one weight of 0 or more per dimension"),
    ({"matryoshka_weights": [1.0]}, "matryoshka_weights need matryoshka dimensions"),
    ({"matryoshka": [16, 8], "multivector": 4}, "trains single vectors"),
    ({"matryoshka": [64, 8]}, "64 is more than the model's 16 dimensions"),
])
def test_bad_matryoshka_settings_stop_before_training(model_dir, tmp_path, settings, message):
    cfg = TrainConfig(out=str(tmp_path / "run"), model=str(model_dir), dim=16, show_progress=False,
                      stages=[StageConfig(steps=1)], **settings)
    with pytest.raises(TwoTowerError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Trainer(cfg)
    assert not (tmp_path / "run").exists()


def test_cli_refuses_a_bad_matryoshka_list(tiny_beir, tmp_path):
    from typer.testing import CliRunner

    from twotower.cli import app

    res = CliRunner().invoke(app, ["train", "--data", str(tiny_beir), "--out", str(tmp_path / "run"),
                                   "--matryoshka", "32,half"])
    assert res.exit_code == 2 and "--matryoshka '32,half': give comma-separated int numbers" in res.output, res.output
