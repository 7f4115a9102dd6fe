"""The evidence behind ``twotower fit``'s recipe defaults: one fine-tuning variant per call on SciFact, trained on
fit's training part (its seeded 80% of the judged train queries; ``--all``: dev too), scored on fit's dev part
(what the defaults were chosen on) and on test (reported only). Appends a JSON line to
.cache/fit_recipe_sweep/results.jsonl; results/fit_recipe_sweep.md lists the runs made.

    python benchmarks/experiments/fit_recipe_sweep.py zeroshot             # no training
    python benchmarks/experiments/fit_recipe_sweep.py base                 # 2 epochs, lr 5e-5 (the old default)
    python benchmarks/experiments/fit_recipe_sweep.py ep4 --epochs 4
"""
import argparse
import json
import sys
import time
from pathlib import Path
import numpy as np
from twotower.data.beir import BeirDataset
from twotower.data.pairs import pairs_from_beir, save_pairs, load_pairs
from twotower.training.fit.recipe import split_queries
from twotower.training.fit import select
from twotower.training.config import StageConfig, TrainConfig
from twotower.training.trainer import Trainer
from twotower.encoders.towers import DualEncoder, EncodeOptions
from twotower.retrieval.bm25 import BM25

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common.py
from _common import DATA as _DATA  # noqa: E402

DATA = _DATA / "scifact"
EXP = Path(__file__).resolve().parents[2] / ".cache" / "fit_recipe_sweep"
ap = argparse.ArgumentParser()
ap.add_argument("name"); ap.add_argument("--start", default=None)
ap.add_argument("--pairs", default=None, help="pairs file (else train split pairs)")
ap.add_argument("--all", action="store_true", help="train on dev queries too")
ap.add_argument("--epochs", type=float, default=2); ap.add_argument("--lr", type=float, default=5e-5)
ap.add_argument("--batch", type=int, default=32); ap.add_argument("--temp", type=float, default=0.05)
ap.add_argument("--neg", type=int, default=0); ap.add_argument("--precision", default="auto")
ap.add_argument("--doc-len", type=int, default=None); ap.add_argument("--seed", type=int, default=42)
ap.add_argument("--drop", type=float, default=0.0); ap.add_argument("--warmup", type=float, default=0.1)
ap.add_argument("--eval-only", action="store_true")
a = ap.parse_args()
tr = BeirDataset.load(DATA, "train"); te = BeirDataset.load(DATA, "test")
dev, train = split_queries(tr.qrels, 0.2, 50, 42)
keep = set(train) | (set(dev) if a.all else set())
out = EXP / a.name
t0 = time.time()
if not a.eval_only and a.name != "zeroshot":
    if a.pairs:
        pairs = [p for p in load_pairs(a.pairs) if p.qid in keep]
    else:
        pairs = [p for p in pairs_from_beir(tr) if p.qid in keep]
    pf = out / "pairs.jsonl"; out.mkdir(parents=True, exist_ok=True); save_pairs(pairs, pf)
    cfg = TrainConfig(out=str(out / "run"), model=a.start, precision=a.precision, attention_dropout=a.drop, seed=a.seed,
                      show_progress=False, checkpoint_every=10000, doc_max_length=a.doc_len,
                      stages=[StageConfig(name="ft", pairs=str(pf), epochs=a.epochs, batch_size=a.batch, lr=a.lr,
                                          temperature=a.temp, hard_negatives=a.neg, warmup=a.warmup)])
    Trainer(cfg).train(resume=False)
train_s = time.time() - t0
m = DualEncoder.load(None if a.name == "zeroshot" else out / "run" / "model")
ids = list(tr.corpus)
opts = EncodeOptions(batch_size=32, precision="auto", show_progress=False)
D = m.encode_documents([tr.corpus[d].full_text for d in ids], opts)
np.save(out / "docs.npy", D) if out.exists() else None
bm_cache = EXP / "bm25_runs.json"
if bm_cache.is_file():
    bm = json.loads(bm_cache.read_text())
else:
    b = BM25().index(ids, [tr.corpus[d].full_text for d in ids], show_progress=False)
    bm = {}
    for split, qids, ds in (("dev", dev, tr), ("test", list(te.qrels), te)):
        s, ix = b.search([ds.queries[q] for q in qids], 100, show_progress=False)
        bm[split] = {q: {ids[j]: float(x) for x, j in zip(rs, ri)} for q, rs, ri in zip(qids, s, ix)}
    EXP.mkdir(parents=True, exist_ok=True)
    bm_cache.write_text(json.dumps(bm))
res = {"name": a.name, "args": vars(a), "train_s": round(train_s)}
runs = {}
for split, qids, ds in (("dev", dev, tr), ("test", list(te.qrels), te)):
    Q = m.encode_queries([ds.queries[q] for q in qids], opts)
    runs[split] = select.dense_run(Q, D, qids, ids, 100)
devq = {q: tr.qrels[q] for q in dev}
res["dev_dense"] = select.score(devq, runs["dev"])["ndcg@10"]
res["test_dense"] = select.score(te.qrels, runs["test"])
best = max((select.score(devq, select.fused("hybrid", runs["dev"], bm["dev"], l, 100))["ndcg@10"], l) for l in np.arange(0, 1.01, 0.05).round(2))
res["dev_hybrid"] = best
res["test_hybrid_devlam"] = select.score(te.qrels, select.fused("hybrid", runs["test"], bm["test"], best[1], 100))
res["test_hybrid_grid"] = {float(l): select.score(te.qrels, select.fused("hybrid", runs["test"], bm["test"], l, 100))["ndcg@10"] for l in (0.3, 0.4, 0.5, 0.6, 0.7)}
json.dump(runs, open(out / "runs.json", "w")) if out.exists() else None
print(json.dumps(res))
with open(EXP / "results.jsonl", "a") as f:
    f.write(json.dumps(res) + "\n")
