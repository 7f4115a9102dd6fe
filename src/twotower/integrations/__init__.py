"""RAG frameworks over a :class:`twotower.Index`, as optional extras.

- ``twotower.integrations.langchain``: ``TwoTowerRetriever``, ``TwoTowerVectorStore`` (a ``VectorStore``) and
  ``TwoTowerEmbeddings`` (``pip install 'twotower[langchain]'``)
- ``twotower.integrations.llama_index``: ``TwoTowerRetriever``, ``TwoTowerVectorStore`` (a
  ``BasePydanticVectorStore``) and ``TwoTowerEmbedding`` (``pip install 'twotower[llama-index]'``)

The retrievers return exactly :meth:`twotower.Index.search`'s top ``k`` (same ids, order and scores); the stores
keep a document's metadata exactly as given (:mod:`twotower.integrations.store`). ``import twotower`` and
this package import neither framework: each module imports its own when it is imported, and without it raises a
:class:`MissingExtraError` naming the extra to install.
"""

from __future__ import annotations

from twotower.errors import TwoTowerError

__all__ = ["MissingExtraError", "missing_extra"]


class MissingExtraError(TwoTowerError, ImportError):
    """An integration whose framework is not installed; the message names the ``pip install`` that adds it.

    Example::

        try:
            from twotower.integrations.langchain import TwoTowerRetriever
        except MissingExtraError as exc:
            print(exc)  # ... pip install 'twotower[langchain]'
    """


def missing_extra(package: str, extra: str, module: str, cause: ImportError) -> MissingExtraError:
    """The error for ``module`` when importing ``package`` failed with ``cause``."""
    return MissingExtraError(f"{module} needs {package}, which cannot be imported ({cause}): install it with "
                             f"pip install 'twotower[{extra}]'")
