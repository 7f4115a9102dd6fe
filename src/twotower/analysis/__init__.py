"""The papers' analyses as functions that write JSON + PNG plots (CLI: ``twotower analyze ...``).

- :mod:`~twotower.analysis.fidelity`: random-projection fidelity of BM25 (Luan et al., §2).
- :mod:`~twotower.analysis.embedding_space`: t-SNE of query vs. document tower spaces + a linear probe.
- :mod:`~twotower.analysis.doclength`: median length of the top-10 retrieved documents (GTR §6.4).
- :mod:`~twotower.analysis.latency`: batch-1 query latency and documents/s (GTR §8).
- :mod:`~twotower.analysis.report`: one markdown page from whatever analysis JSON a folder holds.

Submodules import their heavy dependencies themselves; importing this package is cheap.
"""
