"""Find a BEIR data set on disk, or download it (with checksum) into a cache folder."""

from __future__ import annotations

import logging
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from tqdm.auto import tqdm

from twotower.checks import flag, option_name
from twotower.errors import DatasetNotFound
from twotower.io import check_output_dir, file_digest

log = logging.getLogger(__name__)

BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"
# Published in BEIR's README (md5 of the zip archive).
BEIR_MD5 = {
    "scifact": "5f7d1de60b170fc8027bb7898e2efca1",
    "nfcorpus": "a89dba18a62ef92f7d323ec890a0d38d",
    "arguana": "8ad3e3c2a5867cdced806d6503f29b99",
}


def _download(url: str, dest: Path, timeout: float) -> None:
    with urllib.request.urlopen(url, timeout=timeout) as response, dest.open("wb") as out:
        total = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"downloading {dest.name}") as bar:
            for block in iter(lambda: response.read(1 << 16), b""):
                out.write(block)
                bar.update(len(block))


def fetch_beir(
    name: str, cache_dir: str | Path, *, url: str | None = None, md5: str | None = None, timeout: float = 30.0
) -> Path:
    """Return ``cache_dir/name`` holding the BEIR data set, downloading it first if needed.

    The archive's MD5 is checked against BEIR's published value before anything is unpacked;
    the unpacked folder appears only once complete (unpacked beside it, then renamed).
    """
    cache_dir = Path(cache_dir)
    target = cache_dir / name
    check_output_dir(cache_dir, flag("cache"))  # a file there is named, not a FileExistsError from mkdir
    if (target / "corpus.jsonl").is_file():
        return target
    expected = md5 or BEIR_MD5.get(name)
    if expected is None:
        raise DatasetNotFound(f"no checksum known for BEIR data set '{name}': known are {', '.join(sorted(BEIR_MD5))}")
    url = url or BEIR_URL.format(name=name)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=f".{name}-") as tmp:
        archive = Path(tmp) / f"{name}.zip"
        try:
            _download(url, archive, timeout)
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            raise DatasetNotFound(
                f"could not download {url} ({exc}). Without network access, put the BEIR '{name}' directory "
                f"(corpus.jsonl, queries.jsonl, qrels/) at {target}, or give {option_name('data')} its path instead "
                "of the name."
            ) from None
        got = file_digest(archive, "md5")
        if got != expected:
            raise DatasetNotFound(f"{url}: checksum mismatch (md5 {got}, expected {expected}); nothing was unpacked")
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(tmp)
        unpacked = Path(tmp) / name
        if not (unpacked / "corpus.jsonl").is_file():
            raise DatasetNotFound(f"{url}: the archive holds no {name}/corpus.jsonl")
        shutil.move(str(unpacked), str(target))
    return target


def resolve_data(data: str | Path, cache_dir: str | Path, *, download: bool = True) -> Path:
    """``data`` if it is a directory, else the BEIR data set of that folder name from the cache or the web."""
    path = Path(data)
    if path.is_dir():
        return path
    if path.exists():
        raise DatasetNotFound(f"{path} is a file, not a data directory: give the folder that holds corpus.jsonl, "
                              f"queries.jsonl and qrels/ ({path.parent})")
    if path.suffix.lower() in (".jsonl", ".json", ".tsv", ".gz", ".zip", ".txt", ".csv"):
        raise DatasetNotFound(f"{path}: not found, and it names a file, not a BEIR data set, so nothing is fetched: "
                              f"give a BEIR folder (holding corpus.jsonl) or a data set name such as scifact")
    check_output_dir(cache_dir, flag("cache"))
    if not download:
        raise DatasetNotFound(f"{path}: data directory not found")
    return fetch_beir(path.name, cache_dir)
