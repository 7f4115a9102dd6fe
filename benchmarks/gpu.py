"""twotower against sentence-transformers on one GPU, in one run (issue: GPU as a first-class device).

Rows (``results/gpu.{json,md}``):

- encoding, SciFact corpus × ``--repeat`` (docs/s) and SciFact test NDCG@10 / Recall@100 (from the first copy):
  ``sentence-transformers fp32`` (its default batch 32), ``sentence-transformers fp16 (batch B)`` (the model in half
  precision) for B in 32 / 128 / 256 / 512 — the fastest is marked ``fastest_st_fp16`` and is the baseline of
  ``x_st_fp16_best`` on every row —, ``twotower default`` (``encode_documents`` with every default: device auto,
  precision auto, batch by device, tokenization prefetched), ``tokenizer alone`` (the fast tokenizer's backend
  ``encode_batch_fast`` on the same texts at the same max length: the fastest tokenization the library offers;
  ``x_tokenizer_alone`` on every row). Every system is timed the same way (``timed_passes``): one warm-up call on
  the first 256 texts, then ``--passes`` (default 2) passes over the same corpus copies, the systems taking turns
  pass by pass; the best pass counts (each pass's rate: ``pass_docs_per_s``);
- training, SciFact train → test, same data, epochs, batch, learning rate, max length: ``sentence-transformers mnrl``
  (its own trainer, MultipleNegativesRankingLoss, fp32: its default), ``sentence-transformers mnrl bf16``
  (``bf16=True``, on a GPU with bf16) and ``twotower train`` (defaults: bf16 where the GPU has it, length buckets by
  device) — examples/s over the whole ``train()`` call, steady-state examples/s after the first 10 steps, NDCG@10;
  ``x_st_mnrl`` against the faster ST row;
- ``twotower eval --retriever dense`` on SciFact (a subprocess, wall time) with no flag and with ``--device cpu``;
- the limit: bf16 matmul rate on the encoder's GEMM shapes, the encoder's FLOPs per document on the batches it
  really runs, and the fraction of that rate each encoding row reaches.

    python benchmarks/gpu.py [--repeat 4] [--passes 2] [--epochs 2] [--lr 5e-5] [--parts encode,train,eval] [--device cuda]

On the lent GPU machine: ``../shared/tools/gpu-pack``, then
``run(command="source .gpu/env.sh && python3 benchmarks/gpu.py", carry=[".gpu"])`` and copy results/gpu.* back.
``--device cpu --limit 300 --epochs 0.05`` is a smoke run of every code path on a CPU (results go to
``results/gpu_smoke.*``, never to ``results/gpu.*``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from _common import DATA, load_average, write_results
from encode_pipeline import tokenizer_alone
from twotower.data.beir import BeirDataset
from twotower.encoders.backbone import default_model_path
from twotower.encoders.device import describe, resolve_device
from twotower.evaluation.metrics import evaluate
from twotower.retrieval.dense import exact_search, to_run


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_tflops(device: torch.device, dtype: torch.dtype, m: int, k: int, n: int, seconds: float = 2.0) -> float:
    a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
    for _ in range(5):
        a @ b
    sync(device)
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a @ b
        reps += 10
        sync(device)
    return 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e12


def encoder_flops(tokenizer, cfg, texts: list[str], batch_size: int, max_length: int) -> float:
    """2 × multiply-adds of the transformer on length-sorted batches padded per batch (dense + attention)."""
    h, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    lengths = sorted((len(x) for x in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]),
                     reverse=True)
    flops = 0.0
    for start in range(0, len(lengths), batch_size):
        batch = lengths[start : start + batch_size]
        flops += layers * 2 * batch[0] * len(batch) * (4 * h * h + 2 * h * inter + 2 * batch[0] * h)
    return flops


ST_FP16_BATCHES = (32, 128, 256, 512)
WARMUP = 256  # texts every system encodes once before its timed passes (kernels, allocator, the bf16 weight copy)


def timed_passes(systems: dict, texts: list[str], *, passes: int, warmup: int, sync=lambda: None) -> dict:
    """Time every system the same way: one warm-up call on the first ``warmup`` texts, then ``passes`` timed passes
    over all of ``texts``, the systems taking turns pass by pass (alternating order, so that load from elsewhere
    falls on all alike). Returns ``{name: (first pass's output as float32, best seconds, every pass's seconds)}``."""
    if passes < 1:
        raise ValueError(f"passes {passes}: at least 1")
    names = list(systems)
    for name in names:
        systems[name](texts[:warmup])
        sync()
    out, seconds = {}, {name: [] for name in names}
    for p in range(passes):
        for name in names if p % 2 == 0 else names[::-1]:
            sync()
            t0 = time.perf_counter()
            result = systems[name](texts)
            sync()
            seconds[name].append(time.perf_counter() - t0)
            if name not in out:
                out[name] = np.asarray(result, dtype=np.float32)
    return {name: (out[name], min(seconds[name]), seconds[name]) for name in names}


def mark_baselines(rows: list[dict]) -> None:
    """Ratios on every row: ``x_st_fp32`` (the first row), ``x_st_fp16_best`` (the fastest ST fp16 row, marked
    ``fastest_st_fp16``) and ``x_tokenizer_alone``."""
    fp32 = rows[0]["docs_per_s"]
    fp16 = max((r for r in rows if r["system"].startswith("sentence-transformers fp16")), key=lambda r: r["docs_per_s"])
    fp16["fastest_st_fp16"] = True
    tok = next(r["docs_per_s"] for r in rows if r["system"] == "tokenizer alone")
    for row in rows:
        row["x_st_fp32"] = row["docs_per_s"] / fp32
        row["x_st_fp16_best"] = row["docs_per_s"] / fp16["docs_per_s"]
        row["x_tokenizer_alone"] = row["docs_per_s"] / tok


def test_metrics(ds: BeirDataset, doc_ids: list[str], doc_vecs: np.ndarray, q_vecs: np.ndarray) -> dict:
    qids = list(ds.queries)
    scores, idx = exact_search(q_vecs, doc_vecs, 1000)
    m = evaluate(ds.qrels, to_run(qids, doc_ids, scores, idx), ("ndcg@10", "recall@100"))
    return {"ndcg@10": m["ndcg@10"], "recall@100": m["recall@100"]}


def encode_rows(args, device: torch.device, ds: BeirDataset) -> tuple[list[dict], dict]:
    from sentence_transformers import SentenceTransformer

    from twotower.encoders.towers import DualEncoder, EncodeOptions

    doc_ids = list(ds.corpus)[: args.limit or None]
    corpus = [ds.corpus[d].full_text for d in doc_ids]
    texts = corpus * args.repeat
    queries = list(ds.queries.values())
    st32 = SentenceTransformer(str(default_model_path()), device=str(device))
    st32.max_seq_length = args.max_length
    st16 = SentenceTransformer(str(default_model_path()), device=str(device))
    st16.max_seq_length = args.max_length
    if device.type == "cuda":
        st16.half()
    tt = DualEncoder.load(None, doc_max_length=args.max_length, device=device)
    quiet = EncodeOptions(show_progress=False)

    def st_encode(model, batch: int):
        return lambda x: model.encode(x, batch_size=batch, normalize_embeddings=True, convert_to_numpy=True,
                                      show_progress_bar=False)

    systems = {"sentence-transformers fp32": st_encode(st32, 32)}
    for batch in ST_FP16_BATCHES:  # ST fp16 at every batch: the baseline is its fastest
        systems[f"sentence-transformers fp16 (batch {batch})"] = st_encode(st16, batch)
    systems["twotower default"] = lambda x: tt.encode_documents(x, quiet)
    tokenize = tokenizer_alone(tt.doc_tower.tokenizer, args.max_length)  # the fastest tokenization the library offers
    systems["tokenizer alone"] = tokenize
    query_fns = {"sentence-transformers fp32": systems["sentence-transformers fp32"],
                 "twotower default": lambda x: tt.encode_queries(x, quiet)}
    for batch in ST_FP16_BATCHES:
        query_fns[f"sentence-transformers fp16 (batch {batch})"] = st_encode(st16, 128)
    flops = encoder_flops(tt.doc_tower.tokenizer, tt.doc_tower.backbone.config, texts, 128, args.max_length)
    timed = timed_passes(systems, texts, passes=args.passes, warmup=WARMUP, sync=lambda: sync(device))
    rows, vectors = [], {}
    for name, (vecs, secs, all_secs) in timed.items():
        row = {"system": name, "task": "encode", "docs": len(texts), "docs_per_s": len(texts) / secs,
               "pass_docs_per_s": [round(len(texts) / s, 1) for s in all_secs]}
        if name in query_fns:
            vectors[name] = vecs[: len(corpus)]
            q_vecs = np.asarray(query_fns[name](queries), dtype=np.float32)
            row.update(test_metrics(ds, doc_ids, vecs[: len(corpus)], q_vecs), achieved_tflops=flops / secs / 1e12)
        rows.append(row)
        print(row, flush=True)
    mark_baselines(rows)
    base = rows[0]
    for row in rows:
        if row["system"] in vectors:
            row["min_cosine_to_st_fp32"] = float(np.min(np.sum(vectors[row["system"]] * vectors[base["system"]],
                                                               axis=1)))
    cfg = tt.doc_tower.backbone.config
    tokens = 128 * 200
    limit = {
        "bf16_tflops_ffn_up": matmul_tflops(device, torch.bfloat16 if device.type == "cuda" else torch.float32,
                                            tokens, cfg.hidden_size, cfg.intermediate_size),
        "bf16_tflops_ffn_down": matmul_tflops(device, torch.bfloat16 if device.type == "cuda" else torch.float32,
                                              tokens, cfg.intermediate_size, cfg.hidden_size),
        "encoder_gflop_per_doc": flops / len(texts) / 1e9,
    }
    rate = (limit["bf16_tflops_ffn_up"] + limit["bf16_tflops_ffn_down"]) / 2
    limit["ceiling_docs_per_s"] = rate * 1e12 / (flops / len(texts))
    for row in rows:
        if "achieved_tflops" in row:  # not the tokenizer's row
            row["fraction_of_matmul_rate"] = row["achieved_tflops"] / rate
    return rows, limit


STEADY_AFTER = 10  # steady-state rates leave out the first steps (warm-up: kernels, allocator, plans)


class StepClock:
    """A sentence-transformers trainer callback noting when each optimizer step ends (the device synchronised)."""

    def __init__(self, device: torch.device) -> None:
        from transformers import TrainerCallback

        self.device, self.times = device, []
        clock = self

        class _Callback(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                sync(clock.device)
                clock.times.append(time.perf_counter())

        self.callback = _Callback()

    def steady(self, batch_size: int) -> float | None:
        """Examples/s from the end of step STEADY_AFTER to the last step's (full batches assumed)."""
        t = self.times
        if len(t) <= STEADY_AFTER + 1:
            return None
        return (len(t) - 1 - STEADY_AFTER) * batch_size / (t[-1] - t[STEADY_AFTER])


