"""GTR's scaling claims at our scale, on SciFact (train → test), for all-MiniLM-L6-v2 (22M) and
all-mpnet-base-v2 (110M; install it first: ``twotower models fetch mpnet-base``):

- model size at a fixed bottleneck (GTR §5, Fig. 1): both backbones projected to the same dim;
- bottleneck size (GTR §6.5, Fig. 7): projection dims {128, 256, 384, 768} per backbone;
- data efficiency (GTR §5.3, Table 4): fine-tuned on 10% vs 100% of the train queries.

Rows are named ``minilm-<dim>`` / ``mpnet-<dim>``, with ``stage`` = ``zero-shot``, ``fine-tuned``
(all train queries) or ``fine-tuned-10%``, and ``ndcg@10``, ``recall@100``, ``acc@5/20/100``
(top-k answer accuracy), ``train_s`` and ``encode_s`` (test corpus + queries).

The full study takes hours on 2 cores, so it runs in pieces: every finished row is appended to
``<work>/rows.jsonl`` and skipped when the script runs again with the same settings (key:
backbone, dim, stage, fraction, epochs, max length and the recipe); a killed fine-tune resumes
from its last checkpoint. After every row the results are rewritten from all rows:
``benchmarks/results/gtr_scaling.{json,md}``, ``gtr_bottleneck.png`` and ``gtr_data_efficiency.png``.

    python benchmarks/gtr_scaling.py --plan                       # what is done, what is left
    python benchmarks/gtr_scaling.py --only 'minilm-*'            # one piece (fnmatch on name or name/stage)
    python benchmarks/gtr_scaling.py --backbones mpnet-base --max-length 128 --max-rows 2
    python benchmarks/gtr_scaling.py --report-only                # rewrite the results from rows.jsonl
    python benchmarks/gtr_scaling.py --smoke                      # a minute: tiny subset, 1 step, MiniLM

Zero-shot rows with a projection: the backbone as it is, its pooled embedding mapped by the
projection a fine-tune would start from (seeded as the trainer seeds it): the identity when dim
equals the hidden size, an isometry (orthonormal columns) when it is larger, and a scaled random
semi-orthogonal map (a Johnson–Lindenstrauss-style random projection) when it is smaller; cosine
similarity after it. So zero-shot rows at dim ≥ hidden size equal the backbone itself, and below
it they measure what a random bottleneck loses before any training. They are computed from one
encoding of the test set per backbone (pooled, unnormalised vectors cached in ``<work>/cache``),
projected per dim; ``--smoke`` checks this equals evaluating the saved projected model.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

import _common
from _common import DATA, load_average, write_results

log = logging.getLogger("gtr_scaling")

PREFIX = {"minilm-l6": "minilm", "mpnet-base": "mpnet"}  # registered model name -> row name prefix
METRICS = ("ndcg@10", "recall@100", "acc@5", "acc@20", "acc@100")
TOP_K = 100  # deep enough for recall@100 / acc@100
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Job:
    """One row to compute."""

    backbone: str
    dim: int
    fraction: float  # share of the train queries; 0 = zero-shot
    epochs: float  # 0 = zero-shot
    max_length: int
    batch_size: int
    lr: float
    temperature: float
    seed: int
    precision: str
    equal_steps: bool = False  # a fraction trained for epochs/fraction epochs: as many steps as all the data

    @property
    def zero_shot(self) -> bool:
        return self.fraction == 0

    @property
    def system(self) -> str:
        return f"{PREFIX.get(self.backbone, self.backbone)}-{self.dim}"

    @property
    def stage(self) -> str:
        if self.zero_shot:
            return "zero-shot"
        if self.fraction >= 1:
            return "fine-tuned"
        return f"fine-tuned-{self.fraction * 100:g}%" + ("-equal-steps" if self.equal_steps else "")

    @property
    def name(self) -> str:
        return f"{self.system}/{self.stage}"

    def key(self) -> dict:
        """What makes two rows the same measurement (zero-shot rows do not depend on the recipe)."""
        key = {"backbone": self.backbone, "dim": self.dim, "stage": self.stage, "fraction": self.fraction,
               "epochs": self.epochs, "max_length": self.max_length, "seed": self.seed, "precision": self.precision}
        if not self.zero_shot:
            key.update(batch_size=self.batch_size, lr=self.lr, temperature=self.temperature)
        return key

    @property
    def slug(self) -> str:
        return (f"{self.system}-f{self.fraction:g}-e{self.epochs:g}-L{self.max_length}-b{self.batch_size}"
                f"-lr{self.lr:g}-t{self.temperature:g}-s{self.seed}-{self.precision}")


# --------------------------------------------------------------------------- rows.jsonl
def read_rows(path: Path) -> list[dict]:
    """All complete rows; a line cut short by a kill is skipped."""
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s, line %d: incomplete row skipped (a run was killed while writing it)", path, number)
    return rows


def append_row(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(row) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def is_done(job: Job, rows: list[dict]) -> bool:
    return any(r.get("key") == job.key() for r in rows)


# --------------------------------------------------------------------------- data
def beir_sets(data_root: Path, train_set: Path) -> list[Path]:
    """Other BEIR-format sets beside the training set (corpus.jsonl, queries.jsonl, qrels/test.tsv)."""
    if not data_root.is_dir():
        return []
    return sorted(p for p in data_root.iterdir()
                  if p.is_dir() and p.resolve() != train_set.resolve() and (p / "corpus.jsonl").is_file()
                  and (p / "queries.jsonl").is_file() and (p / "qrels" / "test.tsv").is_file())


def subset_pairs(data: Path, fraction: float, seed: int, out_dir: Path) -> tuple[Path, int, int]:
    """Judged train pairs of a seeded random ``fraction`` of the train queries (each with all its
    positives), as a pairs file. Returns (path, queries kept, pairs)."""
    from twotower.data.beir import BeirDataset
    from twotower.data.pairs import pairs_from_beir, save_pairs

    pairs = pairs_from_beir(BeirDataset.load(data, "train"))
    qids = sorted({p.qid for p in pairs})
    k = len(qids) if fraction >= 1 else max(1, round(fraction * len(qids)))
    keep = set(random.Random(seed).sample(qids, k))
    chosen = [p for p in pairs if p.qid in keep]
    path = out_dir / f"{data.name}-train-q{fraction:g}-seed{seed}.jsonl"
    if not path.is_file():
        save_pairs(chosen, path)
    return path, k, len(chosen)


# --------------------------------------------------------------------------- evaluation
def _encode_s(timings: dict, n_queries: int) -> float:
    return timings["index_s"] + n_queries / timings["queries_per_s"]


def eval_model(model_dir: Path, data: Path, job: Job, args) -> tuple[dict, float]:
    """(metrics, encode seconds) of a saved model on ``data``'s test split, through ``twotower eval``'s path."""
    from twotower.evaluation.pipeline import EvalConfig, run_eval

    res = run_eval(EvalConfig(data=data, split="test", retriever="dense", model=str(model_dir), top_k=TOP_K,
                              batch_size=args.eval_batch_size, precision=job.precision,
                              query_max_length=job.max_length, doc_max_length=job.max_length, metrics=METRICS,
                              show_progress=args.progress))
    return res.metrics, _encode_s(res.timings, res.num_queries)


def pooled_vectors(job: Job, data: Path, args) -> dict:
    """The backbone's pooled, unnormalised test-set vectors (no projection), cached in <work>/cache."""
    from twotower.data.beir import BeirDataset
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    cache = Path(args.work) / "cache" / f"{job.backbone}-L{job.max_length}-{job.precision}-{data.name}.npz"
    ds = BeirDataset.load(data, "test")
    if cache.is_file():
        z = np.load(cache, allow_pickle=False)
        return {"ds": ds, "docs": z["docs"], "queries": z["queries"], "doc_ids": list(z["doc_ids"]),
                "qids": list(z["qids"]), "encode_s": float(z["encode_s"])}
    model = DualEncoder.build(job.backbone, similarity="dot", query_max_length=job.max_length,
                              doc_max_length=job.max_length)  # dot: the tower does not normalise
    opts = EncodeOptions(batch_size=args.eval_batch_size, precision=job.precision, show_progress=args.progress)
    doc_ids, qids = list(ds.corpus), list(ds.queries)
    t0 = time.perf_counter()
    docs = model.encode_documents([ds.corpus[d].full_text for d in doc_ids], opts)
    queries = model.encode_queries([ds.queries[q] for q in qids], opts)
    encode_s = time.perf_counter() - t0
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + ".tmp.npz")
    np.savez(tmp, docs=docs, queries=queries, doc_ids=np.array(doc_ids), qids=np.array(qids), encode_s=encode_s)
    os.replace(tmp, cache)
    return {"ds": ds, "docs": docs, "queries": queries, "doc_ids": doc_ids, "qids": qids, "encode_s": encode_s}


