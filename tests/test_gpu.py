"""Every model-running command on CUDA, on tiny data: ``pytest -m gpu`` (skipped where torch sees no GPU).

Run on a GPU machine as ``python3 -m pytest -m gpu tests/test_gpu.py -ra``. Checks that each command runs with no
flag on the GPU (``--device`` defaults to auto), records the device, and agrees with the CPU: vectors, GradCache
gradients with dropout on (the GPU's RNG must be replayed), a training step's loss.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import TINY_CORPUS, TINY_QUERIES, write_beir

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none here); "
                                 "run `pytest -m gpu` on a GPU machine")]

runner = CliRunner()


def _cli(*args):
    from twotower.cli import app

    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output + repr(res.exception)
    return res


@pytest.fixture()
def train_beir(tmp_path):
    queries = [{"_id": f"q{i}", "text": f"question about {d['title'] or 'cells'} {d['text'][:20]}"}
               for i, d in enumerate(TINY_CORPUS)]
    qrels = [(f"q{i}", d["_id"], 1) for i, d in enumerate(TINY_CORPUS)]
    return write_beir(tmp_path / "train", TINY_CORPUS, queries, qrels, split="train")


@pytest.fixture(scope="module")
def tiny_ce(tmp_path_factory):
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from twotower.encoders.backbone import default_model_path

    path = tmp_path_factory.mktemp("ce")
    tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    BertForSequenceClassification(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=64, num_labels=1)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_auto_is_the_gpu_and_vectors_match_the_cpu(tiny_bert_dir):
    from twotower.encoders.device import resolve_device
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    assert resolve_device("auto").type == "cuda"
    texts = [d["text"] for d in TINY_CORPUS] * 50
    cpu = DualEncoder.load(tiny_bert_dir).encode_documents(texts, EncodeOptions(precision="fp32", show_progress=False))
    gpu_model = DualEncoder.load(tiny_bert_dir, device="cuda")
    assert gpu_model.device.type == "cuda"
    gpu = gpu_model.encode_documents(texts, EncodeOptions(precision="fp32", show_progress=False))
    assert np.min(np.sum(cpu * gpu, axis=1)) > 0.9999
    bf16 = gpu_model.encode_documents(texts, EncodeOptions(precision="bf16", show_progress=False))
    assert np.min(np.sum(cpu * bf16, axis=1)) > 0.99


def test_eval_uses_the_gpu_with_no_flag(tiny_beir, tiny_bert_dir, tiny_ce, tmp_path):
    for retriever in ("dense", "hybrid", "multivector"):
        out = tmp_path / f"{retriever}.json"
        _cli("eval", "--data", tiny_beir, "--retriever", retriever, "--model", tiny_bert_dir, "--out", out, "--no-progress")
        payload = json.loads(out.read_text())
        assert payload["device"].startswith("cuda"), payload
    cpu_out = tmp_path / "cpu.json"
    _cli("eval", "--data", tiny_beir, "--retriever", "dense", "--model", tiny_bert_dir, "--out", cpu_out,
         "--device", "cpu", "--precision", "fp32", "--no-progress")
    gpu_out = tmp_path / "gpu.json"
    _cli("eval", "--data", tiny_beir, "--retriever", "dense", "--model", tiny_bert_dir, "--out", gpu_out,
         "--precision", "fp32", "--no-progress")
    assert json.loads(cpu_out.read_text())["metrics"] == pytest.approx(json.loads(gpu_out.read_text())["metrics"], abs=1e-4)
    _cli("eval", "--data", tiny_beir, "--retriever", "bm25", "--rerank", tiny_ce, "--rerank-depth", "3", "--no-progress")


def test_index_search_and_serve_on_the_gpu(tiny_beir, tiny_bert_dir, tmp_path):
    from fastapi.testclient import TestClient

    from twotower.serve.app import create_app

    idx = tmp_path / "idx"
    _cli("index", "build", "--data", tiny_beir, "--out", idx, "--model", tiny_bert_dir, "--bm25", "--no-progress")
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps({"_id": "n1", "title": "Felines", "text": "Cats purr when they are content."}) + "\n")
    _cli("index", "add", "--index", idx, "--docs", new, "--no-progress")
    res = _cli("search", "--index", idx, "which feline purrs", "-k", "3", "--mode", "hybrid", "--json")
    assert len(res.output.strip().splitlines()) == 3
    app = create_app(idx, api_key="k" * 24)
    assert app.state.service.searcher.encoder.device.type == "cuda"
    with TestClient(app) as client:
        hits = client.post("/search", json={"query": "which feline purrs", "k": 2}).json()
        assert len(hits["hits"]) == 2


@pytest.mark.parametrize("extra", [
    [],
    ["--cache-chunk", "2"],
    ["--towers", "ade-spl", "--dim", "256"],
    ["--multivector", "8"],
    ["--hard-negatives", "bm25"],
    ["--hard-negatives", "model"],
    ["--bucket-size", "2"],
])
def test_train_on_the_gpu(train_beir, tiny_bert_dir, tmp_path, extra):
    data = train_beir
    if "bm25" in extra:  # mining samples BM25 ranks 3..50: give each query unjudged near-copies to find there
        corpus = [{**d, "_id": f"{d['_id']}-{k}"} for k in range(5) for d in TINY_CORPUS]
        queries = [{"_id": f"q{i}", "text": f"question about {d['title'] or 'cells'} {d['text'][:20]}"}
                   for i, d in enumerate(TINY_CORPUS)]
        data = write_beir(tmp_path / "bm25", corpus, queries, [(f"q{i}", f"{d['_id']}-0", 1)
                                                                  for i, d in enumerate(TINY_CORPUS)], split="train")
    out = tmp_path / "run"
    _cli("train", "--data", data, "--model", tiny_bert_dir, "--out", out, "--steps", "3", "--batch-size", "3",
         "--no-progress", *extra)
    log = json.loads((out / "train_log.json").read_text())
    assert log and all(r["device"].startswith("cuda") for r in log) and all(np.isfinite(r["loss"]) for r in log)
    assert json.loads((out / "train_config.json").read_text())["device_used"].startswith("cuda")


def test_mine_pretrain_rerank_training_and_analyses(train_beir, tiny_bert_dir, tiny_ce, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    text = "Cats are small felines. They purr when content. Many people keep cats as pets at home. " * 4
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": text}) + "\n" for i in range(12)))
    _cli("mine", "--data", train_beir, "--out", tmp_path / "mined.jsonl", "--retriever", "model", "--model",
         tiny_bert_dir, "--num-negatives", "2", "--rank-from", "1", "--rank-to", "5", "--no-progress")
    _cli("pretrain", "--corpus", corpus, "--out", tmp_path / "pt1", "--model", tiny_bert_dir, "--negatives", "moco",
         "--queue-size", "16", "--steps", "3", "--batch-size", "4", "--chunk-tokens", "32", "--no-progress")
    _cli("pretrain", "--corpus", corpus, "--out", tmp_path / "pt2", "--model", tiny_bert_dir, "--augment", "ict",
         "--cache-chunk", "2", "--steps", "3", "--batch-size", "4", "--chunk-tokens", "32", "--no-progress")
    res = _cli("train-reranker", "--data", train_beir, "--out", tmp_path / "ce", "--base", tiny_bert_dir,
               "--mine-depth", "4", "--negatives", "2", "--no-progress")
    assert "cuda" in res.output
    analysis = tmp_path / "analysis"
    _cli("analyze", "towers", "--data", train_beir, "--model", tiny_bert_dir, "--n", "6", "--perplexity", "2",
         "--out", analysis, "--no-progress")
    assert json.loads((analysis / "towers.json").read_text())["device"].startswith("cuda")
    _cli("analyze", "doclength", "--data", train_beir, "--split", "train", "--model", tiny_bert_dir, "--out", analysis,
         "--no-progress")
    _cli("analyze", "latency", "--runs", "3", "--warmup", "1", "--n-docs", "8",  # the default model
         "--out", analysis, "--no-progress")
    assert json.loads((analysis / "latency.json").read_text())["device"].startswith("cuda")


def test_gradcache_replays_dropout_on_the_gpu(tiny_bert_dir):
    """With dropout on, GradCache's chunks replay the GPU's random state: gradients equal the plain step's."""
    from twotower.encoders.towers import DualEncoder
    from twotower.training.gradcache import cached_backward
    from twotower.training.losses import InBatchSoftmaxLoss

    model = DualEncoder.build(tiny_bert_dir).to("cuda").train()
    loss_fn = InBatchSoftmaxLoss(0.05)
    texts = [d["text"] for d in TINY_CORPUS]
    queries = [q["text"] for q in TINY_QUERIES] * 2
    q = {k: v.cuda() for k, v in model.query_tower.tokenize(queries).items()}
    d = {k: v.cuda() for k, v in model.doc_tower.tokenize(texts).items()}
    torch.manual_seed(5)
    torch.cuda.manual_seed(5)
    loss_fn(model.forward_queries(q["input_ids"], q["attention_mask"]),
            model.forward_documents(d["input_ids"], d["attention_mask"])).backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    torch.cuda.manual_seed(5)
    cached_backward([(model.forward_queries, q["input_ids"], q["attention_mask"]),
                     (model.forward_documents, d["input_ids"], d["attention_mask"])],
                    lambda a, b: loss_fn(a, b), chunk_size=len(texts))
    for name, g in ((n, p.grad) for n, p in model.named_parameters() if p.grad is not None):
        assert torch.allclose(plain[name], g, atol=1e-5), name


