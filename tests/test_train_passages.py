"""Training on long documents (training/passage_choice.py): ``best`` trains on the passage the starting model scores
highest for the query, worked out by hand here (each passage encoded on its own, the argmax taken); ``first`` on the
document as given (the tokenizer's first window). And the wiring: ``train_passage`` reaches the batches the loss sees
from the Trainer, ``tt.train``, ``twotower train`` and ``tt.fit``, and a wrong value is refused by name."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import write_beir
from twotower.data.pairs import TrainExample, save_pairs
from twotower.errors import TwoTowerError
from twotower.training.config import StageConfig, TrainConfig
from twotower.training.passage_choice import choose_passages, resolve_choice, stage_passages
from twotower.training.trainer import Trainer

TEA = ("The company grows tea on estates in Assam, Kenya and Sri Lanka. Picking starts in March in the north. "
       "Leaves are withered, rolled and dried within a day.")
BOILER = "In March a steam leak from an old boiler injured two workers. After the inspection every factory replaced its boilers."
REPORT = TEA + " " + BOILER  # at a 32-token window: passages of tea first, the boilers in a later one
QUERY = "why were the boilers replaced"
WINDOW = 32


@pytest.fixture(scope="module")
def minilm():
    from twotower.encoders.towers import DualEncoder

    return DualEncoder.build(None, doc_max_length=WINDOW)


def _hand_best(model, query: str, title: str, text: str) -> tuple[list[str], int]:
    """The document's passages as the index splits it at the model's window, and the one whose own vector has the
    highest inner product with the query's, each passage encoded on its own."""
    from twotower.encoders.passages import PassageSpec, split_documents
    from twotower.encoders.towers import EncodeOptions

    split = split_documents(model.doc_tower.tokenizer, [title], [text], PassageSpec().resolved(WINDOW),
                            prompt=model.prompts.get("document", ""))
    opts = EncodeOptions(precision="fp32", show_progress=False, runtime="torch")
    q = model.encode_queries([query], opts)[0]
    scores = [float(model.encode_documents([p], opts)[0] @ q) for p in split.texts]
    return split.texts, int(np.argmax(scores))


def test_best_trains_on_the_passage_holding_the_answer_first_on_the_first_window(minilm):
    passages, k = _hand_best(minilm, QUERY, "", REPORT)
    assert len(passages) >= 2 and k > 0  # the relevant sentence is in a later passage, and the hand argmax finds it
    assert "replaced its boilers" in passages[k] and "boiler" not in passages[0]
    example = TrainExample(QUERY, REPORT, qid="q1", pid="d1")
    best = choose_passages([example], minilm, "best", precision="fp32", show_progress=False)
    assert best.examples[0].positive == passages[k]
    assert (best.long_positives, best.moved_positives) == (1, 1)
    first = choose_passages([example], minilm, "first", show_progress=False)
    assert first.examples[0].positive == REPORT  # as given: the tokenizer keeps its first window, the tea
    ids = minilm.doc_tower.tokenizer(REPORT, truncation=True, max_length=WINDOW)["input_ids"]
    assert "boiler" not in minilm.doc_tower.tokenizer.decode(ids)


def test_a_short_positive_is_left_alone_and_a_long_negative_gets_its_best_passage(minilm):
    example = TrainExample("where is tea grown", "Tea grows in Assam.", negatives=[BOILER + " " + TEA, "Short."])
    passages, k = _hand_best(minilm, "where is tea grown", "", BOILER + " " + TEA)
    assert k > 0
    out = choose_passages([example], minilm, "best", precision="fp32", show_progress=False)
    assert out.examples[0].positive == "Tea grows in Assam."
    assert out.examples[0].negatives == [passages[k], "Short."]
    assert (out.long_positives, out.long_negatives, out.moved_negatives) == (0, 1, 1)


