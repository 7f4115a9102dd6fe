"""The search page of ``twotower serve`` (issue #46): served at ``/`` with its form, its script calling endpoints
that exist and reading fields they answer, behind the same key as the API (the key as a Basic password for a
browser), the query's terms marked by the server as plain-text pieces (serve.highlight), and, where Chromium is
installed, the page run in a real headless browser."""

from __future__ import annotations

import base64
import json
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, urljoin

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, write_beir  # noqa: E402

KEY = "page-key-0123456789"
HEADERS = {"X-API-Key": KEY}
STATIC = Path(__file__).resolve().parents[1] / "src" / "twotower" / "serve" / "static"
SCRIPT = (STATIC / "search.js").read_text(encoding="utf-8")

# a document whose every field holds markup: the page must show it as text
MARKUP = {"_id": "<b>id</b>", "title": "<img src=x onerror=alert(1)> Purrs & <b>cats</b>",
          "text": "Cats <script>alert('x')</script> purr &amp; <i>purr</i> again.",
          "metadata": {"year": 2021, "cohort": {"size": 3270}, "tags": ["<b>x</b>"]}}


def make_client(index: Path, api_key: str | None = KEY, **kwargs):
    from conftest import serve_client

    return serve_client(index, api_key, **kwargs)


def basic(password: str, user: str = "anyone") -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


