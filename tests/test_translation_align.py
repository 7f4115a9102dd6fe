"""Cross-lingual alignment from translation pairs (``encoders.translation_align``): the loss against a numpy
computation by hand on a tiny batch, the group mask, the mining, the fit, and the saved model against the map
applied by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from twotower.encoders.translation_align import (MapConfig, fit_translation_map, mutual_nearest_pairs, read_pairs,
                                                 text_groups, translation_loss)
from twotower.errors import TwoTowerError


def _hand_loss(w, x, y, tau, reg, groups):
    """Symmetric InfoNCE written out with numpy loops: row i's candidates are every y_j (column j's every x_i)
    except the other pairs of i's group; plus reg·‖W − I‖²_F / d."""
    def unit(v):
        return v / np.linalg.norm(v)

    zx, zy = [unit(w @ v) for v in x], [unit(w @ v) for v in y]
    n = len(x)
    total = 0.0
    for i in range(n):
        keep = [j for j in range(n) if j == i or groups[j] != groups[i]]
        row = np.array([zx[i] @ zy[j] / tau for j in keep])
        col = np.array([zx[j] @ zy[i] / tau for j in keep])
        total += 0.5 * (-(zx[i] @ zy[i] / tau) + np.log(np.exp(row).sum()))
        total += 0.5 * (-(zx[i] @ zy[i] / tau) + np.log(np.exp(col).sum()))
    return total / n + reg * ((w - np.eye(len(w))) ** 2).sum() / len(w)


