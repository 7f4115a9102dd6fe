"""Data fetching: a missing folder with no reachable network gives a clear message; a good
archive installs after its checksum is verified; a bad checksum unpacks nothing."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from twotower.data.fetch import fetch_beir, resolve_data
from twotower.errors import DatasetNotFound


def _zip(tmp_path, name="scifact"):
    archive = tmp_path / f"{name}.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(f"{name}/corpus.jsonl", '{"_id": "d1", "title": "", "text": "x"}\n')
        zf.writestr(f"{name}/queries.jsonl", '{"_id": "q1", "text": "x"}\n')
        zf.writestr(f"{name}/qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    return archive, hashlib.md5(archive.read_bytes()).hexdigest()


def test_existing_directory_is_used_as_is(tiny_beir, tmp_path):
    assert resolve_data(tiny_beir, tmp_path / "cache") == tiny_beir


def test_missing_folder_without_network(tmp_path):
    missing = tmp_path / "data" / "scifact"
    with pytest.raises(DatasetNotFound) as err:
        fetch_beir("scifact", tmp_path / "cache", url="http://127.0.0.1:9/scifact.zip", timeout=5)
    text = str(err.value)
    assert text.startswith("could not download http://127.0.0.1:9/scifact.zip")
    assert f"put the BEIR 'scifact' directory (corpus.jsonl, queries.jsonl, qrels/) at {tmp_path / 'cache' / 'scifact'}" in text
    assert not (tmp_path / "cache" / "scifact").exists()
    assert not missing.exists()


def test_good_archive_installs(tmp_path):
    archive, md5 = _zip(tmp_path)
    out = fetch_beir("scifact", tmp_path / "cache", url=archive.as_uri(), md5=md5)
    assert (out / "corpus.jsonl").is_file() and out == tmp_path / "cache" / "scifact"
    assert fetch_beir("scifact", tmp_path / "cache", url="http://127.0.0.1:9/never-used.zip") == out


def test_bad_checksum_unpacks_nothing(tmp_path):
    archive, _ = _zip(tmp_path)
    with pytest.raises(DatasetNotFound, match=r"checksum mismatch .* nothing was unpacked"):
        fetch_beir("scifact", tmp_path / "cache", url=archive.as_uri(), md5="0" * 32)
    assert list((tmp_path / "cache").iterdir()) == []


def test_unknown_dataset_without_checksum(tmp_path):
    with pytest.raises(DatasetNotFound, match="no checksum known for BEIR data set 'mystery'"):
        fetch_beir("mystery", tmp_path)
