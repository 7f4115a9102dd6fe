#!/usr/bin/env python3
"""Carry a model that is too big for one call to the lent GPU machine, in parts (issue: GPU, mpnet's fit).

A `device` call carries at most 64 MiB, and what one call carries stays on the warm machine for the next. This
tool packs an installed model directory (e.g. ``mpnet-base``: 438 MB of fp32 weights) into parts that each fit one
call, and restores it there:

    python tools/gpu_model_pack.py pack mpnet-base            # → .gpu-models/mpnet-base/{manifest.json,part-*}
    # on the GPU machine, one call per part, back to back (a machine left idle 30 s is given back):
    #   run(command="ls .gpu-models/mpnet-base", carry=[".gpu-models/mpnet-base/manifest.json",
    #                                                    ".gpu-models/mpnet-base/part-000"])
    #   run(command="...", carry=[".gpu-models/mpnet-base/part-001"]) ...
    python3 tools/gpu_model_pack.py restore .gpu-models/mpnet-base   # → $TWOTOWER_HOME/models/mpnet-base
    python tools/gpu_model_pack.py verify .gpu-models/mpnet-base [--docs 64]   # here: restored vs packed vectors

The weights travel as fp16 (a tensor whose values fp16 cannot hold stays fp32) and are restored to fp32: each
weight is then exactly ``w.half().float()`` of the original. Every other file travels byte for byte. ``pack``
prints the carry list of each call. ``restore`` checks every part's size and SHA-256 before it writes anything,
names a part that is missing or damaged, and installs the model atomically where ``--model <name>`` finds it
(the registered name's default place), or in ``--dest``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from twotower.errors import TwoTowerError  # noqa: E402
from twotower.io import atomic_directory, atomic_write_json, check_output_dir  # noqa: E402

FP16_MAX = 65504.0
MANIFEST = "manifest.json"
CALL_LIMIT_MIB = 64


def _model_dir(model: str) -> tuple[str, Path]:
    """``(name, directory)`` of a registered model's installed copy, or of a model directory given by path."""
    from twotower.encoders.catalog import lookup, require_installed

    path = Path(model)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TwoTowerError(f"{path}: not a model directory (no config.json)")
        return path.resolve().name, path
    if lookup(model) is None:
        raise TwoTowerError(f"{model}: neither a registered model (twotower models list) nor a model directory")
    return lookup(model).name, require_installed(model)


def _half(data: bytes) -> tuple[bytes, list[str]]:
    """A safetensors file with its float tensors in fp16; the names of the tensors kept in fp32 (out of range)."""
    import torch
    from safetensors.torch import load, save

    tensors, kept = load(data), []
    for name, t in tensors.items():
        if t.is_floating_point() and t.dtype != torch.float16:
            if t.abs().max().item() > FP16_MAX:
                kept.append(name)
            else:
                tensors[name] = t.half()
    return save(tensors), kept


def _float(data: bytes) -> bytes:
    from safetensors.torch import load, save

    return save({k: t.float() if t.is_floating_point() else t for k, t in load(data).items()})


def pack(model: str, out: Path, chunk_mib: float) -> dict:
    name, src = _model_dir(model)
    dest = out / name
    check_output_dir(dest, "--out", replaced=True)
    buf, halved, kept = io.BytesIO(), [], {}
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            rel = path.relative_to(src).as_posix()
            data = path.read_bytes()
            if path.suffix == ".safetensors":
                data, kept[rel] = _half(data)
                halved.append(rel)
            info = tarfile.TarInfo(rel)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    stream = buf.getvalue()
    size = int(chunk_mib * (1 << 20))
    parts = []
    with atomic_directory(dest) as tmp:
        for i in range(0, len(stream), size):
            part = stream[i : i + size]
            fname = f"part-{len(parts):03d}"
            (tmp / fname).write_bytes(part)
            parts.append({"file": fname, "size": len(part), "sha256": hashlib.sha256(part).hexdigest()})
        manifest = {"model": name, "parts": parts, "fp16_files": halved, "kept_fp32": kept,
                    "stream_sha256": hashlib.sha256(stream).hexdigest(), "source": str(src)}
        atomic_write_json(tmp / MANIFEST, manifest)
    return manifest


def check_parts(folder: Path) -> tuple[dict, bytes]:
    """The manifest and the joined parts, after every part's size and SHA-256 is checked."""
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise TwoTowerError(f"{mpath} is missing: carry it (with the first part) in a call")
    try:
        manifest = json.loads(mpath.read_text())
        parts = manifest["parts"]
    except (OSError, ValueError, KeyError) as exc:
        raise TwoTowerError(f"{mpath}: unreadable manifest ({exc}): pack the model again") from None
    missing = [p["file"] for p in parts if not (folder / p["file"]).is_file()]
    if missing:
        raise TwoTowerError(f"{folder}: {len(missing)} of {len(parts)} parts missing ({', '.join(missing)}): carry "
                            f"each in a call (what a call carries stays on the warm machine for the next)")
    chunks = []
    for p in parts:
        data = (folder / p["file"]).read_bytes()
        if len(data) != p["size"] or hashlib.sha256(data).hexdigest() != p["sha256"]:
            raise TwoTowerError(f"{folder / p['file']}: {len(data)} bytes, SHA-256 does not match the manifest "
                                f"(expected {p['size']} bytes): carry it again")
        chunks.append(data)
    stream = b"".join(chunks)
    if hashlib.sha256(stream).hexdigest() != manifest.get("stream_sha256"):
        raise TwoTowerError(f"{folder}: the joined parts do not match the manifest: pack the model again")
    return manifest, stream