def test_loss_matches_a_hand_computed_value():
    rng = np.random.default_rng(3)
    w, x, y = np.eye(4) + 0.3 * rng.normal(size=(4, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
    groups = [0, 1, 1, 2, 3]  # pairs 1 and 2 share a text: neither is the other's negative
    got = translation_loss(torch.tensor(w), torch.tensor(x), torch.tensor(y), 0.1, 0.5, torch.tensor(groups))
    assert float(got) == pytest.approx(_hand_loss(w, x, y, 0.1, 0.5, groups), rel=1e-9)
    unmasked = translation_loss(torch.tensor(w), torch.tensor(x), torch.tensor(y), 0.1, 0.5)
    assert float(unmasked) == pytest.approx(_hand_loss(w, x, y, 0.1, 0.5, list(range(5))), rel=1e-9)
    assert float(unmasked) != pytest.approx(float(got))


def test_fit_pulls_translations_together_and_reg_holds_the_identity():
    """Two 'languages' = one shared content plus a language offset along one axis: the fitted map shrinks that
    axis, so each text's translation becomes its nearest neighbour; a huge reg keeps W at the identity."""
    rng = np.random.default_rng(0)
    content = rng.normal(size=(200, 8))
    offset = np.zeros(8)
    offset[0] = 6.0
    x, y = content + offset, content - offset + 0.05 * rng.normal(size=(200, 8))
    x, y = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), \
        (y / np.linalg.norm(y, axis=1, keepdims=True)).astype(np.float32)

    def top1(w):
        a, b = x @ w.T, y @ w.T
        a, b = a / np.linalg.norm(a, axis=1, keepdims=True), b / np.linalg.norm(b, axis=1, keepdims=True)
        return float(np.mean((a @ b.T).argmax(1) == np.arange(len(a))))

    w, losses = fit_translation_map(x, y, config=MapConfig(steps=200, batch_size=64, lr=1e-2, reg=0.0))
    assert losses[-1] < losses[0] and top1(w) > top1(np.eye(8)) and top1(w) > 0.9
    assert abs(w[0, 0]) < 0.5 < min(abs(w[k, k]) for k in range(1, 8))
    stiff, _ = fit_translation_map(x, y, config=MapConfig(steps=50, batch_size=64, lr=1e-2, reg=1e4))
    assert np.abs(stiff - np.eye(8)).max() < 0.02


def test_mutual_nearest_pairs_and_groups(tmp_path):
    a = np.array([[1, 0], [0, 1], [0.9, 0.1]], dtype=np.float32)
    b = np.array([[0, 1], [1, 0]], dtype=np.float32)
    assert mutual_nearest_pairs(a, b) == [(0, 1), (1, 0)]  # a[2]'s nearest is b[1], whose nearest is a[0]
    assert mutual_nearest_pairs(a[:0], b) == []
    assert text_groups(["en1", "en1", "en2", "x"], ["de1", "fr1", "de2", "de2"]) == [0, 0, 1, 1]
    (tmp_path / "p.tsv").write_text("a dog\tein Hund\n\nthe cat\tdie Katze\n", encoding="utf-8")
    assert read_pairs(tmp_path / "p.tsv") == (["a dog", "the cat"], ["ein Hund", "die Katze"])
    (tmp_path / "bad.tsv").write_text("a dog\tein Hund\tun chien\nx\ty\n", encoding="utf-8")
    with pytest.raises(TwoTowerError, match="bad.tsv:1"):
        read_pairs(tmp_path / "bad.tsv")


def test_saved_model_applies_the_map(tiny_bert_dir, tmp_path):
    """The model written by align_translations encodes v ↦ normalise(W·v), W the map it reports fitting (refitted
    here from the same pairs and seed), v the original model's vectors."""
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.encoders.translation_align import align_translations

    pairs = [("the cat sleeps", "die Katze schläft"), ("a dog runs", "ein Hund läuft"),
             ("the tree is tall", "der Baum ist hoch"), ("fish swim", "Fische schwimmen"),
             ("the house is red", "das Haus ist rot"), ("birds fly", "Vögel fliegen")]
    (tmp_path / "pairs.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in pairs), encoding="utf-8")
    cfg = MapConfig(steps=20, batch_size=4, lr=1e-2, reg=0.1)
    opts = EncodeOptions(precision="fp32", show_progress=False)
    report = align_translations(str(tiny_bert_dir), tmp_path / "pairs.tsv", tmp_path / "out", config=cfg, opts=opts)
    assert report["n_pairs"] == 6 and report["texts"] == 12
    assert json.loads((tmp_path / "out" / "translation_map.json").read_text()) == report
    base = DualEncoder.load(str(tiny_bert_dir))
    texts = sorted({t for p in pairs for t in p})
    v = base.encode_documents(texts, opts)
    row = {t: i for i, t in enumerate(texts)}
    w, _ = fit_translation_map(v[[row[a] for a, _ in pairs]], v[[row[b] for _, b in pairs]],
                               text_groups(*zip(*pairs)), cfg)
    want = v @ w.T
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    got = DualEncoder.load(str(tmp_path / "out")).encode_documents(texts, opts)
    assert np.abs(got - want).max() < 1e-4
    with pytest.raises(TwoTowerError, match="not an empty folder"):
        align_translations(str(tiny_bert_dir), tmp_path / "pairs.tsv", tmp_path / "out", config=cfg, opts=opts)


def test_cli_writes_the_model_and_refuses_bad_pairs(tiny_bert_dir, tmp_path):
    from typer.testing import CliRunner

    from twotower.cli import app

    (tmp_path / "pairs.tsv").write_text("the cat\tdie Katze\na dog\tein Hund\nfish\tFische\n", encoding="utf-8")
    runner = CliRunner()
    res = runner.invoke(app, ["models", "align-translations", "--pairs", str(tmp_path / "pairs.tsv"), "--out",
                              str(tmp_path / "m"), "--model", str(tiny_bert_dir), "--steps", "3", "--batch-size", "2",
                              "--precision", "fp32", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "m" / "translation_map.json").read_text())["n_pairs"] == 3
    (tmp_path / "one.tsv").write_text("the cat\tdie Katze\n", encoding="utf-8")
    res = runner.invoke(app, ["models", "align-translations", "--pairs", str(tmp_path / "one.tsv"), "--out",
                              str(tmp_path / "m2"), "--model", str(tiny_bert_dir)])
    assert res.exit_code == 2 and "at least 2 needed" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "m2").exists()
