"""LangChain ``Embeddings`` over a twotower encoder: its query tower for queries, its document tower for documents,
each with the model's own prompts (e5's ``query:`` / ``passage:``)."""

from __future__ import annotations

from pathlib import Path

from langchain_core.embeddings import Embeddings

from twotower.errors import TwoTowerError

__all__ = ["TwoTowerEmbeddings"]


class TwoTowerEmbeddings(Embeddings):
    """A LangChain ``Embeddings`` over :class:`twotower.Encoder`: ``embed_query`` encodes with the query tower,
    ``embed_documents`` with the document tower (two different towers for an asymmetric model, each with its
    prompt: :attr:`twotower.Encoder.prompts`), as lists of floats (L2-normalised when the model uses cosine).

    ``encoder``: an :class:`~twotower.Encoder`, a model name or directory (None: all-MiniLM-L6-v2, loaded on first
    use); ``device``, ``precision`` and ``batch_size`` as :meth:`twotower.Encoder.load` takes them. The async
    methods run in a worker thread (LangChain's default).

    Example::

        from twotower.integrations.langchain import TwoTowerEmbeddings

        emb = TwoTowerEmbeddings("all-MiniLM-L6-v2", device="cpu")
        q = emb.embed_query("how is green tea made")
        docs = emb.embed_documents(["Green tea leaves are steamed.", "Coffee is roasted."])
        print(len(q), len(docs), sum(a * b for a, b in zip(q, docs[0])))
    """

    def __init__(self, encoder=None, *, device: str = "auto", precision: str = "auto",
                 batch_size: int | None = None) -> None:
        from twotower.api.encoder import Encoder

        if encoder is not None and not isinstance(encoder, (Encoder, str, Path)):
            raise TwoTowerError(f"encoder: give a twotower.Encoder, a model name or a directory, not "
                                f"{type(encoder).__name__}")
        self._given = encoder
        self._options = {"device": device, "precision": precision, "batch_size": batch_size}
        self._encoder = encoder if isinstance(encoder, Encoder) else None

    @property
    def encoder(self):
        """The :class:`twotower.Encoder` (loaded on first use)."""
        if self._encoder is None:
            from twotower.api.encoder import Encoder

            self._encoder = Encoder.load(self._given, **self._options)
        return self._encoder

    def __repr__(self) -> str:
        return f"TwoTowerEmbeddings({self._given if self._encoder is None else self._encoder.name!r})"

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, from the document tower (with the model's document prompt)."""
        texts = _texts(texts, "texts")
        if not texts:
            return []
        return self.encoder.encode_documents(texts).astype(float).tolist()

    def embed_query(self, text: str) -> list[float]:
        """The query's vector, from the query tower (with the model's query prompt)."""
        if not isinstance(text, str):
            raise TwoTowerError(f"text: a query string, not {type(text).__name__}")
        return self.encoder.encode_queries([text])[0].astype(float).tolist()


def _texts(texts, what: str) -> list[str]:
    if isinstance(texts, str):
        raise TwoTowerError(f"{what}: a list of strings, not one string (wrap it in a list)")
    texts = list(texts)
    bad = next((t for t in texts if not isinstance(t, str)), None)
    if bad is not None:
        raise TwoTowerError(f"{what}: a list of strings; {bad!r} is a {type(bad).__name__}")
    return texts
