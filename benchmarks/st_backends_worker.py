"""sentence-transformers' CPU backends in a child process, for benchmarks/cpu_backends.py.

Run by the benchmark under ``--st-python`` (an environment with sentence-transformers and optimum: optimum's
packages need transformers < 4.58, which sentence-transformers 6 and twotower's environment do not have, so they
live in an environment of their own). Loads, on a copy of the model in ``--work``: torch fp32, ``backend="onnx"``,
``backend="openvino"`` and the dynamically quantized int8 ONNX model (``export_dynamic_quantized_onnx_model`` with
the CPU's config: avx512_vnni, avx512 or avx2); a backend that fails to load or export is left out and its reason
sent in ``info["unavailable"]``. Then answers requests on stdin, one JSON line each:
``{"system": name, "texts": [...]}`` → writes the embeddings to ``--work/out.npy`` and replies
``{"seconds": encode time}`` on stdout. ``{"quit": true}`` ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def isa_config() -> str:
    flags = set(Path("/proc/cpuinfo").read_text().split())
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags:
        return "avx512"
    return "avx2"


def quantized_file(work: Path, isa: str) -> str | None:
    """The file ``export_dynamic_quantized_onnx_model`` wrote for ``isa``: ``model_<weights type>_<isa>.onnx``, the
    weights type being optimum's for that config — ``qint8`` for avx512 / avx512_vnni / arm64 but ``quint8`` for
    avx2 (asking for ``model_qint8_avx2.onnx`` made sentence-transformers try to export the folder anew and fail
    with "Unrecognized model ... Should have a model_type key in its config.json")."""
    found = sorted(p.name for p in (work / "onnx").glob(f"model_*int8_{isa}.onnx"))
    return found[0] if found else None


def load(args) -> tuple[dict, dict]:
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    work = Path(args.work) / "st-model"
    if not (work / "modules.json").is_file():
        shutil.copytree(args.model, work, dirs_exist_ok=True)
    systems = {"sentence-transformers torch fp32": SentenceTransformer(str(work), device="cpu")}
    info = {"sentence_transformers": sentence_transformers.__version__, "unavailable": {}}
    isa = args.isa or isa_config()

    def onnx_fp32():
        import onnxruntime
        import optimum.onnxruntime  # noqa: F401

        info["onnxruntime"] = onnxruntime.__version__
        onnx = SentenceTransformer(str(work), device="cpu", backend="onnx")
        if not (work / "onnx" / "model.onnx").is_file():
            onnx.save_pretrained(str(work))
        return onnx

    def onnx_int8():
        from sentence_transformers import export_dynamic_quantized_onnx_model

        onnx = systems.get("sentence-transformers onnx") or onnx_fp32()
        if not quantized_file(work, isa):
            export_dynamic_quantized_onnx_model(onnx, isa, str(work))
        name = quantized_file(work, isa)
        if name is None:
            raise FileNotFoundError(f"export_dynamic_quantized_onnx_model({isa!r}) wrote no onnx/model_*_{isa}.onnx")
        return SentenceTransformer(str(work), device="cpu", backend="onnx", model_kwargs={"file_name": f"onnx/{name}"})

    def openvino():
        import openvino as ov
        import optimum.intel  # noqa: F401

        info["openvino"] = ov.__version__
        model = SentenceTransformer(str(work), device="cpu", backend="openvino")
        if not (work / "openvino" / "openvino_model.xml").is_file():
            model.save_pretrained(str(work))
        hint = str(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT"))  # what backend="openvino" runs at
        info["openvino_precision"] = "bf16" if "bfloat16" in hint or "bf16" in hint else "fp32"
        return model

    for name, make in (("sentence-transformers onnx", onnx_fp32),
                       (f"sentence-transformers onnx-int8 ({isa})", onnx_int8),
                       ("sentence-transformers openvino", openvino)):
        try:  # a backend that cannot be had here is a row with its reason, not the end of the run
            systems[name] = make()
        except Exception as exc:  # noqa: BLE001 - reported to the benchmark, which records it in the results
            info["unavailable"][name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
            print(f"{name}: not available ({info['unavailable'][name]})", file=sys.stderr, flush=True)
    for st in systems.values():
        st.max_seq_length = args.max_length
    import transformers

    info["transformers"] = transformers.__version__
    return systems, info


def main() -> None:
    import numpy as np

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--isa", choices=("avx2", "avx512", "avx512_vnni", "arm64"), default=None,
                    help="the int8 export's config (default: this CPU's)")
    args = ap.parse_args()
    out = sys.stdout
    sys.stdout = sys.stderr  # library chatter must not reach the protocol channel
    systems, info = load(args)
    out.write(json.dumps({"systems": list(systems), "info": info}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("quit"):
            break
        st = systems[req["system"]]
        t0 = time.perf_counter()
        emb = st.encode(req["texts"], batch_size=args.batch_size, normalize_embeddings=True, convert_to_numpy=True,
                        show_progress_bar=False)
        seconds = time.perf_counter() - t0
        np.save(Path(args.work) / "out.npy", np.asarray(emb, dtype=np.float32))
        out.write(json.dumps({"seconds": seconds}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
