"""The LangChain and LlamaIndex retrievers (twotower.integrations) with the real langchain-core and
llama-index-core: exactly Index.search's top k (ids, order, scores) in every mode, sync and async, each hit as its
best passage (the default) or its whole document (``whole_documents=True``), the dense ranking against numpy on the
encoder's own vectors, options checked when a retriever is made, and a clear error naming the pip extra when a
framework is missing. (Documents of several passages: tests/test_rag_passages.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_tests.integration_tests import RetrieversIntegrationTests
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

import twotower as tt
from conftest import subprocess_env
from twotower.integrations.langchain import ScoredDocument, TwoTowerRetriever as LangChainRetriever
from twotower.integrations.llama_index import TwoTowerRetriever as LlamaRetriever

CORPUS = {
    "tea1": {"title": "Green tea", "text": "Green tea leaves are steamed or pan-fired soon after picking."},
    "tea2": {"title": "Black tea", "text": "Black tea is fully oxidised before the leaves are dried."},
    "tea3": {"title": "", "text": "Oolong tea is partly oxidised, between green and black tea."},
    "cof1": {"title": "Coffee roasting", "text": "Coffee beans are roasted at about two hundred degrees."},
    "cof2": {"title": "Espresso", "text": "Espresso forces hot water through finely ground coffee under pressure."},
    "cat1": {"title": "Cats", "text": "Cats purr when they are content and sometimes when they are hurt."},
    "cat2": {"title": "", "text": "A domestic cat sleeps twelve to sixteen hours a day."},
    "dog1": {"title": "Dogs", "text": "Dogs were domesticated from wolves more than fifteen thousand years ago."},
    "vit1": {"title": "Vitamin D", "text": "Vitamin D supplements reduce the risk of fractures in the elderly."},
    "vit2": {"title": "Vitamin C", "text": "Vitamin C deficiency causes scurvy, once common among sailors."},
    "bone": {"title": "Bone density", "text": "Bone mineral density falls with age, faster after menopause."},
    "gene": {"title": "Gene expression", "text": "Gene expression is regulated by transcription factors."},
    "rna1": {"title": "RNA", "text": "Messenger RNA carries the genetic code from DNA to the ribosome."},
    "sun1": {"title": "The Sun", "text": "The sun is a star of spectral type G, fusing hydrogen into helium."},
    "moon": {"title": "The Moon", "text": "The moon raises tides on Earth and keeps one face toward it."},
    "rain": {"title": "", "text": "Rain forms when water vapour condenses around dust in cold air."},
}
QUERIES = ["how is green tea made", "do cats purr when happy", "vitamin D and bone fractures",
           "what does messenger RNA do", "why are there tides", "roasted coffee beans"]
MODES = [pytest.param({"mode": "dense"}, id="dense"), pytest.param({"mode": "hybrid", "lam": 0.3}, id="hybrid"),
         pytest.param({"mode": "bm25"}, id="bm25"), pytest.param({"mode": "rrf"}, id="rrf"),
         pytest.param({}, id="default")]


@pytest.fixture(scope="module")
def index(tiny_bert_dir, tmp_path_factory) -> tt.Index:
    return tt.Index.build(tmp_path_factory.mktemp("integrations") / "idx", CORPUS, encoder=str(tiny_bert_dir),
                          bm25=True, precision="fp32", show_progress=False)


@pytest.fixture(scope="module")
def dense_only(tiny_bert_dir, tmp_path_factory) -> tt.Index:
    return tt.Index.build(tmp_path_factory.mktemp("integrations") / "dense", CORPUS, encoder=str(tiny_bert_dir),
                          bm25=False, precision="fp32", show_progress=False)


def _joined(hit: tt.Hit) -> str:
    return f"{hit.title} {hit.text}" if hit.title else hit.text


def _place(hit: tt.Hit) -> dict:
    """What metadata["passage"] holds for a hit's best passage."""
    p = hit.passages[0]
    place = {"document_id": hit.id, "title": hit.title, "start": p.start, "end": p.end, "score": hit.score,
             "passage_score": p.score}
    return {**place, "page": p.page} if getattr(p, "page", None) is not None else place


