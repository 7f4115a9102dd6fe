"""Training examples: a query, one positive document, optional hard negatives.

From a BEIR split each judged (query, document) pair with score > 0 is one example. A pairs file
is JSONL, one example per line: ``{"query": str, "positive": str, "negatives": [str, ...]}``
(``qid``/``pid``/``negative_ids`` optional).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from twotower.data.beir import BeirDataset, iter_json_records
from twotower.data.ids import text_problem
from twotower.errors import DataError
from twotower.io import atomic_write_text

log = logging.getLogger(__name__)


@dataclass
class TrainExample:
    query: str
    positive: str
    negatives: list[str] = field(default_factory=list)
    qid: str = ""
    pid: str = ""
    negative_ids: list[str] = field(default_factory=list)


SHOWN_IDS = 10  # document ids named in the warning about judged documents without text


def pairs_from_beir(ds: BeirDataset) -> list[TrainExample]:
    """One example per judged relevant (query, document) pair, in qrels order.

    A pair whose document has neither title nor text (real collections hold such records) teaches nothing and
    would be an empty positive: it is skipped, with one warning that counts them and names the documents (they
    stay in the corpus: evaluation still retrieves and scores them). A split without any pair (every judgement
    scored 0, or every judged document empty) is a :class:`DataError` naming its qrels file."""
    pairs, empty = [], []
    for qid, rels in ds.qrels.items():
        for did, score in rels.items():
            if score <= 0:
                continue
            text = ds.corpus[did].full_text
            if not text.strip():
                empty.append(did)
                continue
            pairs.append(TrainExample(query=ds.queries[qid], positive=text, qid=qid, pid=did))
    qrels_path = Path(ds.root) / "qrels" / f"{ds.split}.tsv"
    if empty:
        ids = sorted(set(empty))
        named = ", ".join(ids[:SHOWN_IDS]) + (f" and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else "")
        log.warning("%s: %d judged pair(s) left out of training: their document has neither title nor text "
                    "(%d document(s): %s); give those documents text in corpus.jsonl to train on them",
                    qrels_path, len(empty), len(ids), named)
    if not pairs:
        why = (f"every judged document ({len(set(empty))}) is empty" if empty
               else "none of its judgements has a score > 0")
        from twotower.checks import flag, given

        raise DataError(
            qrels_path, f"no training pairs in split '{ds.split}': {why}",
            hint=f"train on a split with relevant (score > 0) judgements of documents with text, e.g. "
                 f"{given('split', 'train')}, or pass a pairs file as {flag('pairs')}",
        )
    return pairs


def load_pairs(path: str | Path) -> list[TrainExample]:
    path = Path(path)
    out = []
    for number, rec in iter_json_records(path):
        for key in ("query", "positive"):
            if not isinstance(rec.get(key), str) or not rec[key].strip():
                raise DataError(path, f"{key} must be a non-empty string", line=number, field=key)
        negatives = rec.get("negatives", [])
        if not isinstance(negatives, list) or not all(isinstance(n, str) for n in negatives):
            raise DataError(path, "negatives must be a list of strings", line=number, field="negatives")
        for key, text in (("query", rec["query"]), ("positive", rec["positive"]), *(("negatives", n) for n in negatives)):
            problem = text_problem(text)
            if problem:  # before training, not as a tokenizer's codec error
                raise DataError(path, f"{key} {problem}", line=number, field=key)
        out.append(TrainExample(
            query=rec["query"], positive=rec["positive"], negatives=negatives,
            qid=str(rec.get("qid", "")), pid=str(rec.get("pid", "")),
            negative_ids=[str(x) for x in rec.get("negative_ids", [])],
        ))
    if not out:
        raise DataError(path, "no training examples")
    return out


def save_pairs(examples: list[TrainExample], path: str | Path) -> None:
    atomic_write_text(path, "".join(json.dumps(asdict(e)) + "\n" for e in examples))
