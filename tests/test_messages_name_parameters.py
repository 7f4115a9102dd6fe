"""Issue #46: a message raised in Python names the Python parameter (``lam``, ``replace=True``); the CLI, which runs
its commands under command-line names (:func:`twotower.checks.use_cli_names`), shows the flag (``--lambda``,
``--replace``). Each case gives the same bad input through ``tt`` and through ``twotower``."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from typer.testing import CliRunner

import twotower as tt
from surfaces import cli_message, python_message
from twotower.cli import app

runner = CliRunner()


def test_eval_lambda_without_hybrid(tiny_beir):
    text = python_message(lambda: tt.evaluate("bm25", tiny_beir, lam=0.5))
    assert "drop lam or pass mode='hybrid'" in text and "mode='bm25' does not use it" in text
    text = cli_message("eval", "--data", tiny_beir, "--retriever", "bm25", "--lambda", "0.5", "--no-progress")
    assert "drop --lambda or pass --retriever hybrid" in text and "--retriever bm25 does not use it" in text


def test_eval_fusion_norm_without_hybrid(tiny_beir):
    text = python_message(lambda: tt.evaluate("bm25", tiny_beir, norm="zscore"))
    assert text.startswith("norm normalises the two sides of mode='hybrid'")
    text = cli_message("eval", "--data", tiny_beir, "--retriever", "bm25", "--fusion-norm", "zscore", "--no-progress")
    assert "--fusion-norm normalises the two sides of --retriever hybrid" in text


def test_mine_model_with_bm25(tiny_beir, tiny_bert_dir, tmp_path):
    out = tmp_path / "m.jsonl"
    text = python_message(lambda: tt.mine(tiny_beir, out, split="test", model=str(tiny_bert_dir)))
    assert f"model='{tiny_bert_dir}' is not used by retriever='bm25'" in text and "drop model" in text
    text = cli_message("mine", "--data", tiny_beir, "--split", "test", "--out", out, "--model", tiny_bert_dir)
    assert f"--model {tiny_bert_dir} is not used by --retriever bm25" in text and "drop --model" in text
    assert not out.exists()


def test_train_rank_range_checked_before_any_work(tiny_beir, tiny_bert_dir, tmp_path):
    """train's --rank-from/--rank-to (the ranks its mined negatives come from): a reversed range, or one given with
    nothing to mine, is refused by name before a model loads or the run folder is written."""
    cfg = tt.TrainConfig(out=str(tmp_path / "py"), model=str(tiny_bert_dir), device="cpu",
                         stages=[tt.StageConfig(data=str(tiny_beir), split="test", steps=1, batch_size=2)])
    text = python_message(lambda: tt.train(cfg, hard_negatives="bm25", rank_from=9, rank_to=4, data=tiny_beir,
                                            split="test"))
    assert "rank_from=9 is past rank_to=4" in text
    text = python_message(lambda: tt.train(cfg, rank_from=1))
    assert "hard_negatives='none' mines none" in text and "rank_from=1" in text
    out = tmp_path / "cli"
    text = cli_message("train", "--data", tiny_beir, "--split", "test", "--model", tiny_bert_dir, "--out", out,
                        "--steps", "1", "--hard-negatives", "bm25", "--rank-from", "9", "--rank-to", "4")
    assert "--rank-from 9 is past --rank-to 4" in text
    text = cli_message("train", "--data", tiny_beir, "--split", "test", "--model", tiny_bert_dir, "--out", out,
                        "--steps", "1", "--rank-from", "1")
    assert "--hard-negatives none mines none" in text
    assert not (tmp_path / "py").exists() and not out.exists()


def test_mine_reversed_rank_range_stops_before_the_data(tmp_path):
    """mine shares train's check of the rank range: a reversed one is refused by name before the data is read."""
    out = tmp_path / "m.jsonl"
    text = python_message(lambda: tt.mine(tmp_path / "no-such-beir", out, rank_from=9, rank_to=4))
    assert "rank_from=9 is past rank_to=4" in text
    text = cli_message("mine", "--data", tmp_path / "no-such-beir", "--out", out, "--rank-from", "9", "--rank-to", "4")
    assert "--rank-from 9 is past --rank-to 4" in text
    assert not out.exists()


def test_train_rank_from_reaches_the_miner(tiny_beir, tiny_bert_dir, tmp_path):
    """train's --rank-from reaches the miner: on a collection of six documents ranks 3..50 hold no negative, and the
    refusal names --rank-from, a flag train has; from rank 1 the miner finds some."""
    import json

    def run(lo):
        out = tmp_path / f"from{lo}"
        res = runner.invoke(app, [str(a) for a in ("train", "--data", tiny_beir, "--split", "test", "--model",
                                                   tiny_bert_dir, "--out", out, "--steps", "1", "--batch-size", "2",
                                                   "--hard-negatives", "bm25", "--rank-from", lo, "--no-progress")])
        assert res.exit_code in (0, 2) and "Traceback" not in res.output, res.output
        return out, " ".join(res.output.split())

    _, text = run(3)
    assert "ranks 3..50: no example got a negative" in text and "lower --rank-from" in text
    out, _ = run(1)  # the miner writes its pairs before training (which may refuse an example left without one)
    mined = [json.loads(line) for line in (out / "mined-bm25.jsonl").read_text().splitlines()]
    assert sum(len(m["negatives"]) for m in mined) > 0