def test_a_corpus_document_keeps_its_title_in_front_of_its_passage(minilm):
    from twotower.data.beir import Document

    doc = Document(id="d1", title="Annual report", text=REPORT)
    passages, k = _hand_best(minilm, QUERY, doc.title, doc.text)
    example = TrainExample(QUERY, doc.full_text, qid="q1", pid="d1")
    out = choose_passages([example], minilm, "best", documents={"d1": doc}, precision="fp32", show_progress=False)
    assert out.examples[0].positive == passages[k] and passages[k].startswith("Annual report ")


def test_a_wrong_choice_is_refused_by_name():
    with pytest.raises(TwoTowerError, match="train_passage"):
        resolve_choice("middle")
    with pytest.raises(TwoTowerError, match="train_passage"):
        TrainConfig(out="x", train_passage="middle").validate()
    with pytest.raises(TwoTowerError, match="train_passage"):
        stage_passages(None, StageConfig(), [("a chunk", "another")], "best")
    assert stage_passages(None, StageConfig(), [("a chunk", "another")], None) == ([("a chunk", "another")], None)


# ---------------------------------------------------------------- wiring: what the loss sees


def _long_pairs(path: Path) -> list[TrainExample]:
    rng = random.Random(0)
    words = "cat dog tea rust python cell sun moon river stone tree bird fish apple music train".split()
    examples = []
    for i, w in enumerate(words[:6]):
        filler = " ".join(rng.choice(words) for _ in range(60))
        examples.append(TrainExample(f"what is {w}", f"{filler}. The answer: {w} is about {w}. {filler}.",
                                     qid=f"q{i}", pid=f"d{i}"))
    save_pairs(examples, path)
    return examples


def _seen_positives(monkeypatch) -> list[str]:
    seen: list[str] = []
    original = Trainer.batch_texts

    def spy(self, examples, stage, rng):
        seen.extend(e.positive for e in examples)
        return original(self, examples, stage, rng)

    monkeypatch.setattr(Trainer, "batch_texts", spy)
    return seen


@pytest.mark.parametrize("choice", ["first", "best"])
def test_the_trainer_trains_on_the_chosen_passages(tiny_bert_dir, tmp_path, monkeypatch, choice):
    from twotower.encoders.towers import DualEncoder

    examples = _long_pairs(tmp_path / "pairs.jsonl")
    seen = _seen_positives(monkeypatch)
    cfg = TrainConfig(out=str(tmp_path / "run"), model=str(tiny_bert_dir), doc_max_length=WINDOW, precision="fp32",
                      show_progress=False, checkpoint_every=0, train_passage=choice,
                      stages=[StageConfig(pairs=str(tmp_path / "pairs.jsonl"), steps=1, batch_size=6)])
    Trainer(cfg).train()
    start = DualEncoder.build(str(tiny_bert_dir), doc_max_length=WINDOW)  # the starting model, as the run built it
    expected = choose_passages(examples, start, choice, precision="fp32", show_progress=False).examples
    assert sorted(seen) == sorted(e.positive for e in expected)
    originals = {e.positive for e in examples}
    if choice == "first":
        assert set(seen) == originals and not (tmp_path / "run" / "train_passages.json").exists()
    else:
        assert not set(seen) & originals  # every positive is long: each one trains on a passage of itself
        assert all(any(s in e.positive for e in examples) for s in seen)
        report = json.loads((tmp_path / "run" / "train_passages.json").read_text())
        assert report[0]["train_passage"] == "best" and report[0]["long_positives"] == len(examples)


def test_tt_train_passes_the_choice_and_keeps_titles_from_a_beir_stage(tiny_bert_dir, tmp_path, monkeypatch):
    import twotower as tt

    corpus = [{"_id": f"d{i}", "title": f"Title {i}", "text": e.positive}
              for i, e in enumerate(_long_pairs(tmp_path / "pairs.jsonl"))]
    queries = [{"_id": f"q{i}", "text": f"what is {i}"} for i in range(len(corpus))]
    data = write_beir(tmp_path / "beir", corpus, queries, [(f"q{i}", f"d{i}", 1) for i in range(len(corpus))],
                      split="train")
    seen = _seen_positives(monkeypatch)
    cfg = tt.TrainConfig(out=str(tmp_path / "run"), model=str(tiny_bert_dir), doc_max_length=WINDOW,
                         precision="fp32", show_progress=False, checkpoint_every=0, train_passage="best",
                         stages=[tt.StageConfig(data=str(data), steps=1, batch_size=6)])
    tt.train(cfg)
    assert len(seen) == 6 and all(s.startswith("Title ") for s in seen)
    assert all(s != f"Title {i} {c['text']}" for i, c in enumerate(corpus) for s in seen)


