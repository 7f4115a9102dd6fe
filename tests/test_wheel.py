"""The project as a user installs it (issue #58): the wheel built from this checkout, installed into a fresh virtual
environment, runs the Python quickstart's first lines and ``tt.create_app(index)`` with its search page.

Nothing is downloaded: the wheel is built without build isolation (this interpreter's setuptools), installed with
``--no-deps --no-index``, and the new environment sees this interpreter's installed packages (torch, FAISS, the
default model, FastAPI) through a ``.pth`` line, not this checkout: a file the wheel leaves out fails here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "twotower"

pytestmark = pytest.mark.slow  # a wheel, a virtual environment and the default model: about a minute

SCRIPT = textwrap.dedent('''
    import json, sys
    from pathlib import Path

    import twotower as tt
    from fastapi.testclient import TestClient

    # the Python quickstart's first lines (docs/getting-started/quickstart-python.md)
    texts = [
        "Cats are small domesticated felines that purr.",
        "Green tea is brewed from the leaves of Camellia sinensis.",
        "Rust is a systems programming language focused on memory safety.",
    ]
    index = tt.Index.build("my-index", texts, metadatas=[{"topic": "pets"}, {"topic": "drinks"}, {"topic": "code"}],
                           show_progress=False)
    first = [hit.text for hit in index.search("which animal purrs", k=2)]
    index.add(["Dogs are loyal companions that bark."], metadatas=[{"topic": "pets"}])
    pets = [hit.text for hit in index.search("a pet", k=5, filter={"topic": "pets"})]

    # the service over the index just built, with its page
    client = TestClient(tt.create_app(index, api_key="wheel-key-0123456789"))
    page = client.get("/")
    assets = {name: client.get("/static/" + name) for name in ("search.js", "search.css")}
    search = client.post("/search", json={"query": "a pet", "k": 5, "filter": {"topic": "pets"}})
    print(json.dumps({
        "twotower": tt.__file__, "first": first, "pets": pets,
        "page": [page.status_code, page.headers["content-type"], "search-form" in page.text],
        "assets": {n: [r.status_code, len(r.content)] for n, r in assets.items()},
        "info": client.get("/info").json(),
        "search": [search.status_code, [h["metadata"] for h in search.json()["hits"]]],
    }))
''')


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{cmd}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout, built from a copy of it (pip builds in place: no build/ or egg-info here)."""
    pytest.importorskip("setuptools")
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(work / "dist")], env={**os.environ, "PIP_NO_INPUT": "1"})
    (built,) = (work / "dist").glob("twotower-*.whl")
    return built


def test_the_wheel_holds_every_file_of_the_package(wheel):
    """Every file of src/twotower that git tracks (its data files, the search page's among them) is in the wheel."""
    tracked = run(["git", "ls-files", "src/twotower"], cwd=ROOT).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout: no list of the package's files")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [p for p in tracked if p.removeprefix("src/") not in names]
    assert not missing, f"left out of the wheel (pyproject.toml [tool.setuptools.package-data]): {missing}"
    assert {"twotower/serve/static/index.html", "twotower/serve/static/search.js",
            "twotower/serve/static/search.css"} <= names


def test_the_installed_wheel_serves_the_index_it_builds(wheel, tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    # the packages this interpreter has (torch, FAISS, the default model, FastAPI), not this checkout's src:
    # a plain path line; the .pth files of that folder (this checkout's editable install) are not read
    purelib = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (purelib / "zz_host_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check", str(wheel)])

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TWOTOWER_HOME=str(tmp_path / "home"))
    work = tmp_path / "work"
    work.mkdir()
    out = json.loads(run([str(python), "-c", SCRIPT], cwd=work, env=env).stdout.strip().splitlines()[-1])

    assert Path(out["twotower"]).is_relative_to(purelib), out["twotower"]  # the wheel's, not this checkout's
    assert out["first"][0] == "Cats are small domesticated felines that purr."
    assert out["pets"] == ["Dogs are loyal companions that bark.", "Cats are small domesticated felines that purr."]
    assert out["page"] == [200, "text/html; charset=utf-8", True]
    for name in ("search.js", "search.css"):
        size = (PACKAGE / "serve" / "static" / name).stat().st_size
        assert out["assets"][name] == [200, size]
    assert out["info"]["documents"] == 4 and out["info"]["metadata_fields"] == ["topic"]
    assert out["search"] == [200, [{"topic": "pets"}, {"topic": "pets"}]]

    # the command line the wheel installs
    cli = run([str(venv / "bin" / "twotower"), "--help"], cwd=work, env=env)
    assert "serve" in cli.stdout