def initial_model(job: Job):
    """The dual encoder a fine-tune of ``job`` starts from: seeded exactly as the Trainer seeds it."""
    import torch

    from twotower.encoders.towers import DualEncoder

    torch.manual_seed(job.seed)
    return DualEncoder.build(job.backbone, dim=job.dim, query_max_length=job.max_length,
                             doc_max_length=job.max_length)


def eval_projected(pooled: dict, weight: np.ndarray) -> dict:
    """Metrics of cosine retrieval after mapping the pooled vectors by ``weight`` (out × in)."""
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.dense import exact_search, to_run

    def project(x: np.ndarray) -> np.ndarray:
        y = x @ weight.T
        return y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)

    scores, idx = exact_search(project(pooled["queries"]), project(pooled["docs"]), TOP_K)
    return evaluate(pooled["ds"].qrels, to_run(pooled["qids"], pooled["doc_ids"], scores, idx), METRICS)


# --------------------------------------------------------------------------- one row
def base_row(job: Job) -> dict:
    return {"system": job.system, "stage": job.stage, "backbone": job.backbone, "dim": job.dim,
            "fraction": job.fraction, "epochs": job.epochs, "max_length": job.max_length}


def run_zero_shot(job: Job, args, transfer: list[Path]) -> dict:
    model = initial_model(job)
    proj = model.query_tower.projection
    weight = proj.linear.weight.detach().float().numpy()
    kind = ("identity" if proj.in_features == proj.out_features else
            "isometry" if proj.out_features > proj.in_features else "semi-orthogonal")
    del model
    pooled = pooled_vectors(job, Path(args.data), args)
    row = {**base_row(job), **eval_projected(pooled, weight), "train_s": 0.0, "encode_s": pooled["encode_s"],
           "steps": 0, "projection": f"{kind} {proj.in_features}→{proj.out_features}"}
    for other in transfer:
        metrics = eval_projected(pooled_vectors(job, other, args), weight)
        row.update({f"{other.name}:{m}": metrics[m] for m in ("ndcg@10", "recall@100")})
    return row


