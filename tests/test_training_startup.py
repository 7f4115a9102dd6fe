"""What a training run costs outside its steps (issue #47), on the CPU with a tiny model: the time from the call of
``Trainer.train()`` to its first step, and from its last step to its return, bounded by what the same test measures
(one step's time, one model save), not by wall-clock constants; and the GPU's attention kernels, which built a cuDNN
plan for every new batch shape."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from twotower.encoders.device import attention_kernels
from twotower.training import trainer as trainer_module
from twotower.training.trainer import StageConfig, TrainConfig, Trainer


def _timed_run(tmp_path, model_dir, data, steps: int = 8):
    """A run of ``steps`` steps: ``(trainer, call → first step s, last step → return s, step times, forward passes
    and data reads before the first step)``."""
    from twotower.data.beir import BeirDataset

    cfg = TrainConfig(out=str(tmp_path / "run"), model=str(model_dir), device="cpu", precision="fp32",
                      show_progress=False, checkpoint_every=0,
                      stages=[StageConfig(data=str(data), split="test", steps=steps, batch_size=2)])
    tr = Trainer(cfg)
    starts, ends, before = [], [], {"forward": 0, "data": 0}
    step_loss = tr.objective.step_loss

    def timed_step_loss(*args, **kwargs):
        starts.append(time.perf_counter())
        return step_loss(*args, **kwargs)

    def count(what):
        if not starts:
            before[what] += 1

    tr.objective.step_loss = timed_step_loss
    for tower in {id(t): t for t in (tr.model.query_tower, tr.model.doc_tower)}.values():
        tower.register_forward_pre_hook(lambda *_: count("forward"))
    make_optimizer, load = trainer_module.make_optimizer, BeirDataset.load.__func__

    def optimizer_with_clock(*args, **kwargs):
        opt = make_optimizer(*args, **kwargs)
        opt.register_step_post_hook(lambda *_: ends.append(time.perf_counter()))
        return opt

    def counted_load(cls, *args, **kwargs):
        count("data")
        return load(cls, *args, **kwargs)

    trainer_module.make_optimizer, BeirDataset.load = optimizer_with_clock, classmethod(counted_load)
    try:
        t0 = time.perf_counter()
        tr.train()
        t1 = time.perf_counter()
    finally:
        trainer_module.make_optimizer, BeirDataset.load = make_optimizer, classmethod(load)
    steps_s = [e - s for s, e in zip(starts, ends)]
    return tr, starts[0] - t0, t1 - ends[-1], steps_s, before


def test_start_up_and_wind_down_cost_about_a_step(tiny_bert_dir, tiny_beir, tmp_path):
    _timed_run(tmp_path / "warm", tiny_bert_dir, tiny_beir, steps=2)  # imports, allocator: once per process
    tr, start_up, wind_down, steps, before = _timed_run(tmp_path, tiny_bert_dir, tiny_beir)
    # start-up: the data read and checked once, the run folder claimed, an optimizer built; nothing encoded
    assert before == {"forward": 0, "data": 1}
    step = statistics.median(steps[1:])
    t0 = time.perf_counter()
    tr.model.save(tmp_path / "save-once")
    save = time.perf_counter() - t0
    # in time: a few steps of the tiniest model (a model reload, an evaluation pass or a compile is many more).
    # Wind-down: the model and the log written (one save).
    assert start_up < 10 * step, (start_up, steps)
    assert wind_down < 3 * save + 3 * step, (wind_down, save, steps)
    # and the first step is a step like the others: nothing is built on it (compile, per-shape plans)
    assert steps[0] < 10 * step, steps


def test_gpu_attention_leaves_out_cudnn_in_training_and_encoding():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with attention_kernels(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before  # nothing changes off the GPU
    cfg = TrainConfig(out="unused", device="cpu", precision="fp32", show_progress=False)
    tr = Trainer.__new__(Trainer)  # the forward-pass context of a trainer on a GPU, without a GPU
    tr.config, tr.precision, tr.device = cfg, "fp32", torch.device("cuda")
    with tr._autocast():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


@pytest.mark.gpu
def test_gpu_training_steps_run_without_cudnn_attention(tiny_bert_dir, tiny_beir, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    seen = []
    cfg = TrainConfig(out=str(tmp_path / "run"), model=str(tiny_bert_dir), device="cuda", show_progress=False,
                      checkpoint_every=0, stages=[StageConfig(data=str(tiny_beir), split="test", steps=2,
                                                              batch_size=2)])
    tr = Trainer(cfg)
    tr.model.doc_tower.backbone.register_forward_hook(
        lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    tr.train()
    assert seen and not any(seen)


def test_one_pass_embedding_of_a_steps_groups(tiny_bert_dir, tiny_beir, tmp_path, monkeypatch):
    """On a GPU a step's queries, positives and negatives (shared towers, no buckets) are embedded in one padded
    batch: the same embeddings as one call per group, in the same places, with one forward pass per step."""
    from twotower.training.buckets import embed_together

    torch.manual_seed(0)
    tower = trainer_module.DualEncoder.load(tiny_bert_dir).doc_tower.eval()
    texts = [["a short query", "cells"], ["a much longer document about cells and their membranes", "b", "c d"]]
    parts = []
    for group in texts:
        batch = tower.tokenize(group)
        parts.append((batch["input_ids"], batch["attention_mask"]))
    assert parts[0][0].shape[1] < parts[1][0].shape[1]  # widths differ: the padding is exercised
    with torch.no_grad():
        together = embed_together(tower, parts)
        for (ids, mask), emb in zip(parts, together):
            assert torch.allclose(emb, tower(ids, mask), atol=1e-5)
    # and the trainer takes that path where ONE_PASS_DEVICES says so (here: the CPU, buckets off)
    monkeypatch.setattr(trainer_module, "ONE_PASS_DEVICES", {"cpu"})
    cfg = TrainConfig(out=str(tmp_path / "run"), model=str(tiny_bert_dir), device="cpu", precision="fp32",
                      show_progress=False, checkpoint_every=0,
                      stages=[StageConfig(data=str(tiny_beir), split="test", steps=2, batch_size=3, bucket_size=0)])
    tr = Trainer(cfg)
    calls = []
    tr.model.doc_tower.register_forward_pre_hook(lambda _m, args: calls.append(len(args[0])))
    tr.train()
    assert calls == [6, 6], calls  # 3 queries + 3 positives, one pass per step
