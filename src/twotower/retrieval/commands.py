"""CLI commands for stored indexes, search and re-rankers: ``index build|add|remove|info``,
``search`` and ``train-reranker``. Heavy imports stay inside the command functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    from twotower.console import BATCH_HELP, COMPILE_HELP, DEVICE_HELP, LANGUAGE_HELP, PRF_DEPTH_HELP, PRF_WEIGHT_HELP
    from twotower.console import console
    from twotower.console import fail as _fail
    from twotower.errors import TwoTowerError
    from twotower.io import check_output_dir

    index_app = typer.Typer(help="Build and grow a persistent index directory.", no_args_is_help=True)
    app.add_typer(index_app, name="index")

    @index_app.command("build")
    def index_build(
        data: Path = typer.Option(..., "--data", help="BEIR directory (its corpus.jsonl) or a corpus .jsonl file."),
        out: Path = typer.Option(..., "--out", help="Index directory (created; an existing index gets a new version)."),
        model: Optional[str] = typer.Option(None, help="Encoder directory (default: all-MiniLM-L6-v2)."),
        kind: str = typer.Option("flat", help="flat | hnsw | ivf | ivfpq | any FAISS factory string"),
        hnsw_m: int = typer.Option(32, "--hnsw-m", min=2, help="HNSW graph degree M."),
        ef_construction: int = typer.Option(200, "--ef-construction", min=1),
        nlist: Optional[int] = typer.Option(None, "--nlist", min=1, help="IVF lists (default ≈ 4·√n)."),
        pq_m: Optional[int] = typer.Option(None, "--pq-m", min=1, help="IVF-PQ sub-quantizers (default dim/8)."),
        bm25: bool = typer.Option(False, "--bm25", help="Also store a BM25 index (for --mode bm25|hybrid; "
                                  "on by itself for a model fitted to hybrid or RRF retrieval by 'twotower fit')."),
        bigrams: bool = typer.Option(False, "--bigrams", help="BM25 over unigrams + bigrams."),
        language: Optional[str] = typer.Option(None, "--language", help=LANGUAGE_HELP + " Implies --bm25."),
        multivector: Optional[int] = typer.Option(None, "--multivector", min=1,
                                                  help="ME-BERT: keep the first M token vectors per document (default: the M the model was trained with, if any)."),
        project: Optional[int] = typer.Option(None, "--project", min=1,
                                              help="Multi-vector: random projection of token vectors to this many dims."),
        vectors: str = typer.Option("fp32", "--vectors", help="How vectors are stored: fp32 | fp16 | int8 (per-dimension "
                                    "ranges from the corpus) | binary (sign bits searched by Hamming distance, "
                                    "then rescored)."),
        dim: Optional[int] = typer.Option(None, "--dim", help="Keep the first D dimensions of every vector, "
                                          "re-normalised (Matryoshka-trained models); queries are cut the same way."),
        rescore: Optional[str] = typer.Option(None, "--rescore", help="--vectors binary: rescore the Hamming "
                                              "candidates against int8 (default) or fp32 vectors memory-mapped from "
                                              "disk, or none."),
        rescore_factor: int = typer.Option(4, "--rescore-factor", help="--vectors binary: rescore k × this many "
                                           "Hamming candidates."),
        batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help=BATCH_HELP),
        precision: str = typer.Option("auto", help="auto | fp32 | bf16"),
        device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
        compile_: bool = typer.Option(False, "--compile", help=COMPILE_HELP),
        progress: bool = typer.Option(True, help="Show progress bars."),
        use_ray: bool = typer.Option(False, "--ray", help="Encode on Ray: an actor pool holding the model."),
        ray_address: Optional[str] = typer.Option(None, "--ray-address", help="auto | local | ray://host:port"),
        workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Ray actors (default: one per CPU/GPU)."),
        gpus_per_worker: float = typer.Option(0.0, "--gpus-per-worker", min=0.0, help="Ray: GPUs per actor."),
    ) -> None:
        """Encode a corpus and write an index directory (vectors, ids, FAISS, optional BM25, manifest)."""
        from twotower.retrieval.bm25 import BM25Params
        from twotower.retrieval.searcher import EncodeConfig, build_index, spec_for_model
        from twotower.retrieval.store import IndexSpec

        cfg = EncodeConfig(batch_size=batch_size, precision=precision, show_progress=progress, compile=compile_,
                           device=device)
        try:
            check_output_dir(out, "--out")  # before any loading or encoding
            spec = IndexSpec(kind=kind, hnsw_m=hnsw_m, ef_construction=ef_construction, nlist=nlist, pq_m=pq_m,
                             bm25=bm25 or bigrams or language is not None,
                             bm25_params=BM25Params(ngram=2 if bigrams else 1, language=language or "en"),
                             vectors=vectors, dim=dim, rescore=rescore, rescore_factor=rescore_factor)
            spec = spec_for_model(spec, model, language_given=language is not None)  # a fitted hybrid needs BM25
            if use_ray:
                from twotower.scale.ray_encode import RayConfig, build_index_ray

                if multivector or project:
                    raise TwoTowerError("--ray encodes single-vector indexes; drop --multivector/--project")
                store = build_index_ray(data, out, model=model, spec=spec, cfg=cfg, ray_cfg=RayConfig(
                    address=ray_address, workers=workers, gpus_per_worker=gpus_per_worker))
            else:
                store = build_index(data, out, model=model, spec=spec, multivector=multivector, project_dim=project,
                                    cfg=cfg)
        except (TwoTowerError, ValueError) as exc:
            _fail(exc)
        m = store.manifest
        v = m.get("vectors") or {}
        stored = "" if v.get("type", "fp32") == "fp32" else f" {v['type']}"
        if v.get("type") == "binary":
            stored += (", no rescoring" if v.get("rescore") == "none"
                       else f", rescored against {v.get('rescore')} × {v.get('rescore_factor')}")
        cut = f" (cut from {v['source_dim']})" if v.get("source_dim", m["dim"]) != m["dim"] else ""
        console.print(f"{out}: version {store.version}, {m['num_docs']} documents, {m['num_vectors']} vectors of "
                      f"{m['dim']} dims{cut}{stored}, {m['factory']}{', BM25' if m['bm25'] else ''}")

    @index_app.command("add")
    def index_add(
        index: Path = typer.Option(..., "--index", help="Index directory."),
        docs: Path = typer.Option(..., "--docs", help="New documents, BEIR corpus lines (_id, title, text)."),
        replace: bool = typer.Option(False, "--replace", help="Overwrite documents whose ids are already indexed."),
        model: Optional[str] = typer.Option(None, help="Encoder (default: the one recorded in the manifest)."),
        batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help=BATCH_HELP),
        precision: str = typer.Option("auto", help="auto | fp32 | bf16"),
        device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
        compile_: bool = typer.Option(False, "--compile", help=COMPILE_HELP),
        progress: bool = typer.Option(True, help="Show progress bars."),
    ) -> None:
        """Encode only the new documents and add them as a new index version."""
        from twotower.retrieval.searcher import EncodeConfig, add_documents

        try:
            store = add_documents(index, docs, replace=replace, model=model,
                                  cfg=EncodeConfig(batch_size=batch_size, precision=precision, show_progress=progress,
                                                   compile=compile_, device=device))
        except (TwoTowerError, ValueError) as exc:
            _fail(exc)
        console.print(f"{index}: version {store.version}, {len(store)} documents")

    @index_app.command("remove")
    def index_remove(
        index: Path = typer.Option(..., "--index", help="Index directory."),
        ids: list[str] = typer.Argument(..., help="Document ids to remove."),
    ) -> None:
        """Remove documents (a new index version without them)."""
        from twotower.retrieval.store import IndexStore

        try:
            store = IndexStore.open(index).remove(ids, show_progress=False)
        except (TwoTowerError, ValueError) as exc:
            _fail(exc)
        console.print(f"{index}: version {store.version}, {len(store)} documents")

    @index_app.command("info")
    def index_info(
        index: Path = typer.Option(..., "--index", help="Index directory."),
        verify: bool = typer.Option(False, help="Check every file's sha256."),
    ) -> None:
        """Print the live version's manifest."""
        from twotower.retrieval.store import IndexStore

        try:
            store = IndexStore.open(index, verify=verify)
        except TwoTowerError as exc:
            _fail(exc)
        print(json.dumps(store.manifest, indent=2))

    @app.command("search")
    def search_cmd(
        query: str = typer.Argument(..., help="Query text."),
        index: Path = typer.Option(..., "--index", help="Index directory."),
        k: int = typer.Option(10, "-k", "--top-k", min=1),
        mode: Optional[str] = typer.Option(
            None, help="dense | bm25 | hybrid | rrf (default: the mode 'twotower fit' chose for the model, else dense)"),
        lam: Optional[float] = typer.Option(None, "--lambda", help="Hybrid weight of dense (default: tuned value)."),
        fusion_norm: Optional[str] = typer.Option(
            None, "--fusion-norm", help="How --mode hybrid normalises each side per query: minmax | zscore (default: "
            "the fitted model's, else minmax)."),
        prf_depth: Optional[int] = typer.Option(None, "--prf-depth", help=PRF_DEPTH_HELP),
        prf_weight: Optional[float] = typer.Option(None, "--prf-weight", help=PRF_WEIGHT_HELP),
        ef_search: Optional[int] = typer.Option(None, "--ef-search", min=1, help="HNSW efSearch."),
        nprobe: Optional[int] = typer.Option(None, "--nprobe", min=1, help="IVF lists probed."),
        rerank: Optional[Path] = typer.Option(
            None, "--rerank", help="Cross-encoder directory: re-rank the hits (default: the fitted model's re-ranker "
            "when --mode is not given; 'none': no re-ranking)."),
        rerank_depth: Optional[int] = typer.Option(None, "--rerank-depth", min=1,
                                                   help="Hits re-ranked (default 100); needs --rerank."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON lines instead of a table."),
        device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    ) -> None:
        """Print the top-k documents for QUERY: rank, id, score, title."""
        from rich.table import Table

        from twotower.retrieval.searcher import Searcher

        try:
            if not query.strip():
                raise TwoTowerError("QUERY is empty: give the text to search for, e.g. twotower search --index DIR "
                                    "'how is green tea made'")
            if rerank_depth is not None and rerank is None:
                raise TwoTowerError("--rerank-depth sets how many hits --rerank re-ranks: pass --rerank DIR or drop it")
            rerank_depth = 100 if rerank_depth is None else rerank_depth
            if lam is not None and mode not in (None, "hybrid"):  # mode None: the fitted model's, checked below
                raise TwoTowerError(f"--lambda weighs dense against BM25 in --mode hybrid; --mode {mode} does not use "
                                    "it: drop --lambda or pass --mode hybrid")
            searcher = Searcher(index, device=device)
            fitted = searcher.defaults
            weight = None
            if rerank is None and mode is None and fitted is not None and fitted.rerank:
                rerank = Path(fitted.rerank_path(searcher.store.manifest["model"]["path"]))
                rerank_depth, weight = fitted.rerank_depth, fitted.rerank_weight
            if rerank is not None and str(rerank) == "none":
                rerank = None
            asked_lam = lam
            mode, lam = searcher.resolve(mode, lam)  # a fitted model's own mode and λ unless given
            if asked_lam is not None and mode != "hybrid":
                raise TwoTowerError(f"--lambda weighs dense against BM25 in --mode hybrid; --mode {mode} does not use "
                                    "it: drop --lambda or pass --mode hybrid")
            depth = max(k, rerank_depth) if rerank else k
            if fusion_norm is not None and mode != "hybrid":
                raise TwoTowerError(f"--fusion-norm normalises the two sides of --mode hybrid; --mode {mode} does not "
                                    "use it: drop it or pass --mode hybrid")
            from twotower.retrieval.prf import check_prf

            check_prf(prf_depth, prf_weight, mode=mode, mode_option="--mode")
            hits = searcher.search(query, depth, mode=mode, lam=lam, ef_search=ef_search, nprobe=nprobe,
                                   norm=fusion_norm, prf_depth=prf_depth, prf_weight=prf_weight)
            if rerank:
                from twotower.retrieval.rerank import Reranker, blend

                store = searcher.store
                ce = Reranker(rerank, device=device)
                top = hits[:rerank_depth]
                scores = ce.score([(query, _doc_text(store, h.doc_id)) for h in top])
                scored = {h.doc_id: float(s) for h, s in zip(top, scores)}
                if weight is not None:  # the fitted blend with the first stage (retrieval.rerank.blend)
                    scored = blend({h.doc_id: h.score for h in top}, scored, weight)
                for h in top:
                    h.score = scored[h.doc_id]
                hits = sorted(hits[:rerank_depth], key=lambda h: -h.score)
            hits = hits[:k]
        except (TwoTowerError, ValueError) as exc:
            _fail(exc)
        if as_json:
            for rank, h in enumerate(hits, start=1):
                print(json.dumps({"rank": rank, "id": h.doc_id, "score": round(h.score, 6), "title": h.title}))
            return
        table = Table(title=f"{mode}: {query}")
        for name in ("rank", "id", "score", "title"):
            table.add_column(name, justify="right" if name in ("rank", "score") else "left")
        for rank, h in enumerate(hits, start=1):
            table.add_row(str(rank), h.doc_id, f"{h.score:.4f}", h.title)
        console.print(table)

    @app.command("train-reranker")
    def train_reranker_cmd(
        data: Path = typer.Option(..., "--data", help="BEIR directory with qrels/<split>.tsv."),
        out: Path = typer.Option(..., "--out", help="Where to save the cross-encoder."),
        base: Optional[str] = typer.Option(None, help="Backbone (default: all-MiniLM-L6-v2)."),
        split: str = typer.Option("train", help="qrels split to train on (never test)."),
        negatives: int = typer.Option(3, min=1, help="BM25-mined negatives per positive."),
        mine_depth: int = typer.Option(30, "--mine-depth", min=2, help="BM25 depth mined for negatives."),
        epochs: int = typer.Option(4, min=1, help="Passes over the groups (SciFact: 1 epoch at 3e-5 stays at chance "
                                                   "loss; 4 at 1e-4 learns: README, Fit)."),
        batch_queries: int = typer.Option(8, "--batch-queries", min=1, help="(query, positive) groups per step."),
        lr: float = typer.Option(1e-4),
        max_length: int = typer.Option(192, "--max-length", min=16),
        max_queries: Optional[int] = typer.Option(None, "--max-queries", min=1, help="Train on at most this many groups."),
        precision: str = typer.Option("auto", help="auto | fp32 | bf16"),
        device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
        seed: int = typer.Option(0),
        progress: bool = typer.Option(True, help="Show progress bars."),
    ) -> None:
        """Train a cross-encoder re-ranker: judged positives vs BM25-mined negatives, softmax over each group."""
        from twotower.retrieval.rerank import RerankerTrainConfig, train_reranker

        try:
            cfg = RerankerTrainConfig(negatives=negatives, mine_depth=mine_depth, epochs=epochs,
                                      batch_queries=batch_queries, lr=lr, max_length=max_length, precision=precision,
                                      seed=seed, max_queries=max_queries, show_progress=progress, device=device)
            check_output_dir(out, "--out", replaced=True)  # before any loading or training
            stats = train_reranker(data, out, base=base, split=split, cfg=cfg)
        except (TwoTowerError, ValueError) as exc:
            _fail(exc)
        console.print(f"{out}: " + ", ".join(f"{k} {v}" for k, v in stats.items()))


def _doc_text(store, doc_id: str) -> str:
    d = store.document(store.row_of[doc_id])
    return f"{d['title']} {d['text']}".strip() if d["title"] else d["text"]
