"""Saving a model prints no progress bar of its own (issue #35, case 10): transformers' "Writing model shards" bar
appeared under --no-progress. Saving a few MB is not a wait a bar should announce, so saves are quiet always."""

from __future__ import annotations

from typer.testing import CliRunner

from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, write_beir


def test_saving_a_tower_prints_no_progress_bar(tiny_bert_dir, tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    from twotower.encoders.io import load_tower, save_tower

    tower = load_tower(str(tiny_bert_dir))
    capfd.readouterr()
    save_tower(tower, tmp_path / "saved")
    out, err = capfd.readouterr()
    assert "Writing model shards" not in out + err and "it/s" not in err, err
    assert (tmp_path / "saved" / "config.json").is_file()
    assert hf_logging.is_progress_bar_enabled()  # put back as it was, for whoever wants bars


def test_train_with_no_progress_prints_no_bar(tiny_bert_dir, tmp_path, capfd):
    from twotower.cli import app

    data = write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, TINY_QRELS, split="train")
    capfd.readouterr()
    res = CliRunner().invoke(app, ["train", "--data", str(data), "--model", str(tiny_bert_dir), "--out",
                                   str(tmp_path / "run"), "--epochs", "1", "--batch-size", "2", "--no-progress",
                                   "--precision", "fp32"])
    out, err = capfd.readouterr()
    assert res.exit_code == 0, res.output
    for text in (res.output, out, err):
        assert "Writing model shards" not in text and "it/s]" not in text, text
    assert (tmp_path / "run" / "model" / "config.json").is_file()