def restore(folder: Path, dest: Path | None) -> Path:
    """Check the parts in ``folder`` and install the model they hold in ``dest`` (default: the registered name's
    place)."""
    manifest, stream = check_parts(folder)
    if dest is None:
        from twotower.encoders.catalog import default_dest, lookup

        if lookup(manifest["model"]) is None:
            raise TwoTowerError(f"{manifest['model']} is not a registered model: give --dest")
        dest = default_dest(manifest["model"])
    check_output_dir(dest, "--dest", replaced=True)
    return _install(manifest, stream, dest)


def _install(manifest: dict, stream: bytes, dest: Path) -> Path:
    """Write the checked parts' files into ``dest`` (fp16 weights back to fp32), the whole folder in one rename."""
    halved = set(manifest["fp16_files"])
    with tarfile.open(fileobj=io.BytesIO(stream)) as tar, atomic_directory(dest) as tmp:
        members = [m for m in tar.getmembers() if m.isfile()]
        for m in members:
            if not (tmp / m.name).resolve().is_relative_to(tmp.resolve()):
                raise TwoTowerError(f"part stream names {m.name!r}, outside the model folder: pack the model again")
        for m in members:
            data = tar.extractfile(m).read()
            (tmp / m.name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / m.name).write_bytes(_float(data) if m.name in halved else data)
    return dest


def verify(folder: Path, docs: int) -> float:
    """Restore the parts into a temporary folder and encode the first ``docs`` SciFact documents with it and with
    the model it was packed from (fp32, torch, this machine): the smallest cosine between the two."""
    import tempfile

    import numpy as np

    from twotower.encoders.towers import DualEncoder, EncodeOptions

    manifest, stream = check_parts(folder)
    corpus = Path(os.environ.get("TWOTOWER_DATA", ROOT.parent / "shared" / "data")) / "scifact" / "corpus.jsonl"
    if not corpus.is_file():
        raise TwoTowerError(f"{corpus} not found: set TWOTOWER_DATA to the folder that holds scifact/")
    with corpus.open() as f:
        texts = [json.loads(line)["text"] for line, _ in zip(f, range(docs))]
    opts = EncodeOptions(precision="fp32", runtime="torch", show_progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        restored = _install(manifest, stream, Path(tmp) / "model")
        a = DualEncoder.load(manifest["source"]).encode_documents(texts, opts)
        b = DualEncoder.load(str(restored)).encode_documents(texts, opts)
    return float(np.min(np.sum(a * b, axis=1)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack", help="pack an installed model (name or directory) into parts")
    p.add_argument("model")
    p.add_argument("--out", default=".gpu-models", help="folder for <model>/manifest.json and parts")
    p.add_argument("--chunk-mib", type=float, default=56.0,
                   help=f"part size (MiB); a call carries {CALL_LIMIT_MIB} MiB with the working tree")
    r = sub.add_parser("restore", help="check the parts and install the model (fp32)")
    r.add_argument("folder")
    r.add_argument("--dest", default=None, help="model directory to write (default: where --model <name> looks)")
    v = sub.add_parser("verify", help="restore into a temporary folder and compare vectors with the packed model")
    v.add_argument("folder")
    v.add_argument("--docs", type=int, default=64, help="SciFact documents to encode with both")
    args = ap.parse_args(argv)
    try:
        if args.verb == "pack":
            if not 0 < args.chunk_mib < CALL_LIMIT_MIB:
                raise TwoTowerError(f"--chunk-mib {args.chunk_mib}: must be above 0 and below {CALL_LIMIT_MIB}")
            out = Path(args.out)
            m = pack(args.model, out, args.chunk_mib)
            folder = out / m["model"]
            print(f"packed {m['model']} into {len(m['parts'])} parts in {folder}; one call each, back to back:")
            for i, part in enumerate(m["parts"]):
                carry = ([str(folder / MANIFEST)] if i == 0 else []) + [str(folder / part["file"])]
                print(f"  call {i + 1}: carry={json.dumps(carry)}  ({part['size'] / (1 << 20):.1f} MiB)")
            print(f"then: python3 tools/gpu_model_pack.py restore {folder}")
        elif args.verb == "verify":
            if args.docs < 1:
                raise TwoTowerError(f"--docs {args.docs}: must be at least 1")
            print(f"{args.docs} SciFact documents: min cosine {verify(Path(args.folder), args.docs):.6f} between the "
                  "restored model's vectors and the packed model's (fp32, torch)")
        else:
            print(f"restored {restore(Path(args.folder), Path(args.dest) if args.dest else None)}")
    except TwoTowerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