class Elements(HTMLParser):
    """Every start tag of a page as (tag, attributes)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def by_id(self, ident: str) -> tuple[str, dict]:
        found = [t for t in self.tags if t[1].get("id") == ident]
        assert len(found) == 1, (ident, found)
        return found[0]


# ---------------------------------------------------------------------------------------------
# the page and its files


def test_the_page_holds_its_form_and_loads_only_its_own_files(served_index):
    c = make_client(served_index)
    page = c.get("/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "default-src 'none'" in csp
    html = Elements(page.text)
    assert html.by_id("search-form")[0] == "form"
    assert html.by_id("q")[0] == "input" and html.by_id("q")[1]["type"] == "search"
    assert html.by_id("k")[1]["type"] == "number"
    assert html.by_id("filter")[0] == "input" and "hidden" in html.by_id("filter-row")[1]  # until /info says
    assert html.by_id("hits")[0] == "ol" and html.by_id("status")[0] == "p"
    modes = [a["value"] for t, a in html.tags if t == "input" and a.get("name") == "mode"]
    assert modes == ["dense", "bm25", "hybrid"]
    assert [a["type"] for t, a in html.tags if t == "button"] == ["submit"]  # Enter in any field searches

    # what it loads: its own script and style sheet, by relative address, nothing from elsewhere
    loads = [a.get("src") or a.get("href") for t, a in html.tags if t in ("script", "link", "img", "iframe")]
    assert sorted(loads) == ["data:,", "static/search.css", "static/search.js"], loads
    types = {"static/search.js": "text/javascript", "static/search.css": "text/css"}
    for path, kind in types.items():
        r = c.get(urljoin("/", path))
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), path
        assert r.text == (STATIC / path.split("/")[1]).read_text(encoding="utf-8")
        code = re.sub(r"/\*.*?\*/|^\s*//.*?$", "", r.text, flags=re.S | re.M)  # comments out
        assert not re.search(r"https?:|//[a-z0-9]|@import|url\(|import\(", code), path
    assert not re.search(r"https?://|<script>|\son[a-z]+=|style=", page.text)  # no inline code, nothing remote
    assert c.get("/static/index.html").status_code == 404 and c.get("/static/../app.py").status_code == 404
    assert c.get("/static/nothing.js").status_code == 404


def test_the_script_builds_text_nodes_never_html():
    """Document text reaches the page through textContent and text nodes: none of the APIs that parse HTML."""
    for api in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                "setAttribute(\"on", "DOMParser", "createContextualFragment"):
        assert api not in SCRIPT, api
    assert "textContent" in SCRIPT and "createTextNode" in SCRIPT


def fetched() -> dict[str, str]:
    """The endpoints the script fetches, as ``{name: method}`` (``fetch(api("NAME"), GET | post(...))``)."""
    calls = re.findall(r"fetch\(api\(\"([^\"]+)\"\),\s*(GET|post\()", SCRIPT)
    assert len(calls) == SCRIPT.count("fetch("), "a fetch the test does not read: write it as fetch(api(NAME), ...)"
    return {name: "GET" if how == "GET" else "POST" for name, how in calls}


def fields_read(name: str) -> set[str]:
    """The fields the script reads off an object it calls ``name`` (``info.modes`` → modes)."""
    return set(re.findall(rf"\b{re.escape(name)}\.([a-z_]+)\b", SCRIPT)) - {"length", "includes", "join", "map"}


def test_the_script_calls_endpoints_that_answer_with_the_fields_it_reads(served_index):
    c = make_client(served_index)
    assert fetched() == {"info": "GET", "search": "POST"}
    info = c.get(urljoin("/", "info"))
    assert info.status_code == 200, info.text
    body = info.json()
    assert fields_read("info") <= set(body), fields_read("info") - set(body)
    assert {"modes", "default_mode", "metadata_fields", "max_k"} <= fields_read("info")

    # the body the page sends: query, highlight, k, mode, filter (the script's own names)
    sent = set(re.findall(r"body\.([a-z]+) =", SCRIPT)) | {"query", "highlight"}
    assert sent == {"query", "highlight", "k", "mode", "filter"}
    r = c.post(urljoin("/", "search"), json={"query": "purring cats", "highlight": True, "k": 3, "mode": "hybrid",
                                             "filter": {"lang": {"$exists": False}}})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert fields_read("answer") <= set(answer)
    hit = answer["hits"][0]
    assert (fields_read("hit") - {"highlight"}) <= set(hit) and {"id", "score", "title", "metadata"} <= fields_read("hit")
    assert fields_read("highlight") == {"title", "text", "cut_before", "cut_after", "lead"}
    assert set(hit["highlight"]) == {"title", "text", "cut_before", "cut_after"}  # a titled document: no lead
    untitled = c.post("/search", json={"query": "mitochondria", "highlight": True, "k": 1, "mode": "bm25"}).json()
    assert set(untitled["hits"][0]["highlight"]) == {"title", "text", "cut_before", "cut_after", "lead"}
    assert fields_read("lead") == set(untitled["hits"][0]["highlight"]["lead"]) == {"text", "cut_after"}
    assert fields_read("piece") == {"text", "match"} and set(hit["highlight"]["text"][0]) == {"text", "match"}
    # what the error display reads: detail, a list of {loc, msg} for a 422
    bad = c.post("/search", json={"query": "x", "filter": {"year": {"$after": 1}}})
    assert bad.status_code == 422 and {"loc", "msg"} <= set(bad.json()["detail"][0])
    assert "filter" in bad.json()["detail"][0]["loc"] and "$after" in bad.json()["detail"][0]["msg"]


# ---------------------------------------------------------------------------------------------
# /info: what the page offers


def test_info_names_the_modes_and_the_metadata_fields(served_index, tmp_path, tiny_bert_dir):
    c = make_client(served_index)
    info = c.get("/info").json()
    assert info == {"version": "v000001", "documents": 6, "model": str(tiny_bert_dir), "modes": ["dense", "bm25",
                    "hybrid", "rrf"], "default_mode": "hybrid", "metadata_fields": [], "max_k": 1000,
                    "max_query_chars": 2048, "passages": 6}  # an index of passages: here one a document
    assert c.post("/documents", json={"documents": [MARKUP]}, headers=HEADERS).status_code == 200
    info = c.get("/info").json()
    assert info["metadata_fields"] == ["cohort.size", "tags", "year"] and info["documents"] == 7
    assert info["version"] == "v000002"

    from twotower.retrieval.indexing import EncodeConfig, build_index

    data = write_beir(tmp_path / "tiny", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    build_index(data, tmp_path / "dense-only", model=str(tiny_bert_dir), cfg=EncodeConfig(show_progress=False))
    assert make_client(tmp_path / "dense-only").get("/info").json()["modes"] == ["dense"]


# ---------------------------------------------------------------------------------------------
# auth: the page behind the same key as the API


PAGE = ["/", "/static/search.js", "/static/search.css"]


def test_keyed_reads_refuse_the_page_and_the_api_alike_without_the_key(served_index):
    c = make_client(served_index, open_reads=False)
    search = {"query": "purr", "mode": "bm25"}

    def calls(headers):
        return {**{p: c.get(p, headers=headers) for p in PAGE + ["/info"]},
                "/search": c.post("/search", json=search, headers=headers)}

    # without credentials: 401 everywhere; the page's challenge makes a browser ask for the key
    for path, r in calls({}).items():
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", (path, r.status_code)
        assert "text/html" not in r.headers["content-type"] and "purr" not in r.text
        challenge = r.headers["www-authenticate"]
        assert challenge == ('Basic realm="twotower search", charset="UTF-8"' if path in PAGE else "ApiKey"), path
    # with the key, as a browser sends it (Basic, any user name) or as the API's header: everything answers
    for headers in (basic(KEY), basic(KEY, user=""), HEADERS):
        for path, r in calls(headers).items():
            assert r.status_code == 200, (path, headers, r.text[:200])
        assert calls(headers)["/search"].json()["hits"][0]["id"] == "d1"
    # a wrong key: the page challenges again (the browser asks again); the API answers 403 as before
    for path, r in calls(basic(KEY + "x")).items():
        if path in PAGE:
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic "), path
            assert r.json()["detail"].startswith("wrong API key"), path
        else:
            assert r.status_code == 403 and r.json()["detail"] == "wrong API key", path
    for path, r in calls({"X-API-Key": "not-the-key-at-all"}).items():
        assert r.status_code == 403, path
    # an X-API-Key header decides when both are sent (the API's contract), and a Basic password no key
    assert c.get("/", headers={**basic(KEY), "X-API-Key": "not-the-key-at-all"}).status_code == 403
    for header in ("Basic !!!", "Basic " + base64.b64encode(KEY.encode()).decode(), "Bearer " + KEY, "Basic"):
        assert c.get("/", headers={"Authorization": header}).status_code == 401, header
    assert c.get("/healthz").status_code == 200  # liveness stays open


def test_a_browsers_credentials_never_write(served_index):
    """The Basic password counts for reads only: credentials a browser adds by itself cannot change the index."""
    for open_reads in (True, False):
        c = make_client(served_index, open_reads=open_reads)
        r = c.post("/documents", json={"documents": [{"_id": "x1", "text": "t"}]}, headers=basic(KEY))
        assert r.status_code == 401 and r.headers["www-authenticate"] == "ApiKey", r.text
        assert c.delete("/documents/d1", headers=basic(KEY)).status_code == 401
        assert c.get("/documents/x1", headers=HEADERS).status_code == 404
        assert c.get("/documents/d1", headers=HEADERS).status_code == 200


def test_open_reads_serve_the_page_to_anyone(served_index):
    for api_key in (KEY, None):
        c = make_client(served_index, api_key=api_key)
        for path in PAGE + ["/info"]:
            assert c.get(path).status_code == 200, (api_key, path)
        assert c.post("/documents", json={"documents": ["t"]}).status_code == (401 if api_key else 403)


def test_basic_password():
    from twotower.serve.auth import basic_password

    def enc(s: bytes) -> str:
        return base64.b64encode(s).decode()

    assert basic_password("Basic " + enc(b"user:pa:ss word")) == "pa:ss word"
    assert basic_password("basic  " + enc(b":key")) == "key"
    for header in (None, "", "Basic", "Basic " + enc(b"no-colon"), "Basic not*base64", "Bearer " + enc(b"a:b"),
                   "Basic " + enc(b"u:\xff\xfe")):
        assert basic_password(header) is None, header


# ---------------------------------------------------------------------------------------------
# highlighting: plain-text pieces, the query's terms as BM25 sees them


def joined(pieces) -> str:
    return "".join(p["text"] for p in pieces)


def marks(pieces) -> list[str]:
    return [p["text"] for p in pieces if p["match"]]


def test_search_marks_the_query_terms_as_plain_text_pieces(served_index):
    c = make_client(served_index)
    assert c.post("/documents", json={"documents": [MARKUP]}, headers=HEADERS).status_code == 200
    r = c.post("/search", json={"query": "the cat purrs", "k": 10, "mode": "bm25", "highlight": True})
    assert r.status_code == 200, r.text
    hits = {h["id"]: h for h in r.json()["hits"]}
    assert set(hits) == {"d1", "<b>id</b>"}
    d1 = hits["d1"]["highlight"]
    # the pieces give the text back unchanged; "Cats", "purr" and "Purrs" give the query's terms (stemmed)
    assert joined(d1["text"]) == TINY_CORPUS[0]["text"] and not d1["cut_before"] and not d1["cut_after"]
    assert marks(d1["text"]) == ["Cats", "purr"] and marks(d1["title"]) == ["Cats"]
    m = hits["<b>id</b>"]["highlight"]
    assert joined(m["title"]) == MARKUP["title"] and joined(m["text"]) == MARKUP["text"]  # markup kept as text
    assert marks(m["title"]) == ["Purrs", "cats"]  # "the" is a stopword: never marked
    assert marks(m["text"]) == ["Cats", "purr", "purr"]
    assert ["<script>alert('x')</script>" in p["text"] for p in m["text"]].count(True) == 1
    assert all("<mark" not in p["text"] for p in m["text"] + m["title"])
    assert hits["<b>id</b>"]["metadata"] == MARKUP["metadata"]

    # without "highlight" the answer is as it was (no highlight field), for both search endpoints
    plain = c.post("/search", json={"query": "purr", "mode": "bm25"}).json()["hits"]
    assert all(set(h) == {"id", "score", "title", "metadata", "passages"} for h in plain)
    batch = c.post("/search/batch", json={"queries": ["purr", "green tea"], "k": 1, "mode": "bm25",
                                          "highlight": True}).json()["results"]
    assert [marks(r[0]["highlight"]["text"]) for r in batch] == [["purr", "purr"], ["Green", "tea"]]
    assert "highlight" not in c.post("/search/batch", json={"queries": ["tea"], "k": 1}).json()["results"][0][0]
    for bad in ("yes", 1, None):
        assert c.post("/search", json={"query": "tea", "highlight": bad}).status_code == 422, bad


def test_a_long_text_shows_a_window_around_its_matches(served_index):
    c = make_client(served_index)
    filler = "Lorem ipsum dolor sit amet consectetur. " * 60
    text = filler + "Volcanoes erupt and lava flows down the volcano slopes. " + filler
    doc = {"_id": "long", "title": "Geology", "text": text}
    assert c.post("/documents", json={"documents": [doc]}, headers=HEADERS).status_code == 200
    hit = c.post("/search", json={"query": "volcano lava", "mode": "bm25", "k": 1, "highlight": True}).json()["hits"][0]
    h = hit["highlight"]
    window = joined(h["text"])
    assert hit["id"] == "long" and h["cut_before"] and h["cut_after"]
    assert window in text and 150 <= len(window) <= 300
    assert marks(h["text"]) == ["Volcanoes", "lava", "volcano"]
    at = text.index(window)
    assert text[at - 1] == " " and text[at + len(window)] == " "  # cut between words
    # no match at all (a dense hit): the start of the passage that matched (long documents are split: #52)
    dense = c.post("/search", json={"query": "unrelated words", "mode": "dense", "k": 20, "highlight": True}).json()
    long_hit = next(x for x in dense["hits"] if x["id"] == "long")
    passage, shown = long_hit["passages"][0], long_hit["highlight"]
    assert text[passage["start"]:passage["end"]] == passage["text"] and passage["text"].startswith(joined(shown["text"]))
    assert shown["cut_before"] == (passage["start"] > 0) and shown["cut_after"]
    assert marks(shown["text"]) == []


def test_highlighter_languages_and_windows():
    from twotower.serve.highlight import WINDOW_CHARS, Highlighter, choose_window, segments

    en = Highlighter(None)
    t = en.terms("Which feline purrs in the garden?")
    assert t == {"which", "felin", "purr", "garden"}
    assert en.title("Felines purr; gardens", t).segments == [("Felines", True), (" ", False), ("purr", True),
                                                             ("; ", False), ("gardens", True)]
    de = Highlighter({"language": "de"})
    assert [s for s, m in de.title("Das Haus und die Häuser", de.terms("häuser")).segments if m] == ["Haus", "Häuser"]
    zh = Highlighter({"language": "zh"})
    assert zh.title("我喜欢绿茶和红茶", zh.terms("绿茶")).segments == [("我喜欢", False), ("绿茶", True), ("和红", False),
                                                                   ("茶", True)]
    # an index whose BM25 dropped stopwords and stemming marks exactly the words
    raw = Highlighter({"language": "en", "stopwords": "", "stemmer": ""})
    assert [s for s, m in raw.title("the cats purr", raw.terms("the purr")).segments if m] == ["the", "purr"]

    # windows: the densest run of matches, cut at spaces; the whole text when short
    text = " ".join(f"w{i}" for i in range(400))
    spans = [(text.index(" w100 ") + 1, text.index(" w100 ") + 5, "a"), (text.index(" w300 ") + 1,
             text.index(" w300 ") + 5, "b"), (text.index(" w305 ") + 1, text.index(" w305 ") + 5, "c")]
    start, end = choose_window(text, spans, WINDOW_CHARS)
    assert start <= spans[1][0] and spans[2][1] <= end and end - start <= WINDOW_CHARS
    assert text[start - 1] == " " and text[end] == " "
    assert choose_window("short", [], WINDOW_CHARS) == (0, 5)
    assert segments("abcdef", [(1, 2, "x"), (4, 6, "y")], 0, 6) == [("a", False), ("b", True), ("cd", False),
                                                                    ("ef", True)]
    assert segments("abcdef", [(1, 2, "x"), (4, 6, "y")], 2, 5) == [("cd", False), ("e", True)]


# ---------------------------------------------------------------------------------------------
# the page in a real headless browser (Chromium from the package manager), where one is installed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def live_server(served_index):
    """The keyed-reads service on loopback (uvicorn in a thread), with the markup document added."""
    import httpx
    import uvicorn

    from twotower.serve.app import create_app

    app = create_app(served_index, api_key=KEY, open_reads=False, precision="fp32")
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not answer /healthz"
        time.sleep(0.1)
    assert httpx.post(base + "/documents", json={"documents": [MARKUP]}, headers=HEADERS).status_code == 200
    yield port
    server.should_exit = True
    thread.join(timeout=15)


def rendered(port: int, query: str, password: str = KEY) -> str:
    """The page's DOM once its scripts ran (``--dump-dom``), opened with the key as the Basic password."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    with tempfile.TemporaryDirectory() as profile:  # a profile of its own: no lock shared with another Chromium
        result = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                 f"--user-data-dir={profile}", "--virtual-time-budget=15000", "--dump-dom",
                                 f"http://page:{quote(password, safe='')}@127.0.0.1:{port}/?{query}"],
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def text_of(dom: str, ident: str) -> str:
    m = re.search(rf'<[a-z0-9]+ id="{ident}"[^>]*>(.*?)</', dom, re.S)
    assert m, ident
    return m.group(1)


