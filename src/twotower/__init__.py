"""twotower: train, index, evaluate and serve dual-encoder (two-tower) dense retrievers.

The public Python API lives here, at the package top; everything else is internal and may change. Names load on
first use, so ``import twotower`` is fast and does not import torch.

Data
    :func:`load_beir`, :func:`fetch_beir` (download a BEIR data set), :class:`Dataset`, :class:`Document`,
    :func:`document_id` / :func:`document_ids` (the ids plain-string documents get)
Models
    :class:`Encoder` (``encode_queries`` / ``encode_documents`` / ``save``), :func:`list_models`,
    :func:`fetch_model`, :func:`align_languages`, :func:`align_translations`
Search
    :class:`Index` (``build`` / ``open`` / ``search`` / ``add`` / ``remove`` / ``info`` / ``documents``),
    the option groups of ``Index.build``: :class:`ANN`, :class:`Compression`, :class:`Passages`, :class:`Ray`,
    :class:`Milvus`,
    :class:`Hit` (with the document's ``metadata``), :func:`parse_filter` / :class:`Filter` (metadata filters),
    :class:`Reranker`, :func:`create_app` and :func:`serve_index` (the HTTP service)
Evaluation
    :func:`evaluate`, :class:`EvalResult`, :func:`read_result`, :func:`score_run`, :func:`read_run`, :func:`write_run`
Training
    :func:`fit`, :class:`FitResult`, :class:`FitRecipe`, :func:`train`, :class:`TrainConfig`, :class:`StageConfig`,
    :func:`pretrain`, :class:`PretrainConfig`, :class:`ViewConfig`, :func:`mine`, :func:`train_reranker`,
    :class:`RerankerTrainConfig`
Analyses (the papers' studies)
    :func:`analyze_fidelity` / :class:`FidelityConfig`, :func:`analyze_towers` / :class:`TowersConfig`,
    :func:`analyze_doclength` / :class:`DocLengthConfig`, :func:`analyze_latency` / :class:`LatencyConfig`,
    :func:`build_report`
Errors
    :class:`TwoTowerError` and its subclasses :class:`DataError`, :class:`ModelError`, :class:`DatasetNotFound`

Example::

    import twotower as tt

    ds = tt.load_beir("my-beir-dir", split="test")
    index = tt.Index.build("my-index", ds, bm25=True)
    for hit in index.search("vitamin D and bone density", k=3, mode="hybrid"):
        print(hit.id, round(hit.score, 3), hit.title)
    print(tt.evaluate(index, ds).metrics["ndcg@10"])
"""

from __future__ import annotations

import importlib
import os

# Nothing is fetched from a hub unless the user asks for it (HF_HUB_OFFLINE=0 in the environment).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

__version__ = "0.1.0"

# public name -> the module that defines it (loaded on first use: PEP 562)
_EXPORTS: dict[str, str] = {
    # errors
    "TwoTowerError": "twotower.errors",
    "DataError": "twotower.errors",
    "ModelError": "twotower.errors",
    "DatasetNotFound": "twotower.errors",
    # data
    "Dataset": "twotower.api.dataset",
    "Document": "twotower.api.dataset",
    "load_beir": "twotower.api.dataset",
    "document_id": "twotower.data.metadata",
    "document_ids": "twotower.data.metadata",
    "fetch_beir": "twotower.api.tools",
    # models
    "Encoder": "twotower.api.encoder",
    "list_models": "twotower.api.tools",
    "fetch_model": "twotower.api.tools",
    "align_languages": "twotower.api.tools",
    "align_translations": "twotower.api.tools",
    # search
    "Index": "twotower.api.index",
    "ANN": "twotower.api.build_specs",
    "Compression": "twotower.api.build_specs",
    "Passages": "twotower.api.build_specs",
    "Ray": "twotower.api.build_specs",
    "Milvus": "twotower.api.build_specs",
    "Hit": "twotower.api.hit",
    "Filter": "twotower.retrieval.filters",
    "parse_filter": "twotower.retrieval.filters",
    "Reranker": "twotower.retrieval.rerank",
    "create_app": "twotower.api.tools",
    "serve_index": "twotower.api.tools",
    # evaluation
    "evaluate": "twotower.api.evaluate",
    "EvalResult": "twotower.evaluation.result",
    "score_run": "twotower.api.evaluate",
    "read_run": "twotower.api.evaluate",
    "read_result": "twotower.api.evaluate",
    "write_run": "twotower.api.evaluate",
    # training
    "fit": "twotower.api.training",
    "FitResult": "twotower.api.training",
    "FitRecipe": "twotower.api.training",
    "train": "twotower.api.training",
    "TrainConfig": "twotower.training.config",
    "StageConfig": "twotower.training.config",
    "pretrain": "twotower.api.training",
    "PretrainConfig": "twotower.training.pretrain",
    "ViewConfig": "twotower.data.augment",
    "mine": "twotower.api.training",
    "train_reranker": "twotower.api.training",
    "RerankerTrainConfig": "twotower.retrieval.rerank",
    # analyses
    "analyze_fidelity": "twotower.api.analysis",
    "FidelityConfig": "twotower.analysis.fidelity",
    "analyze_towers": "twotower.api.analysis",
    "TowersConfig": "twotower.analysis.embedding_space",
    "analyze_doclength": "twotower.api.analysis",
    "DocLengthConfig": "twotower.analysis.doclength",
    "analyze_latency": "twotower.api.analysis",
    "LatencyConfig": "twotower.analysis.latency",
    "build_report": "twotower.api.analysis",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'twotower' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
