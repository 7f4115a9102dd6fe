"""Files a user names are read through one checked reader (issue #35, case 2 and the kind "special files read without
a check"; case 8: an unwritable --out file is refused, not replaced)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, subprocess_env, write_beir

runner = CliRunner()
PY = sys.executable


def cli(*argv, timeout: float = 60.0, **env) -> subprocess.CompletedProcess:
    """The real CLI in a child process, killed after ``timeout`` s (a read blocking on a FIFO must fail the test,
    not hang the suite) and held to 6 GiB of address space (a read of /dev/zero must not eat the machine)."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    return subprocess.run([PY, "-m", "twotower.cli", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=subprocess_env(**env), preexec_fn=limit)


def finishes(fn, *args, timeout: float = 10.0):
    """``fn(*args)`` run in a daemon thread: its result, or the exception it raised; a call still blocked after
    ``timeout`` s (a read waiting on a FIFO) fails the test instead of hanging the suite."""
    out: list = []

    def call():
        try:
            out.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), f"{getattr(fn, '__name__', fn)}{args} blocked for {timeout} s"
    return out[0]


@pytest.fixture()
def fifo(tmp_path) -> Path:
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    return path


def result_json(tmp_path, **over) -> Path:
    row = {"retriever": "bm25", "model": None, "metrics": {"ndcg@10": 0.5}, "timings": {"queries_per_s": 10.0}}
    row.update(over)
    path = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(row))
    return path


# ---- the reader itself ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/null", "fifo", "dir"])
def test_reader_refuses_what_is_not_a_regular_file_without_reading(special, tmp_path, fifo):
    from twotower.errors import TwoTowerError
    from twotower.io import read_input_bytes

    path = {"fifo": fifo, "dir": tmp_path}.get(special, Path(special))
    result = finishes(read_input_bytes, path, "--x")
    assert isinstance(result, TwoTowerError) and "not a regular file" in str(result) and str(path) in str(result)


def test_reader_refuses_a_file_over_its_limit_and_reads_one_under_it(tmp_path):
    from twotower.errors import TwoTowerError
    from twotower.io import read_input_bytes, read_input_text

    path = tmp_path / "k.txt"
    path.write_bytes(b"\xef\xbb\xbfabc\n" + b"x" * 100)
    assert read_input_text(path, limit=200) == "abc\n" + "x" * 100  # BOM dropped
    with pytest.raises(TwoTowerError, match=r"--key .*k.txt: the key file is 107 bytes, more than the 50 bytes"):
        read_input_bytes(path, "--key", limit=50, what="key file")
    link = tmp_path / "link"
    link.symlink_to(path)
    assert read_input_bytes(link) == path.read_bytes()  # a link to a regular file is read


def test_reader_names_line_and_column_of_bytes_that_are_not_utf8(tmp_path):
    from twotower.errors import TwoTowerError
    from twotower.io import read_input_text

    path = tmp_path / "c.toml"
    path.write_bytes(b"a = 1\nb = \"x\xffy\"\n")
    with pytest.raises(TwoTowerError, match=r"c.toml, line 2: bytes that are not UTF-8 at column 7"):
        read_input_text(path)


# ---- through the commands -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("timings", [{"queries_per_s": "fast"}, {"queries_per_s": None}, {"queries_per_s": True},
                                     {"queries_per_s": [1]}, []])
def test_table_refuses_timings_that_are_not_numbers(tmp_path, timings):
    from twotower.cli import app

    path = result_json(tmp_path, timings=timings)
    res = runner.invoke(app, ["table", str(path)])
    assert res.exit_code == 2, res.output
    assert "timings" in res.output and str(path.name) in res.output and "Traceback" not in res.output


def test_table_without_timings_shows_a_dash(tmp_path):
    from twotower.cli import app

    path = tmp_path / "r.json"
    path.write_text(json.dumps({"retriever": "bm25", "metrics": {"ndcg@10": 0.25}}))
    res = runner.invoke(app, ["table", str(path)])
    assert res.exit_code == 0, res.output
    assert "0.2500" in res.output


def test_table_refuses_dev_zero_and_a_fifo_quickly(tmp_path, fifo):
    good = result_json(tmp_path)
    for special in ("/dev/zero", fifo):
        res = cli("table", good, special, timeout=60)
        assert res.returncode == 2, res.stderr
        assert "not a regular file" in res.stderr and str(special) in res.stderr and "Traceback" not in res.stderr