def assert_documents_are_hits(docs: list, hits: list[tt.Hit], whole: bool = False) -> None:
    assert [type(d) for d in docs] == [ScoredDocument] * len(hits) and all(isinstance(d, Document) for d in docs)
    assert [d.id for d in docs] == [h.id for h in hits]
    assert [d.score for d in docs] == [h.score for h in hits]  # exactly: the same search
    if whole:
        assert [d.page_content for d in docs] == [_joined(h) for h in hits]
        assert [d.metadata for d in docs] == [h.metadata for h in hits]  # exactly as given: nothing added
    else:  # the best passage (these documents are short: their whole text), its place beside the metadata
        assert [d.page_content for d in docs] == [h.passages[0].text for h in hits] == [h.text for h in hits]
        assert [d.metadata for d in docs] == [{**h.metadata, "passage": _place(h)} for h in hits]


def assert_nodes_are_hits(nodes: list, hits: list[tt.Hit], whole: bool = False) -> None:
    assert all(isinstance(n, NodeWithScore) and isinstance(n.node, TextNode) for n in nodes)
    assert [n.score for n in nodes] == [h.score for h in hits]
    if whole:
        assert [n.node.id_ for n in nodes] == [h.id for h in hits]
        assert [n.node.metadata for n in nodes] == [h.metadata for h in hits]  # exactly as given: nothing added
        assert [n.node.text for n in nodes] == [_joined(h) for h in hits]
    else:
        assert [n.node.ref_doc_id for n in nodes] == [n.node.id_ for n in nodes] == [h.id for h in hits]
        assert [n.node.text for n in nodes] == [h.text for h in hits]
        assert [(n.node.start_char_idx, n.node.end_char_idx) for n in nodes] == [(0, len(h.text)) for h in hits]
        assert [n.node.metadata for n in nodes] == [{**h.metadata, "passage": _place(h)} for h in hits]


# ------------------------------------------------------------------------------- the same top k as Index.search


WHOLE = [pytest.param(False, id="passages"), pytest.param(True, id="whole")]


@pytest.mark.parametrize("whole", WHOLE)
@pytest.mark.parametrize("k", [3, 7])
@pytest.mark.parametrize("options", MODES)
def test_langchain_returns_index_search_top_k(index, options, k, whole):
    retriever = LangChainRetriever(index, k=k, whole_documents=whole, **options)
    for q in QUERIES:
        hits = index.search(q, k=k, **options)
        assert hits and (len(hits) == k or options.get("mode") == "bm25")  # BM25 scores matching documents only
        assert_documents_are_hits(retriever.invoke(q), hits, whole)


@pytest.mark.parametrize("whole", WHOLE)
@pytest.mark.parametrize("k", [3, 7])
@pytest.mark.parametrize("options", MODES)
def test_llama_index_returns_index_search_top_k(index, options, k, whole):
    retriever = LlamaRetriever(index, k=k, whole_documents=whole, **options)
    for q in QUERIES:
        hits = index.search(q, k=k, **options)
        assert hits and (len(hits) == k or options.get("mode") == "bm25")  # BM25 scores matching documents only
        assert_nodes_are_hits(retriever.retrieve(q), hits, whole)
        assert_nodes_are_hits(retriever.retrieve(QueryBundle(q)), hits, whole)


def test_the_options_reach_the_search(index):
    """Each mode ranks differently here, so a retriever that dropped its mode (or λ) would be caught above."""
    rankings = {}
    for name, options in [("dense", {"mode": "dense"}), ("bm25", {"mode": "bm25"}),
                          ("hybrid.3", {"mode": "hybrid", "lam": 0.3}), ("hybrid.9", {"mode": "hybrid", "lam": 0.9})]:
        retriever = LangChainRetriever(index, k=5, **options)
        rankings[name] = [tuple((d.id, d.score) for d in retriever.invoke(q)) for q in QUERIES]
    assert len({tuple(r) for r in rankings.values()}) == len(rankings)


