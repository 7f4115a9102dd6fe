// The search page of `twotower serve`: plain JavaScript, no build step, nothing loaded from elsewhere.
// Every text from the index (titles, snippets, ids, metadata) reaches the page through text nodes
// (textContent / createTextNode), never as HTML. Requests are relative to the page, so it also works
// behind a proxy that serves the service under a path prefix.
"use strict";

const MODES = ["dense", "bm25", "hybrid"];
const TITLE_CHARS = 150;  // a longer title is cut, with an ellipsis (the whole of it in the tooltip)
const $ = (id) => document.getElementById(id);
let info = null;

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

// Text from the index inside <bdi>: its direction its own (dir=auto), isolated, so that a right-to-left title or
// a bidi control character (U+202E) in it never reorders the fields around it.
function bdi(className, text) {
  return el("bdi", className, text);
}

const GET = {headers: {accept: "application/json"}};

// An endpoint's address beside the page's, without the user name and password an address may carry
// (http://user:key@host/: fetch refuses such addresses; the browser sends the key it was given anyway).
function api(name) {
  return new URL(name, location.protocol + "//" + location.host + location.pathname).href;
}

function post(body) {
  return {method: "POST", headers: {"content-type": "application/json", accept: "application/json"},
          body: JSON.stringify(body)};
}

// An API answer as {ok, status, body}; body is the parsed JSON, or {detail: text} when it is not JSON.
async function answer(response) {
  const text = await response.text();
  let parsed;
  try { parsed = JSON.parse(text); } catch (e) { parsed = {detail: text || response.statusText}; }
  return {ok: response.ok, status: response.status, body: parsed};
}

// ---- the error a request got, in words, and where it belongs (the filter's line or the page's) -------

function describe(result) {
  const {status, body} = result;
  if (status === 401 || status === 403) {
    return {text: `The service refused the key (${status}): reload the page to enter it again.`};
  }
  const detail = body && body.detail;
  if (Array.isArray(detail)) {
    const onFilter = detail.filter((d) => Array.isArray(d.loc) && d.loc.includes("filter"));
    const shown = onFilter.length ? onFilter : detail;
    const text = shown.map((d) => (onFilter.length ? "" : (d.loc || []).filter((p) => p !== "body").join(".") + ": ")
      + String(d.msg || "").replace(/^Value error, /, "")).join("; ");
    return {text, filter: onFilter.length > 0};
  }
  return {text: `${status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`};
}

function showError(node, text) {
  node.textContent = text || "";
  node.hidden = !text;
}

// ---- the index: modes, metadata fields, limits ----------------------------------------------------

async function loadInfo() {
  let result;
  try {
    result = await answer(await fetch(api("info"), GET));
  } catch (e) {
    $("index-info").textContent = "";
    showError($("error"), "cannot reach the service: " + e.message);
    return;
  }
  if (!result.ok) {
    $("index-info").textContent = "";
    showError($("error"), describe(result).text);
    return;
  }
  info = result.body;
  const parts = [`${info.documents.toLocaleString("en")} documents`, info.version];
  if (info.model) parts.push(info.model);
  $("index-info").textContent = parts.join(" · ");
  for (const input of document.querySelectorAll('input[name="mode"]')) {
    const supported = info.modes.includes(input.value);
    input.disabled = !supported;
    input.parentElement.title = supported ? "" : "this index has no BM25 part (twotower index build --bm25)";
  }
  $("k").max = String(info.max_k);
  $("q").maxLength = info.max_query_chars;
  const fields = info.metadata_fields;
  if (fields === null || fields.length) {  // null: not known (Milvus, a large index), so offered all the same
    $("filter-row").hidden = false;
    const list = $("filter-fields");
    list.replaceChildren();
    if (fields) {  // each field name isolated: a name's bidi characters stay inside it
      list.append("fields: ");
      fields.forEach((name, i) => list.append(...(i ? [", "] : []), bdi("field", name)));
    }
    if (fields && fields.length) $("filter").placeholder = `{"${fields[0]}": {"$exists": true}}`;
  }
}

function chosenMode() {
  const checked = document.querySelector('input[name="mode"]:checked');
  return checked ? checked.value : null;
}

function chooseMode(mode) {
  const usable = (m) => MODES.includes(m) && (!info || info.modes.includes(m));
  const pick = usable(mode) ? mode : (info && usable(info.default_mode) ? info.default_mode
    : MODES.find(usable));
  for (const input of document.querySelectorAll('input[name="mode"]')) input.checked = input.value === pick;
}

// ---- searching ----------------------------------------------------------------------------------

async function search() {
  const query = $("q").value.trim();
  showError($("error"), "");
  showError($("filter-error"), "");
  if (!query) {
    $("q").focus();
    return;
  }
  const body = {query, highlight: true};
  const k = parseInt($("k").value, 10);
  if (Number.isFinite(k)) body.k = Math.max(1, Math.min(k, info ? info.max_k : 1000));
  const mode = chosenMode();
  if (mode) body.mode = mode;
  const filterText = $("filter").value.trim();
  if (filterText && !$("filter-row").hidden) {
    try {
      body.filter = JSON.parse(filterText);
    } catch (e) {
      showError($("filter-error"), "not JSON: " + e.message);
      return;
    }
    if (body.filter === null || typeof body.filter !== "object" || Array.isArray(body.filter)) {
      showError($("filter-error"), 'a filter is a JSON object, e.g. {"year": {"$gte": 2020}}');
      return;
    }
  }
  remember(query, mode, body.k, filterText);
  $("status").textContent = "searching…";
  $("go").disabled = true;
  const started = performance.now();
  let result;
  try {
    result = await answer(await fetch(api("search"), post(body)));
  } catch (e) {
    $("status").textContent = "";
    showError($("error"), "cannot reach the service: " + e.message);
    return;
  } finally {
    $("go").disabled = false;
  }
  const roundTrip = performance.now() - started;
  if (!result.ok) {
    $("status").textContent = "";
    const problem = describe(result);
    showError(problem.filter ? $("filter-error") : $("error"), problem.text);
    return;
  }
  render(result.body, roundTrip);
}