def run_fine_tune(job: Job, args, transfer: list[Path]) -> dict:
    from twotower.training.trainer import StageConfig, TrainConfig, Trainer

    work = Path(args.work)
    run_dir = work / "runs" / job.slug
    pairs, n_q, n_pairs = subset_pairs(Path(args.data), job.fraction, job.seed, work / "pairs")
    done_file = run_dir / "gtr_train.json"
    if not (done_file.is_file() and (run_dir / "model").is_dir()):
        stage = StageConfig(pairs=str(pairs), epochs=job.epochs, steps=args.steps, batch_size=job.batch_size,
                            lr=job.lr, warmup=0.1, temperature=job.temperature)
        cfg = TrainConfig(out=str(run_dir), model=job.backbone, dim=job.dim, precision=job.precision,
                          query_max_length=job.max_length, doc_max_length=job.max_length, seed=job.seed,
                          checkpoint_every=args.checkpoint_every, keep_checkpoints=1, show_progress=args.progress,
                          stages=[stage])
        trainer = Trainer(cfg)
        resumed = trainer.latest_checkpoint() is not None
        t0 = time.perf_counter()
        trainer.train(resume=resumed)
        wall = time.perf_counter() - t0
        history = trainer.history
        steps = history[-1]["step"] if history else 0
        if resumed and history:  # the wall time before the kill is gone: estimate it from the final step rate
            train_s, estimated = steps * job.batch_size / history[-1]["examples_per_s"], True
        else:
            train_s, estimated = wall, False
        done_file.write_text(json.dumps({"train_s": train_s, "estimated": estimated, "steps": steps}))
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    done = json.loads(done_file.read_text())
    metrics, encode_s = eval_model(run_dir / "model", Path(args.data), job, args)
    row = {**base_row(job), **metrics, "train_s": done["train_s"], "encode_s": encode_s, "steps": done["steps"],
           "train_queries": n_q, "train_pairs": n_pairs}
    if done["estimated"]:
        row["train_s_estimated"] = True
    for other in transfer:
        other_metrics, _ = eval_model(run_dir / "model", other, job, args)
        row.update({f"{other.name}:{m}": other_metrics[m] for m in ("ndcg@10", "recall@100")})
    return row


