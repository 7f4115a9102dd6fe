"""``fit --matryoshka`` (issue #33): the Matryoshka dimensions and weights reach the training config of both of
fit's training rounds (the trainer builds its MatryoshkaLoss from that config: test_compression_mrl checks the
loss), through the CLI and ``tt.fit``; a rerun with the same options resumes; bad values stop before encoding."""

from __future__ import annotations

import json

import pytest

from test_fit import _data

import twotower as tt


def _configs(out) -> dict:
    return {stage: json.loads(p.read_text()) for stage in ("finetune", "retrain")
            if (p := out / "stages" / stage / "run" / "train_config.json").is_file()}


def test_cli_fit_carries_matryoshka_into_training_and_resumes(tiny_bert_dir, tmp_path):
    from typer.testing import CliRunner

    from twotower.cli import app

    data = _data(tmp_path / "data", test_split=False)
    out = tmp_path / "fit"
    args = ["fit", "--data", str(data), "--out", str(out), "--model", str(tiny_bert_dir), "--min-dev", "4",
            "--batch-size", "4", "--epochs", "1", "--no-mine", "--no-progress", "--precision", "fp32",
            "--matryoshka", "32,16,8", "--matryoshka-weights", "1,1,2", "--cv-below", "0"]
    runner = CliRunner()
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    configs = _configs(out)
    assert list(configs) == ["finetune"]
    assert configs["finetune"]["matryoshka"] == [32, 16, 8]
    assert configs["finetune"]["matryoshka_weights"] == [1.0, 1.0, 2.0]
    recipe = json.loads((out / "fit.json").read_text())["recipe"]
    assert recipe["matryoshka"] == [32, 16, 8] and recipe["matryoshka_weights"] == [1.0, 1.0, 2.0]
    res = runner.invoke(app, args)  # the recipe read back from JSON (lists) equals the new one (tuples)
    assert res.exit_code == 0 and "already done" in res.output, res.output
    res = runner.invoke(app, args[:-4])  # the same out without Matryoshka is another recipe
    assert res.exit_code == 2 and "matryoshka" in res.output


def test_api_fit_carries_matryoshka_into_both_training_rounds(tiny_bert_dir, tmp_path):
    data = _data(tmp_path / "data")
    result = tt.fit(data, tmp_path / "fit", model=str(tiny_bert_dir), min_dev=4, batch_size=4, epochs=1,
                    mined_epochs=1, rank_from=1, rank_to=8, mined_per_query=2, matryoshka=[32, 8],
                    show_progress=False, precision="fp32", cv_below=0)
    configs = _configs(result.out)
    assert sorted(configs) == ["finetune", "retrain"]
    for config in configs.values():
        assert config["matryoshka"] == [32, 8] and config["matryoshka_weights"] is None


@pytest.mark.parametrize("extra, message", [
    (["--matryoshka", "64,16"], "64 is more than the model's 32 dimensions"),
    (["--matryoshka", "32,x"], "--matryoshka '32,x': comma-separated int numbers"),
    (["--matryoshka", "32,16", "--matryoshka-weights", "1"], "one weight of 0 or more per dimension"),
    (["--matryoshka-weights", "1,2"], "--matryoshka-weights need --matryoshka dimensions"),
])
def test_bad_fit_matryoshka_stops_before_encoding(tiny_bert_dir, tmp_path, extra, message):
    from typer.testing import CliRunner

    from twotower.cli import app

    data = _data(tmp_path / "data", test_split=False)
    out = tmp_path / "fit"
    res = CliRunner().invoke(app, ["fit", "--data", str(data), "--out", str(out), "--model", str(tiny_bert_dir),
                                   "--min-dev", "4", "--batch-size", "4", "--no-mine", "--no-progress", *extra])
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split())
    assert not list(out.glob("stages/*/doc_vectors.npy"))  # nothing was encoded
