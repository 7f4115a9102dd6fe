"""Where GPU encoding time goes, one process (issue #47): ``encode_documents`` on SciFact × ``--repeat`` with the
pipeline's settings varied (tokenizer threads ``TOKENIZE_WORKERS``, chunk ``GPU_TOKENIZE_CHUNK``, batch size, the
interpreter's GIL switch interval), against the tokenizer alone, the pipeline with a no-op model (what everything but
the forward pass costs) and the forward pass alone on pre-tokenized batches. Each row: the best of ``--tries`` runs.

    python benchmarks/experiments/gpu_encode_sweep.py [--repeat 4] [--label default]   (on the GPU machine)

Prints one JSON line per row; writes results/gpu_encode_sweep_<label>.{json,md} (or ``--out``, JSON only). The committed
results/gpu_encode_sweep.* join the runs with ``--label default`` and, in a second process, ``RAYON_NUM_THREADS=14
... --tries 1 --label rayon14`` (the tokenizer's thread pool two short of the cores), made in one call with gpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from _common import DATA, write_results  # noqa: E402
from encode_pipeline import NoOpTower, tokenizer_alone  # noqa: E402
from twotower.data.beir import BeirDataset  # noqa: E402
from twotower.encoders import inference  # noqa: E402
from twotower.encoders.towers import DualEncoder  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--tries", type=int, default=2)
    ap.add_argument("--label", default="default")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--limit", type=int, default=0, help="first N documents (a smoke run)")
    args = ap.parse_args()
    corpus = [d.full_text for d in BeirDataset.load(DATA / "scifact", "test").corpus.values()]
    texts = corpus[: args.limit or None] * args.repeat
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tower = DualEncoder.load(doc_max_length=256, device=device).doc_tower
    rows = []

    def timed(name: str, fn, **settings) -> None:
        best = float("inf")
        for _ in range(args.tries):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        rows.append({"label": args.label, "system": name, **settings, "docs_per_s": round(len(texts) / best)})
        print(json.dumps(rows[-1]), flush=True)

    tokenize = tokenizer_alone(tower.tokenizer, 256)
    tokenize(texts[:256])
    timed("tokenizer alone", lambda: tokenize(texts))
    inference.encode_texts(tower, texts[:1024], show_progress=False)  # warm-up: kernels, the bf16 copy
    defaults = (inference.TOKENIZE_WORKERS, inference.GPU_TOKENIZE_CHUNK)
    noop = NoOpTower(tower).to(device)
    for workers, chunk in ((1, 2048), (2, 2048), (3, 2048), (2, 1024), (2, 4096), (4, 1024)):
        inference.TOKENIZE_WORKERS, inference.GPU_TOKENIZE_CHUNK = workers, chunk
        timed("twotower encode", lambda: inference.encode_texts(tower, texts, show_progress=False),
              workers=workers, chunk=chunk, batch=inference.default_batch_size(device))
        timed("no-op model pipeline", lambda: inference.encode_texts(noop, texts, show_progress=False,
                                                                     precision="fp32", prefetch=device.type == "cuda"),
              workers=workers, chunk=chunk)
    inference.TOKENIZE_WORKERS, inference.GPU_TOKENIZE_CHUNK = defaults
    for batch in (256, 1024, 2048):
        timed("twotower encode", lambda: inference.encode_texts(tower, texts, batch_size=batch, show_progress=False),
              workers=defaults[0], chunk=defaults[1], batch=batch)
    for interval in (0.0005, 0.001):
        old = sys.getswitchinterval()
        sys.setswitchinterval(interval)
        timed("twotower encode", lambda: inference.encode_texts(tower, texts, show_progress=False),
              workers=defaults[0], chunk=defaults[1], switch_interval=interval)
        sys.setswitchinterval(old)
    fast = inference.bf16_copy(tower) if device.type == "cuda" else tower
    batches = [(i.to(device), m.to(device)) for _, i, m in
               inference.length_sorted_batches(tower.tokenizer, texts, 256, 512, chunk=len(texts))]

    def forward() -> None:
        with torch.inference_mode(), inference.attention_kernels(device):
            for i, m in batches:
                fast(i, m)

    forward()
    timed("forward alone (bf16 weights, b512, pre-tokenized)", forward)
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "device": str(device), "cores": os.cpu_count()}, indent=1))
    else:
        write_results(f"gpu_encode_sweep_{args.label}", rows, extra={"device": str(device)})


if __name__ == "__main__":
    main()
