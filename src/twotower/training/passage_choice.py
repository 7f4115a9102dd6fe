"""Which passage of a long positive (or hard negative) a training example trains on.

The trainer's tokenizer keeps a document's first ``doc_max_length`` tokens. For a document longer than that whose
relevant part comes later, that first window is a wrong positive: the query is pulled towards text that does not
answer it. An index splits such a document into passages (:mod:`twotower.encoders.passages`) and scores it by its best
one (MaxP), so training can pick the same unit:

- ``first``: the document as given, cut by the tokenizer to its first window (FirstP; what training did before);
- ``best``: the passage that the *starting* model scores highest for the example's query (MaxP training: Dai & Callan
  2019), found once before training with the index's own splitter (:class:`~twotower.encoders.passages.PassageSpec`
  with the model's document window, its default overlap), batched, behind a progress bar. Hard negatives get their
  best passage too: the index ranks a negative document by its best passage, so that is the text a positive must
  beat; the first window of a long negative is often unrelated to the query, an easy negative.

A document that fits in one window is left as it is under either choice. A passage keeps its document's title in
front (as the index encodes it) where the example's ``pid`` / ``negative_ids`` name a document of ``documents``
whose full text is the example's text; otherwise the example's text is split as it stands.

Example::

    from twotower.training.passage_choice import choose_passages

    chosen = choose_passages(examples, model, "best", show_progress=False)
    print(chosen.long_positives, chosen.moved_positives, chosen.examples[0].positive[:60])
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from twotower.checks import flag, given
from twotower.data.pairs import TrainExample
from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)

CHOICES = ("first", "best")
# chosen by benchmarks/train_long.py (results/train_long.md): see docs/guides/long-documents.md
DEFAULT = "best"


def resolve_choice(value: str | None) -> str:
    """``value`` checked (``first`` | ``best``; None: :data:`DEFAULT`), with a message naming ``train_passage``."""
    if value is None:
        return DEFAULT
    if value not in CHOICES:
        raise TwoTowerError(f"unknown {given('train_passage', value)}: choose {' or '.join(CHOICES)} (which passage "
                            "of a document longer than the model's window a training example trains on)")
    return value


@dataclass
class PassageChoice:
    """The examples with their chosen passages, and what the choice changed: examples whose positive is longer than
    the window (``long_positives``) and those whose chosen passage is not the first (``moved_positives``); the same
    for hard negatives."""

    examples: list[TrainExample]
    long_positives: int = 0
    moved_positives: int = 0
    long_negatives: int = 0
    moved_negatives: int = 0
    passages_scored: int = 0

    def summary(self) -> dict:
        return {"examples": len(self.examples), "long_positives": self.long_positives,
                "moved_positives": self.moved_positives, "long_negatives": self.long_negatives,
                "moved_negatives": self.moved_negatives, "passages_scored": self.passages_scored}


def _source(text: str, doc_id: str, documents: Mapping | None) -> tuple[str, str]:
    """``(title, text)`` to split: the corpus document's own where it is the example's text, else the text alone."""
    doc = documents.get(doc_id) if documents is not None and doc_id else None
    if doc is not None and doc.full_text == text:
        return doc.title, doc.text
    return "", text


def choose_passages(examples: Sequence[TrainExample], model, choice: str | None = None, *,
                    documents: Mapping | None = None, precision: str = "auto", batch_size: int | None = None,
                    show_progress: bool = True) -> PassageChoice:
    """``examples`` with each positive and hard negative replaced by its ``choice`` passage for its query, scored by
    ``model`` (a :class:`~twotower.encoders.towers.DualEncoder`: the model training starts from). ``documents``:
    ``{id: Document}`` that the examples' ids name (titles kept in front of passages, as an index does)."""
    from twotower.encoders.passages import PassageSpec, split_documents
    from twotower.encoders.runtimes import encode_with_runtime

    choice = resolve_choice(choice)
    examples = list(examples)
    if choice == "first" or not examples:
        return PassageChoice(examples)
    # every distinct document (title, text) once, however many examples name it
    keys: dict[tuple[str, str], int] = {}
    pos_doc = [keys.setdefault(_source(e.positive, e.pid, documents), len(keys)) for e in examples]
    neg_doc = [[keys.setdefault(_source(n, nid, documents), len(keys))
                for n, nid in zip(e.negatives, e.negative_ids or [""] * len(e.negatives))] for e in examples]
    sources = list(keys)
    spec = PassageSpec().resolved(model.doc_max_length)
    split = split_documents(model.doc_tower.tokenizer, [t for t, _ in sources], [x for _, x in sources], spec,
                            prompt=model.prompts.get("document", ""))
    counts = np.diff(split.offsets)
    long_docs = {d for d in range(len(sources)) if counts[d] > 1}
    wanted = {d for d in pos_doc if d in long_docs} | {d for ds in neg_doc for d in ds if d in long_docs}
    rows = sorted(p for d in wanted for p in range(split.offsets[d], split.offsets[d + 1]))
    queries = sorted({e.query for e, d, ns in zip(examples, pos_doc, neg_doc)
                      if d in long_docs or any(n in long_docs for n in ns)})
    if not rows:
        return PassageChoice(examples)
    log.info("training on best passages: %d of %d distinct documents are longer than the %d-token window; scoring "
             "their %d passages for %d queries with the starting model", len(wanted), len(sources), spec.window,
             len(rows), len(queries))
    p_vecs = encode_with_runtime(model.doc_tower, model.document_texts([split.texts[p] for p in rows]),
                                 runtime="torch", precision=precision, max_length=model.doc_max_length,
                                 batch_size=batch_size, show_progress=show_progress, desc="scoring passages")
    q_vecs = model.encode_queries(queries, _opts(precision, batch_size))
    for tower in (model.query_tower, model.doc_tower):  # training changes the weights: no inference copy to keep
        tower.__dict__.pop("_bf16_cache", None)
    p_row = {p: i for i, p in enumerate(rows)}
    q_row = {q: i for i, q in enumerate(queries)}

    def best(query: str, doc: int) -> tuple[str | None, bool]:
        """The doc's best passage for the query (None for a one-passage doc), and whether it is not the first."""
        if doc not in long_docs:
            return None, False
        first, stop = int(split.offsets[doc]), int(split.offsets[doc + 1])
        scores = p_vecs[[p_row[p] for p in range(first, stop)]] @ q_vecs[q_row[query]]
        k = int(np.argmax(scores))
        return split.texts[first + k], k > 0

    out = PassageChoice([], passages_scored=len(rows))
    for e, d, ns in zip(examples, pos_doc, neg_doc):
        text, moved = best(e.query, d)
        out.long_positives += text is not None
        out.moved_positives += moved
        negatives = []
        for n_text, n in zip(e.negatives, ns):
            chosen, n_moved = best(e.query, n)
            out.long_negatives += chosen is not None
            out.moved_negatives += n_moved
            negatives.append(chosen if chosen is not None else n_text)
        out.examples.append(replace(e, positive=text if text is not None else e.positive, negatives=negatives))
    log.info("training on best passages: %d of %d positives are long, %d train on a later passage than the first; "
             "%d of %d hard negatives are long, %d moved", out.long_positives, len(examples), out.moved_positives,
             out.long_negatives, sum(len(e.negatives) for e in examples), out.moved_negatives)
    return out


