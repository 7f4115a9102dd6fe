"""Stages TOML files: relative paths inside them are read from the file's folder, not the working directory."""

from __future__ import annotations

import json
import textwrap

from typer.testing import CliRunner

from conftest import TINY_CORPUS, write_beir
from twotower.cli import app
from twotower.training.trainer import TrainConfig

QUERIES = ["cats purr", "dogs bark loudly", "rust is memory safe", "green tea"]


def _beir(root):
    queries = [{"_id": f"q{i}", "text": t} for i, t in enumerate(QUERIES)]
    qrels = [(f"q{i}", f"d{i + 1}", 1) for i in range(len(QUERIES))]
    return write_beir(root, TINY_CORPUS, queries, qrels, split="train")


def test_relative_paths_resolve_against_the_toml_folder(tmp_path, monkeypatch):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "models" / "mine").mkdir(parents=True)
    toml = folder / "stages.toml"
    toml.write_text(textwrap.dedent(f"""
        model = "models/mine"
        out = "runs/a"
        [[stage]]
        data = "data/beir"
        [[stage]]
        pairs = "../pairs.jsonl"
        [[stage]]
        data = "{tmp_path / 'absolute'}"
    """))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = TrainConfig.from_toml("../configs/stages.toml")  # the file itself named relative to the working directory
    assert cfg.model == str(folder / "models" / "mine")
    assert cfg.out == str(folder / "runs" / "a")
    assert [s.data for s in cfg.stages] == [str(folder / "data" / "beir"), None, str(tmp_path / "absolute")]
    assert cfg.stages[1].pairs == str(folder / "../pairs.jsonl")
    # options given on the command line are the user's, relative to the working directory: left alone
    cfg = TrainConfig.from_toml(toml, out="run", model="here/model")
    assert (cfg.out, cfg.model) == ("run", "here/model")


def test_model_names_and_hub_ids_stay_names(tmp_path):
    for name in ("mpnet-base", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        toml = tmp_path / "s.toml"
        toml.write_text(f'model = "{name}"\n[[stage]]\ndata = "d"\n')
        assert TrainConfig.from_toml(toml, out="o").model == name
    toml.write_text('model = "./mpnet-base"\n[[stage]]\ndata = "d"\n')  # "./": a path, even where nothing is yet
    assert TrainConfig.from_toml(toml, out="o").model == str(tmp_path / "mpnet-base")


def test_train_config_from_another_folder_end_to_end(tmp_path, tiny_bert_dir, monkeypatch):
    """`twotower train --config configs/stages.toml` run from elsewhere trains on the data beside the file."""
    folder = tmp_path / "configs"
    _beir(folder / "data")
    (folder / "models").mkdir()
    (folder / "models" / "tiny").symlink_to(tiny_bert_dir, target_is_directory=True)
    (folder / "stages.toml").write_text(textwrap.dedent("""
        model = "models/tiny"
        precision = "fp32"
        [[stage]]
        name = "only"
        data = "data"
        steps = 1
        batch_size = 2
    """))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["train", "--config", "configs/stages.toml", "--out", "run", "--no-progress"])
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert saved["model"] == str(folder / "models" / "tiny")
    assert saved["stages"][0]["data"] == str(folder / "data")
    assert (tmp_path / "run" / "model" / "twotower.json").is_file()
