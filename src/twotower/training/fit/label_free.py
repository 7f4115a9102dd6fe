"""``twotower fit`` on data without training labels: the retriever chosen from what can be known without them (the
documents' and queries' languages, the encoder's) and, where a multilingual encoder retrieves across languages
(dense alone) and the documents hold several, its language directions removed (``encoders.language_bias``: LIR,
from the documents alone)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from twotower.errors import TwoTowerError
from twotower.retrieval.defaults import RetrievalDefaults

# The hybrid's λ without labels for a multilingual encoder on one-language data: chosen on XQuAD-R's dev half over
# its 11 monolingual sets with multilingual-e5-small (benchmarks/results/multilingual_fusion.md: 0.6, held-out half
# 0.8530 vs 0.8503 at 0.5); at 0.5 German fell below dense alone (0.8462 vs 0.8477), at 0.6 none of the 11 does.
MULTILINGUAL_LAMBDA = 0.6


def label_free_retriever(doc_language: str, query_language: str, encoder_languages: Sequence[str] | None,
                         lam: float) -> tuple[str, float | None, str]:
    """(mode, λ, why) for data with no training labels, from what is known without them: the languages of the
    documents and of the queries (``data.language.detect_language``; ``multi``: mixed or undetermined) and the ones
    the encoder was trained on (``registry.model_languages``; None: unknown, ``multi``: many, in one space).
    An unknown encoder, or languages that could not be told, give the hybrid at the default ``lam`` (no basis for
    anything else).

    - an encoder trained on other languages than the data's (both determined): BM25 alone — an English-only
      encoder pulls a hybrid below BM25 on other languages (XQuAD-R zh: 0.757 vs 0.817 NDCG@10);
    - queries in another language than the documents, or mixed, with a multilingual encoder: dense alone —
      BM25 cannot match words across languages and drags a fusion down (XQuAD-R pool mAP: hybrid 0.187, dense 0.299);
    - one language and a multilingual encoder: the hybrid at :data:`MULTILINGUAL_LAMBDA` (such an encoder is the
      stronger side outside English, where BM25's stemmers are weaker);
    - otherwise the hybrid at the default ``lam``."""
    langs = {doc_language, query_language}
    if encoder_languages is None:
        return "hybrid", lam, f"hybrid retrieval at the default λ {lam} (the encoder's languages are not known)"
    multilingual = "multi" in encoder_languages
    if not multilingual and "multi" not in langs and not langs <= set(encoder_languages):
        return "bm25", None, (f"the encoder was trained on {'/'.join(encoder_languages)} text only and the data is "
                              f"{'/'.join(sorted(langs))}: BM25 alone")
    if multilingual and (len(langs) > 1 or "multi" in langs):
        return "dense", None, (f"queries ({query_language}) and documents ({doc_language}) are not in one language: "
                               "BM25 cannot match words across languages, dense alone")
    if multilingual:
        return "hybrid", MULTILINGUAL_LAMBDA, (f"hybrid retrieval at λ {MULTILINGUAL_LAMBDA} (a multilingual encoder on "
                                               f"{doc_language} text)")
    return "hybrid", lam, f"hybrid retrieval at the default λ {lam}"


def label_free_choice(data, model: str | None, doc_language: str, lam: float) -> tuple[str, float | None, str, str]:
    """(mode, λ, why, the queries' language) for the BEIR directory ``data`` without training labels:
    :func:`label_free_retriever` on the detected query language and ``model``'s languages."""
    from twotower.data.beir import load_queries
    from twotower.encoders.registry import model_languages
    from twotower.retrieval.analyzers import detect_language

    query_language = detect_language(list(load_queries(Path(data) / "queries.jsonl").values()))
    mode, lam_out, why = label_free_retriever(doc_language, query_language, model_languages(model), lam)
    return mode, lam_out, why, query_language


def align_stage(fit) -> dict:
    """The encoder with the directions spanned by its per-language document means removed, written to
    ``stages/align/model`` (``twotower models align-languages`` on the fit's documents; fit on XQuAD-R pool: mAP
    0.2991 -> 0.5412). Fewer than two languages with enough documents: ``{"model": None, "skipped": why}``."""
    from twotower.encoders.language_bias import align_languages

    target = fit.stages.dir("align") / "model"
    shutil.rmtree(target, ignore_errors=True)  # a half-written one from a killed run
    try:
        report = align_languages(fit.recipe.model, fit.data, target, opts=fit.encode_opts())
    except TwoTowerError as exc:  # e.g. one language dominates: nothing to align
        shutil.rmtree(target, ignore_errors=True)
        return {"model": None, "skipped": str(exc)}
    return {"model": str(target.relative_to(fit.out)), "languages": report["languages"],
            "directions": report["directions"]}


def fit_without_labels(fit, lam: float) -> tuple[dict, dict, str]:
    """(stages, choices, message) of a fit whose data has no training labels; writes ``OUT/model``."""
    from twotower.encoders.registry import model_languages

    data, recipe, out = fit.data, fit.recipe, fit.out
    language = fit.bm25_language()
    mode, lam, why, query_language = label_free_choice(data, recipe.model, language, lam)
    message = (f"{data}/qrels/{recipe.split}.tsv: no training labels (fewer than 2 judged queries): nothing to "
               f"fine-tune or tune on; the model is the zero-shot one, {why}, BM25 language {language}")
    if mode == "bm25" and recipe.model is None:
        message += (" (with labels fit would tune that; for a dense or hybrid retriever in this language pass "
                    "--model multilingual-e5-small after 'twotower models fetch multilingual-e5-small')")
    stages, stage = {}, "zeroshot"
    if mode == "dense" and "multi" in (model_languages(recipe.model) or ()):  # across languages: align them
        started = time.perf_counter()
        stages["align"] = fit.stages.done("align") or fit.stages.finish("align", align_stage(fit), started)
        if stages["align"]["model"]:
            stage = "align"
            message += (f"; the encoder's language bias removed ({stages['align']['directions']} directions from the "
                        f"documents' languages: {', '.join(stages['align']['languages'])})")
        else:
            message += f"; language-bias removal skipped: {stages['align']['skipped']}"
    if not (out / "model" / "twotower.json").is_file():
        fit.write_model(stage, RetrievalDefaults(mode=mode, lam=lam, rerank_depth=recipe.rerank_depth, language=language))
    choices = {"model": stage, "mode": mode, "lambda": lam, "rerank": None, "dev": None, "language": language,
               "query_language": query_language, "note": message}
    return stages, choices, message
