"""Device handling without a GPU: every tensor a training step builds must follow the model's device.

The model is moved to PyTorch's ``meta`` device (shapes only, no data), where combining it with a tensor left
on the CPU raises "not on the expected device", exactly as CUDA does ("expected self and mask to be on the same
device" was the crash of ``twotower train`` on GPUs, which no CPU test saw). Real BERT towers, real tokenizer,
real losses; transformers' mask shortcut (a data-dependent ``.all()``, impossible without data) is turned off.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from twotower.checks import cli_names
from twotower.data.augment import ViewConfig
from twotower.data.pairs import TrainExample
from twotower.encoders.device import resolve_device
from twotower.encoders.towers import DualEncoder
from twotower.errors import TwoTowerError
from twotower.training.batching import false_negative_mask
from twotower.training.losses import InBatchSoftmaxLoss
from twotower.training.trainer import StageConfig, TrainConfig, Trainer

# two examples share a query and one shares a positive: the duplicate mask has entries
EXAMPLES = [
    TrainExample(query="which feline purrs", positive="cats purr", negatives=["dogs bark", "tea leaves"], qid="q1", pid="d1"),
    TrainExample(query="which feline purrs", positive="kittens purr too", negatives=["rust", "tea"], qid="q1", pid="d7"),
    TrainExample(query="memory safety", positive="rust is memory safe", negatives=["python", "tea"], qid="q2", pid="d4"),
    TrainExample(query="green tea", positive="cats purr", negatives=["rust", "python"], qid="q3", pid="d1"),
]


@pytest.fixture()
def on_meta(monkeypatch):
    import transformers.masking_utils as masking

    monkeypatch.setattr(masking, "_ignore_bidirectional_mask_sdpa", lambda *a, **k: False)


def _meta_trainer(tmp_path, tiny_bert_dir, **cfg):
    model = DualEncoder.build(tiny_bert_dir, dim=16, towers=cfg.pop("towers", "sde")).to("meta")
    return Trainer(TrainConfig(out=str(tmp_path / "run"), precision="fp32", show_progress=False, **cfg), model=model)


@pytest.mark.parametrize("cache_chunk", [None, 2])
@pytest.mark.parametrize("towers", ["sde", "ade"])
def test_a_step_builds_every_tensor_on_the_model_device(on_meta, tmp_path, tiny_bert_dir, cache_chunk, towers):
    trainer = _meta_trainer(tmp_path, tiny_bert_dir, towers=towers)
    assert trainer.device.type == "meta"
    stage = StageConfig(hard_negatives=1, cache_chunk=cache_chunk, bucket_size=0)
    loss = trainer._step_loss(EXAMPLES, stage, InBatchSoftmaxLoss(0.05), random.Random(0))
    assert loss.device.type == "meta"
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    assert grads and all(g.device.type == "meta" for g in grads)


def test_the_old_cpu_mask_fails_on_another_device(on_meta, tmp_path, tiny_bert_dir, monkeypatch):
    """The check has teeth: a mask built on the CPU (the GPU crash) fails here too."""
    trainer = _meta_trainer(tmp_path, tiny_bert_dir)
    monkeypatch.setattr(trainer, "false_negative_mask", lambda examples: false_negative_mask(examples))
    with pytest.raises(RuntimeError, match="device"):
        trainer._step_loss(EXAMPLES, StageConfig(bucket_size=0), InBatchSoftmaxLoss(0.05), random.Random(0))


def test_multivector_step_on_the_model_device(on_meta, tmp_path, tiny_bert_dir):
    trainer = _meta_trainer(tmp_path, tiny_bert_dir, multivector=3)
    trainer.objective.setup(trainer)
    loss = trainer.objective.step_loss(trainer, EXAMPLES, StageConfig(hard_negatives=1), InBatchSoftmaxLoss(0.05),
                                       random.Random(0))
    assert loss.device.type == "meta"


@pytest.mark.parametrize("negatives", ["inbatch", "moco"])
def test_pretraining_step_on_the_model_device(on_meta, tmp_path, tiny_bert_dir, negatives):
    from twotower.training.pretrain import ContrastivePretraining, PretrainConfig

    corpus = tmp_path / "corpus.jsonl"
    text = "Cats are small felines. They purr when content. Many people keep cats as pets at home. " * 3
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": text}) + "\n" for i in range(6)))
    objective = ContrastivePretraining(PretrainConfig(corpus=str(corpus), views=ViewConfig(chunk_tokens=16, min_tokens=4),
                                                      negatives=negatives, queue_size=8))
    model = DualEncoder.build(tiny_bert_dir).to("meta")
    trainer = Trainer(TrainConfig(out=str(tmp_path / "pt"), precision="fp32", show_progress=False,
                                  stages=[StageConfig(name="pretrain", bucket_size=0)]), model=model, objective=objective)
    objective.setup(trainer)
    chunks = objective.examples(trainer.config.stages[0])[:4]
    loss = objective.step_loss(trainer, chunks, trainer.config.stages[0], InBatchSoftmaxLoss(0.05), random.Random(0))
    assert loss.device.type == "meta"
    if negatives == "moco":
        assert objective.queue.keys.device.type == "meta"


def test_false_negative_mask_matches_a_hand_listing():
    mask = false_negative_mask(EXAMPLES)
    expected = torch.zeros(4, 4, dtype=torch.bool)
    for i, j in [(0, 1), (1, 0), (0, 3), (3, 0)]:  # same query q1; same positive d1
        expected[i, j] = True
    assert torch.equal(mask, expected)


def test_device_names_are_checked_up_front():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    for bad in ("gpu", "cpu:1", "cuda:x", "tpu"):
        with pytest.raises(TwoTowerError, match=f"^device='{bad}': not a device name"):
            resolve_device(bad)
        with cli_names(), pytest.raises(TwoTowerError, match=f"^--device '{bad}': not a device name"):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(TwoTowerError, match="no CUDA GPU"):
            resolve_device("cuda:0")


def test_cpu_defaults_and_recorded_device(tmp_path, tiny_bert_dir, tiny_beir):
    """On the CPU: length buckets of 8 by default, and the device written into the run's config and log."""
    cfg = TrainConfig(out=str(tmp_path / "run"), model=str(tiny_bert_dir), device="cpu", show_progress=False,
                      stages=[StageConfig(data=str(tiny_beir), split="test", steps=2, batch_size=2)])
    trainer = Trainer(cfg)
    assert trainer.bucket_size(cfg.stages[0]) == 8
    trainer.train()
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["device_used"] == "cpu"
    log = json.loads((tmp_path / "run" / "train_log.json").read_text())
    assert [r["device"] for r in log] == ["cpu", "cpu"]