def test_mine_rank_from_past_the_collection(tiny_beir, tmp_path):
    out = tmp_path / "m.jsonl"
    text = python_message(lambda: tt.mine(tiny_beir, out, split="test", rank_from=20, rank_to=50,
                                           show_progress=False))
    assert "rank_from=20: the collection has only 6 documents" in text and "give rank_from at most 6" in text
    text = cli_message("mine", "--data", tiny_beir, "--split", "test", "--out", out, "--rank-from", "20",
                        "--rank-to", "50", "--no-progress")
    assert "--rank-from 20: the collection has only 6 documents" in text and "give --rank-from at most 6" in text


def test_index_build_vectors(tiny_beir, tiny_bert_dir, tmp_path):
    text = python_message(lambda: tt.Index.build(tmp_path / "idx", tiny_beir, encoder=str(tiny_bert_dir),
                                                  device="cpu", show_progress=False, vectors="binary",
                                                  kind="ivfpq"))
    assert "vectors='binary' builds a FAISS binary index of kind flat or hnsw" in text
    text = cli_message("index", "build", "--data", tiny_beir, "--out", tmp_path / "idx", "--model", tiny_bert_dir,
                        "--device", "cpu", "--no-progress", "--vectors", "binary", "--kind", "ivfpq")
    assert "--vectors binary builds a FAISS binary index of --kind flat or hnsw" in text


def test_index_add_existing_ids_needs_replace(tiny_beir, tiny_bert_dir, tmp_path):
    index = tt.Index.build(tmp_path / "idx", tiny_beir, encoder=str(tiny_bert_dir), device="cpu",
                           show_progress=False)
    doc = {"_id": "d1", "title": "again", "text": "the same id"}
    text = python_message(lambda: index.add([doc]))
    assert "(pass replace=True to overwrite them)" in text
    new = tmp_path / "new.jsonl"
    new.write_text('{"_id": "d1", "title": "again", "text": "the same id"}\n')
    text = cli_message("index", "add", "--index", tmp_path / "idx", "--docs", new, "--no-progress")
    assert "(pass --replace to overwrite them)" in text


def test_index_into_a_folder_that_is_no_index(tiny_beir, tiny_bert_dir, tmp_path):
    target = tmp_path / "run"
    target.mkdir()
    (target / "train_log.json").write_text("[]")
    text = python_message(lambda: tt.Index.build(target, tiny_beir, encoder=str(tiny_bert_dir), device="cpu",
                                                  show_progress=False))
    assert "is not an index directory (it holds train_log.json: a training run); choose an empty or new path" in text
    text = cli_message("index", "build", "--data", tiny_beir, "--out", target, "--model", tiny_bert_dir,
                        "--device", "cpu", "--no-progress")
    assert "is not an index directory (it holds train_log.json: a training run); choose an empty or new --out" in text


def test_train_into_a_run_needs_resume(tiny_beir, tiny_bert_dir, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "train_log.json").write_text("[]")
    cfg = tt.TrainConfig(out=str(out), model=str(tiny_bert_dir), precision="fp32", show_progress=False,
                         stages=[tt.StageConfig(data=str(tiny_beir), split="test", batch_size=2, steps=1)])
    text = python_message(lambda: tt.train(cfg))
    assert "pass resume=True to continue it, or choose another out" in text
    text = cli_message("train", "--data", tiny_beir, "--split", "test", "--model", tiny_bert_dir, "--out", out,
                        "--steps", "1", "--batch-size", "2", "--no-progress")
    assert "pass --resume to continue it, or choose another --out" in text


def test_models_fetch_from_a_missing_folder(tmp_path):
    missing = tmp_path / "none"
    text = python_message(lambda: tt.fetch_model("mpnet-base", from_dir=missing))
    assert f"from_dir='{missing}': no such folder" in text
    text = cli_message("models", "fetch", "mpnet-base", "--from-dir", missing)
    assert f"--from-dir {missing}: no such folder" in text


def test_fidelity_k_grid(tiny_beir, tmp_path):
    cfg = tt.FidelityConfig(data=str(tiny_beir), k_max=100, k_step=32)
    text = python_message(lambda: tt.analyze_fidelity(cfg, tmp_path / "a"))
    assert "k_max (100) must be a positive multiple of k_step (32)" in text
    text = cli_message("analyze", "fidelity", "--data", tiny_beir, "--out", tmp_path / "b", "--k-max", "100",
                        "--k-step", "32")
    assert "--k-max (100) must be a positive multiple of --k-step (32)" in text


# ---- no new hard-coded flag in a message raised outside the CLI ----------------------------------------------

_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SRC = Path(__file__).resolve().parents[1] / "src" / "twotower"


def _hard_coded_flags() -> dict[str, list[str]]:
    """Per file under src/twotower (cli/ left out): the flags spelt out in string literals of ``raise X(...)``, other
    than those quoting a whole command (``twotower index build --bm25``, ``pip install --no-deps``)."""
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("cli/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            for sub in ast.walk(node.exc):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    if "twotower " in sub.value or "pip " in sub.value:
                        continue
                    found.setdefault(rel, []).extend(f"{m} (line {sub.lineno})" for m in _FLAG.findall(sub.value))
    return {k: v for k, v in found.items() if v}


def test_no_hard_coded_flags_in_messages():
    found = _hard_coded_flags()
    assert not found, ("messages raised outside the CLI name flags; name the Python parameter through "
                      f"twotower.checks (flag, given, switch) instead: {found}")


def test_the_scan_sees_a_hard_coded_flag(tmp_path, monkeypatch):
    """The scan is no no-op: a ``raise`` spelling ``--out`` in a file of its own is found."""
    pkg = tmp_path / "twotower"
    pkg.mkdir()
    (pkg / "m.py").write_text('def f(out):\n    raise ValueError(f"{out}: choose another --out")\n')
    monkeypatch.setattr(sys.modules[__name__], "SRC", pkg)
    assert _hard_coded_flags() == {"m.py": ["--out (line 2)"]}