@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")),
                    reason="no chromium on PATH (apt-get install chromium)")
def test_the_page_in_headless_chromium(live_server):
    dom = rendered(live_server, "q=the+cat+purrs&mode=bm25&k=5")
    status = text_of(dom, "status")
    assert re.match(r"2 hits · server \d+(\.\d)? ms · round trip \d+(\.\d)? ms · v000002$", status), status
    assert re.search(r'<input type="radio" name="mode" value="bm25"[^>]*>', dom)
    assert dom.count('<li class="hit">') == 2
    # the marks are elements; the document's markup is text (escaped in the dump), never elements
    assert "<mark>purr</mark>" in dom and "<mark>Cats</mark>" in dom and "<mark>Purrs</mark>" in dom
    assert "&lt;img src=x onerror=alert(1)&gt; <mark>Purrs</mark> &amp; &lt;b&gt;<mark>cats</mark>&lt;/b&gt;" in dom
    assert "&lt;script&gt;alert('x')&lt;/script&gt;" in dom and "<img" not in dom and "<b>" not in dom
    assert '<bdi class="key">cohort.size</bdi><bdi class="value">3270</bdi>' in dom
    assert 'id="filter-row" class="filter-row" hidden' not in dom  # the index has metadata: the filter is offered

    # a filter the server refuses (422): its message under the filter box, no hits
    dom = rendered(live_server, "q=purr&filter=" + quote(json.dumps({"year": {"$after": 2020}})))
    assert "unknown operator '$after'" in text_of(dom, "filter-error") and '<li class="hit">' not in dom
    # a filter that is not JSON never leaves the page
    dom = rendered(live_server, "q=purr&filter=" + quote("{year: 2021"))
    assert text_of(dom, "filter-error").startswith("not JSON")
    # a filter that matches
    dom = rendered(live_server, "q=purr&mode=bm25&filter=" + quote(json.dumps({"cohort.size": {"$gte": 1000}})))
    assert dom.count('<li class="hit">') == 1 and "1 hit ·" in text_of(dom, "status")
    # a wrong key: the page is refused and shows nothing of the index
    dom = rendered(live_server, "q=purr", password="not-the-key-at-all")
    assert "purr" not in dom.replace("q=purr", "") and '<li class="hit">' not in dom


