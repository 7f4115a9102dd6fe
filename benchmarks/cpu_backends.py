"""CPU encoding: every sentence-transformers backend against every twotower runtime, in one run (issue #31).

1. Speed: the first ``--docs`` SciFact documents (title + text), cut into ``--slice``-document slices; every system
   encodes each slice in turn (the order reversed every other slice), so load from other processes falls on all
   alike. Systems: sentence-transformers torch fp32, ``backend="onnx"``, ``backend="openvino"`` and its dynamically
   quantized int8 ONNX model (``export_dynamic_quantized_onnx_model`` with this CPU's config), run by
   ``st_backends_worker.py`` under ``--st-python`` (optimum needs transformers < 4.58: its own environment); and
   twotower's runtimes (encoders/runtimes.py): torch fp32 / bf16, ONNX Runtime fp32, OpenVINO fp32 / bf16, ONNX
   Runtime int8. docs/s, ratio to sentence-transformers torch, smallest cosine to its fp32 vectors.
2. Quality: SciFact test NDCG@10 / Recall@100 on the full corpus for the ``--ndcg`` systems (each encodes corpus
   and queries itself). Rows are kept in ``--work`` keyed by their settings, so a later run reuses them.
3. The limit: matmul rate per precision on the encoder's GEMM shapes (fp32 / bf16: torch's kernels, as speed.py;
   int8: ONNX Runtime's dynamically quantized MatMul), the attention kernel's rate, the ceiling they imply
   (speed.py's model: dense FLOPs at the matmul rate + attention FLOPs at the attention rate) and the fraction reached.

    python benchmarks/cpu_backends.py --st-python /path/to/st-env/bin/python [--docs 1024] [--ndcg default,fp32]

Results: results/cpu_backends_<cpu>.{json,md}, cpu = amx | avx512bf16 | avx512 | avx2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from _common import cached_row, encoding_parser, load_average, test_documents, vector_metrics, write_results
from speed import attention_gflops, encoder_flops, matmul_gflops
from twotower.analysis._common import cpu_flags
from twotower.encoders import runtimes
from twotower.encoders.backbone import default_model_path
from twotower.encoders.inference import cpu_has_fast_bf16, encode_texts
from twotower.encoders.towers import DualEncoder

ST_TORCH = "sentence-transformers torch fp32"


def cpu_kind(flags: list[str]) -> str:
    for flag, kind in (("amx_bf16", "amx"), ("avx512_bf16", "avx512bf16"), ("avx512f", "avx512"), ("avx2", "avx2")):
        if flag in flags:
            return kind
    return "other"


class StWorker:
    """sentence-transformers' backends in a child process (st_backends_worker.py); ``encode(system, texts)``
    returns ``(embeddings, seconds)``, the seconds measured in the child around ``encode`` alone."""

    def __init__(self, python: str, work: Path, args) -> None:
        script = Path(__file__).resolve().parent / "st_backends_worker.py"
        self.work = work
        self.proc = subprocess.Popen(
            [python, str(script), "--model", str(default_model_path()), "--work", str(work),
             "--max-length", str(args.max_length), "--batch-size", str(args.batch_size)]
            + (["--isa", args.st_isa] if args.st_isa else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hello = json.loads(self.proc.stdout.readline() or "{}")
        if "systems" not in hello:  # every sentence-transformers row is then recorded as not run, with this reason
            self.proc.wait(timeout=60)
            self.systems, self.info = [], {"unavailable": {
                ST_TORCH: f"the sentence-transformers worker under {python} did not start (exit {self.proc.returncode}; "
                          "see its messages above)"}}
            return
        self.systems, self.info = hello["systems"], hello["info"]

    def encode(self, system: str, texts: list[str]) -> tuple[np.ndarray, float]:
        self.proc.stdin.write(json.dumps({"system": system, "texts": list(texts)}) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        return np.load(self.work / "out.npy"), reply["seconds"]

    def close(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def tt_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"torch": torch.__version__}
    for package in ("onnx", "onnxruntime", "openvino"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            pass
    return out


def timed(fn):
    def run(texts):
        t0 = time.perf_counter()
        emb = fn(texts)
        return emb, time.perf_counter() - t0
    return run


def twotower_systems(tower, args, corpus: list[str]) -> tuple[dict, dict, dict]:
    """``{name: texts -> (emb, s)}`` for every twotower runtime/precision this CPU offers, ``{name: precision}``
    (``openvino-int8`` calibrated on ``corpus`` and checked on a sample of it, as ``auto`` does) and
    ``{name: reason}`` for those that could not be had."""
    def torch_run(precision):
        return timed(lambda t: encode_texts(tower, t, max_length=args.max_length, batch_size=args.batch_size,
                                            precision=precision, show_progress=False))

    def graph_run(runtime, precision):
        # exported (or cached), calibrated (int8) and verified here
        graph = runtimes.graph_for(tower, runtime, precision, texts=corpus, max_length=args.max_length)
        graph.check_sample(corpus)
        return timed(lambda t: graph.encode(t, max_length=args.max_length, batch_size=args.batch_size))

    bf16 = cpu_has_fast_bf16()
    systems, precisions, unavailable = {}, {}, {}
    for name, precision, make in (
        ("twotower torch fp32", "fp32", lambda: torch_run("fp32")),
        ("twotower torch bf16", "bf16", lambda: torch_run("bf16")),
        ("twotower onnx fp32", "fp32", lambda: graph_run("onnx", "fp32")),
        ("twotower openvino fp32", "fp32", lambda: graph_run("openvino", "fp32")),
        ("twotower openvino bf16", "bf16", lambda: graph_run("openvino", "bf16")),
        ("twotower onnx-int8", "int8", lambda: graph_run("onnx-int8", "int8")),
        ("twotower openvino-int8", "int8", lambda: graph_run("openvino-int8", "int8")),
    ):
        if precision == "bf16" and not bf16:
            continue
        try:
            systems[name], precisions[name] = make(), precision
        except Exception as exc:  # noqa: BLE001 - a runtime missing here is a row with its reason
            unavailable[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
            print(f"{name}: not run ({unavailable[name]})", flush=True)
    return systems, precisions, unavailable


AUTO = "twotower auto (its own batch size)"


def result_rows(out: dict, precisions: dict, unavailable: dict, n_texts: int, default_name: str) -> list[dict]:
    """One row per system timed (``out``: ``{name: (embeddings, seconds)}``) — docs/s, ratio to sentence-transformers
    torch and smallest cosine to its vectors (to twotower torch fp32's when the sentence-transformers row could not
    run: ``reference`` says which) — then one per system that could not be produced here, with its reason
    (``not_run``) and no numbers."""
    ref_name = ST_TORCH if ST_TORCH in out else "twotower torch fp32"
    ref, ref_s = out[ref_name]
    rows = []
    for name, (emb, secs) in out.items():
        rows.append({"system": name, "precision": precisions[name], "default": "auto" if name == default_name else "",
                     "docs_per_s": n_texts / secs, "ratio_vs_st_torch": ref_s / secs,
                     "min_cosine_vs_st_fp32": float((emb * ref).sum(1).min())})
        if ref_name != ST_TORCH:
            rows[-1]["reference"] = ref_name
    for name, why in unavailable.items():
        if name not in out:
            rows.append({"system": name, "precision": "int8" if "int8" in name else "", "default": "",
                         "docs_per_s": None, "not_run": why})
    return rows


def summarize(rows: list[dict], st_systems: list[str], default_name: str, choice: dict) -> dict:
    """``auto``'s speed against the fastest sentence-transformers backend keeping cosine ≥ 0.99 and the fastest
    twotower int8 row against sentence-transformers' int8, over the rows that ran (a ratio without both sides is
    left out)."""
    ran = [r for r in rows if r.get("docs_per_s") is not None]
    summary = {"auto": choice}
    fastest_st = max((r for r in ran if r["system"] in st_systems and "int8" not in r["system"]
                      and r["min_cosine_vs_st_fp32"] >= 0.99), key=lambda r: r["docs_per_s"], default=None)
    default = next((r for r in ran if r["system"] == default_name), None)
    if fastest_st and default:
        summary["fastest_st_backend"] = fastest_st["system"]
        summary["auto_vs_fastest_st"] = default["docs_per_s"] / fastest_st["docs_per_s"]
    st_int8 = next((r for r in ran if r["system"].startswith("sentence-transformers onnx-int8")), None)
    tt_int8 = max((r for r in ran if r["system"].startswith("twotower") and r["precision"] == "int8"),
                  key=lambda r: r["docs_per_s"], default=None)
    if st_int8 and tt_int8:
        summary["fastest_twotower_int8"] = tt_int8["system"]
        summary["int8_vs_st_int8"] = tt_int8["docs_per_s"] / st_int8["docs_per_s"]
    return summary


def auto_system(tower, corpus: list[str], max_length: int) -> tuple[callable, dict]:
    """What ``auto`` picks for the whole corpus on this CPU, encoding as it does (its own batch size: the graph
    runtimes' default on this CPU, not ``--batch-size``), and the choice."""
    graph = runtimes.graph_for(tower, "auto", "auto", texts=corpus, max_length=max_length)
    choice = runtimes.last_choice(tower)
    if graph is None:
        return timed(lambda t: encode_texts(tower, t, max_length=max_length, precision=choice["precision"],
                                            show_progress=False)), choice
    return timed(lambda t: graph.encode(t, max_length=max_length)), choice


def take_turns(systems: dict, texts: list[str], slice_size: int) -> dict:
    names = list(systems)
    for n in names:  # warm-up: first-call costs are not throughput
        systems[n](texts[:8])
    parts, seconds = {n: [] for n in names}, dict.fromkeys(names, 0.0)
    for k, start in enumerate(range(0, len(texts), slice_size)):
        chunk = texts[start:start + slice_size]
        for n in (names if k % 2 == 0 else names[::-1]):
            emb, s = systems[n](chunk)
            parts[n].append(emb)
            seconds[n] += s
        print(f"slice {k + 1}: {start + len(chunk)} documents, load {load_average():.1f}", flush=True)
    return {n: (np.concatenate(parts[n]), seconds[n]) for n in names}


def int8_matmul_gflops(m: int, k: int, n: int, seconds: float = 2.0) -> float:
    """GFLOP/s of ONNX Runtime's dynamically quantized MatMul (activations quantized per call, int8 weights)
    on an (m×k)·(k×n) product: the kernel twotower's and sentence-transformers' int8 paths run."""
    import tempfile

    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((k, n)).astype(np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "mm",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n])], [w])
    with tempfile.TemporaryDirectory() as tmp:
        fp32, int8 = Path(tmp) / "mm.onnx", Path(tmp) / "mm8.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), fp32)
        quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8, per_channel=True)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = torch.get_num_threads()
        sess = ort.InferenceSession(str(int8), opts, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    for _ in range(3):
        sess.run(None, {"X": x})
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sess.run(None, {"X": x})
        reps += 1
    return 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9


def static_int8_matmul_gflops(m: int, k: int, n: int, seconds: float = 2.0) -> float:
    """GFLOP/s of OpenVINO's statically quantized MatMul (NNCF, activation scales calibrated once, int8 weights) on
    an (m×k)·(k×n) product: the kernel twotower's ``openvino-int8`` runs."""
    import nncf
    import openvino as ov

    lin = torch.nn.Linear(k, n, bias=False).eval()
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    model = ov.convert_model(lin, example_input=torch.from_numpy(x))
    quantized = nncf.quantize(model, nncf.Dataset([x]), subset_size=1, preset=nncf.QuantizationPreset.MIXED)
    req = ov.Core().compile_model(quantized, "CPU", {"INFERENCE_NUM_THREADS": torch.get_num_threads(),
                                                    "INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
    for _ in range(3):
        req.infer([x])
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        req.infer([x])
        reps += 1
    return 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = encoding_parser(__doc__)
    ap.add_argument("--docs", type=int, default=1024, help="documents for the speed comparison")
    ap.add_argument("--slice", type=int, default=128, help="documents per turn")
    ap.add_argument("--ndcg", default="default,fp32",
                    help="systems with full-corpus NDCG: comma-separated row names, or default (auto's row), fp32 "
                         "(twotower onnx fp32), int8 (both int8 rows), st (every sentence-transformers row), all, "
                         "none")
    ap.add_argument("--st-python", default=sys.executable,
                    help="Python of an environment with sentence-transformers and optimum[onnxruntime] / "
                         "optimum-intel[openvino] (rows it cannot load are left out)")
    ap.add_argument("--st-isa", default=None, choices=("avx2", "avx512", "avx512_vnni"),
                    help="config of sentence-transformers' int8 export (default: this CPU's; avx2 runs on any x86-64)")
    ap.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "twotower-cpu-backends"))
    args = ap.parse_args()
    load_start = load_average()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    flags = cpu_flags()
    kind = cpu_kind(flags)

    ds, doc_ids, corpus = test_documents(args)
    texts = corpus[: args.docs]
    model = DualEncoder.load(query_max_length=args.max_length, doc_max_length=args.max_length)
    tower = model.doc_tower
    worker = StWorker(args.st_python, work, args)
    systems = {name: (lambda t, n=name: worker.encode(n, t)) for name in worker.systems}
    precisions = {name: ("int8" if "int8" in name else "bf16" if "openvino" in name and
                         worker.info.get("openvino_precision") == "bf16" else "fp32") for name in worker.systems}
    tt_systems, tt_precisions, tt_unavailable = twotower_systems(tower, args, corpus)
    systems.update(tt_systems)
    precisions.update(tt_precisions)
    unavailable = {**worker.info.get("unavailable", {}), **tt_unavailable}  # rows that cannot be produced here
    systems[AUTO], choice = auto_system(tower, corpus, args.max_length)
    precisions[AUTO] = choice["precision"]
    default_name = AUTO
    print(f"auto picks {choice}", flush=True)

    out = take_turns(systems, texts, args.slice)
    rows = result_rows(out, precisions, unavailable, len(texts), default_name)
    for row in rows:
        print(row, flush=True)

    # the limit
    cfg = tower.backbone.config
    h, inter = cfg.hidden_size, cfg.intermediate_size
    m = args.batch_size * 128
    peak = {"fp32": np.mean([matmul_gflops(torch.float32, m, h, inter), matmul_gflops(torch.float32, m, inter, h)]),
            "int8": np.mean([int8_matmul_gflops(m, h, inter), int8_matmul_gflops(m, inter, h)]),
            "int8 static": np.mean([static_int8_matmul_gflops(m, h, inter), static_int8_matmul_gflops(m, inter, h)])}
    attn = {"fp32": attention_gflops(torch.float32, args.batch_size, cfg.num_attention_heads, args.max_length,
                                     h // cfg.num_attention_heads)}
    if cpu_has_fast_bf16():
        peak["bf16"] = np.mean([matmul_gflops(torch.bfloat16, m, h, inter),
                                matmul_gflops(torch.bfloat16, m, inter, h)])
        attn["bf16"] = attention_gflops(torch.bfloat16, args.batch_size, cfg.num_attention_heads, args.max_length,
                                        h // cfg.num_attention_heads)
    attn["int8"] = attn["int8 static"] = attn["fp32"]  # the int8 graphs keep attention's two matmuls in fp32
    split = encoder_flops(tower, texts, args.batch_size, args.max_length)
    flops = split["dense"] + split["attention"]
    for row in rows:
        if row.get("docs_per_s") is None:  # not run here
            continue
        static = row["system"] == "twotower openvino-int8" or (row["system"] == AUTO and
                                                                choice["runtime"] == "openvino-int8")
        p = "int8 static" if static else row["precision"]
        if p not in peak:
            continue
        ceiling = len(texts) / (split["dense"] / (peak[p] * 1e9) + split["attention"] / (attn[p] * 1e9))
        gflops = flops / (len(texts) / row["docs_per_s"]) / 1e9
        row.update({"gflops_per_s": gflops, "fraction_of_matmul_peak": gflops / peak[p],
                    "ceiling_docs_per_s": ceiling, "fraction_of_ceiling": row["docs_per_s"] / ceiling})

    def save() -> None:
        load_end = load_average()
        summary = summarize(rows, worker.systems, default_name, choice)
        fastest_st = {"system": summary.get("fastest_st_backend", "none (no sentence-transformers row ran)")}
        if unavailable:
            summary["not_run"] = unavailable
        print(summary, flush=True)
        ndcg_rows = [r["system"] for r in rows if "ndcg@10" in r]
        write_results(f"cpu_backends_{kind}", rows, extra={
            "cpu_flags": flags, "load_average": {"start": load_start, "end": load_end}, "st_worker": worker.info,
            "matmul_gflops": peak, "attention_gflops": attn, "summary": summary,
            "encoder_gflop_per_doc": flops / len(texts) / 1e9}, notes=(
            f"CPU flags: {' '.join(flags)}; torch threads {torch.get_num_threads()}; load average {load_start:.1f} at "
            f"start, {load_end:.1f} at end. all-MiniLM-L6-v2, max length {args.max_length}, batch {args.batch_size}; "
            f"speed on the first {len(texts)} SciFact documents, systems taking turns on {args.slice}-document slices "
            "(order reversed every other slice). sentence-transformers "
            f"{worker.info.get('sentence_transformers')} (transformers {worker.info.get('transformers')}, onnxruntime "
            f"{worker.info.get('onnxruntime')}, openvino {worker.info.get('openvino')}, its CPU default precision "
            f"{worker.info.get('openvino_precision')}) in a child process, timed there around encode(); twotower in this "
            "process (torch " + torch.__version__ + "), timed around its encode. "
            f"'default' marks the row `auto` picks on this CPU ({choice['runtime']} {choice['precision']}: "
            f"{choice['reason']}). Fastest sentence-transformers backend with min cosine ≥ 0.99: {fastest_st['system']}"
            + (f"; auto / it = {summary['auto_vs_fastest_st']:.2f}×" if "auto_vs_fastest_st" in summary else "")
            + (f"; {summary['fastest_twotower_int8']} / sentence-transformers int8 = {summary['int8_vs_st_int8']:.2f}×"
               if "int8_vs_st_int8" in summary else "") + ". "
            f"NDCG@10 / Recall@100: SciFact test, full corpus ({len(corpus)} documents), queries encoded by the same "
            f"system; rows with it: {', '.join(ndcg_rows) or 'none'} (kept in --work by settings: a row computed by an "
            "earlier run of this script with the same settings is reused). The limit: matmul rate on the encoder's GEMM "
            f"shapes ({m}×{h}×{inter} and {m}×{inter}×{h}): "
            + ", ".join(f"{p} {v:.0f} GFLOP/s" for p, v in peak.items())
            + " (fp32/bf16: torch's kernels; int8: ONNX Runtime's dynamically quantized MatMul, the int8 rows' limit; "
            "int8 static: OpenVINO's MatMul quantized by NNCF, the openvino-int8 row's limit); attention "
            "(scaled_dot_product_attention, padding mask) "
            + ", ".join(f"{p} {v:.0f}" for p, v in attn.items() if not p.startswith("int8"))
            + " GFLOP/s (int8 rows: attention stays fp32). ceiling_docs_per_s = documents / (dense FLOPs / matmul rate + "
            "attention FLOPs / attention rate), everything else free; fraction_of_ceiling = docs_per_s / ceiling."
            + ("".join(f" Not run here: {name} ({why})." for name, why in unavailable.items()))))

    save()
    # quality on the full corpus, for the asked systems
    wanted = []  # in the order asked for: a run cut short keeps the first ones (cached in --work)
    for item in (s.strip() for s in args.ndcg.split(",") if s.strip()):
        wanted += {"default": [default_name], "fp32": ["twotower onnx fp32"], "none": [],
                   "int8": [n for n in systems if "int8" in n], "st": list(worker.systems),
                   "all": list(systems)}.get(item, [item])
    qids = list(ds.queries)
    queries = [ds.queries[q] for q in qids]
    by_name = {r["system"]: r for r in rows}
    for name in dict.fromkeys(n for n in wanted if n in by_name and n in systems):
        row = by_name[name]

        def quality(name=name):
            encode = systems[name]
            doc_vecs = np.concatenate([encode(corpus[i:i + 512])[0] for i in range(0, len(corpus), 512)])
            return vector_metrics(ds.qrels, qids, encode(queries)[0], doc_ids, doc_vecs)

        settings = {"docs": len(corpus), "max_length": args.max_length, "batch_size": args.batch_size,
                    "versions": worker.info if name in worker.systems else tt_versions()}
        if name.startswith("twotower") and "torch" not in name:  # the graph as exported, fused, quantized now
            from twotower.encoders import runtimes_graph, runtimes_int8

            settings["graph"] = [runtimes_graph.SHAPE_POLICY, runtimes_graph.ORT_FILE, runtimes_graph.INT8_FILE,
                                 runtimes_int8.INT8_STATIC_FILE, runtimes_int8.CALIBRATION_TEXTS, "MIXED"]
        saved = cached_row(work, f"ndcg {name}", settings, quality)
        row.update({k: v for k, v in saved.items() if k != "system"})
        save()
    worker.close()


if __name__ == "__main__":
    main()