def test_prefetched_encoding_equals_inline(tiny_bert_dir, monkeypatch):
    """The GPU path's background tokenizer (forced on here, in chunks of 5 texts prepared by parallel workers)
    gives the same vectors, in the same order."""
    from conftest import TINY_CORPUS
    from twotower.encoders import inference
    from twotower.encoders.inference import encode_texts

    monkeypatch.setattr(inference, "GPU_TOKENIZE_CHUNK", 5)
    model = DualEncoder.load(tiny_bert_dir)
    texts = [d["text"] for d in TINY_CORPUS] * 7 + ["", "x"]
    inline = encode_texts(model.doc_tower, texts, batch_size=4, precision="fp32", show_progress=False, prefetch=False)
    ahead = encode_texts(model.doc_tower, texts, batch_size=4, precision="fp32", show_progress=False, prefetch=True)
    assert inline.shape == (len(texts), model.dim)
    assert torch.allclose(torch.from_numpy(inline), torch.from_numpy(ahead), atol=1e-6)
    # and equal to the plain padded forward of each text alone (an independent path)
    tower = model.doc_tower.eval()
    with torch.no_grad():
        for i in (0, 5, len(texts) - 2):
            b = tower.tokenize([texts[i]])
            ref = tower(b["input_ids"], b["attention_mask"])[0]
            assert torch.allclose(ref, torch.from_numpy(inline[i]), atol=1e-5)


def test_parallel_chunk_workers_give_the_batches_of_one(tiny_bert_dir):
    """Chunks prepared by several threads come out in order, the batches of a single thread exactly; a consumer
    that stops early does not hang."""
    from transformers import AutoTokenizer

    from conftest import TINY_CORPUS
    from twotower.encoders.inference import length_sorted_batches

    tok = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    texts = [d["text"][: 7 + 11 * i] for i, d in enumerate(TINY_CORPUS * 5)]
    one = list(length_sorted_batches(tok, texts, 32, 3, chunk=4))
    many = list(length_sorted_batches(tok, texts, 32, 3, chunk=4, workers=3))
    assert len(one) == len(many) > 8
    for (r1, i1, m1), (r2, i2, m2) in zip(one, many):
        assert np.array_equal(r1, r2) and torch.equal(i1, i2) and torch.equal(m1, m2)
    assert sorted(np.concatenate([r for r, _, _ in many]).tolist()) == list(range(len(texts)))
    early = length_sorted_batches(tok, texts, 32, 3, chunk=4, workers=3)
    next(early)
    early.close()


def test_prefetched_passes_errors_on_and_stops_early():
    from twotower.encoders.inference import prefetched

    def failing():
        yield 1
        raise ValueError("tokenizer broke")

    got = []
    with pytest.raises(ValueError, match="tokenizer broke"):
        for item in prefetched(failing(), 2):
            got.append(item)
    assert got == [1]
    endless = prefetched(iter(range(10**9)), 3)
    assert [next(endless) for _ in range(5)] == [0, 1, 2, 3, 4]
    endless.close()  # the producer thread stops instead of filling forever


def test_padding_matches_the_tokenizer(tiny_bert_dir):
    from transformers import AutoTokenizer

    from twotower.encoders.inference import pad_token_ids

    tok = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    texts = ["a b c d e", "a", "tea leaves are brewed"]
    ids = tok(texts)["input_ids"]
    input_ids, mask = pad_token_ids(ids, tok.pad_token_id)
    ref = tok(texts, padding=True, return_tensors="pt")
    assert torch.equal(input_ids, ref["input_ids"]) and torch.equal(mask, ref["attention_mask"])
    input_ids, mask = pad_token_ids(ids, tok.pad_token_id, multiple=8)
    ref = tok(texts, padding=True, pad_to_multiple_of=8, return_tensors="pt")
    assert input_ids.shape[1] == 8 and torch.equal(input_ids, ref["input_ids"])
    assert torch.equal(mask, ref["attention_mask"])
