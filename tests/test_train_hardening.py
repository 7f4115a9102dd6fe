"""`twotower train` on bad options and interrupted runs: a clear error before any work, never a wrong model."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from typer.testing import CliRunner

from conftest import TINY_CORPUS, copy_without_dropout, write_beir
from twotower.cli import app
from twotower.encoders.towers import DualEncoder
from twotower.errors import TwoTowerError
from twotower.training.checkpoints import complete_checkpoints
from twotower.training.trainer import StageConfig, TrainConfig, Trainer

runner = CliRunner()


@pytest.fixture()
def train_beir(tmp_path):
    queries = [{"_id": f"q{i}", "text": f"question about {d['title'] or 'cells'}"} for i, d in enumerate(TINY_CORPUS)]
    qrels = [(f"q{i}", d["_id"], 1) for i, d in enumerate(TINY_CORPUS)]
    return write_beir(tmp_path / "beir", TINY_CORPUS, queries, qrels, split="train")


@pytest.mark.parametrize("args, message", [
    (["--temperature", "0"], "--temperature 0.0: a finite number above 0"),
    (["--temperature", "-1"], "--temperature -1.0: a finite number above 0"),
    (["--steps", "0"], "--steps 0: a whole number at least 1"),
    (["--steps", "-3"], "--steps -3: a whole number at least 1"),
    (["--epochs", "0"], "--epochs 0.0: a finite number above 0"),
    (["--dim", "0"], "--dim 0: a whole number at least 1"),
    (["--lr", "0"], "--lr 0.0: a finite number above 0"),
    (["--attention-dropout", "1.5"], "--attention-dropout 1.5"),
    (["--device", "gpu"], "--device 'gpu': not a device name"),
])
def test_bad_numbers_stop_before_any_work(tmp_path, tiny_bert_dir, train_beir, args, message):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--data", str(train_beir), "--model", str(tiny_bert_dir), "--out", str(out),
                              "--no-progress", *args])
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split()) and "Traceback" not in res.output
    assert not (out / "model").exists() and not (out / "train_config.json").exists()


def test_data_and_pairs_together_are_refused(tmp_path, tiny_bert_dir, train_beir):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"query": "a", "positive": "b"}\n')
    res = runner.invoke(app, ["train", "--data", str(train_beir), "--pairs", str(pairs), "--model", str(tiny_bert_dir),
                              "--out", str(tmp_path / "run"), "--no-progress"])
    assert res.exit_code == 2 and "gives both data" in " ".join(res.output.split())


def _cfg(out, model, data, **stage) -> TrainConfig:
    stage = {"data": str(data), "batch_size": 2, "steps": 4, "lr": 1e-3, **stage}
    return TrainConfig(out=str(out), model=str(model), precision="fp32", show_progress=False, checkpoint_every=2,
                       keep_checkpoints=10, stages=[StageConfig(**stage)])


def test_a_finished_run_is_not_overwritten_without_resume(tmp_path, tiny_bert_dir, train_beir):
    out = tmp_path / "run"
    Trainer(_cfg(out, tiny_bert_dir, train_beir, steps=2)).train()
    before = (out / "model" / "twotower.json").read_bytes()
    res = runner.invoke(app, ["train", "--data", str(train_beir), "--model", str(tiny_bert_dir), "--out", str(out),
                              "--steps", "2", "--batch-size", "2", "--no-progress"])
    assert res.exit_code == 2 and "already holds a training run" in " ".join(res.output.split())
    assert (out / "model" / "twotower.json").read_bytes() == before


def _interrupted(out, cfg_factory, keep_until: int):
    """A run that 'was killed' after the checkpoint at global step ``keep_until``: later ones and the model gone."""
    import shutil

    Trainer(cfg_factory()).train()
    full_log = json.loads((out / "train_log.json").read_text())
    for ckpt in complete_checkpoints(out / "checkpoints"):
        if int(ckpt.name.split("-")[1]) > keep_until:
            shutil.rmtree(ckpt)
    shutil.rmtree(out / "model")
    (out / "train_log.json").unlink()
    return full_log


def test_resume_keeps_the_whole_log_and_names_checkpoints_by_global_step(tmp_path, tiny_bert_dir, train_beir):
    out = tmp_path / "run"

    def cfg():
        c = _cfg(out, tiny_bert_dir, train_beir, steps=4)
        c.stages = [StageConfig(name="a", data=str(train_beir), batch_size=2, steps=4, lr=1e-3),
                    StageConfig(name="b", data=str(train_beir), batch_size=2, steps=6, lr=1e-3)]
        return c

    full_log = _interrupted(out, cfg, keep_until=6)  # killed in stage b after its step 2 (global 6)
    assert [p.name for p in complete_checkpoints(out / "checkpoints")] == ["step-00000002", "step-00000006"]
    Trainer(cfg()).train(resume=True)
    names = [p.name for p in complete_checkpoints(out / "checkpoints")]
    assert names == ["step-00000002", "step-00000006", "step-00000008"]  # not offset by the resumed step
    log = json.loads((out / "train_log.json").read_text())
    assert [(r["stage"], r["step"]) for r in log] == [("a", s) for s in range(1, 5)] + [("b", s) for s in range(1, 7)]
    assert [r["global_step"] for r in log] == list(range(1, 11))
    assert [r["loss"] for r in log] == pytest.approx([r["loss"] for r in full_log], abs=1e-6)


def test_resume_falls_back_past_a_truncated_checkpoint(tmp_path, tiny_bert_dir, train_beir, caplog):
    out = tmp_path / "run"
    full_log = _interrupted(out, lambda: _cfg(out, tiny_bert_dir, train_beir, steps=6), keep_until=4)
    newest = out / "checkpoints" / "step-00000004" / "model.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a disk that filled up mid-copy
    with caplog.at_level(logging.WARNING):
        Trainer(_cfg(out, tiny_bert_dir, train_beir, steps=6)).train(resume=True)
    assert "step-00000004 cannot be read" in caplog.text
    log = json.loads((out / "train_log.json").read_text())
    assert [r["step"] for r in log] == list(range(1, 7))
    assert [r["loss"] for r in log] == pytest.approx([r["loss"] for r in full_log], abs=1e-6)


def test_resume_with_other_settings_is_refused(tmp_path, tiny_bert_dir, train_beir):
    out = tmp_path / "run"
    _interrupted(out, lambda: _cfg(out, tiny_bert_dir, train_beir, steps=4), keep_until=2)
    for change in ({"batch_size": 3}, {"steps": 8}, {"lr": 5e-4}):
        with pytest.raises(TwoTowerError, match=f"stage 1 {next(iter(change))}"):
            Trainer(_cfg(out, tiny_bert_dir, train_beir, **{"steps": 4, **change})).train(resume=True)
    res = runner.invoke(app, ["train", "--data", str(train_beir), "--model", str(tiny_bert_dir), "--out", str(out),
                              "--steps", "4", "--batch-size", "3", "--lr", "1e-3", "--precision", "fp32",
                              "--resume", "--no-progress"])
    assert res.exit_code == 2 and "differ from the checkpoint" in " ".join(res.output.split())


def test_resume_may_change_the_gradcache_chunk_and_gives_the_same_run(tmp_path, tiny_bert_dir, train_beir):
    """cache_chunk changes how a step is computed, not what: a resume may add it, and ends where the run without
    it ends (the losses of an uninterrupted run without GradCache; dropout off, whose masks GradCache's chunks
    draw in another order)."""
    model, out = copy_without_dropout(tiny_bert_dir, tmp_path / "model"), tmp_path / "run"
    full_log = _interrupted(out, lambda: _cfg(out, model, train_beir, steps=4), keep_until=2)
    with pytest.raises(TwoTowerError, match="stage 1 batch_size"):  # what a step computes is still checked
        Trainer(_cfg(out, model, train_beir, steps=4, batch_size=3, cache_chunk=1)).train(resume=True)
    Trainer(_cfg(out, model, train_beir, steps=4, cache_chunk=1)).train(resume=True)
    log = json.loads((out / "train_log.json").read_text())
    assert [r["loss"] for r in log] == pytest.approx([r["loss"] for r in full_log], abs=1e-5)


def test_checkpoint_minutes_checkpoints_a_slow_run_between_step_checkpoints(tmp_path, tiny_bert_dir, train_beir):
    """checkpoint_minutes=10 with steps of 7 minutes (a clock that advances 7 minutes a step): a checkpoint after
    steps 2, 4 and 6 (14 minutes after the last), none after the last step; without it, none at all."""
    def run(out, minutes):
        cfg = _cfg(out, tiny_bert_dir, train_beir, steps=7)
        cfg.checkpoint_every, cfg.checkpoint_minutes = 1000, minutes
        trainer = Trainer(cfg)
        trainer.clock = lambda: 7 * 60 * (len(trainer.history) + len(trainer._pending))  # 7 minutes a step
        trainer.train()
        return [p.name for p in complete_checkpoints(out / "checkpoints")]

    assert run(tmp_path / "timed", 10) == ["step-00000002", "step-00000004", "step-00000006"]
    assert run(tmp_path / "steps", None) == []


@pytest.mark.parametrize("minutes", [0, -1, float("nan"), True, "10"])
def test_checkpoint_minutes_must_be_positive(tmp_path, minutes):
    cfg = TrainConfig(out=str(tmp_path / "run"), checkpoint_minutes=minutes)
    with pytest.raises(TwoTowerError, match="checkpoint_minutes"):
        cfg.validate()


def test_a_diverged_loss_stops_training_without_saving(tmp_path, tiny_bert_dir, train_beir):
    out = tmp_path / "run"
    cfg = _cfg(out, tiny_bert_dir, train_beir, steps=2, temperature=1e-45)  # scores / 1e-45 overflow: inf - inf
    with pytest.raises(TwoTowerError, match="training diverged"):
        Trainer(cfg).train()
    assert not (out / "model").exists()


def test_stages_file_values_of_the_wrong_type(tmp_path):
    bad = tmp_path / "stages.toml"
    bad.write_text("[[stage]]\nname = 'x'\nsteps = 'ten'\n")
    with pytest.raises(TwoTowerError, match=r"stage 1: 'steps' is 'ten', wanted int"):
        TrainConfig.from_toml(bad, out="x")


def test_model_passed_in_stays_on_its_device_unless_one_is_named(tmp_path, tiny_bert_dir, train_beir):
    model = DualEncoder.build(tiny_bert_dir)
    assert Trainer(_cfg(tmp_path / "r", tiny_bert_dir, train_beir), model=model).device == torch.device("cpu")
