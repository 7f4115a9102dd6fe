"""LangChain's own standard suites against twotower: ``VectorStoreIntegrationTests`` for
:class:`TwoTowerVectorStore` with twotower's encoder (the tiny test BERT) and with LangChain's fake embeddings
(``get_embeddings()``, the suite's own), and ``EmbeddingsIntegrationTests`` for :class:`TwoTowerEmbeddings`; then
what the suites leave out: metadata keys that name a document's own fields elsewhere, filters, MMR, reopening."""

from __future__ import annotations

import pytest
from langchain_tests.integration_tests import EmbeddingsIntegrationTests, VectorStoreIntegrationTests

from twotower.integrations.langchain import TwoTowerEmbeddings, TwoTowerVectorStore


class _Anyio:
    """The suites' async tests run under anyio, on asyncio."""

    pytestmark = pytest.mark.anyio

    @pytest.fixture
    def anyio_backend(self):
        return "asyncio"


class TestWithFakeEmbeddings(_Anyio, VectorStoreIntegrationTests):
    """The suite's own store set-up: LangChain's DeterministicFakeEmbedding."""

    @pytest.fixture
    def vectorstore(self, tmp_path):
        store = TwoTowerVectorStore(tmp_path / "store", embedding=self.get_embeddings())
        yield store
        store.delete()


class TestWithTwoTowerEncoder(_Anyio, VectorStoreIntegrationTests):
    """twotower's own encoder (embedding=None): the tiny test BERT, in fp32."""

    @pytest.fixture
    def vectorstore(self, tiny_bert_dir):
        store = TwoTowerVectorStore(encoder=str(tiny_bert_dir), precision="fp32")  # a temporary folder
        yield store
        store.delete()


class TestTwoTowerEmbeddings(_Anyio, EmbeddingsIntegrationTests):
    @pytest.fixture(autouse=True)
    def _model_dir(self, tiny_bert_dir):
        type(self).model_dir = str(tiny_bert_dir)

    @property
    def embeddings_class(self):
        return TwoTowerEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        return {"encoder": self.model_dir, "precision": "fp32"}