# --------------------------------------------------------------------------- the plan
def plan(args) -> list[Job]:
    common = dict(max_length=args.max_length, batch_size=args.batch_size, lr=args.lr,
                  temperature=args.temperature, seed=args.seed, precision=args.precision)
    jobs = []
    for backbone in args.backbones:
        jobs += [Job(backbone, dim, 0.0, 0.0, **common) for dim in args.dims]
        for fraction in args.fractions:
            equal = args.equal_steps and fraction < 1
            epochs = args.epochs / fraction if equal else args.epochs
            jobs += [Job(backbone, dim, fraction, epochs, **common, equal_steps=equal) for dim in args.dims]
    if args.only:
        jobs = [j for j in jobs if any(fnmatch.fnmatch(s, pat) for pat in args.only
                                       for s in (j.name, j.system, j.stage, j.backbone))]
    return jobs


# --------------------------------------------------------------------------- results
STAGE_ORDER = {"zero-shot": 0, "fine-tuned": 1}
COLUMNS = ("system", "stage", "dim", "fraction", "epochs", "max_length", "steps", *METRICS, "train_s", "encode_s")
RECIPE = ("batch_size", "lr", "temperature", "seed", "precision")


def table_rows(rows: list[dict]) -> list[dict]:
    """One display row per stored row, sorted; recipe fields become columns only where they vary."""
    varying = [k for k in RECIPE if len({json.dumps(r["key"].get(k)) for r in rows if k in r["key"]}) > 1]
    out = []
    for r in sorted(rows, key=lambda r: (r["backbone"], STAGE_ORDER.get(r["stage"], 2), -r["fraction"],
                                         r["epochs"], r["max_length"], r["dim"])):
        shown = {c: r[c] for c in COLUMNS if c in r}
        shown.update({k: r["key"][k] for k in varying if k in r["key"]})
        shown.update({k: v for k, v in r.items() if ":" in k})  # transfer metrics
        if r.get("train_s_estimated"):
            shown["train_s"] = f"≈{r['train_s']:.0f}"
        out.append(shown)
    return out


def pick(rows: list[dict], system: str, stage: str, max_length: int | None = None) -> dict | None:
    """The row of ``system`` at ``stage`` (and ``max_length`` if given); where several settings exist,
    the longest max length, then the newest."""
    hits = [r for r in rows if r["system"] == system and r["stage"] == stage
            and (max_length is None or r["max_length"] == max_length)]
    return max(hits, key=lambda r: (r["max_length"], r.get("finished", ""))) if hits else None


def lengths(rows: list[dict]) -> list[int]:
    return sorted({r["max_length"] for r in rows}, reverse=True)


def comparisons(rows: list[dict]) -> list[str]:
    """Sentences for GTR's three questions, from whatever rows exist."""
    def get(system: str, stage: str, length: int) -> float | None:
        row = pick(rows, system, stage, length)
        return row["ndcg@10"] if row else None

    lines = []
    dims = sorted({r["dim"] for r in rows})
    for stage in ("zero-shot", "fine-tuned"):
        pairs = []
        for d in dims:  # the two backbones compared at the same max length only (the longest both have)
            for length in lengths(rows):
                a, b = pick(rows, f"minilm-{d}", stage, length), pick(rows, f"mpnet-{d}", stage, length)
                if a and b:
                    pairs.append((d, length, a["ndcg@10"], b["ndcg@10"]))
                    break
        if pairs:
            lines.append(f"- Model size at a fixed bottleneck ({stage}, NDCG@10, MiniLM → mpnet): "
                         + "; ".join(f"dim {d} at max length {n}: {a:.4f} → {b:.4f} ({b - a:+.4f})"
                                     for d, n, a, b in pairs) + ".")
    fracs = sorted({r["stage"] for r in rows if r["stage"].startswith("fine-tuned-")})
    for prefix in ("minilm", "mpnet"):
        for length in lengths(rows):  # a backbone's rows at one max length at a time
            curve = [(d, get(f"{prefix}-{d}", "fine-tuned", length)) for d in dims]
            curve = [(d, v) for d, v in curve if v is not None]
            if len(curve) > 1:
                lines.append(f"- Bottleneck ({prefix}, max length {length}, fine-tuned NDCG@10 by dim): "
                             + ", ".join(f"{d}: {v:.4f}" for d, v in curve) + ".")
            for st in fracs:
                both = [(d, get(f"{prefix}-{d}", st, length), get(f"{prefix}-{d}", "fine-tuned", length)) for d in dims]
                both = [(d, a, b) for d, a, b in both if a is not None and b is not None]
                if both:
                    lines.append(f"- Data efficiency ({prefix}, max length {length}, NDCG@10 {st} vs all train "
                                 "queries): " + "; ".join(f"dim {d}: {a:.4f} vs {b:.4f} ({a - b:+.4f})"
                                                          for d, a, b in both) + ".")
    return lines