function remember(query, mode, k, filterText) {
  const params = new URLSearchParams({q: query});
  if (mode) params.set("mode", mode);
  if (k) params.set("k", String(k));
  if (filterText) params.set("filter", filterText);
  history.replaceState(null, "", "?" + params.toString());
}

function ms(value) {
  return value < 10 ? value.toFixed(1) + " ms" : Math.round(value) + " ms";
}

function render(answer, roundTrip) {
  const hits = answer.hits;
  $("status").textContent = `${hits.length} ${hits.length === 1 ? "hit" : "hits"} · server ${ms(answer.took_ms)}`
    + ` · round trip ${ms(roundTrip)} · ${answer.version}`;
  const list = $("hits");
  list.replaceChildren(...hits.map((hit, i) => renderHit(hit, i + 1)));
  if (!hits.length) list.append(el("li", "none", "No document matches."));
}

// pieces [{text, match}] as text nodes, the matches inside <mark>
function marked(node, segments) {
  for (const piece of segments) {
    node.append(piece.match ? el("mark", null, piece.text) : document.createTextNode(piece.text));
  }
  return node;
}

// the first `most` characters of pieces (whole code points, trailing space dropped) and whether any were left out
function cut(segments, most) {
  const out = [];
  let left = most;
  for (const piece of segments) {
    const chars = Array.from(piece.text);
    if (chars.length <= left) {
      out.push(piece);
      left -= chars.length;
      continue;
    }
    out.push({text: chars.slice(0, left).join("").trimEnd(), match: piece.match});
    return {pieces: out, cut: true};
  }
  return {pieces: out, cut: false};
}

// the title: the document's own, cut at TITLE_CHARS; else the start of its text (a plain-string document); else
// "untitled"
function renderTitle(hit) {
  const title = el("h2", "title");
  const highlight = hit.highlight || null;
  let pieces, more = false;
  if (hit.title.trim()) {
    pieces = highlight ? highlight.title : [{text: hit.title, match: false}];
  } else if (highlight && highlight.lead && highlight.lead.text.length) {
    title.classList.add("lead");
    pieces = highlight.lead.text;
    more = highlight.lead.cut_after;
  } else {
    title.append(el("span", "untitled", "untitled"));
    return title;
  }
  const shown = cut(pieces, TITLE_CHARS);
  const text = marked(bdi(null), shown.pieces);
  if (shown.cut || more) text.append("…");
  if (shown.cut && hit.title) title.title = hit.title;
  title.append(text);
  return title;
}

function renderHit(hit, rank) {
  const item = el("li", "hit");
  const head = el("div", "hit-head");
  head.append(el("span", "rank", rank));
  head.append(renderTitle(hit), el("span", "score", hit.score.toFixed(4)));
  const id = el("div", "doc-id");
  id.append(bdi(null, hit.id));
  item.append(head, id);
  if (hit.highlight && hit.highlight.text.length) {
    const snippet = el("p", "snippet");
    if (hit.highlight.cut_before) snippet.append("… ");
    snippet.append(marked(bdi(null), hit.highlight.text));
    if (hit.highlight.cut_after) snippet.append(" …");
    item.append(snippet);
  }
  const meta = flatten(hit.metadata || {});
  if (meta.length) {
    const list = el("ul", "meta");
    for (const [key, value] of meta) {
      const entry = el("li");
      const chars = Array.from(value);  // whole code points: an emoji is never cut in two
      const shown = chars.length > 80 ? chars.slice(0, 79).join("") + "…" : value;
      entry.append(bdi("key", key), bdi("value", shown));
      if (shown !== value) entry.title = value;
      list.append(entry);
    }
    item.append(list);
  }
  return item;
}

// metadata as [dotted path, value text] pairs: nested objects opened up, lists and other values as JSON
function flatten(value, prefix = "", out = []) {
  for (const [key, inner] of Object.entries(value)) {
    const path = prefix ? prefix + "." + key : key;
    if (inner && typeof inner === "object" && !Array.isArray(inner) && Object.keys(inner).length) {
      flatten(inner, path, out);
    } else {
      out.push([path, typeof inner === "string" ? inner : JSON.stringify(inner)]);
    }
  }
  return out;
}

// ---- start: the index's facts, then the search the address holds (?q=...&mode=...&k=...&filter=...) ------

async function start() {
  $("search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    search();
  });
  document.addEventListener("keydown", (event) => {  // "/" goes to the query box, as on most search pages
    if (event.key === "/" && !["INPUT", "TEXTAREA"].includes(document.activeElement.tagName)) {
      event.preventDefault();
      $("q").focus();
    }
  });
  const params = new URLSearchParams(location.search);
  await loadInfo();
  chooseMode(params.get("mode"));
  if (params.get("k")) $("k").value = params.get("k");
  if (params.get("filter")) $("filter").value = params.get("filter");
  if (params.get("q")) {
    $("q").value = params.get("q");
    if (info) search();
  }
}

start();
