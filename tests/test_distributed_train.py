"""Multi-process training: ``twotower train`` under torchrun (2 CPU processes, gloo)."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import twotower
from conftest import TINY_CORPUS, copy_without_dropout, subprocess_env, write_beir

QUERIES = [{"_id": f"q{i}", "text": t} for i, t in enumerate(
    ["which feline purrs", "loyal barking animal", "dynamic typing language", "memory safe systems language",
     "how is green tea made", "powerhouse of the cell", "small pets that purr", "camellia sinensis leaves"])]
CORPUS = TINY_CORPUS + [{"_id": "d7", "title": "Kittens", "text": "Kittens purr when they are content."},
                        {"_id": "d8", "title": "Oolong", "text": "Oolong is a partly oxidised tea."}]
# one positive per document: no in-batch false negatives, which one process masks and several do not
QRELS = [(q["_id"], d, 1) for q, d in zip(QUERIES, ["d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8"])]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_bert_dir) -> tuple[Path, Path]:
    """Tiny data (8 pairs: global batch 4 = 2 per process, 2 steps) and the tiny BERT without
    dropout, so every process's forward pass is deterministic."""
    root = tmp_path_factory.mktemp("ddp")
    data = write_beir(root / "data", CORPUS, QUERIES, QRELS, split="train")
    return data, copy_without_dropout(tiny_bert_dir, root / "model")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = subprocess_env(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


TRAIN_ARGS = ["--split", "train", "--steps", "2", "--batch-size", "2", "--lr", "1e-3", "--precision", "fp32",
              "--no-progress", "--checkpoint-every", "100"]


def test_torchrun_cli_trains_and_saves(setup, tmp_path):
    """7 pairs, 3 per process: the second global batch has 1 example left, wrapped around so that
    both processes get an equal share (an empty or uneven share broke the all-gather)."""
    _, model = setup
    data = write_beir(tmp_path / "data", CORPUS, QUERIES[:7], QRELS[:7], split="train")
    out = tmp_path / "run"
    args = [*TRAIN_ARGS]
    args[args.index("--batch-size") + 1] = "3"
    proc = _torchrun(["-m", "twotower.cli", "train", "--data", str(data), "--model", str(model), "--out", str(out),
                      *args], tmp_path)
    assert proc.stdout.count("model saved to") == 2  # both ranks finished
    assert "FutureWarning" not in proc.stderr, proc.stderr  # once a deprecation warning per rank (all_gather)
    from twotower.encoders.towers import DualEncoder

    trained = DualEncoder.load(out / "model")
    log = __import__("json").loads((out / "train_log.json").read_text())
    assert [r["step"] for r in log] == [1, 2] and all(r["loss"] > 0 for r in log)
    before = DualEncoder.load(model)
    diff = max((a - b).abs().max().item() for a, b in zip(trained.parameters(), before.parameters()))
    assert diff > 1e-4  # it learned


def test_ranks_agree_and_match_one_process_with_the_global_batch(setup, tmp_path):
    """Gradients averaged across processes: both ranks step with the gradients one process gets from
    the whole global batch (gathered negatives included), and end with the same weights, those of
    that one process."""
    data, model = setup
    script = tmp_path / "ddp_train.py"
    script.write_text(textwrap.dedent(f"""
        import sys, torch
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        import twotower
        assert twotower.__file__ == {twotower.__file__!r}, twotower.__file__  # the code under test
        from twotower.training.trainer import StageConfig, TrainConfig, Trainer, maybe_init_distributed
        maybe_init_distributed()
        import torch.distributed as dist
        out, world_batch = sys.argv[1], int(sys.argv[2])
        world = dist.get_world_size() if dist.is_initialized() else 1
        stage = StageConfig(data={str(data)!r}, split="train", steps=2, batch_size=world_batch // world, lr=1e-3,
                            max_grad_norm=None, warmup=0.0)
        cfg = TrainConfig(out=out, model={str(model)!r}, precision="fp32", show_progress=False, stages=[stage])
        trainer = Trainer(cfg)
        first_grads = {{}}

        def keep_first_step(optimizer, args, kwargs):  # the gradients the optimizer steps with
            if not first_grads:
                names = {{id(p): n for n, p in trainer.model.named_parameters()}}
                for group in optimizer.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            first_grads[names[id(p)]] = p.grad.clone()

        register_optimizer_step_pre_hook(keep_first_step)
        trained = trainer.train()
        torch.save(trained.state_dict(), f"{{out}}/rank{{trainer.rank}}.pt")
        torch.save(first_grads, f"{{out}}/grads{{trainer.rank}}.pt")
    """))
    _torchrun([str(script), str(tmp_path / "ddp"), "4"], tmp_path)
    env = subprocess_env()
    single = subprocess.run([sys.executable, str(script), str(tmp_path / "single"), "4"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    half = subprocess.run([sys.executable, str(script), str(tmp_path / "half"), "2"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert half.returncode == 0, half.stderr[-3000:]

    # step 1's gradients: averaged across the 2 processes they are the one process's full-batch gradients
    # (AdamW's first step is nearly blind to their scale, so the weights below cannot show a sum instead)
    g0, g1 = torch.load(tmp_path / "ddp" / "grads0.pt"), torch.load(tmp_path / "ddp" / "grads1.pt")
    g_one = torch.load(tmp_path / "single" / "grads0.pt")
    assert g0.keys() == g1.keys() == g_one.keys() and g_one
    for name in g_one:
        assert torch.equal(g0[name], g1[name]), f"ranks step with different gradients for {name}"
        scale = g_one[name].abs().max().item()  # float noise of the different padding: ~1e-6 of that
        assert (g0[name] - g_one[name]).abs().max().item() <= 1e-4 * scale + 1e-8, name
    r0 = torch.load(tmp_path / "ddp" / "rank0.pt")
    r1 = torch.load(tmp_path / "ddp" / "rank1.pt")
    one = torch.load(tmp_path / "single" / "rank0.pt")
    assert r0.keys() == r1.keys() == one.keys()
    for name in r0:
        assert torch.equal(r0[name], r1[name]), f"ranks disagree on {name}"
    # same updates as one process over the global batch (padding per half-batch: float noise only)
    worst = max((r0[n] - one[n]).abs().max().item() for n in r0)
    assert worst < 1e-4, worst
    # one process on half the batch (what a rank without gradient averaging computes) is far off
    half = torch.load(tmp_path / "half" / "rank0.pt")
    assert max((half[n] - one[n]).abs().max().item() for n in r0) > 10 * max(worst, 1e-5)
    assert (tmp_path / "ddp" / "model" / "twotower.json").is_file()


@pytest.mark.parametrize("n", [1, 5, 7, 12])
def test_every_process_gets_an_equal_share(n):
    from twotower.training.batching import batch_indices, steps_for
    from twotower.training.config import StageConfig

    _, per_epoch = steps_for(StageConfig(batch_size=3), n, 2)
    seen = set()
    for step in range(per_epoch):
        shares = [batch_indices(0, 0, step, n, 3, rank, 2) for rank in range(2)]
        assert [len(s) for s in shares] == [3, 3]
        seen.update(int(i) for s in shares for i in s)
    assert seen == set(range(n))  # an epoch still covers every example
    # one process: the last batch stays short, as before
    assert len(batch_indices(0, 0, per_epoch - 1, n, 6, 0, 1)) == (n % 6 or 6)
