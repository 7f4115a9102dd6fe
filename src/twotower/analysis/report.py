"""``twotower analyze report``: one markdown page from whatever analysis JSON a folder holds.

Every analysis writes ``<name>.json`` with ``analysis``, ``title``, ``rows`` (a list of flat dicts),
``plots`` (PNG file names next to it) and optionally ``tables`` ({caption: rows or the payload key holding them}), ``command``,
``notes``, ``machine`` and ``timings``; the report shows them in a fixed order (fidelity, towers, doclength, latency, then any
other) with a table per analysis and the plots as images linked relative to the page.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from twotower.errors import DataError, TwoTowerError
from twotower.io import atomic_write_text, read_input_text

log = logging.getLogger(__name__)

ORDER = ("fidelity", "towers", "doclength", "latency")


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return "–"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value).replace("|", "\\|")


def markdown_table(rows: list[dict]) -> list[str]:
    if not rows:
        return ["(no rows)"]
    cols = list(dict.fromkeys(k for r in rows for k in r if not isinstance(r[k], (list, dict))))
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return lines


def load_results(folder: str | Path) -> list[tuple[Path, dict]]:
    """Analysis JSON files in ``folder`` (those with an ``analysis`` key), in report order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TwoTowerError(f"{folder}: folder not found (run some 'twotower analyze ...' commands with --out {folder})")
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            payload = json.loads(read_input_text(path, what="analysis JSON"))
        except json.JSONDecodeError as exc:
            raise DataError(path, f"malformed JSON: {exc.msg}", line=exc.lineno,
                            hint="re-run the analysis that wrote it") from None
        if isinstance(payload, dict) and "analysis" in payload:
            found.append((path, payload))
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(found, key=lambda item: (rank.get(item[1]["analysis"], len(ORDER)), item[0].name))


def build_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the markdown page (default ``<folder>/report.md``) and return its path."""
    folder = Path(folder)
    out = Path(out) if out else folder / "report.md"
    results = load_results(folder)
    if not results:
        foreign = sorted(p.name for p in folder.glob("*.json"))
        skipped = (f"; its {len(foreign)} JSON file(s) ({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}) "
                   f"are not analysis results: they lack the 'analysis' key that 'twotower analyze' writes"
                   if foreign else "")
        raise TwoTowerError(f"{folder}: no analysis JSON found{skipped} (run 'twotower analyze "
                            f"fidelity|towers|doclength|latency --out {folder}' first)")
    lines = ["# twotower analyses", ""]
    lines += [f"- [{p['title']}](#{p['analysis']})" for _, p in results]
    lines.append("")
    for path, p in results:
        lines += [f'<a id="{p["analysis"]}"></a>', f"## {p['title']}", ""]
        meta = [f"data: `{p['dataset']}`" + (f" / {p['split']}" if p.get("split") else "")] if p.get("dataset") else []
        if p.get("command"):
            meta.append(f"command: `{p['command']}`")
        if p.get("machine"):
            m = p["machine"]
            meta.append(f"machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}")
        if p.get("timings", {}).get("total_s") is not None:
            meta.append(f"wall time: {p['timings']['total_s']:.0f} s")
        meta.append(f"source: [{path.name}]({os.path.relpath(path, out.parent)})")
        lines += [f"- {m}" for m in meta] + [""]
        lines += markdown_table(p.get("rows", [])) + [""]
        for name, rows in (p.get("tables") or {}).items():
            rows = p.get(rows, []) if isinstance(rows, str) else rows  # a key of the payload, or the rows
            lines += [f"**{name}**", ""] + markdown_table(rows) + [""]
        for note in p.get("notes", []):
            lines.append(f"- {note}")
        if p.get("notes"):
            lines.append("")
        for plot in p.get("plots", []):
            img = folder / plot
            if not img.is_file():
                log.warning("%s: plot %s is missing", path, plot)
                lines += [f"(missing plot: {plot})", ""]
                continue
            lines += [f"![{plot}]({os.path.relpath(img, out.parent)})", ""]
    atomic_write_text(out, "\n".join(lines))
    return out
