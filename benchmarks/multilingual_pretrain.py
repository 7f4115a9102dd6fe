"""mContriever-style pre-training of multilingual-e5-small on XQuAD-R's multilingual sentences (issue #23, item 4):
Contriever's independent cropping + MoCo on the 13,014 ``pool`` sentences (11 languages; no questions, no labels),
then the zero-shot model and the pre-trained one on every XQuAD-R set, and both after language-bias removal.

1. runs ``twotower pretrain --model multilingual-e5-small --corpus xquad-r/pool --augment crop --negatives moco ...``
   as a command (the views go behind e5's prompts: query view "query:", key view "passage:");
2. encodes the pool's sentences and questions with the result (cached in WORK);
3. scores it beside the zero-shot model (vectors cached by ``benchmarks/multilingual.py``): mAP over the full ranking
   (LAReQA's measure) and NDCG@10 / R@100 on the 11 monolingual sets, ``to-en`` and ``pool``.

    python benchmarks/multilingual_pretrain.py [--steps 100] [--batch-size 32] [--lr 1e-5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DATA, write_results  # noqa: E402
from multilingual import E5, LAREQA_BEST, _load, vectors  # noqa: E402
from multilingual_align import score_sets  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".cache" / "multilingual_pretrain"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--queue-size", type=int, default=4096)
    ap.add_argument("--chunk-tokens", type=int, default=64)
    args = ap.parse_args()
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    doc_ids, doc_texts, qids, q_texts, qrels = _load(0)
    zd, zq, _ = vectors(E5, doc_ids, doc_texts, qids, q_texts, "auto", None)
    run = WORK / f"crop-moco-s{args.steps}-b{args.batch_size}-lr{args.lr}"
    settings = ["--augment", "crop", "--negatives", "moco", "--queue-size", str(args.queue_size), "--momentum", "0.999",
                "--chunk-tokens", str(args.chunk_tokens), "--steps", str(args.steps), "--batch-size",
                str(args.batch_size), "--lr", str(args.lr), "--freeze-embeddings"]
    if not (run / "model" / "twotower.json").is_file():
        cmd = [sys.executable, "-m", "twotower.cli", "pretrain", "--model", E5, "--corpus", str(DATA / "xquad-r" / "pool"),
               "--out", str(run), "--no-progress", *settings]
        print("$", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        (run / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    wall_s = float((run / "wall_s.txt").read_text())
    if not (run / "queries.npy").is_file():
        model = DualEncoder.load(str(run / "model"))
        opts = EncodeOptions(show_progress=True)
        np.save(run / "docs.npy", model.encode_documents(doc_texts, opts))
        np.save(run / "queries.npy", model.encode_queries(q_texts, opts))
    pd, pq = np.load(run / "docs.npy"), np.load(run / "queries.npy")
    log = json.loads((run / "train_log.json").read_text()) if (run / "train_log.json").is_file() else None
    rows, by_lang = score_sets({E5: (zd, zq), f"{E5} + crop/MoCo": (pd, pq)}, doc_ids, qids, qrels)
    pool = {r["system"]: r["map"] for r in rows if r["system"].endswith(" pool")}
    mono = {name: round(float(np.mean([r["ndcg@10"] for r in rows if r["system"].rsplit(" ", 1)[0] == name
                                       and r["system"].rsplit(" ", 1)[1] not in ("pool", "to-en")])), 4)
            for name in (E5, f"{E5} + crop/MoCo")}
    notes = (f"Pre-training: `twotower pretrain --model {E5} --corpus xquad-r/pool {' '.join(settings)}` ({wall_s} s on "
             f"the 2 CPU cores): two independent crops of each 13,014-sentence chunk (the pool's sentences, every "
             f"language), MoCo queue {args.queue_size}, momentum 0.999, temperature 0.05, token-embedding matrix frozen. "
             f"Evaluation: all 13,090 questions; map over the full ranking (LAReQA's best mBERT baseline on `pool`: "
             f"{LAREQA_BEST}). pool mAP: {pool}; monolingual NDCG@10, mean of the 11 sets: {mono}.")
    write_results("multilingual_pretrain", rows, notes=notes, extra={"map_by_language": by_lang, "train_log": log,
                                                                     "mono_mean_ndcg@10": mono})


if __name__ == "__main__":
    main()