def test_a_training_step_matches_the_cpu(tiny_bert_dir, train_beir, tmp_path):
    """Dropout off: one step's loss on the GPU equals the CPU's (same batch, hard negatives, duplicate mask)."""
    from conftest import copy_without_dropout
    from twotower.data.pairs import TrainExample
    from twotower.training.losses import InBatchSoftmaxLoss
    from twotower.training.trainer import StageConfig, TrainConfig, Trainer

    plain = copy_without_dropout(tiny_bert_dir, tmp_path / "nodrop")
    examples = [TrainExample(query="which feline purrs", positive=TINY_CORPUS[0]["text"], negatives=[TINY_CORPUS[2]["text"]],
                             qid="q1", pid="d1"),
                TrainExample(query="which feline purrs", positive=TINY_CORPUS[1]["text"], negatives=[TINY_CORPUS[3]["text"]],
                             qid="q1", pid="d2"),
                TrainExample(query="green tea", positive=TINY_CORPUS[4]["text"], negatives=[TINY_CORPUS[5]["text"]],
                             qid="q3", pid="d5")]
    losses = {}
    for device in ("cpu", "cuda"):
        trainer = Trainer(TrainConfig(out=str(tmp_path / device), model=str(plain), device=device, precision="fp32",
                                      show_progress=False))
        stage = StageConfig(hard_negatives=1, bucket_size=0)
        losses[device] = float(trainer._step_loss(examples, stage, InBatchSoftmaxLoss(0.05), random.Random(0)))
    assert losses["cuda"] == pytest.approx(losses["cpu"], abs=1e-4)
