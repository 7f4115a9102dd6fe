"""`twotower fit` against the best zero-shot retriever on labeled collections, and its learning curve.

For each collection: a train/test split of its judged queries (SciFact: its own; XQuAD-R monolingual sets, which
only have test judgements: a seeded draw of ``--train-queries`` of them for training, the rest for test; its
cross-lingual sets ``to-en`` and ``pool``: drawn by question, see :func:`draw_questions`), then

1. ``twotower fit --data D --out O`` as a command (its wall time measured here), and test NDCG@10 of the model it
   wrote, through ``run_eval`` with the retrieval stored in it (as ``twotower eval --model O/model`` runs it);
2. with ``--reranker``: ``twotower fit ... --reranker`` on the same O (it resumes the finished fit and adds the
   distillation and re-ranker stages; its own wall time), evaluated the same way (re-ranker included where fit
   kept it);
3. the zero-shot retrievers on the same test queries: BM25, the starting encoder dense, and their hybrid at λ 0.5;
   "best zero-shot" is the best of the three *on test* (an oracle choice: the strictest baseline).

``--train-queries N`` on SciFact draws N of its judged train queries (seeded): the learning curve.

    python benchmarks/fit_collections.py --collection xquad-r-en --train-queries 200 [--reranker]
    python benchmarks/fit_collections.py --collection scifact --train-queries 50 --name fit_learning_curve

Rows accumulate in results/<name>.json (one per collection and training size; a rerun replaces its own row).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, RESULTS, write_results

ROOT = Path(__file__).resolve().parents[1]


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for line in path.read_text().splitlines()[1:]:
        q, d, s = line.split("\t")
        out.setdefault(q, {})[d] = int(s)
    return out


def write_qrels(path: Path, qrels: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{s}" for q in sorted(qrels) for d, s in qrels[q].items()]
    path.write_text("\n".join(lines) + "\n")


CROSS_LINGUAL = ("to-en", "pool")  # XQuAD-R's sets where each question is asked in all 11 languages


def cross_lingual_question(query_id: str) -> str:
    """The question a cross-lingual XQuAD-R query asks (its id: ``<lang>-<question id>``)."""
    return query_id.split("-", 1)[1]


def draw_questions(judged: dict, train_queries: int | None, seed: int,
                   question=cross_lingual_question) -> tuple[dict, dict]:
    """A seeded train/test split of an XQuAD-R set by *question*: training takes ``train_queries`` questions (default
    60% of them), each in one of its languages drawn at random; test takes every language of the other questions, so
    that no test query is a translation of a training query. ``question``: a query id's question (cross-lingual ids
    ``<lang>-<question id>``; a monolingual set passes ``str``: each query is its own question)."""
    groups: dict[str, list[str]] = {}
    for q in sorted(judged):
        groups.setdefault(question(q), []).append(q)
    keys = sorted(groups)
    rng = random.Random(seed)
    rng.shuffle(keys)
    cut = train_queries or round(0.6 * len(keys))
    train = {q: judged[q] for q in (rng.choice(groups[k]) for k in keys[:cut])}
    return train, {q: judged[q] for k in keys[cut:] for q in groups[k]}


def prepare(collection: str, train_queries: int | None, seed: int, work: Path) -> tuple[Path, int, int]:
    """The BEIR folder fit learns from (corpus and queries linked; qrels/train.tsv and test.tsv written)."""
    if collection == "scifact":
        source = DATA / "scifact"
        train, test = read_qrels(source / "qrels" / "train.tsv"), read_qrels(source / "qrels" / "test.tsv")
        if train_queries:
            ids = sorted(train)
            random.Random(seed).shuffle(ids)
            train = {q: train[q] for q in ids[:train_queries]}
    elif collection.startswith("xquad-r-"):
        source = DATA / "xquad-r" / collection.removeprefix("xquad-r-")
        judged = read_qrels(source / "qrels" / "test.tsv")
        cross_lingual = collection.removeprefix("xquad-r-") in CROSS_LINGUAL
        train, test = draw_questions(judged, train_queries, seed,
                                     question=cross_lingual_question if cross_lingual else str)
    else:
        raise SystemExit(f"unknown collection {collection}")
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        link = data / name
        if not link.exists():
            link.symlink_to((source / name).resolve())
    write_qrels(data / "qrels" / "train.tsv", train)
    write_qrels(data / "qrels" / "test.tsv", test)
    return data, len(train), len(test)


def run_fit_cli(data: Path, out: Path, extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "twotower.cli", "fit", "--data", str(data), "--out", str(out), "--no-progress", *extra]
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    return time.perf_counter() - t0


def zero_shot(data: Path, out: Path) -> tuple[dict[str, float], dict]:
    """Test NDCG@10 of BM25, the starting encoder (its corpus vectors as fit kept them) and their hybrid at 0.5."""

    from twotower.data.beir import BeirDataset
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.bm25 import BM25
    from twotower.retrieval.dense import to_run
    from twotower.retrieval.hybrid import interpolate
    from twotower.training.fit.corpus import CorpusVectors

    test = BeirDataset.load(data, "test")
    qids = list(test.qrels)
    doc_ids = json.loads((out / "stages" / "zeroshot" / "doc_ids.json").read_text())
    recipe = json.loads((out / "recipe.json").read_text())["recipe"]
    model = DualEncoder.load(recipe.get("model"))
    q = model.encode_queries([test.queries[x] for x in qids], EncodeOptions(show_progress=False))
    s, i = CorpusVectors.load(out / "stages" / "zeroshot").search(q, 100)  # by best passage, as fit scored it
    dense = to_run(qids, doc_ids, s, i)
    language = json.loads((out / "stages" / "zeroshot" / "done.json").read_text())["bm25_language"]
    from twotower.retrieval.bm25 import BM25Params

    bm = BM25(BM25Params(language=language)).index(doc_ids, [test.corpus[d].full_text for d in doc_ids],
                                                    show_progress=False)
    s, i = bm.search([test.queries[x] for x in qids], 100, show_progress=False)
    sparse = to_run(qids, doc_ids, s, i)
    runs = {"bm25": sparse, "zero-shot dense": dense,
            "zero-shot hybrid 0.5": interpolate(dense, sparse, 0.5, n_best=100, top_k=100)}
    return ({k: round(evaluate(test.qrels, r, ("ndcg@10",))["ndcg@10"], 4) for k, r in runs.items()},
            {"dense": dense, "sparse": sparse, "qrels": test.qrels})


def fitted_zero_shot(out: Path, runs: dict) -> float | None:
    """Where fit chose the zero-shot encoder (no re-ranker): its test score from the zero-shot runs above, fused as
    stored in the model (what ``eval --model`` computes, without encoding the corpus again); None otherwise."""
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.defaults import read_defaults
    from twotower.training.fit.select import fused

    c = json.loads((out / "fit.json").read_text())["choices"]
    if c["model"] != "zeroshot" or c.get("rerank"):
        return None
    d = read_defaults(out / "model")
    run = fused(d.mode, runs["dense"], runs["sparse"], d.lam, 100, d.norm)
    return round(evaluate(runs["qrels"], run, ("ndcg@10",))["ndcg@10"], 4)


def fitted(data: Path, out: Path, *, rerank: bool) -> float:
    from twotower.evaluation.pipeline import EvalConfig, run_eval

    cfg = EvalConfig(data=data, split="test", model=str(out / "model"), top_k=100, show_progress=False,
                     **({} if rerank else {"rerank": "none"}))
    return round(run_eval(cfg).metrics["ndcg@10"], 4)


def choice(out: Path) -> str:
    report = json.loads((out / "fit.json").read_text())
    c = report["choices"]
    how = c["model"] + " " + c["mode"] + (f" λ{c['lambda']}" + (f" {c['norm']}" if c.get("norm") else "")
                                          if c["mode"] == "hybrid" else "")
    if c.get("rerank"):
        how += f" +CE w{c.get('rerank_weight') or 1.0}"
    cv = report["stages"].get("cv")
    if cv:
        how += f" (cv gain {cv['why'].get('mean_gain')} ± {cv['why'].get('gain_spread')})"
    return how


def write_table(name: str, seed: int, rows: list[dict], extra: dict) -> None:
    """results/<name>.{json,md}: the rows by collection and size, the notes, and what earlier runs recorded beside
    the rows (``extra``; its ``rerun_note*`` texts also in the markdown)."""
    rows.sort(key=lambda r: (r["collection"], r["train_queries"]))
    notes = ("all-MiniLM-L6-v2 (fit's default) on 2 shared CPU cores (other engineers' jobs ran alongside: 'load "
             "before' is the 1/5/15-minute load average when the row's run started). NDCG@10 on the test queries "
             "only, read after fit finished (fit reads qrels/train.tsv alone). 'best zero-shot': the best of BM25, "
             "zero-shot dense and their hybrid at λ 0.5, chosen on test (an oracle: the strictest baseline). 'fit "
             "wall_s': the sum of fit.json's stage times without the re-ranker; 'fit --reranker wall_s (added)': the "
             "second call's wall time (it resumes the fit and adds distillation and the re-ranker). Each row's "
             "command: `python benchmarks/fit_collections.py --collection C --train-queries N [--reranker] --name "
             f"{name}` (XQuAD-R: N of the judged queries drawn with seed {seed} for training, the rest "
             "test; SciFact: N of its train queries, its test split).")
    notes += "".join(f"\n\n{v}" for k, v in sorted(extra.items()) if k.startswith("rerun_note"))
    write_results(name, rows, notes=notes, extra=extra)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--collection", required=True, help="scifact | xquad-r-<lang> | xquad-r-to-en | xquad-r-pool")
    ap.add_argument("--train-queries", type=int, help="judged queries to train on (default: all / 60%%)")
    ap.add_argument("--seed", type=int, default=13, help="the draw of training queries")
    ap.add_argument("--reranker", action="store_true", help="also fit --reranker (resuming the fit)")
    ap.add_argument("--name", default="fit_collections")
    ap.add_argument("--fit-args", default="")
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "fit_collections")
    args = ap.parse_args()
    key = f"{args.collection}-{args.train_queries or 'all'}"
    work = args.work / key
    data, n_train, n_test = prepare(args.collection, args.train_queries, args.seed, work)
    out = work / "fit"
    extra = args.fit_args.split()
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    run_fit_cli(data, out, extra)
    report = json.loads((out / "fit.json").read_text())
    stages = report["stages"]
    fit_wall = sum(s.get("wall_s", 0) for n, s in stages.items() if n not in ("distill", "rerank", "cv"))
    if "cv" in stages:  # a cv stage resumed from saved fold runs times only its decision: the folds' own times count
        fit_wall += max(stages["cv"]["wall_s"], sum(f.get("wall_s", 0) for f in stages["cv"]["folds"]))
    row = {"collection": args.collection, "train_queries": n_train, "test_queries": n_test}
    zs, runs = zero_shot(data, out)
    row.update(zs)
    best = max(zs, key=zs.get)
    score = fitted_zero_shot(out, runs)
    row.update({"best zero-shot": zs[best], "best zero-shot is": best,
                "fit": score if score is not None else fitted(data, out, rerank=False),
                "fit chose": choice(out), "fit wall_s": round(fit_wall, 1)})
    row["fit - best zero-shot"] = round(row["fit"] - row["best zero-shot"], 4)
    if args.reranker:
        rr_s = run_fit_cli(data, out, [*extra, "--reranker"])
        score = fitted_zero_shot(out, runs)  # the re-ranker left out of a zero-shot choice: scored as 'fit' is
        row.update({"fit --reranker": score if score is not None else fitted(data, out, rerank=True),
                    "fit --reranker chose": choice(out),
                    "fit --reranker wall_s (added)": round(rr_s, 1)})
        report = json.loads((out / "fit.json").read_text())
        d = report["stages"].get("distill")
        if d:
            row["distill kept"] = d.get("kept")
    row["load before"] = load_before
    path = RESULTS / f"{args.name}.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    rows = old.get("rows", [])
    # what earlier runs recorded beside the rows (rerun notes, rows of a former rule) stays, notes in the .md too
    extra = {k: v for k, v in old.items() if k not in ("command", "machine", "rows")}
    rows = [r for r in rows if (r["collection"], r["train_queries"]) != (row["collection"], row["train_queries"])]
    rows.append(row)
    write_table(args.name, args.seed, rows, extra)
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
