"""Issue #46 for training, pre-training, fit, the analyses, language alignment and devices: a message raised in
Python names the Python parameter (``matryoshka=[8, 8]``, ``ratio_min``, ``device='gpu'``); the CLI, which runs its
commands under command-line names, shows the flag (``--matryoshka 8,8``, ``--crop-min``, ``--device 'gpu'``). Each
case gives the same bad input through ``tt`` and through ``twotower``, and is refused before any training or
encoding."""

from __future__ import annotations

import pytest

import twotower as tt
from surfaces import cli_message, python_message


def _train_config(out, model, **settings):
    return tt.TrainConfig(out=str(out), model=str(model), device="cpu", show_progress=False,
                          stages=[tt.StageConfig(steps=1, batch_size=2)], **settings)


def test_train_matryoshka_lists_as_each_caller_writes_them(tiny_beir, tiny_bert_dir, tmp_path):
    py, cli = tmp_path / "py", tmp_path / "cli"
    text = python_message(lambda: tt.train(_train_config(py, tiny_bert_dir, matryoshka=[8, 8])))
    assert "matryoshka=[8, 8]: give distinct dimensions of at least 1, e.g. matryoshka=[384, 192, 96, 48]" in text
    text = python_message(lambda: tt.train(_train_config(py, tiny_bert_dir, matryoshka_weights=[1.0])))
    assert "matryoshka_weights need matryoshka dimensions" in text
    base = ("train", "--data", tiny_beir, "--split", "test", "--model", tiny_bert_dir, "--out", cli, "--steps", "1",
            "--no-progress")
    text = cli_message(*base, "--matryoshka", "8,8")
    assert "--matryoshka 8,8: give distinct dimensions of at least 1, e.g. --matryoshka 384,192,96,48" in text
    text = cli_message(*base, "--matryoshka-weights", "1,2")
    assert "--matryoshka-weights need --matryoshka dimensions" in text
    assert not py.exists() and not cli.exists()


def test_train_stages_file_not_found(tmp_path):
    missing = tmp_path / "none.toml"
    text = python_message(lambda: tt.train(missing, out=str(tmp_path / "py")))
    assert f"config='{missing}': file not found (give a TOML file with [[stage]] tables)" in text
    text = cli_message("train", "--config", missing, "--out", tmp_path / "cli")
    assert f"--config {missing}: file not found" in text


def test_pretrain_views_name_the_ratios(tmp_path, tiny_bert_dir):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one document about cats.\n\nanother about dogs.\n")
    cfg = tt.TrainConfig(out=str(tmp_path / "py"), model=str(tiny_bert_dir), device="cpu", show_progress=False,
                         stages=[tt.StageConfig(name="pretrain", steps=1, batch_size=2)])

    def pretrain(**views):
        return tt.pretrain(cfg, tt.PretrainConfig(corpus=str(corpus), views=tt.ViewConfig(**views)))

    text = python_message(lambda: pretrain(ratio_min=0.6, ratio_max=0.5))
    assert "crop ratios (ratio_min, ratio_max) must satisfy 0 < min ≤ max ≤ 1, got [0.6, 0.5]" in text
    text = python_message(lambda: pretrain(delete=0.5, replace=0.5))
    assert "at 1 no token of the text is kept (Contriever: delete=0.1)" in text
    base = ("pretrain", "--corpus", corpus, "--out", tmp_path / "cli", "--model", tiny_bert_dir, "--device", "cpu",
            "--steps", "1", "--batch-size", "2", "--no-progress")
    text = cli_message(*base, "--crop-min", "0.6", "--crop-max", "0.5")
    assert "crop ratios (--crop-min, --crop-max) must satisfy 0 < min ≤ max ≤ 1, got [0.6, 0.5]" in text
    text = cli_message(*base, "--delete", "0.5", "--replace", "0.5")
    assert "(Contriever: --delete 0.1)" in text
    assert not (tmp_path / "py").exists() and not (tmp_path / "cli").exists()


def test_fit_damaged_run_folder_names_out(tiny_beir, tmp_path):
    out = tmp_path / "fit"
    out.mkdir()
    (out / "recipe.json").write_text("{")
    text = python_message(lambda: tt.fit(tiny_beir, out, split="test", show_progress=False))
    assert "not valid JSON; out holds a damaged fit run: pass a new out" in text
    text = cli_message("fit", "--data", tiny_beir, "--out", out, "--split", "test", "--no-progress")
    assert "not valid JSON; --out holds a damaged fit run: pass a new --out" in text


def test_fit_without_a_corpus_names_data(tmp_path):
    missing = tmp_path / "no-beir"
    text = python_message(lambda: tt.fit(missing, tmp_path / "py", show_progress=False))
    assert f"data='{missing}': no corpus.jsonl (pass a BEIR-format directory)" in text
    text = cli_message("fit", "--data", missing, "--out", tmp_path / "cli", "--no-progress")
    assert f"--data {missing}: no corpus.jsonl" in text