def test_dense_ranking_matches_numpy_on_the_encoders_vectors(index):
    """An independent reference: the encoder's query and document vectors, inner products and argsort in numpy."""
    ids = list(CORPUS)
    encoder = index.encoder
    doc_vecs = encoder.encode_documents([CORPUS[i] for i in ids])
    k = 5
    for q in QUERIES:
        scores = doc_vecs @ encoder.encode_queries([q])[0]
        expected = np.sort(scores)[::-1][:k]
        for got in (LangChainRetriever(index, k=k, mode="dense").invoke(q),
                    [(n.node.ref_doc_id, n.score) for n in LlamaRetriever(index, k=k, mode="dense").retrieve(q)]):
            pairs = [(d.id, d.score) for d in got] if isinstance(got[0], Document) else got
            np.testing.assert_allclose([s for _, s in pairs], expected, atol=1e-4)
            np.testing.assert_allclose([s for _, s in pairs], [scores[ids.index(d)] for d, _ in pairs], atol=1e-4)


def test_an_index_path_opens_the_index(index):
    """A path gives the index Index.open opens with its defaults (precision auto: not always the fp32 it was built
    with, so scores are compared with that index's, not the built one's)."""
    opened = tt.Index.open(index.path)
    for q in QUERIES[:2]:
        hits = opened.search(q, k=4, mode="hybrid")
        assert_documents_are_hits(LangChainRetriever(str(index.path), k=4, mode="hybrid").invoke(q), hits)
        assert_documents_are_hits(LangChainRetriever(index=index.path, k=4, mode="hybrid").invoke(q), hits)
        assert_nodes_are_hits(LlamaRetriever(str(index.path), k=4, mode="hybrid").retrieve(q), hits)


def test_a_reranker_directory_is_loaded_once_and_reranks_as_index_search(index, tiny_ce_dir):
    options = {"mode": "dense", "rerank": str(tiny_ce_dir), "rerank_depth": 8}
    lc, li = LangChainRetriever(index, k=4, **options), LlamaRetriever(index, k=4, **options)
    assert isinstance(lc.rerank, tt.Reranker) and isinstance(li.options["rerank"], tt.Reranker)
    # the reference's own copy, loaded as Index.search loads a directory (which it does on every call)
    ce = tt.Reranker(tiny_ce_dir, device=index.device, precision=index.precision)
    assert [h.id for h in index.search(QUERIES[0], k=4, **options)] == \
        [h.id for h in index.search(QUERIES[0], k=4, **{**options, "rerank": ce})]
    changed = 0
    for q in QUERIES:
        hits = index.search(q, k=4, **{**options, "rerank": ce})
        changed += [h.id for h in hits] != [h.id for h in index.search(q, k=4, mode="dense")]
        assert_documents_are_hits(lc.invoke(q), hits)
        assert_nodes_are_hits(li.retrieve(q), hits)
    assert changed, "the cross-encoder changed no ranking: this test would not see a retriever that skipped it"


def test_llama_nodes_show_the_text_not_the_id_or_score_to_an_llm(index):
    whole = LlamaRetriever(index, k=1, mode="bm25", whole_documents=True).retrieve("green tea steamed")[0]
    assert whole.node.id_ == "tea1"
    shown = whole.node.get_content(metadata_mode=MetadataMode.LLM)
    assert "Green tea" in shown and CORPUS["tea1"]["text"] in shown
    assert "score" not in shown and "tea1" not in shown and f"{whole.score}" not in shown
    found = LlamaRetriever(index, k=1, mode="bm25").retrieve("green tea steamed")[0]  # the passage: the text alone
    assert found.node.ref_doc_id == "tea1" and found.node.metadata["passage"]["title"] == "Green tea"
    for mode in (MetadataMode.LLM, MetadataMode.EMBED):
        shown = found.node.get_content(metadata_mode=mode)
        assert shown == CORPUS["tea1"]["text"]  # its place (id, offsets, scores) is the program's, not the LLM's