def test_serve_refuses_a_key_file_that_is_a_device_or_fifo(tmp_path, fifo):
    from twotower.errors import TwoTowerError
    from twotower.serve.auth import read_api_key

    for special in (fifo,):  # /dev/zero: through the CLI below, in a memory-capped child
        result = finishes(read_api_key, special)
        assert isinstance(result, TwoTowerError), result
        assert "--api-key-file" in str(result) and "not a regular file" in str(result)
    big = tmp_path / "big.key"
    big.write_bytes(b"k" * (2 << 20))
    with pytest.raises(TwoTowerError, match=r"--api-key-file .*big.key: the API key file is 2.0 MiB"):
        read_api_key(big)


def test_serve_cli_refuses_dev_zero_as_key_file_before_loading(tmp_path):
    res = cli("serve", "--index", tmp_path / "no-index", "--api-key-file", "/dev/zero", timeout=60)
    assert res.returncode == 2 and "not a regular file" in res.stderr, res.stderr


def test_key_file_with_a_bom_is_read(tmp_path):
    from twotower.serve.auth import read_api_key

    path = tmp_path / "api.key"
    path.write_bytes("\ufeff0123456789abcdef0123\r\n".encode("utf-8"))
    assert read_api_key(path) == "0123456789abcdef0123"


def test_beir_loader_refuses_a_fifo_corpus_without_blocking(tmp_path):
    data = write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    (data / "corpus.jsonl").unlink()
    os.mkfifo(data / "corpus.jsonl")
    res = cli("eval", "--data", data, "--retriever", "bm25", "--no-progress", timeout=60)
    assert res.returncode == 2 and "corpus.jsonl" in res.stderr and "regular file" in res.stderr, res.stderr


def test_train_config_refuses_dev_zero(tmp_path):
    from twotower.errors import TwoTowerError
    from twotower.training.config import TrainConfig

    link = tmp_path / "c.toml"
    link.symlink_to("/dev/zero")
    result = finishes(TrainConfig.from_toml, link)
    assert isinstance(result, TwoTowerError) and "not a regular file" in str(result), result


@pytest.mark.parametrize("command", ["fetch", "locate"])
def test_data_cache_that_is_a_file_is_named(tmp_path, command):
    from twotower.cli import app

    cache = tmp_path / "cache"
    cache.write_text("x")
    target = "scifact" if command == "fetch" else str(tmp_path / "scifact")
    res = runner.invoke(app, ["data", command, target, "--cache", str(cache)])
    assert res.exit_code == 2, res.output
    assert "--cache" in res.output and "not a directory" in res.output and "Traceback" not in res.output


def test_analyze_report_names_the_foreign_json_it_skipped(tmp_path):
    from twotower.cli import app

    (tmp_path / "results.json").write_text(json.dumps({"retriever": "bm25", "metrics": {}}))
    (tmp_path / "list.json").write_text("[1, 2]")
    res = runner.invoke(app, ["analyze", "report", "--out", str(tmp_path)])
    assert res.exit_code == 2, res.output
    assert "results.json" in res.output and "list.json" in res.output and "'analysis'" in res.output


# ---- case 8: an --out file without write permission ---------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any file mode")
def test_out_file_without_write_permission_is_refused_up_front(tmp_path):
    from twotower.errors import TwoTowerError
    from twotower.io import atomic_write_text, check_output_file

    out = tmp_path / "results.json"
    out.write_text("keep me")
    out.chmod(0o444)
    with pytest.raises(TwoTowerError, match=r"--out .*results.json.*read-only"):
        check_output_file(out, "--out")
    with pytest.raises(TwoTowerError, match="read-only"):
        atomic_write_text(out, "new")
    assert out.read_text() == "keep me" and stat.S_IMODE(out.stat().st_mode) == 0o444


def test_out_file_mode_check_does_not_depend_on_who_runs_it(tmp_path):
    """Root bypasses file modes, so the check reads the mode bits, not os.access: a 0444 file is refused for root too
    (the rename would otherwise replace a file its owner marked read-only)."""
    from twotower.cli import app

    data = write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    out = tmp_path / "results.json"
    out.write_text("keep me")
    out.chmod(0o444)
    res = runner.invoke(app, ["eval", "--data", str(data), "--retriever", "bm25", "--no-progress", "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "read-only" in res.output and out.read_text() == "keep me"