def plot(rows: list[dict], results: Path) -> list[Path]:
    from twotower.analysis._common import pyplot, save_figure

    plt = pyplot()
    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"minilm": "tab:blue", "mpnet": "tab:red"}
    dims = sorted({r["dim"] for r in rows})
    several = len(lengths(rows)) > 1  # then one line / bar group per max length, labelled with it
    for prefix, color in colors.items():
        for stage, style in (("fine-tuned", "-o"), ("zero-shot", "--s")):
            for k, length in enumerate(lengths(rows)):
                picked = [pick(rows, f"{prefix}-{d}", stage, length) for d in dims]
                pts = [(r["dim"], r["ndcg@10"]) for r in picked if r is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, alpha=1.0 - 0.45 * (k > 0),
                            label=f"{prefix} {stage}" + (f", max length {length}" if several else ""))
    if ax.lines:
        ax.set_xscale("log", base=2)
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.set_xlabel("projection (bottleneck) dim")
        ax.set_ylabel("NDCG@10, SciFact test")
        ax.set_title("Bottleneck size (GTR §6.5): NDCG@10 vs projection dim")
        ax.grid(True, alpha=0.3)
        ax.legend()
        written.append(save_figure(fig, results / "gtr_bottleneck.png"))
    else:
        plt.close(fig)
    tuned = [r for r in rows if r["stage"] != "zero-shot"]
    if tuned:
        fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(tuned) + 3), 4.5))
        groups = sorted({(r["system"], r["max_length"]) for r in tuned},
                        key=lambda g: (g[0].split("-")[0], -g[1], int(g[0].split("-")[1])))
        stages = sorted({r["stage"] for r in rows}, key=lambda s: (STAGE_ORDER.get(s, 2), s))
        width = 0.8 / len(stages)
        lows: list[float] = []
        for i, stage in enumerate(stages):
            vals = [(pick(rows, s, stage, n) or {}).get("ndcg@10", np.nan) for s, n in groups]
            lows.extend(v for v in vals if v == v)
            ax.bar(np.arange(len(groups)) + (i - (len(stages) - 1) / 2) * width, vals, width, label=stage)
        ax.set_xticks(np.arange(len(groups)), [s + (f"\nlen {n}" if several else "") for s, n in groups], rotation=30)
        ax.set_ylim(max(0.0, min(lows) - 0.05), max(lows) + 0.02)
        ax.set_ylabel("NDCG@10, SciFact test")
        ax.set_title("Data efficiency (GTR §5.3): share of train queries")
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)
        written.append(save_figure(fig, results / "gtr_data_efficiency.png"))
    return written


