"""Mutation check of training/, retrieval/ and evaluation/: plant one bug at a time, see whether the tests notice.

Each mutant of ``tools/quality/mutants.py`` (an exact snippet of ``src/twotower/<file>``, found exactly once, and its
replacement) is applied to a scratch copy of ``src`` (the working tree is never changed); the test files mapped to
its module run with that copy first on PYTHONPATH (``pytest -x``, one timeout per mutant), the file is restored,
and the outcome recorded: ``killed`` (a test failed), ``survived`` (all passed), ``timeout`` (counted as killed,
reported apart) or ``error`` (pytest could not run: not counted). Mutants marked ``equivalent`` run too but stay
out of the score. Writes ``tools/quality/results/mutation_check.{json,md}``.

    PYTHONPATH=$PWD/src python tools/quality/mutation_check.py                 # every mutant
    PYTHONPATH=$PWD/src python tools/quality/mutation_check.py --ids a,b --merge  # re-run some, keep the rest

``--merge`` keeps the previous results file's outcomes for the mutants not re-run and records, for the ones
re-run, their previous outcome as ``before``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, TESTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
PACKAGES = ("training", "retrieval", "evaluation")


def check_mutants(src: Path) -> None:
    """Every snippet occurs exactly once in its file and every mutated file still compiles."""
    ids = [m["id"] for m in MUTANTS]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"duplicate mutant ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    for m in MUTANTS:
        text = (src / "twotower" / m["file"]).read_text()
        count = text.count(m["old"])
        if count != 1:
            raise SystemExit(f"mutant {m['id']}: the snippet occurs {count} times in {m['file']} (needs exactly 1)")
        if m["file"] not in TESTS and "tests" not in m:
            raise SystemExit(f"mutant {m['id']}: no tests mapped to {m['file']}")
        compile(text.replace(m["old"], m["new"]), m["file"], "exec")


def run_tests(scratch: Path, tests: list[str], timeout: int) -> tuple[str, float, str]:
    env = {**os.environ, "PYTHONPATH": str(scratch), "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - t0, ""
    elapsed = time.perf_counter() - t0
    tail = (proc.stdout or "").strip().splitlines()
    summary = tail[-1] if tail else (proc.stderr or "").strip()[-200:]
    if proc.returncode == 0:
        return "survived", elapsed, summary
    if proc.returncode == 1:
        return "killed", elapsed, summary
    return "error", elapsed, f"pytest exit {proc.returncode}: {summary}"


def score(results: list[dict]) -> dict:
    """Per package and overall: killed (timeouts included) / counted (neither equivalent nor error)."""
    out = {}
    for pkg in (*PACKAGES, "overall"):
        rows = [r for r in results if not r.get("equivalent") and r["outcome"] != "error"
                and (pkg == "overall" or r["file"].startswith(pkg + "/"))]
        killed = sum(r["outcome"] in ("killed", "timeout") for r in rows)
        out[pkg] = {"mutants": len(rows), "killed": killed, "survived": len(rows) - killed,
                    "score": round(killed / len(rows), 4) if rows else None}
    return out


def write(results: list[dict], command: str, history: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = score(results)
    payload = {"command": command, "score": summary, "history": history, "mutants": results}
    (RESULTS / "mutation_check.json").write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    lines = ["# mutation_check", "", f"Command: `{command}`", "",
             "Score = killed / mutants, equivalent mutants and pytest errors excluded (timeouts count as killed).", "",
             "| package | mutants | killed | survived | score |", "|---|---|---|---|---|"]
    for pkg, s in summary.items():
        pct = f"{100 * s['score']:.1f}%" if s["score"] is not None else "-"
        lines.append(f"| {pkg} | {s['mutants']} | {s['killed']} | {s['survived']} | {pct} |")
    for label, past in history.items():
        lines += ["", f"Earlier ({label}): " + ", ".join(
            f"{pkg} {v['killed']}/{v['mutants']}" for pkg, v in past.items())]
    if history:
        lines += ["", "This command re-ran only the mutants it names (column 'before': their earlier outcome); the "
                  "others keep their outcome from the earlier run (tests were only added since, so a mutant "
                  "killed then is killed now)."]
    lines += ["", "| id | file | bug | outcome | before | seconds | tests |", "|---|---|---|---|---|---|---|"]
    for r in results:
        outcome = r["outcome"] + (" (equivalent)" if r.get("equivalent") else "")
        lines.append(f"| {r['id']} | {r['file']} | {r['desc']} | {outcome} | {r.get('before', '')} | "
                     f"{r['seconds']:.0f} | {' '.join(Path(t).name for t in r['tests'])} |")
    eq = [r for r in results if r.get("equivalent")]
    if eq:
        lines += ["", "Equivalent mutants (excluded from the score):", ""]
        lines += [f"- `{r['id']}`: {r['equivalent']}" for r in eq]
    notes = [r for r in results if r.get("note")]
    if notes:
        lines += ["", "Survivors and notes:", ""] + [f"- `{r['id']}`: {r['note']}" for r in notes]
    (RESULTS / "mutation_check.md").write_text("\n".join(lines) + "\n")


def _with_notes(rows) -> list[dict]:
    """Rows in MUTANTS order with the equivalence reasons and notes of mutants.py (the current ones)."""
    order = {m["id"]: i for i, m in enumerate(MUTANTS)}
    ordered = sorted((r for r in rows if r["id"] in order), key=lambda r: order[r["id"]])
    for r in ordered:
        spec = MUTANTS[order[r["id"]]]
        for key in ("equivalent", "note"):
            r.pop(key, None)
            if spec.get(key):
                r[key] = spec[key]
    return ordered


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ids", help="comma-separated mutant ids to run (default: all)")
    ap.add_argument("--merge", action="store_true", help="keep the results file's other mutants (see the doc)")
    ap.add_argument("--label", default="previous run", help="name of the earlier score kept in the history (--merge)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per mutant (default 300)")
    ap.add_argument("--list", action="store_true", help="check and list the mutants, run nothing")
    ap.add_argument("--report", action="store_true",
                    help="rewrite the .md (and notes in the .json) from the results file, run nothing")
    args = ap.parse_args()
    if args.report:
        old = json.loads((RESULTS / "mutation_check.json").read_text())
        rows = _with_notes(old["mutants"])
        write(rows, old["command"], old.get("history", {}))
        return

    src = ROOT / "src"
    check_mutants(src)
    chosen = MUTANTS
    if args.ids and not args.merge and not args.list:
        raise SystemExit("--ids runs some mutants only: add --merge, or the results file would lose the others")
    if args.ids:
        wanted = args.ids.split(",")
        unknown = set(wanted) - {m["id"] for m in MUTANTS}
        if unknown:
            raise SystemExit(f"unknown mutant ids: {sorted(unknown)}")
        chosen = [m for m in MUTANTS if m["id"] in wanted]
    if args.list:
        for m in chosen:
            print(f"{m['id']:32s} {m['file']:32s} {m['desc']}")
        print(f"{len(chosen)} mutants")
        return

    previous, history = {}, {}
    out_json = RESULTS / "mutation_check.json"
    if args.merge and out_json.exists():
        old = json.loads(out_json.read_text())
        previous = {r["id"]: r for r in old["mutants"]}
        history = {**old.get("history", {}), args.label: old["score"]}

    scratch = Path(tempfile.mkdtemp(prefix="mut-src-"))
    try:
        shutil.copytree(src, scratch, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        probe = subprocess.run([sys.executable, "-c", "import twotower; print(twotower.__file__)"], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(scratch)}, capture_output=True, text=True)
        if not probe.stdout.strip().startswith(str(scratch)):
            raise SystemExit(f"the scratch copy is not the twotower that tests import: {probe.stdout or probe.stderr}")
        results = dict(previous)
        for n, m in enumerate(chosen, start=1):
            target = scratch / "twotower" / m["file"]
            original = target.read_text()
            tests = m.get("tests") or TESTS[m["file"]]
            target.write_text(original.replace(m["old"], m["new"]))
            try:
                outcome, seconds, summary = run_tests(scratch, tests, args.timeout)
            finally:
                target.write_text(original)
            row = {k: v for k, v in m.items() if k not in ("old", "new", "tests")}
            row.update(old=m["old"], new=m["new"], tests=tests, outcome=outcome, seconds=round(seconds, 1),
                       summary=summary)
            if m["id"] in previous:
                row["before"] = previous[m["id"]]["outcome"]
            results[m["id"]] = row
            print(f"[{n}/{len(chosen)}] {m['id']:32s} {outcome:9s} {seconds:6.1f}s  {summary}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ordered = _with_notes(results.values())
    command = "PYTHONPATH=$PWD/src python tools/quality/mutation_check.py" + (
        " " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "")
    write(ordered, command, history)
    print(json.dumps(score(ordered), indent=1))


if __name__ == "__main__":
    main()
