"""CLI commands for stored indexes, search and re-rankers: ``index build|add|remove|info``,
``search`` and ``train-reranker``. Heavy imports stay inside the command functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

FILTER_HELP = ('Only documents whose metadata pass this filter: JSON such as \'{"source": "wiki", "year": {"$gte": '
               '2020}}\' ($eq $ne $gt $gte $lt $lte $in $nin $exists, $and / $or lists, dotted paths), or @FILE.json '
               'to read it from a file. Docs: "Your documents: metadata and filters".')


def read_filter(value: str | None):
    """The ``--filter`` option parsed (JSON text, or ``@path`` to a JSON file): a ``twotower.Filter`` or None;
    every error names ``--filter``."""
    import twotower as tt
    from twotower.errors import TwoTowerError

    if value is None:
        return None
    text = value
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TwoTowerError(f"--filter {value}: cannot read {path} ({exc}); give a JSON file, or the JSON "
                                "itself") from None
    try:
        return tt.parse_filter(text)
    except TwoTowerError as exc:
        raise TwoTowerError(f"--filter: {exc}") from None


def register(app: typer.Typer) -> None:
    from twotower.cli.console import (BATCH_HELP, COMPILE_HELP, DEVICE_HELP, LANGUAGE_HELP, PRF_DEPTH_HELP, PRF_WEIGHT_HELP,
                                  RUNTIME_HELP)
    import twotower as tt
    from twotower.cli.console import console
    from twotower.cli.console import fail as _fail
    from twotower.errors import TwoTowerError

    LOCK_HELP = ("Seconds to wait while another writer holds the index's lock, then give up with nothing changed "
                 "(0: at once).")
    index_app = typer.Typer(help="Build and grow a persistent index directory.", no_args_is_help=True)
    app.add_typer(index_app, name="index")

    @index_app.command("build")
    def index_build(
        data: Path = typer.Option(..., "--data", help="BEIR directory (its corpus.jsonl) or a corpus .jsonl file; "
                                  "fields other than _id/id, title and text are kept as metadata."),
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
        backend: str = typer.Option("faiss", "--backend", help="faiss (vectors, documents and BM25 in --out) | milvus "
                                    "(in a Milvus collection; --out keeps the manifest)."),
        uri: Optional[str] = typer.Option(None, "--uri", help="--backend milvus: a Milvus Lite file (path ending in "
                                          ".db) or a server http(s)://host:19530 (token: $TWOTOWER_MILVUS_TOKEN)."),
        collection: Optional[str] = typer.Option(None, "--collection", help="--backend milvus: the collection "
                                                 "(default: twotower_<name of --out>)."),
        runtime: str = typer.Option("auto", "--runtime", help=RUNTIME_HELP),
    ) -> None:
        """Encode a corpus and write an index directory (vectors, ids, FAISS, optional BM25, manifest)."""
        try:
            tt.check_output_dir(out, "--out")  # before any loading or encoding
            index = tt.Index.build(
                out, data, encoder=model, kind=kind, hnsw_m=hnsw_m, ef_construction=ef_construction, nlist=nlist,
                pq_m=pq_m, bm25=bm25, bigrams=bigrams, language=language, multivector=multivector, project=project,
                batch_size=batch_size, precision=precision, device=device, compile=compile_, show_progress=progress,
                ray=use_ray, ray_address=ray_address, workers=workers, gpus_per_worker=gpus_per_worker,
                vectors=vectors, dim=dim, rescore=rescore, rescore_factor=rescore_factor, runtime=runtime,
                **({"backend": backend, "uri": uri, "collection": collection} if backend != "faiss" or uri or collection
                   else {}))
        except (TwoTowerError, ValueError) as exc:
            _fail(exc)
        m = index.info()
        v = m.get("vectors") or {}  # index build --vectors / --dim (retrieval.index.codecs)
        stored = "" if v.get("type", "fp32") == "fp32" else f" {v['type']}"
        if v.get("type") == "binary":
            stored += (", no rescoring" if v.get("rescore") == "none"
                       else f", rescored against {v.get('rescore')} × {v.get('rescore_factor')}")
        cut = f" (cut from {v['source_dim']})" if v.get("source_dim", m["dim"]) != m["dim"] else ""
        console.print(f"{out}: version {m['live_version']}, {m['num_docs']} documents, {m['num_vectors']} vectors of "
                      f"{m['dim']} dims{cut}{stored}, {m['factory']}{', BM25' if m['bm25'] else ''}")

    @index_app.command("add")
    def index_add(
        index: Path = typer.Option(..., "--index", help="Index directory."),
        docs: Path = typer.Option(..., "--docs", help="New documents, BEIR corpus lines (_id, title, text; any "
                                  "other field is kept as metadata)."),
        replace: bool = typer.Option(False, "--replace", help="Overwrite documents whose ids are already indexed."),
        model: Optional[str] = typer.Option(None, help="Encoder (default: the one recorded in the manifest)."),
        batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help=BATCH_HELP),
        precision: str = typer.Option("auto", help="auto | fp32 | bf16"),
        device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
        compile_: bool = typer.Option(False, "--compile", help=COMPILE_HELP),
        progress: bool = typer.Option(True, help="Show progress bars."),
        runtime: str = typer.Option("auto", "--runtime", help=RUNTIME_HELP),
        lock_timeout: float = typer.Option(60.0, "--lock-timeout", help=LOCK_HELP),
    ) -> None:
        """Encode only the new documents and add them as a new index version."""
        try:
            opened = tt.Index.open(index, model=model, device=device, precision=precision)
            opened.add(docs, replace=replace, batch_size=batch_size, compile=compile_, show_progress=progress,
                       runtime=runtime, lock_timeout=lock_timeout)
        except (TwoTowerError, ValueError) as exc:
            _fail(exc)
        console.print(f"{index}: version {opened.info()['live_version']}, {len(opened)} documents")

    @index_app.command("remove")
    def index_remove(
        index: Path = typer.Option(..., "--index", help="Index directory."),
        ids: list[str] = typer.Argument(..., help="Document ids to remove."),
        lock_timeout: float = typer.Option(60.0, "--lock-timeout", help=LOCK_HELP),
    ) -> None:
        """Remove documents (a new index version without them)."""
        try:
            opened = tt.Index.open(index).remove(ids, lock_timeout=lock_timeout)
        except (TwoTowerError, ValueError) as exc:
            _fail(exc)
        console.print(f"{index}: version {opened.info()['live_version']}, {len(opened)} documents")

    @index_app.command("attach")
    def index_attach(
        out: Path = typer.Option(..., "--out", help="Index directory to create (a new or empty folder)."),
        uri: str = typer.Option(..., "--uri", help="The Milvus server (http://host:19530) or Milvus Lite .db."),
        collection: str = typer.Option(..., "--collection", help="The collection a --backend milvus build made."),
    ) -> None:
        """An index folder for a Milvus index, from the URI and collection alone (e.g. for a serve replica)."""
        try:
            attached = tt.Index.attach(out, uri=uri, collection=collection)
        except (TwoTowerError, ValueError) as exc:
            _fail(exc)
        console.print(f"{out}: version {attached.info()['live_version']}, {len(attached)} documents (Milvus collection "
                      f"{collection})")

    @index_app.command("info")
    def index_info(
        index: Path = typer.Option(..., "--index", help="Index directory."),
        verify: bool = typer.Option(False, help="Check every file's sha256."),
    ) -> None:
        """Print the live version's manifest."""
        try:
            manifest = tt.Index.open(index, verify=verify).store.manifest
        except TwoTowerError as exc:
            _fail(exc)
        print(json.dumps(manifest, indent=2))

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
        filter_: Optional[str] = typer.Option(None, "--filter", help=FILTER_HELP),
        as_json: bool = typer.Option(False, "--json", help="Print JSON lines (rank, id, score, title, metadata) "
                                     "instead of a table."),
        device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    ) -> None:
        """Print the top-k documents for QUERY: rank, id, score, title (--json: with their metadata)."""
        from rich.table import Table

        try:
            if not query.strip():
                raise TwoTowerError("QUERY is empty: give the text to search for, e.g. twotower search --index DIR "
                                    "'how is green tea made'")
            if rerank_depth is not None and rerank is None:
                raise TwoTowerError("--rerank-depth sets how many hits --rerank re-ranks: pass --rerank DIR or drop it")
            flt = read_filter(filter_)  # before the index and the model are loaded
            if lam is not None and mode not in (None, "hybrid"):  # mode None: the fitted model's, checked below
                raise TwoTowerError(f"--lambda weighs dense against BM25 in --mode hybrid; --mode {mode} does not use "
                                    "it: drop --lambda or pass --mode hybrid")
            opened = tt.Index.open(index, device=device)
            resolved, _ = opened.resolve(mode, lam)  # a fitted model's own mode unless given
            if lam is not None and resolved != "hybrid":
                raise TwoTowerError(f"--lambda weighs dense against BM25 in --mode hybrid; --mode {resolved} does not "
                                    "use it: drop --lambda or pass --mode hybrid")
            if fusion_norm is not None and resolved != "hybrid":
                raise TwoTowerError(f"--fusion-norm normalises the two sides of --mode hybrid; --mode {resolved} does "
                                    "not use it: drop it or pass --mode hybrid")
            if prf_weight is not None and prf_depth is None:
                raise TwoTowerError("--prf-weight needs --prf-depth (how many top documents feed back)")
            if prf_depth is not None and resolved == "bm25":
                raise TwoTowerError("--prf-depth feeds the top documents' vectors back into a dense query; --mode bm25 "
                                    "has none: drop it or pass --mode dense | hybrid | rrf")
            hits = opened.search(query, k, mode=mode, lam=lam, ef_search=ef_search, nprobe=nprobe, norm=fusion_norm,
                                 prf_depth=prf_depth, prf_weight=prf_weight,
                                 rerank=str(rerank) if rerank is not None else None, rerank_depth=rerank_depth,
                                 filter=flt)
            mode = resolved
        except (TwoTowerError, ValueError) as exc:
            _fail(exc)
        if not hits and not as_json:
            why = " (BM25 returns only documents sharing a term with the query)" if mode == "bm25" else ""
            why += " under --filter" if flt is not None and not flt.empty else ""
            console.print(f"{mode}: no document matches {query!r}{why}", highlight=False, soft_wrap=True)
            return
        if as_json:
            for rank, h in enumerate(hits, start=1):
                print(json.dumps({"rank": rank, "id": h.id, "score": round(h.score, 6), "title": h.title,
                                  "metadata": h.metadata}))
            return
        table = Table(title=f"{mode}: {query}")
        for name in ("rank", "id", "score", "title"):
            table.add_column(name, justify="right" if name in ("rank", "score") else "left")
        for rank, h in enumerate(hits, start=1):
            table.add_row(str(rank), h.id, f"{h.score:.4f}", h.title)
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
        try:
            cfg = tt.RerankerTrainConfig(negatives=negatives, mine_depth=mine_depth, epochs=epochs,
                                      batch_queries=batch_queries, lr=lr, max_length=max_length, precision=precision,
                                      seed=seed, max_queries=max_queries, show_progress=progress, device=device)
            tt.check_output_dir(out, "--out", replaced=True)  # before any loading or training
            stats = tt.train_reranker(data, out, base=base, split=split, config=cfg)
        except (TwoTowerError, ValueError) as exc:
            _fail(exc)
        console.print(f"{out}: " + ", ".join(f"{k} {v}" for k, v in stats.items()))