def write_all(rows: list[dict], args, transfer: list[Path]) -> None:
    if not rows:
        return
    results = _common.RESULTS
    results.mkdir(parents=True, exist_ok=True)
    recipe = {k: sorted({json.dumps(r["key"].get(k)) for r in rows if k in r["key"]}) for k in RECIPE}
    recipe_text = ", ".join(f"{k} {' / '.join(str(json.loads(x)) for x in v)}" for k, v in recipe.items())
    transfer_note = (f"Zero-shot transfer to {', '.join(p.name for p in transfer)}: the `<set>:ndcg@10` / "
                     "`<set>:recall@100` columns." if transfer else
                     f"Transfer: no second BEIR-format set in {Path(args.data).parent} (only "
                     f"{Path(args.data).name}), so no zero-shot transfer rows.")
    notes = "\n".join([
        f"SciFact train → test ({Path(args.data).name}). Recipe: {recipe_text}; "
        "AdamW, 10% warm-up, bi-directional in-batch softmax, SDE (shared towers) with a projection to `dim` "
        "(GTR's bottleneck), cosine similarity, the same max length for queries and documents in training and "
        "evaluation. precision auto = bf16 where the CPU has AMX/AVX512-BF16.",
        "",
        "zero-shot: the backbone with the projection a fine-tune starts from (identity when dim = hidden size, an "
        "isometry when larger, a random semi-orthogonal map when smaller), no training; computed from one encoding "
        "of the test set per backbone, so its encode_s is that shared encoding. fine-tuned-N%: a seeded N% of "
        "the train queries with all their judged positives (SciFact train has no judged negatives), same epochs "
        "(fine-tuned-N%-equal-steps: epochs / N, as many steps as all the data; `--equal-steps`). train_s ≈N: the run was resumed after a kill and its time is estimated from "
        "the final step rate. encode_s: test corpus + queries (+ exact search).",
        "",
        transfer_note,
        "",
        *comparisons(rows),
        "",
        f"Load average when written: {load_average():.1f} on {os.cpu_count()} cores (other jobs share the CPU; "
        "compare times within a run).",
    ])
    write_results("gtr_scaling", table_rows(rows), notes=notes, extra={"records": rows})
    plot(rows, results)


# --------------------------------------------------------------------------- main
def run(args) -> int:
    """Compute the pending rows (at most ``--max-rows``) and rewrite the results. Returns rows computed."""
    work = Path(args.work)
    rows_file = work / "rows.jsonl"
    transfer = [Path(p) for p in args.transfer] if args.transfer is not None else beir_sets(
        Path(args.data).parent, Path(args.data))
    rows = read_rows(rows_file)
    jobs = plan(args)
    pending = [j for j in jobs if not is_done(j, rows)]
    if args.plan:
        for j in jobs:
            print(f"{'done   ' if j not in pending else 'pending'}  {j.name}  (max_length {j.max_length}, "
                  f"epochs {j.epochs:g})")
        print(f"{len(jobs) - len(pending)} done, {len(pending)} pending; rows in {rows_file}")
        return 0
    if args.report_only:
        write_all(rows, args, transfer)
        return 0
    computed = 0
    for job in pending:
        if args.max_rows is not None and computed >= args.max_rows:
            break
        if PREFIX.get(job.backbone) is None:
            raise SystemExit(f"unknown backbone '{job.backbone}': use {', '.join(PREFIX)}")
        print(f"[{computed + 1}/{len(pending)}] {job.name} (max_length {job.max_length}, epochs {job.epochs:g})",
              flush=True)
        t0 = time.perf_counter()
        row = run_zero_shot(job, args, transfer) if job.zero_shot else run_fine_tune(job, args, transfer)
        row.update(key=job.key(), wall_s=round(time.perf_counter() - t0, 1), load_avg=round(load_average(), 1),
                   finished=time.strftime("%Y-%m-%d %H:%M"))
        append_row(rows_file, row)
        rows.append(row)
        if not job.zero_shot and not args.keep_models:  # only now: a kill before the append keeps the model
            shutil.rmtree(work / "runs" / job.slug, ignore_errors=True)
        computed += 1
        print("  " + ", ".join(f"{m} {row[m]:.4f}" for m in METRICS)
              + f", train_s {row['train_s']:.0f}, encode_s {row['encode_s']:.0f}", flush=True)
        write_all(rows, args, transfer)
    return computed