def steady_rate(history: list[dict]) -> float | None:
    """twotower's examples/s after its first STEADY_AFTER steps, from the run's log: each record's cumulative
    ``examples_per_s`` gives the time its step ended (examples seen / rate)."""
    if len(history) <= STEADY_AFTER + 1:
        return None
    first, last = history[STEADY_AFTER - 1], history[-2]  # the last step's batch may be partial: stop before it
    # step n ended (n × batch) / rate_n after the start; the batch cancels out of the ratio
    ends = [r["step"] / r["examples_per_s"] for r in (first, last)]
    return (last["step"] - first["step"]) / (ends[1] - ends[0])


def block_times(history: list[dict], batch_size: int, every: int = 10) -> list[float]:
    """Seconds each block of ``every`` steps took, from the log's cumulative rates (step n ended n × batch / rate
    after the stage began): a first epoch much slower than the next shows a cost paid per new batch shape."""
    ends = [0.0] + [r["step"] * batch_size / r["examples_per_s"] for r in history[every - 1 :: every]]
    return [round(b - a, 3) for a, b in zip(ends, ends[1:])]


def train_rows(args, device: torch.device, data: Path, ds_test: BeirDataset, work: Path) -> list[dict]:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    from twotower.data.pairs import pairs_from_beir
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.training.trainer import StageConfig, TrainConfig, Trainer

    pairs = pairs_from_beir(BeirDataset.load(data, "train"))
    n_examples = len(pairs) * args.epochs
    doc_ids = list(ds_test.corpus)
    corpus = [ds_test.corpus[d].full_text for d in doc_ids]
    queries = list(ds_test.queries.values())
    rows = []

    train = Dataset.from_dict({"anchor": [p.query for p in pairs], "positive": [p.positive for p in pairs]})
    for name, bf16 in (("sentence-transformers mnrl", False), ("sentence-transformers mnrl bf16", True)):
        if bf16 and not (device.type == "cuda" and torch.cuda.is_bf16_supported()):
            continue
        model = SentenceTransformer(str(default_model_path()), device=str(device))
        model.max_seq_length = args.max_length
        targs = SentenceTransformerTrainingArguments(
            output_dir=str(work / "st-tmp"), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
            learning_rate=args.lr, warmup_ratio=0.1, weight_decay=0.01, save_strategy="no", report_to=[], seed=42,
            logging_steps=10, use_cpu=device.type == "cpu", bf16=bf16)
        clock = StepClock(device)
        trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=train, callbacks=[clock.callback],
                                             loss=MultipleNegativesRankingLoss(model, scale=1 / args.temperature))
        sync(device)
        t0 = time.perf_counter()
        trainer.train()
        sync(device)
        wall = time.perf_counter() - t0
        st_vecs = model.encode(corpus, batch_size=128, normalize_embeddings=True, convert_to_numpy=True)
        st_q = model.encode(queries, batch_size=128, normalize_embeddings=True, convert_to_numpy=True)
        rows.append({"system": name, "task": "train", "examples_per_s": n_examples / wall, "wall_s": wall,
                     "steady_examples_per_s": clock.steady(args.batch_size),
                     **test_metrics(ds_test, doc_ids, st_vecs, st_q)})
        print(rows[-1], flush=True)
        del model, trainer

    stage = StageConfig(data=str(data), epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, warmup=0.1,
                        temperature=args.temperature)
    cfg = TrainConfig(out=str(work / "tt"), device=str(device), doc_max_length=args.max_length,
                      query_max_length=args.max_length, checkpoint_every=0, show_progress=False, stages=[stage])
    trainer = Trainer(cfg)
    first_step: list[float] = []
    step_loss = trainer.objective.step_loss

    def timed_step_loss(*a, **k):  # when the first step starts: what train() spends before it
        if not first_step:
            first_step.append(time.perf_counter())
        return step_loss(*a, **k)

    trainer.objective.step_loss = timed_step_loss
    sync(device)
    t0 = time.perf_counter()
    trained = trainer.train()
    sync(device)
    wall = time.perf_counter() - t0
    opts = EncodeOptions(show_progress=False)
    loaded = DualEncoder.load(work / "tt" / "model", device=device)
    rows.append({"system": "twotower train", "task": "train", "examples_per_s": n_examples / wall, "wall_s": wall,
                 "steady_examples_per_s": steady_rate(trainer.history),
                 "to_first_step_s": first_step[0] - t0, "block_s": block_times(trainer.history, args.batch_size),
                 "precision": trainer.precision, "bucket_size": trainer.bucket_size(stage),
                 **test_metrics(ds_test, doc_ids, loaded.encode_documents(corpus, opts),
                                loaded.encode_queries(queries, opts))})
    del trained
    fastest_st = max(r["examples_per_s"] for r in rows[:-1])
    rows[-1]["x_st_mnrl"] = rows[-1]["examples_per_s"] / fastest_st  # the faster of ST fp32 and ST bf16
    print(rows[-1], flush=True)
    return rows


