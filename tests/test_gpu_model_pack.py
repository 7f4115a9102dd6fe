"""tools/gpu_model_pack.py: a model carried to the GPU machine in parts comes back whole, or not at all."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("gpu_model_pack", ROOT / "tools" / "gpu_model_pack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def packed(tool, tiny_bert_dir, tmp_path):
    """The tiny BERT packed in parts of 64 KiB (several parts): ``(source dir, parts folder)``."""
    src = tmp_path / "tiny"
    shutil.copytree(tiny_bert_dir, src)
    assert tool.main(["pack", str(src), "--out", str(tmp_path / "carry"), "--chunk-mib", "0.0625"]) == 0
    return src, tmp_path / "carry" / "tiny"


def test_round_trip_restores_fp32_weights_rounded_through_fp16_and_every_other_file_as_is(tool, packed, tmp_path):
    src, folder = packed
    manifest = json.loads((folder / "manifest.json").read_text())
    assert len(manifest["parts"]) > 3 and manifest["fp16_files"] == ["model.safetensors"]
    carried = sum(p["size"] for p in manifest["parts"])
    assert carried < 0.6 * sum(f.stat().st_size for f in src.rglob("*") if f.is_file())  # the weights went in half
    dest = tmp_path / "restored"
    assert tool.main(["restore", str(folder), "--dest", str(dest)]) == 0
    before, after = load_file(src / "model.safetensors"), load_file(dest / "model.safetensors")
    assert before.keys() == after.keys()
    for name, w in before.items():
        assert after[name].dtype == w.dtype
        assert torch.equal(after[name], w.half().float() if w.is_floating_point() else w), name
    assert any(not torch.equal(after[n], w) for n, w in before.items())  # fp16 really was the carrier
    for f in src.rglob("*"):
        if f.is_file() and f.suffix != ".safetensors":
            assert (dest / f.relative_to(src)).read_bytes() == f.read_bytes(), f.name

    from twotower.encoders.towers import DualEncoder, EncodeOptions

    texts = ["vitamin D and bone fractures", "a niche for mesenchymal stem cells", "SiO2 nanoparticles"]
    opts = EncodeOptions(precision="fp32", runtime="torch", show_progress=False)
    a = DualEncoder.load(str(src)).encode_documents(texts, opts)
    b = DualEncoder.load(str(dest)).encode_documents(texts, opts)
    assert np.min(np.sum(a * b, axis=1)) > 0.9999


def test_a_tensor_beyond_fp16_range_travels_in_fp32(tool, tmp_path):
    src = tmp_path / "big"
    src.mkdir()
    (src / "config.json").write_text("{}")
    big = torch.tensor([1.0, 70000.0, -3.3])
    save_file({"big": big, "small": torch.tensor([0.1, 0.2]), "ids": torch.arange(3)}, src / "model.safetensors")
    assert tool.main(["pack", str(src), "--out", str(tmp_path / "c")]) == 0
    assert json.loads((tmp_path / "c/big/manifest.json").read_text())["kept_fp32"] == {"model.safetensors": ["big"]}
    assert tool.main(["restore", str(tmp_path / "c/big"), "--dest", str(tmp_path / "out")]) == 0
    back = load_file(tmp_path / "out/model.safetensors")
    assert torch.equal(back["big"], big) and torch.equal(back["ids"], torch.arange(3))
    assert torch.equal(back["small"], torch.tensor([0.1, 0.2]).half().float())


@pytest.mark.parametrize("damage", ["missing", "flipped", "short"])
def test_a_missing_or_damaged_part_is_named_and_nothing_is_written(tool, packed, tmp_path, capsys, damage):
    _, folder = packed
    part = folder / "part-001"
    if damage == "missing":
        part.unlink()
    elif damage == "flipped":
        data = bytearray(part.read_bytes())
        data[100] ^= 1
        part.write_bytes(bytes(data))
    else:
        part.write_bytes(part.read_bytes()[:-1])
    dest = tmp_path / "restored"
    assert tool.main(["restore", str(folder), "--dest", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "part-001" in err and "carry" in err and "Traceback" not in err
    assert not dest.exists()


def test_restore_installs_a_registered_model_where_model_name_finds_it(tool, tiny_bert_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TWOTOWER_HOME", str(tmp_path / "home"))
    src = tmp_path / "mpnet-base"
    shutil.copytree(tiny_bert_dir, src)
    (src / ".twotower-model.json").write_text(json.dumps({"name": "mpnet-base"}))
    assert tool.main(["pack", str(src), "--out", str(tmp_path / "c")]) == 0
    assert tool.main(["restore", str(tmp_path / "c/mpnet-base")]) == 0

    from twotower.encoders.catalog import installed_path

    assert installed_path("mpnet-base") == tmp_path / "home/models/mpnet-base"


@pytest.mark.parametrize("argv, message", [
    (["pack", "{tmp}", "--chunk-mib", "64"], "--chunk-mib 64.0: must be above 0 and below 64"),
    (["pack", "{tmp}", "--chunk-mib", "0"], "--chunk-mib 0.0"),
    (["pack", "{tmp}"], "not a model directory (no config.json)"),
    (["pack", "no-such-model"], "neither a registered model"),
    (["restore", "{tmp}"], "manifest.json is missing"),
])
def test_bad_input_stops_with_a_message(tool, tmp_path, capsys, argv, message):
    assert tool.main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_restore_refuses_to_replace_a_file(tool, packed, tmp_path, capsys):
    _, folder = packed
    dest = tmp_path / "a-file"
    dest.write_text("keep me")
    assert tool.main(["restore", str(folder), "--dest", str(dest)]) == 2
    assert dest.read_text() == "keep me" and "not a directory" in capsys.readouterr().err


def test_verify_compares_the_restored_vectors_with_the_packed_models(tool, packed, tmp_path, capsys, monkeypatch):
    _, folder = packed
    data = tmp_path / "data" / "scifact"
    data.mkdir(parents=True)
    (data / "corpus.jsonl").write_text("".join(json.dumps({"_id": str(i), "text": t}) + "\n" for i, t in
                                               enumerate(["cats purr", "vitamin D and bones", "stem cells"])))
    monkeypatch.setenv("TWOTOWER_DATA", str(tmp_path / "data"))
    assert tool.main(["verify", str(folder), "--docs", "3"]) == 0
    cosine = float(capsys.readouterr().out.split("min cosine ")[1].split()[0])
    assert 0.9999 < cosine <= 1.000001
    monkeypatch.setenv("TWOTOWER_DATA", str(tmp_path / "nowhere"))
    assert tool.main(["verify", str(folder), "--docs", "3"]) == 2
    assert "set TWOTOWER_DATA" in capsys.readouterr().err
