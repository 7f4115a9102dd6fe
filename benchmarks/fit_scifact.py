"""`twotower fit` on SciFact: test NDCG@10 and R@100 after each stage, with wall times (CPU; all-MiniLM-L6-v2
unless ``--fit-args "--model NAME"``).

1. runs ``twotower fit --data scifact --out WORK/fit --reranker`` as a command (its stages time themselves in
   fit.json; every choice is made on a dev part of the *train* queries: fit never reads qrels/test.tsv);
2. only then reads the test split: each stage's encoder (its corpus vectors, kept by fit, and the test queries
   encoded here) dense, BM25 and the zero-shot hybrid at λ 0.5; the fitted model with the retrieval stored in it
   (mode, λ: read back from its twotower.json), the fusion done as ``eval`` does it at ``--top-k 100``; with
   ``--eval-path`` also through ``run_eval(model=WORK/fit/model)`` itself (one more encoding of the corpus), which
   must give the same numbers; with the re-ranker fit trained over that top 100 where fit ran one.

    python benchmarks/fit_scifact.py [--work .cache/fit_scifact] [--no-reranker] [--eval-path]

Rerunning resumes the fit in WORK (finished stages are kept), so the stage wall times are those fit.json recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, write_results  # noqa: E402

from twotower.encoders.inference import cpu_has_fast_bf16  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def hardware_note() -> str:
    """Where fit ran (its --device auto): the GPU where torch sees one, else the CPU and its threads (issue #47: the
    notes said "CPU, 2 threads" on an H200)."""
    import torch

    if torch.cuda.is_available():
        return (f"GPU ({torch.cuda.get_device_name(0)}, {os.cpu_count()} CPU cores), precision auto (bf16 where the "
                "GPU has it)")
    precision = ("training in bf16 (the CPU has AMX/AVX512-BF16); the corpus encoded by the runtime 'auto' chose, as "
                 "the fit's log says" if cpu_has_fast_bf16() else "fp32: no fast bf16 on this CPU")
    return f"CPU, {torch.get_num_threads()} threads, precision auto ({precision})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DATA / "scifact")
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "fit_scifact")
    ap.add_argument("--no-reranker", action="store_true")
    ap.add_argument("--name", default="fit_scifact", help="results/<name>.{json,md}")
    ap.add_argument("--fit-args", default="", help="extra options for twotower fit")
    ap.add_argument("--eval-path", action="store_true", help="also evaluate through run_eval (re-encodes the corpus)")
    ap.add_argument("--cpu-log", type=Path, help="a log of the fit process's CPU seconds (cpu_s=...) to summarise")
    args = ap.parse_args()
    out = args.work / "fit"
    cmd = [sys.executable, "-m", "twotower.cli", "fit", "--data", str(args.data), "--out", str(out), "--no-progress"]
    cmd += [] if args.no_reranker else ["--reranker"]
    cmd += args.fit_args.split()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    print("$", " ".join(cmd), flush=True)
    load_before = load_average()
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env)
    fit_wall = time.perf_counter() - t0
    load_after = load_average()
    report = json.loads((out / "fit.json").read_text())
    rows, notes = evaluate_stages(args.data, out, report, eval_path=args.eval_path)
    stages = report["stages"]
    pipeline_s = sum(s["wall_s"] for name, s in stages.items() if name != "rerank")
    for row in rows:
        if row["system"] == "twotower fit":
            row["wall_s"] = round(pipeline_s, 1)
    cpu = ""
    if args.cpu_log and args.cpu_log.is_file():
        lines = [x for x in args.cpu_log.read_text().splitlines() if "cpu_s=" in x]
        cpu_s = [float(x.split("cpu_s=")[1].split()[0]) for x in lines if x.split("cpu_s=")[1].split()[0]]
        loads = [float(x.split("load=")[1].split()[0]) for x in lines]
        cpu = (f" CPU time of the fit process (sampled every 20 s from /proc, {args.cpu_log.name}): {max(cpu_s):.0f} s "
               f"by the last sample; 1-minute load average while it ran {min(loads):.1f}–{max(loads):.1f} "
               f"(mean {sum(loads) / len(loads):.1f}) on {os.cpu_count()} cores.")
    starting_model = report["recipe"].get("model") or "all-MiniLM-L6-v2"
    final = final_choice(stages)
    hardware = hardware_note()
    notes_md = f"""