# ----------------------------------------------------------------------------------------------------- async


def test_async_paths_equal_the_sync_ones(index):
    lc, li = LangChainRetriever(index, k=5, mode="hybrid"), LlamaRetriever(index, k=5, mode="hybrid")

    async def main():
        docs = await asyncio.gather(*(lc.ainvoke(q) for q in QUERIES))
        nodes = await asyncio.gather(*(li.aretrieve(q) for q in QUERIES))
        return docs, nodes

    docs, nodes = asyncio.run(main())  # concurrent searches of one index: one at a time, none fails
    for q, d, n in zip(QUERIES, docs, nodes):
        hits = index.search(q, k=5, mode="hybrid")
        assert_documents_are_hits(d, hits)
        assert_nodes_are_hits(n, hits)


def test_langchain_batch_runs_searches_from_threads(index):
    retriever = LangChainRetriever(index, k=3, mode="dense")
    for q, docs in zip(QUERIES, retriever.batch(QUERIES, config={"max_concurrency": 4})):
        assert_documents_are_hits(docs, index.search(q, k=3, mode="dense"))


def test_searches_of_one_index_run_one_at_a_time(index, monkeypatch):
    """Concurrent async calls of both retrievers over one index never overlap inside the index's searcher (its fast
    tokenizer fails under concurrent calls): each search holds the floor for 50 ms, so without the Index's lock
    the worker threads would overlap."""
    active, most = [0], [0]
    guard = threading.Lock()
    real_search = index._searcher.run

    def counting_search(*args, **kwargs):
        with guard:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            threading.Event().wait(0.05)
            return real_search(*args, **kwargs)
        finally:
            with guard:
                active[0] -= 1

    lc, li = LangChainRetriever(index, k=2, mode="dense"), LlamaRetriever(index, k=2, mode="dense")
    monkeypatch.setattr(index._searcher, "run", counting_search)

    async def main():
        return await asyncio.gather(*(lc.ainvoke(q) for q in QUERIES), *(li.aretrieve(q) for q in QUERIES))

    results = asyncio.run(main())
    assert len(results) == 2 * len(QUERIES) and all(len(r) == 2 for r in results)
    assert most[0] == 1


@pytest.mark.parametrize("framework", ["langchain", "llama_index"])
def test_async_search_does_not_block_the_event_loop(index, framework, monkeypatch):
    """The search waits for a coroutine on the same loop to run: on the loop's own thread it would wait forever
    (here: fail after 10 s)."""
    loop_ran = threading.Event()
    threads = []
    real_search = index.search

    def search_once_the_loop_has_run(*args, **kwargs):
        threads.append(threading.get_ident())
        assert loop_ran.wait(timeout=10), "the event loop did not run while the search waited: it was blocked"
        return real_search(*args, **kwargs)

    retriever = (LangChainRetriever(index, k=3, mode="dense") if framework == "langchain"
                 else LlamaRetriever(index, k=3, mode="dense"))
    monkeypatch.setattr(index, "search", search_once_the_loop_has_run)

    async def main():
        async def tick():
            await asyncio.sleep(0.05)
            loop_ran.set()

        got, _ = await asyncio.gather(retriever.ainvoke(QUERIES[0]) if framework == "langchain"
                                      else retriever.aretrieve(QUERIES[0]), tick())
        return got, threading.get_ident()

    got, loop_thread = asyncio.run(main())
    assert threads and threads[0] != loop_thread
    monkeypatch.undo()
    hits = index.search(QUERIES[0], k=3, mode="dense")
    (assert_documents_are_hits if framework == "langchain" else assert_nodes_are_hits)(got, hits)


# ---------------------------------------------------------------------------------------------- bad settings