def _any_long(model, examples: Sequence[TrainExample]) -> bool:
    """Whether any positive or negative is longer than the model's document window (prompt and special tokens
    counted, as the splitter counts them)."""
    prompt = model.prompts.get("document", "")
    texts = list({prompt + t for e in examples for t in (e.positive, *e.negatives)})
    ids = model.doc_tower.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
    return any(len(x) > model.doc_max_length for x in ids)


def _opts(precision: str, batch_size: int | None):
    from twotower.encoders.towers import EncodeOptions

    return EncodeOptions(batch_size=batch_size, precision=precision, show_progress=False, runtime="torch")


def stage_passages(model, stage, examples: Sequence, choice: str | None, *, documents: Mapping | None = None,
                   precision: str = "auto", show_progress: bool = True) -> tuple[list, dict | None]:
    """A training stage's examples with the run's passage ``choice`` applied (the trainer's hook), and what the
    choice changed (:meth:`PassageChoice.summary`; None where nothing was chosen). Items that are not (query,
    positive) pairs (pre-training's text chunks, distillation's scored candidates) have no positive to choose from:
    left as they are under the default, refused when ``best`` was asked for by name."""
    resolved = resolve_choice(choice)
    if resolved == "first" or not examples:
        return list(examples), None
    if not all(isinstance(e, TrainExample) for e in examples):
        if choice is None:
            return list(examples), None
        raise TwoTowerError(f"{given('train_passage', choice)} chooses a passage of each pair's positive, and stage "
                            f"'{stage.name}' trains on items without one (pre-training or distillation); drop "
                            f"{flag('train_passage')} or set it to first")
    if documents is None and getattr(stage, "data", None) and _any_long(model, examples):  # else: read data once
        from twotower.data.beir import BeirDataset

        documents = BeirDataset.load(stage.data, stage.split).corpus
    chosen = choose_passages(examples, model, resolved, documents=documents, precision=precision,
                             show_progress=show_progress)
    return chosen.examples, {"stage": stage.name, "train_passage": resolved, **chosen.summary()}