def test_the_cli_passes_the_choice_and_refuses_a_wrong_one(tiny_bert_dir, tmp_path, monkeypatch):
    from twotower.cli import app

    _long_pairs(tmp_path / "pairs.jsonl")
    seen = _seen_positives(monkeypatch)
    runner = CliRunner()
    common = ["train", "--pairs", str(tmp_path / "pairs.jsonl"), "--model", str(tiny_bert_dir), "--steps", "1",
              "--batch-size", "6", "--max-length", str(WINDOW), "--precision", "fp32", "--no-progress"]
    result = runner.invoke(app, [*common, "--out", str(tmp_path / "best"), "--train-passage", "best"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert json.loads((tmp_path / "best" / "train_config.json").read_text())["train_passage"] == "best"
    assert (tmp_path / "best" / "train_passages.json").is_file()
    best_seen, seen[:] = list(seen), []
    result = runner.invoke(app, [*common, "--out", str(tmp_path / "first"), "--train-passage", "first"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert not (tmp_path / "first" / "train_passages.json").exists()
    assert set(seen) != set(best_seen)
    result = runner.invoke(app, [*common, "--out", str(tmp_path / "bad"), "--train-passage", "middle"])
    assert result.exit_code == 2 and "--train-passage" in result.output


def test_fit_trains_both_rounds_with_the_recipe_s_choice(tiny_bert_dir, tmp_path, monkeypatch):
    import twotower as tt
    from twotower.training.fit import run as fit_run

    corpus = [{"_id": f"d{i}", "title": "", "text": f"document {i} about topic {i % 7}"} for i in range(40)]
    queries = [{"_id": f"q{i}", "text": f"topic {i % 7} number {i}"} for i in range(40)]
    data = write_beir(tmp_path / "beir", corpus, queries, [(f"q{i}", f"d{i}", 1) for i in range(40)], split="train")
    made: list = []

    class Stop(Exception):
        pass

    class Spy:
        def __init__(self, cfg, objective=None, documents=None):
            made.append((cfg, documents))
            raise Stop

    import twotower.training.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "Trainer", Spy)
    with pytest.raises(Stop):
        tt.fit(data, tmp_path / "fit", model=str(tiny_bert_dir), mine=False, cv_below=0, min_dev=4,
               train_passage="first", show_progress=False, precision="fp32")
    cfg, documents = made[0]
    assert cfg.train_passage == "first" and set(documents) == {f"d{i}" for i in range(40)}
    assert fit_run.FitRecipe().train_passage == resolve_choice(None)
    with pytest.raises(TwoTowerError, match="train_passage"):
        tt.fit(data, tmp_path / "fit2", model=str(tiny_bert_dir), train_passage="middle")


def test_a_fit_recorded_before_train_passage_resumes_with_first_only(tmp_path):
    from twotower.training.fit.recipe import FitRecipe
    from twotower.training.fit.stages import RECIPE_FILE, StageLog

    old = FitRecipe().to_json()
    del old["train_passage"]  # a fit.json recipe from before the setting
    (tmp_path / RECIPE_FILE).write_text(json.dumps({"data": "d", "recipe": old}))
    log = StageLog(tmp_path)
    assert log.claim(FitRecipe(train_passage="first").to_json(), "d") is True
    with pytest.raises(TwoTowerError, match="train_passage"):
        log.claim(FitRecipe(train_passage="best").to_json(), "d")