def test_device_named_as_each_caller_knows_it(tiny_beir, tiny_bert_dir, tmp_path):
    text = python_message(lambda: tt.fit(tiny_beir, tmp_path / "py", device="gpu", show_progress=False))
    assert text.startswith("device='gpu': not a device name; choose auto | cpu | cuda | cuda:N")
    text = python_message(lambda: tt.Encoder.load(str(tiny_bert_dir), device="gpu"))
    assert text.startswith("device='gpu': not a device name")
    text = cli_message("fit", "--data", tiny_beir, "--out", tmp_path / "cli", "--device", "gpu", "--no-progress")
    assert "--device 'gpu': not a device name; choose auto | cpu | cuda | cuda:N" in text
    text = cli_message("index", "build", "--data", tiny_beir, "--out", tmp_path / "idx", "--model", tiny_bert_dir,
                        "--device", "gpu", "--no-progress")
    assert "--device 'gpu': not a device name" in text
    assert not (tmp_path / "py").exists() and not (tmp_path / "idx").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine without a GPU")
def test_cuda_without_a_gpu():
    text = python_message(lambda: tt.Encoder.load(None, device="cuda"))
    assert text.startswith("device='cuda': torch sees no CUDA GPU here") and "use device='cpu' or auto" in text
    from twotower.checks import cli_names
    from twotower.encoders.device import resolve_device

    with cli_names(), pytest.raises(tt.TwoTowerError) as info:
        resolve_device("cuda")
    assert str(info.value).startswith("--device cuda: torch sees no CUDA GPU") and "use --device cpu or auto" in \
        str(info.value)


def test_latency_query_length_past_the_positions(tiny_bert_dir, tmp_path):
    cfg = tt.LatencyConfig(models=[str(tiny_bert_dir)], precisions=("fp32",), query_length=1000, runs=1, warmup=0,
                           n_docs=1, device="cpu", show_progress=False)
    text = python_message(lambda: tt.analyze_latency(cfg))
    assert "query_length=1000 is more than the 128 positions of model" in text and "give 128 or less" in text
    text = python_message(lambda: tt.analyze_latency(tt.LatencyConfig(runs=0, show_progress=False)))
    assert "latency needs runs ≥ 1 and query_length ≥ 2 (got runs=0, query_length=128)" in text
    text = cli_message("analyze", "latency", "--model", tiny_bert_dir, "--query-length", "1000", "--runs", "1",
                        "--warmup", "0", "--n-docs", "1", "--device", "cpu", "--out", tmp_path / "an", "--no-progress")
    assert "--query-length 1000 is more than the 128 positions of model" in text


def test_towers_perplexity(tiny_beir, tmp_path):
    text = python_message(lambda: tt.analyze_towers(tt.TowersConfig(data=tiny_beir, perplexity=0)))
    assert text.startswith("perplexity=0: t-SNE's perplexity")
    text = cli_message("analyze", "towers", "--data", tiny_beir, "--perplexity", "0", "--out", tmp_path / "an",
                        "--no-progress")
    assert "--perplexity 0.0: t-SNE's perplexity" in text


def test_align_languages_names_its_options(tiny_beir, tiny_bert_dir, tmp_path):
    text = python_message(lambda: tt.align_languages(str(tiny_bert_dir), tiny_beir, tmp_path / "a", per_language=5))
    assert "per_language=5: at least 20" in text
    missing = tmp_path / "no-beir"
    text = python_message(lambda: tt.align_languages(str(tiny_bert_dir), missing, tmp_path / "a"))
    assert f"data='{missing}': no corpus.jsonl" in text
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    text = python_message(lambda: tt.align_languages(str(tiny_bert_dir), tiny_beir, tmp_path / "full"))
    assert f"out='{tmp_path / 'full'}': exists and is not an empty folder" in text
    base = ("models", "align-languages", "--model", tiny_bert_dir, "--no-progress")
    text = cli_message(*base, "--data", tiny_beir, "--out", tmp_path / "a", "--per-language", "5")
    assert "--per-language 5: at least 20" in text
    text = cli_message(*base, "--data", missing, "--out", tmp_path / "a")
    assert f"--data {missing}: no corpus.jsonl" in text
    text = cli_message(*base, "--data", tiny_beir, "--out", tmp_path / "full")
    assert f"--out {tmp_path / 'full'}: exists and is not an empty folder" in text
    assert not (tmp_path / "a").exists()


def test_eval_no_metric(tiny_beir):
    text = python_message(lambda: tt.evaluate("bm25", tiny_beir, metrics=[]))
    assert "metrics names no metric: give e.g. ['ndcg@10', 'recall@100']" in text
    text = cli_message("eval", "--data", tiny_beir, "--retriever", "bm25", "--metrics", ",", "--no-progress")
    assert "--metrics names no metric: give e.g. ndcg@10,recall@100" in text
