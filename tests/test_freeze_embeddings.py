"""``freeze_embeddings`` / ``train --freeze-embeddings``: the token-embedding matrix gets no gradient and no
optimizer state while every other backbone weight still trains; recorded in the run, a resume invariant."""

from __future__ import annotations

import json

import torch
from typer.testing import CliRunner

from twotower.data.pairs import TrainExample, save_pairs
from twotower.encoders.towers import DualEncoder
from twotower.training.config import RESUME_INVARIANTS
from twotower.training.optimizer import make_optimizer
from twotower.training.trainer import StageConfig, TrainConfig, Trainer

PAIRS = [TrainExample(query=f"question {i} about cats", positive=f"answer {i}: cats purr and sleep") for i in range(8)]
EMB = {f"{t}_tower.backbone.embeddings.word_embeddings.weight" for t in ("query", "doc")}  # shared (sde): both names


def _pairs(tmp_path):
    path = tmp_path / "pairs.jsonl"
    save_pairs(PAIRS, path)
    return path


def _changed(before: dict, after: dict) -> set[str]:
    return {k for k, v in after.items() if k in before and not torch.equal(v, before[k])}


def test_frozen_embeddings_stay_and_the_rest_trains(tmp_path, tiny_bert_dir):
    before = {k: v.clone() for k, v in DualEncoder.build(tiny_bert_dir).state_dict().items()}
    stage = StageConfig(pairs=str(_pairs(tmp_path)), batch_size=4, steps=2, lr=1e-2)
    runs = {}
    for freeze in (False, True):
        trainer = Trainer(TrainConfig(out=str(tmp_path / f"run{freeze}"), model=str(tiny_bert_dir), precision="fp32",
                                      freeze_embeddings=freeze, show_progress=False, stages=[stage]))
        emb = trainer.model.query_tower.backbone.get_input_embeddings().weight
        state_ids = {id(p) for g in make_optimizer(trainer.model, stage).param_groups for p in g["params"]}
        assert (id(emb) in state_ids) is not freeze  # no AdamW moments for a frozen matrix
        trainer.train()
        saved = json.loads((tmp_path / f"run{freeze}" / "train_config.json").read_text())
        assert saved["freeze_embeddings"] is freeze
        runs[freeze] = _changed(before, DualEncoder.load(tmp_path / f"run{freeze}" / "model").state_dict())
    assert EMB <= runs[False] and not EMB & runs[True]  # lr 1e-2: two steps move every trained matrix
    assert runs[True] == runs[False] - EMB, "freezing the embeddings must leave the rest training"
    assert "freeze_embeddings" in RESUME_INVARIANTS


def test_cli_freeze_embeddings(tmp_path, tiny_bert_dir):
    from twotower.cli import app

    res = CliRunner().invoke(app, ["train", "--pairs", str(_pairs(tmp_path)), "--model", str(tiny_bert_dir),
                                   "--out", str(tmp_path / "run"), "--steps", "1", "--batch-size", "4",
                                   "--freeze-embeddings", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["freeze_embeddings"] is True
    res = CliRunner().invoke(app, ["train", "--pairs", str(_pairs(tmp_path)), "--model", str(tiny_bert_dir),
                                   "--out", str(tmp_path / "run2"), "--steps", "1", "--batch-size", "4", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "run2" / "train_config.json").read_text())["freeze_embeddings"] is False


def test_toml_freeze_embeddings(tmp_path, tiny_bert_dir):
    toml = tmp_path / "run.toml"
    toml.write_text(f'freeze_embeddings = true\nout = "{tmp_path / "o"}"\n[[stage]]\nsteps = 1\n')
    assert TrainConfig.from_toml(toml).freeze_embeddings is True
    toml.write_text(f'freeze_embeddings = "yes"\nout = "{tmp_path / "o"}"\n[[stage]]\nsteps = 1\n')
    import pytest

    from twotower.errors import TwoTowerError

    with pytest.raises(TwoTowerError, match="freeze_embeddings"):
        TrainConfig.from_toml(toml)


def test_separate_towers_both_frozen(tmp_path, tiny_bert_dir):
    from twotower.training.optimizer import freeze_token_embeddings

    model = DualEncoder.build(tiny_bert_dir, towers="ade")
    vocab, hidden = model.query_tower.backbone.get_input_embeddings().weight.shape
    assert freeze_token_embeddings(model) == 2 * vocab * hidden
    assert not any(t.backbone.get_input_embeddings().weight.requires_grad for t in (model.query_tower, model.doc_tower))
    assert all(p.requires_grad for n, p in model.named_parameters() if "word_embeddings" not in n)


def test_pretrain_cli_freeze_embeddings(tmp_path, tiny_bert_dir):
    """``pretrain --freeze-embeddings``: recorded, and the embedding matrix leaves the run unchanged while the rest
    of the backbone moves."""
    from twotower.cli import app

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"cats purr and sleep in the sun number {i} "
                                          "while dogs bark at the mail and birds sing"}) + "\n" for i in range(8)))
    before = {k: v.clone() for k, v in DualEncoder.build(tiny_bert_dir).state_dict().items()}
    res = CliRunner().invoke(app, ["pretrain", "--corpus", str(corpus), "--model", str(tiny_bert_dir), "--out",
                                   str(tmp_path / "pre"), "--steps", "2", "--batch-size", "4", "--lr", "1e-2",
                                   "--chunk-tokens", "16", "--precision", "fp32", "--freeze-embeddings", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "pre" / "train_config.json").read_text())["freeze_embeddings"] is True
    changed = _changed(before, DualEncoder.load(tmp_path / "pre" / "model").state_dict())
    assert changed and not EMB & changed
