"""MkDocs hook: the headline results table, rendered from the committed results files.

``docs/hooks/headline.json`` names each row's results file and row (``system``); the numbers, the command that made
them (as its markdown twin states it, with paths relative to the repository) and the machine come from that file, so
the README, the docs home and the results overview cannot disagree. A page holding ``<!-- headline -->`` gets the
table; ``tests/test_docs.py`` checks that the README holds the same table
(``python docs/hooks/headline.py`` prints it, to paste after a new run).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

MARKER = "<!-- headline -->"
ROOT = Path(__file__).resolve().parents[2]
_COMMAND = re.compile(r"^Command:\s*`(?P<cmd>[^`]+)`", re.MULTILINE)


def _cpu(machine: dict) -> str:
    cpu = str(machine.get("cpu") or "?").replace("Intel(R) Xeon(R) Processor", "Intel Xeon")
    return f"{cpu}, {machine.get('cores', '?')} cores"


def _command(source: Path, data: dict) -> str:
    """The command of a results file as its ``.md`` twin states it (``benchmarks/_common.write_results`` writes the
    paths there so that they read the same in any clone), else the JSON's ``"command"`` as it was typed."""
    md = source.with_suffix(".md")
    stated = _COMMAND.search(md.read_text(encoding="utf-8")) if md.is_file() else None
    return stated.group("cmd") if stated else data["command"]


def table(root: Path = ROOT, *, links: str | None = None) -> str:
    """The headline table as markdown; ``links``: the results pages' folder relative to the page (each row's
    command then links its run), None for none."""
    spec = json.loads((root / "docs" / "hooks" / "headline.json").read_text(encoding="utf-8"))
    lines = ["| retriever | NDCG@10 | Recall@100 | precision, CPU | command |", "|---|---|---|---|---|"]
    for row in spec["rows"]:
        source = root / "benchmarks" / "results" / row["source"]
        data = json.loads(source.read_text(encoding="utf-8"))
        found = [r for r in data["rows"] if r.get("system") == row["system"]]
        if len(found) != 1:
            raise ValueError(f"headline.json: {row['source']} has {len(found)} rows named {row['system']!r}")
        ndcg = f"{found[0]['ndcg@10']:.4f}"
        ndcg = f"**{ndcg}**" if row.get("bold") else ndcg
        command = f"`{_command(source, data)}`"
        if links is not None:
            command += f" ([run]({links}/{Path(row['source']).with_suffix('.md').as_posix()}))"
        fields = {k: v for k, v in found[0].items() if k.isidentifier()}  # {runtime}, {seconds} from the row
        lines.append(f"| {row['label']} | {ndcg} | {found[0]['recall@100']:.4f} | {row['precision'].format(**fields)}; "
                     f"{_cpu(data.get('machine') or {})} | {command} |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    runs = "results/runs" if page.file.src_uri == "index.md" else "runs"
    return markdown.replace(MARKER, table(Path(config["config_file_path"]).resolve().parent, links=runs))


if __name__ == "__main__":
    print(table())