def eval_rows(args, data: Path, device: torch.device) -> list[dict]:
    rows = []
    cli = [sys.executable, "-m", "twotower.cli", "eval", "--data", str(data), "--retriever", "dense", "--no-progress"]
    for name, extra in (("twotower eval (no flag)", []), ("twotower eval --device cpu", ["--device", "cpu"])):
        if device.type == "cpu" and not extra:
            continue  # a CPU smoke run has no GPU row
        out = Path(tempfile.mkdtemp()) / "r.json"
        t0 = time.perf_counter()
        proc = subprocess.run(cli + extra + ["--out", str(out)], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed:\n{proc.stderr[-2000:]}")
        import json

        payload = json.loads(out.read_text())
        rows.append({"system": name, "task": "eval", "wall_s": wall, "device": payload["device"],
                     "ndcg@10": payload["metrics"]["ndcg@10"], "recall@100": payload["metrics"]["recall@100"]})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeat", type=int, default=4, help="encode the corpus this many times over (throughput)")
    ap.add_argument("--limit", type=int, default=0, help="first N documents only (smoke runs; NDCG needs all)")
    ap.add_argument("--passes", type=int, default=2, help="timed passes per encoding system (the best is kept)")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--temperature", type=float, default=0.05)
    ap.add_argument("--parts", default="encode,train,eval")
    args = ap.parse_args()
    device = resolve_device(args.device)
    data = Path(args.data)
    parts = set(args.parts.split(","))
    ds = BeirDataset.load(data, "test")
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    rows, limit = [], {}
    if "encode" in parts:
        enc, limit = encode_rows(args, device, ds)
        rows += enc
    if "train" in parts:
        rows += train_rows(args, device, data, ds, work)
    if "eval" in parts:
        rows += eval_rows(args, data, device)
    name = "gpu" if device.type == "cuda" and not args.limit else "gpu_smoke"
    write_results(name, rows, extra={"device": describe(device), "limit": limit, "settings": vars(args)}, notes=(
        f"Device: {describe(device)}. Encoding: SciFact corpus ×{args.repeat}, max length {args.max_length}, "
        "NDCG@10 / Recall@100 on SciFact test from the first copy's vectors; achieved_tflops = the encoder's FLOPs on "
        "length-sorted batches of 128 divided by the time; fraction_of_matmul_rate against the bf16 matmul rate "
        f"measured on the encoder's FFN shapes in this run ({limit.get('bf16_tflops_ffn_up', float('nan')):.3g} / "
        f"{limit.get('bf16_tflops_ffn_down', float('nan')):.3g} TFLOP/s). Training: SciFact train, {args.epochs} "
        f"epochs, batch {args.batch_size}, lr {args.lr}, temperature {args.temperature}. Load at the end: "
        f"{load_average():.1f}."))


if __name__ == "__main__":
    main()