BAD = [({"k": 0}, "k=0"), ({"k": "5"}, "k='5'"), ({"k": True}, "k=True"), ({"mode": "semantic"}, "mode 'semantic'"),
       ({"mode": "dense", "lam": 0.5}, "lam"), ({"mode": "hybrid", "lam": 1.5}, "lam=1.5"), ({"mode": "hybrid", "norm": "l2"}, "norm"),
       ({"mode": "dense", "norm": "zscore"}, "norm"), ({"rerank_depth": 5}, "rerank_depth"),
       ({"prf_depth": 0}, "prf_depth"), ({"mode": "bm25", "prf_depth": 3}, "prf_depth"),
       ({"prf_weight": 0.5}, "prf_weight"), ({"nprobe": -1}, "nprobe")]


@pytest.mark.parametrize("make", [LangChainRetriever, LlamaRetriever], ids=["langchain", "llama_index"])
@pytest.mark.parametrize("options,named", BAD, ids=[n for _, n in BAD])
def test_bad_options_are_refused_when_the_retriever_is_made(index, make, options, named):
    options = dict(options)
    k = options.pop("k", 3)
    with pytest.raises(tt.TwoTowerError, match=named.replace("(", r"\(")):
        make(index, k=k, **options)


@pytest.mark.parametrize("make", [LangChainRetriever, LlamaRetriever], ids=["langchain", "llama_index"])
def test_bad_indexes_and_queries_are_refused(index, dense_only, make, tmp_path):
    with pytest.raises(tt.TwoTowerError, match="index: give a twotower.Index or the path"):
        make(42)
    with pytest.raises((tt.TwoTowerError, TypeError), match="lamda"):  # a misspelt option is not ignored
        make(index, mode="hybrid", lamda=0.3)
    with pytest.raises(tt.TwoTowerError):
        make(tmp_path / "no-such-index")
    for mode in ("bm25", "hybrid", "rrf"):
        with pytest.raises(tt.TwoTowerError, match=f"mode {mode} needs the index's BM25 part"):
            make(dense_only, mode=mode)
    retriever = make(dense_only, k=2)
    call = retriever.invoke if make is LangChainRetriever else retriever.retrieve
    for query in ("", "   "):
        with pytest.raises(tt.TwoTowerError, match="query"):
            call(query)


@pytest.mark.parametrize("module,package,extra", [("langchain", "langchain_core", "langchain"),
                                                  ("llama_index", "llama_index", "llama-index")])
def test_a_missing_framework_names_the_pip_extra(module, package, extra):
    code = (f"import sys\nsys.modules[{package!r}] = None  # as if it were not installed\n"
            "import twotower\n"
            f"try:\n    from twotower.integrations.{module} import TwoTowerRetriever\n"
            "except twotower.TwoTowerError as exc:\n"
            "    print(isinstance(exc, ImportError), exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("True twotower.integrations.")
    assert f"pip install 'twotower[{extra}]'" in proc.stdout


def test_import_twotower_imports_no_framework():
    code = ("import sys, twotower, twotower.integrations, twotower.integrations.search\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('langchain_core', 'llama_index', 'torch')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ------------------------------------------------------------------------------- LangChain's standard retriever suite


class _StandardSuite(RetrieversIntegrationTests):
    """langchain-tests' RetrieversIntegrationTests, every test as it ships (none overridden: its own
    test_no_overrides_DO_NOT_OVERRIDE checks that), on the CORPUS index; async tests run under anyio."""

    pytestmark = pytest.mark.anyio

    @pytest.fixture
    def anyio_backend(self):
        return "asyncio"

    @pytest.fixture(autouse=True)
    def _given(self, index):
        self._index = index

    @property
    def retriever_constructor(self):
        return LangChainRetriever

    @property
    def retriever_query_example(self) -> str:
        return QUERIES[0]


class TestLangChainStandardSuiteOnAnIndex(_StandardSuite):
    """The retriever built from an open twotower.Index."""

    @property
    def retriever_constructor_params(self) -> dict:
        return {"index": self._index}


class TestLangChainStandardSuiteOnAPath(_StandardSuite):
    """The retriever built from the index directory's path, with options (hybrid search)."""

    @property
    def retriever_constructor_params(self) -> dict:
        return {"index": str(self._index.path), "mode": "hybrid", "lam": 0.4}
