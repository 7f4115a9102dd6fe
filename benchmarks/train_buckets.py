"""Training-step speed: length buckets vs a padded batch, and sentence-transformers' MNRL step.

One training step (forward + loss + backward of a batch of SciFact train pairs, the default model,
max length 256) is timed for
- ``sentence-transformers mnrl``: MultipleNegativesRankingLoss on ``model.tokenize`` features (what
  its trainer runs per step, without the optimizer);
- ``twotower bucket N``: twotower's step (bi-directional in-batch softmax) with the batch's texts
  run in length buckets of N (``bucket 0``: the whole padded batch, as sentence-transformers does).
The same batches are used by every system; systems take turns, each pass over the batches is timed,
and the best pass counts (background load only ever slows a pass down). Writes
``results/train_buckets.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import tempfile
import time

import torch

from _common import DATA, load_average, write_results
from twotower.encoders.backbone import default_model_path
from twotower.training.losses import InBatchSoftmaxLoss
from twotower.training.trainer import StageConfig, TrainConfig, Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--sizes", default="0,4,8,16")
    args = ap.parse_args()
    torch.manual_seed(0)
    load_start = load_average()

    stage = StageConfig(data=args.data, split="train", batch_size=args.batch_size)
    trainer = Trainer(TrainConfig(out=tempfile.mkdtemp(prefix="tt-buckets-"), stages=[stage], show_progress=False,
                                  precision="fp32", doc_max_length=args.max_length,
                                  query_max_length=args.max_length))
    trainer.objective.setup(trainer)
    examples = trainer.objective.examples(stage)
    rng = random.Random(0)
    batches = [rng.sample(examples, args.batch_size) for _ in range(args.batches)]
    loss_fn = InBatchSoftmaxLoss(stage.temperature, stage.bidirectional)
    trainer.model.train()

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    st = SentenceTransformer(str(default_model_path()), device="cpu")
    st.max_seq_length = args.max_length
    st.train()
    mnrl = MultipleNegativesRankingLoss(st, scale=1 / stage.temperature)

    def st_step(batch) -> None:
        st.zero_grad(set_to_none=True)
        features = [st.tokenize([e.query for e in batch]), st.tokenize([e.positive for e in batch])]
        mnrl(features, None).backward()

    def tt_step(size: int):
        sized = dataclasses.replace(stage, bucket_size=size)

        def step(batch) -> None:
            trainer.model.zero_grad(set_to_none=True)
            trainer.objective.step_loss(trainer, batch, sized, loss_fn, random.Random(1))
        return step

    systems = {"sentence-transformers mnrl": st_step}
    systems.update({f"twotower bucket {s}": tt_step(int(s)) for s in args.sizes.split(",")})
    best = {name: float("inf") for name in systems}
    for p in range(args.passes):
        for name, step in systems.items():
            t0 = time.perf_counter()
            for batch in batches:
                step(batch)
            secs = (time.perf_counter() - t0) / len(batches)
            best[name] = min(best[name], secs)
            print(f"pass {p + 1}: {name}: {secs:.2f} s/step", flush=True)

    ref = best["sentence-transformers mnrl"]
    rows = [{"system": name, "s_per_step": s, "examples_per_s": args.batch_size / s, "speedup_vs_st": ref / s}
            for name, s in best.items()]
    for row in rows:
        print(row)
    write_results("train_buckets", rows, notes=(
        f"all-MiniLM-L6-v2, fp32, batch {args.batch_size} SciFact train pairs, max length {args.max_length}; "
        f"{args.batches} batches per pass, best of {args.passes} passes, systems in turns. A step = forward + "
        "loss + backward (no optimizer update). 'twotower bucket 0' pads the whole batch like sentence-transformers; "
        f"N > 0 runs buckets of N texts sorted by length. torch threads {torch.get_num_threads()}; load average "
        f"{load_start:.1f} at start, {load_average():.1f} at end."))


if __name__ == "__main__":
    main()