# ---------------------------------------------------------------------------------------------
# what a person sees (issue #53): untitled documents, long titles, bidi characters, leaf fields

LONG_TITLE = "Green tea and its many properties, " * 10  # 350 characters
BIDI = [  # a right-to-left override in a title and in a metadata key; neither may reorder the next field
    {"_id": "rlo", "title": "Tea \u202eoverride in the title", "text": "green tea with a bidi key",
     "metadata": {"\u202enote": "plain value", "after": "next field", "cohort": {"size": 12}}},
    {"_id": "long", "title": LONG_TITLE, "text": "Green tea leaves are steamed and rolled."},
]
PLAIN = "Green tea is brewed from the leaves of Camellia sinensis, a plant grown across Asia for its leaves. " * 2


def test_an_untitled_document_leads_with_its_texts_start(served_index):
    c = make_client(served_index)
    assert c.post("/documents", json={"documents": [PLAIN, "Short tea note."]}, headers=HEADERS).status_code == 200
    hits = c.post("/search", json={"query": "green tea", "k": 10, "mode": "bm25", "highlight": True}).json()["hits"]
    by_id = {h["id"]: h for h in hits}
    long_lead = by_id[__import__("twotower").document_id(PLAIN)]["highlight"]["lead"]
    shown = joined(long_lead["text"])
    assert PLAIN.startswith(shown) and 100 <= len(shown) <= 120 and long_lead["cut_after"]
    assert PLAIN[len(shown)] == " "  # cut between words
    assert marks(long_lead["text"]) == ["Green", "tea"] * 2  # the text repeats after 100 characters
    short = by_id[__import__("twotower").document_id("Short tea note.")]["highlight"]["lead"]
    assert joined(short["text"]) == "Short tea note." and not short["cut_after"] and marks(short["text"]) == ["tea"]
    assert all("lead" not in h["highlight"] for h in hits if h["title"])  # a titled document keeps its title