SciFact: fit learns from qrels/train.tsv only (809 judged queries; a seeded 20% of them, by query id, held out as dev
for every choice); the table is on the 300 test queries, read only after fit finished. {starting_model},
{hardware}. wall_s per stage row: that stage alone (as fit.json records it;
encodings of the corpus included); 'twotower fit' row: every stage but the re-ranking itself (the default command
`twotower fit --data scifact --out DIR`, or with `--reranker` its distillation too, which trains the cross-encoder;
its wall_s is the sum of the stages'), evaluated with the retrieval stored in DIR/model (the fitted {final['model']}
encoder, {final['mode']} λ {final['lambda']}, normalisation {final.get('norm')}), as
`twotower eval --model DIR/model --top-k 100` runs it. This call of the script (fit resumed or run): {fit_wall:.0f} s.
Load average (1/5/15 min) before this call: {load_before}; after: {load_after} ({os.cpu_count()} cores, shared with
other engineers' jobs).{cpu}

Choices made on dev: {json.dumps(report['choices'])}. Margin: {stages.get('margin', {}).get('margin')}
({stages.get('margin', {}).get('why')}). {notes}
"""
    write_results(args.name, rows, notes=notes_md, extra={"fit": report, "fit_wall_s": round(fit_wall, 1),
                                                               "load_before": load_before, "load_after": load_after})
    print((ROOT / "benchmarks" / "results" / f"{args.name}.md").read_text())


def final_choice(stages: dict) -> dict:
    """The retrieval fit put into DIR/model: the distilled or refined encoder's where it won on dev, else select's."""
    for stage in ("distill", "refine"):
        if (stages.get(stage) or {}).get("kept"):
            return stages[stage]["chosen"]
    return stages["select"]["chosen"]


def evaluate_stages(data: Path, out: Path, report: dict, *, eval_path: bool = False) -> tuple[list[dict], str]:

    from twotower.data.beir import BeirDataset
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.evaluation.metrics import evaluate
    from twotower.evaluation.pipeline import EvalConfig, run_eval
    from twotower.retrieval.bm25 import BM25
    from twotower.retrieval.dense import to_run
    from twotower.retrieval.hybrid import interpolate
    from twotower.retrieval.defaults import read_defaults
    from twotower.retrieval.rerank import Reranker, blend
    from twotower.training.fit.corpus import CorpusVectors
    from twotower.training.fit.select import fused

    metrics = ("ndcg@10", "recall@100")
    test = BeirDataset.load(data, "test")
    qids = list(test.queries)
    stages = report["stages"]

    def row(system, run, wall=None, **extra):
        m = evaluate(test.qrels, run, metrics)
        r = {"system": system, "ndcg@10": round(m["ndcg@10"], 4), "recall@100": round(m["recall@100"], 4)}
        if wall is not None:
            r["wall_s"] = round(wall, 1)
        return {**r, **extra}

    def dense(stage: str, model_dir: str | None):
        folder = out / "stages" / stage
        doc_ids = json.loads((folder / "doc_ids.json").read_text())
        model = DualEncoder.load(model_dir)
        q = model.encode_queries([test.queries[x] for x in qids], EncodeOptions(show_progress=False))
        s, i = CorpusVectors.load(folder).search(q, 100)  # each document by its best passage, as fit scored it
        return to_run(qids, doc_ids, s, i)

    doc_ids = list(test.corpus)
    bm = BM25().index(doc_ids, [test.corpus[d].full_text for d in doc_ids], show_progress=False)
    s, i = bm.search([test.queries[q] for q in qids], 100, show_progress=False)
    sparse = to_run(qids, doc_ids, s, i)
    zs = dense("zeroshot", report["recipe"].get("model"))  # the starting model (None: the default)
    rows = [row("bm25", sparse), row("zero-shot dense", zs, stages["zeroshot"]["wall_s"]),
            row("zero-shot hybrid λ 0.5", interpolate(zs, sparse, 0.5, n_best=100, top_k=100))]
    fitted = read_defaults(out / "model")  # what eval / search / serve will use
    chosen = final_choice(stages)
    assert (fitted.mode, fitted.lam, fitted.norm) == (chosen["mode"], chosen["lambda"],
                                                      None if chosen.get("norm") == "minmax" else chosen.get("norm"))
    runs = {"zeroshot": zs, **{s: dense(s, str(out / stages[s]["model"])) for s in ("finetune", "retrain", "refine", "distill")
                               if s in stages and "model" in stages[s]}}
    rows.append(row("fine-tuned (dense)", runs["finetune"], stages["finetune"]["wall_s"]))
    if "retrain" in runs:
        mined_wall = sum(stages[s]["wall_s"] for s in ("margin", "mine", "retrain"))
        rows.append(row("mined negatives, retrained (dense)", runs["retrain"], mined_wall))

    def tuned(choice: dict) -> tuple[dict, str]:
        norm = None if choice.get("norm") == "minmax" else choice.get("norm")
        how = choice["mode"] + (f" λ {choice['lambda']} ({norm or 'minmax'})" if choice["mode"] == "hybrid" else "")
        return fused(choice["mode"], runs[choice["model"]], sparse, choice["lambda"], 100, norm), how

    selected, how = tuned(stages["select"]["chosen"])
    rows.append(row(f"retriever tuned on dev ({stages['select']['chosen']['model']} encoder, {how})", selected,
                    stages["select"]["wall_s"]))
    if "refine" in runs:  # the third round on the chosen encoder's own top-ranked lists (kept only where dev rose)
        rows.append(row("third round on its own top 8 (refine, dense)", runs["refine"], stages["refine"]["wall_s"]))
        refined, how = tuned(stages["refine"]["chosen"])
        rows.append(row(f"retriever tuned on dev after the third round ({stages['refine']['chosen']['model']} "
                        f"encoder, {how}; kept: {stages['refine']['kept']})", refined))
    if "distill" in runs:  # fit --reranker: the cross-encoder taught the chosen encoder (kept only where dev rose)
        rows.append(row("cross-encoder distilled into the encoder (dense)", runs["distill"], stages["distill"]["wall_s"]))
        distilled, how = tuned(stages["distill"]["chosen"])
        rows.append(row(f"retriever tuned on dev after distillation ({stages['distill']['chosen']['model']} encoder, "
                        f"{how}; kept: {stages['distill']['kept']})", distilled))
    final = fused(fitted.mode, runs[chosen["model"]], sparse, fitted.lam, 100, fitted.norm)
    rows.append(row("twotower fit", final))
    notes = ""
    if eval_path:
        t0 = time.perf_counter()
        via = run_eval(EvalConfig(data=data, split="test", model=str(out / "model"), top_k=100, rerank="none",
                                  show_progress=False))
        rows.append({**row("twotower fit, via eval --model (re-encoded)", via.run), "eval_s": round(time.perf_counter() - t0, 1)})
    fitted_run = final
    rr = stages.get("rerank")
    if rr is not None:
        ce = Reranker(out / "stages" / "rerank" / "reranker")
        t0 = time.perf_counter()
        weight = rr.get("weight")
        alone = ce.rerank(fitted_run, test.queries, lambda d: test.corpus[d].full_text, top_n=rr["depth"],
                          show_progress=False)  # the cross-encoder's scores, once
        per_q = 1000 * (time.perf_counter() - t0) / len(qids)
        reranked = alone
        if weight not in (None, 1.0):  # as Reranker.rerank(weight=…) blends them (tests/test_rerank.py)
            top = {q: dict(sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))[: rr["depth"]]) for q, d in fitted_run.items()}
            reranked = {q: blend(top[q], {d: alone[q][d] for d in top[q]}, weight) for q in top}
        # with distillation the cross-encoder was trained in the distill stage (the rerank stage found it there)
        train_s = rr["train_s"] or (stages.get("distill") or {}).get("reranker_train_s", 0.0)
        rows.append(row(f"+ cross-encoder re-ranker, top {rr['depth']}, weight {weight}", reranked, train_s,
                        rerank_ms_per_query=round(per_q, 1), kept_by_fit=rr["kept"]))
        if weight not in (None, 1.0):
            rows.append(row(f"+ cross-encoder alone, top {rr['depth']} (reference)", alone))
        notes = (f"Re-ranker: twotower's own cross-encoder (MiniLM backbone, trained by fit on the training part, BM25 "
                 f"negatives; {rr['settings']}) re-scoring the fitted retriever's top {rr['depth']}, its z-scored scores "
                 f"blended with the retriever's by weight {weight} (chosen on dev; 1 = alone): dev NDCG@10 "
                 f"{rr['dev_before']['ndcg@10']} → {rr['dev_after']['ndcg@10']} ({'kept' if rr['kept'] else 'not kept'} by "
                 f"fit; by weight: {json.dumps({w: v['ndcg@10'] for w, v in rr.get('dev_by_weight', {}).items()})}); on test it costs "
                 f"{per_q:.0f} ms per query on these 2 cores (training {train_s:.0f} s"
                 f"{', in the distill stage, whose wall_s includes it' if not rr['train_s'] else ''}).")
    return rows, notes


if __name__ == "__main__":
    main()