def _csv(kind):
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--backbones", type=_csv(str), default=["minilm-l6", "mpnet-base"])
    ap.add_argument("--dims", type=_csv(int), default=[128, 256, 384, 768])
    ap.add_argument("--fractions", type=_csv(float), default=[1.0, 0.1],
                    help="shares of the train queries to fine-tune on")
    ap.add_argument("--equal-steps", action="store_true",
                    help="train a fraction f for epochs/f epochs (as many steps as the full set)")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=None, help="fixed steps per fine-tune instead of epochs")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--eval-batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--temperature", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--precision", default="auto", help="auto | fp32 | bf16 (training and encoding)")
    ap.add_argument("--checkpoint-every", type=int, default=10, help="fine-tune checkpoint interval (steps)")
    ap.add_argument("--transfer", nargs="*", default=None,
                    help="second BEIR sets for zero-shot transfer (default: the others beside --data)")
    ap.add_argument("--only", action="append", default=[],
                    help="fnmatch pattern on 'system/stage', system, stage or backbone; repeatable")
    ap.add_argument("--max-rows", type=int, default=None, help="stop after computing this many rows")
    ap.add_argument("--work", default=str(ROOT / ".cache" / "gtr"))
    ap.add_argument("--keep-models", action="store_true", help="keep fine-tuned models in <work>/runs")
    ap.add_argument("--plan", action="store_true", help="list done and pending rows, compute nothing")
    ap.add_argument("--report-only", action="store_true", help="rewrite the results from rows.jsonl")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    ap.add_argument("--smoke", action="store_true", help="tiny subset, 1 step, MiniLM only; results under <work>/smoke")
    return ap.parse_args(argv)


# --------------------------------------------------------------------------- smoke
def _write_subset(src, root: Path, train_q: list[str], test_q: list[str], n_docs: int) -> Path:
    """A tiny BEIR directory: the given queries, their judged documents and the first ``n_docs`` others."""
    from twotower.data.beir import BeirDataset

    train, test = BeirDataset.load(src, "train"), BeirDataset.load(src, "test")
    doc_ids = list(dict.fromkeys([d for q in train_q for d in train.qrels[q]] + [d for q in test_q for d in test.qrels[q]]
                                 + list(test.corpus)[:n_docs]))
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": test.corpus[d].title,
                                                           "text": test.corpus[d].text}) + "\n" for d in doc_ids))
    queries = {**{q: train.queries[q] for q in train_q}, **{q: test.queries[q] for q in test_q}}
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    for split, ds, qids in (("train", train, train_q), ("test", test, test_q)):
        (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
            f"{q}\t{d}\t{s}\n" for q in qids for d, s in ds.qrels[q].items()))
    return root


def smoke(args) -> None:
    """Run the whole flow on a tiny subset and check it: rows, resume-skip, the zero-shot shortcut."""
    from twotower.data.beir import BeirDataset

    work = Path(args.work) / "smoke"
    shutil.rmtree(work, ignore_errors=True)
    src = Path(args.data)
    train_q = list(BeirDataset.load(src, "train").qrels)[:24]
    test_q = list(BeirDataset.load(src, "test").qrels)
    data = _write_subset(src, work / "data" / "scifact-mini", train_q, test_q[:10], 40)
    other = _write_subset(src, work / "data" / "transfer-mini", train_q[:4], test_q[10:18], 40)
    args.data, args.transfer, args.work = str(data), [str(other)], str(work)
    args.backbones, args.dims, args.fractions = ["minilm-l6"], [128, 384], [1.0, 0.5]
    args.steps, args.batch_size, args.max_length, args.precision, args.only = 1, 8, 64, "fp32", []
    _common.RESULTS = work / "results"  # never touch benchmarks/results from a smoke run
    n = run(args)
    assert n == 6, f"expected 6 rows, computed {n}"
    assert run(args) == 0, "a re-run must skip the finished rows"
    rows = read_rows(work / "rows.jsonl")
    assert all(f"{other.name}:ndcg@10" in r for r in rows), "transfer metrics missing"
    # the zero-shot shortcut (one encoding, projected per dim) equals evaluating the saved projected model
    job = plan(args)[0]
    assert job.zero_shot and job.dim == 128
    initial_model(job).save(work / "zero-shot-128")
    direct, _ = eval_model(work / "zero-shot-128", data, job, args)
    shutil.rmtree(work / "zero-shot-128")
    shortcut = next(r for r in rows if r["key"] == job.key())
    diff = max(abs(direct[m] - shortcut[m]) for m in METRICS)
    assert diff < 1e-6, f"zero-shot shortcut differs from the saved model by {diff}"
    for name in ("gtr_scaling.json", "gtr_scaling.md", "gtr_bottleneck.png", "gtr_data_efficiency.png"):
        assert (work / "results" / name).is_file(), name
    print(f"smoke OK: {len(rows)} rows, re-run skipped them, zero-shot shortcut = saved model (max diff {diff:.1e}); "
          f"results in {work / 'results'}")


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.smoke:
        smoke(args)
        return
    from twotower.errors import TwoTowerError

    try:
        run(args)
    except TwoTowerError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