def test_the_field_list_shows_leaf_fields_only():
    from twotower.serve.app import leaf_paths

    assert leaf_paths(["a", "a.b", "a.b.c", "a-b", "ab", "c"]) == ["a-b", "a.b.c", "ab", "c"]
    assert leaf_paths([]) == [] and leaf_paths(["x"]) == ["x"]


@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")),
                    reason="no chromium on PATH (apt-get install chromium)")
def test_the_page_isolates_bidi_cuts_long_titles_and_leads_untitled_documents(live_server):
    import html
    import httpx

    base = f"http://127.0.0.1:{live_server}"
    r = httpx.post(base + "/documents", json={"documents": BIDI + [PLAIN]}, headers=HEADERS)
    assert r.status_code == 200, r.text
    dom = rendered(live_server, "q=green+tea+bidi+key&mode=bm25&k=10")
    hits = re.findall(r'<li class="hit">(.*?)</li>\s*(?=<li class="hit">|</ol>)', dom, re.S)
    assert len(hits) == 4, dom[-3000:]  # and d5, about green tea
    rlo, long, plain = (next(h for h in hits if f">{i}</bdi>" in h) for i in ("rlo", "long",
                                                                             __import__("twotower").document_id(PLAIN)))
    # every text from the index sits in a <bdi>: the override's key and its value are two isolated fields
    assert '<bdi class="key">\u202enote</bdi><bdi class="value">plain value</bdi>' in rlo
    assert '<bdi class="key">after</bdi><bdi class="value">next field</bdi>' in rlo
    assert '<h2 class="title"><bdi><mark>Tea</mark> \u202eoverride in the title</bdi></h2>' in rlo, rlo
    assert '<div class="doc-id"><bdi>rlo</bdi></div>' in rlo and '<p class="snippet"><bdi>' in rlo
    # the long title: its first 150 characters and an ellipsis, the whole of it in the tooltip
    m = re.search(r'<h2 class="title" title="([^"]*)"><bdi>(.*?)</bdi></h2>', long, re.S)
    assert m and html.unescape(m.group(1)) == LONG_TITLE, long
    shown = html.unescape(re.sub(r"</?mark>", "", m.group(2)))
    assert shown.endswith("…") and LONG_TITLE.startswith(shown[:-1]) and len(shown) <= 151
    # the plain string: its text's start in the title's place, marked, never "untitled"
    m = re.search(r'<h2 class="title lead"><bdi>(.*?)</bdi></h2>', plain, re.S)
    assert m and "untitled" not in plain, plain
    lead = html.unescape(re.sub(r"</?mark>", "", m.group(1)))
    assert lead.endswith("…") and PLAIN.startswith(lead[:-1]) and "<mark>Green</mark>" in m.group(1)
    # the filter's field list: leaf fields only, each isolated
    fields = text_of(dom, "filter-fields") + dom.split('id="filter-fields"', 1)[1].split("</p>", 1)[0]
    assert '<bdi class="field">cohort.size</bdi>' in fields and '<bdi class="field">\u202enote</bdi>' in fields
    assert '<bdi class="field">cohort</bdi>' not in fields
