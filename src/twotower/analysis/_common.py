"""Shared by the analyses: machine facts, matplotlib set-up, atomic PNG/JSON output."""

from __future__ import annotations

import io
import os
import platform
from pathlib import Path
from typing import Any

from twotower.io import atomic_write_bytes, atomic_write_json


def machine_info() -> dict[str, Any]:
    import torch

    from twotower.encoders.inference import cpu_has_fast_bf16

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fast_bf16": cpu_has_fast_bf16(),  # the AMX / AVX512-BF16 flags (not a measured speed: see encoders/runtimes)
        "cpu_flags": cpu_flags(),
    }


CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def cpu_flags() -> list[str]:
    """Which of :data:`CPU_FLAGS` this CPU has (what decides the int8 / bf16 kernels), from /proc/cpuinfo."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return []
    return [f for f in CPU_FLAGS if f in flags]


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _claim(path: str | Path) -> None:
    """The analyses' output folder holds analyses only (twotower.outputs): checked before each file is written."""
    from twotower.outputs import claim_output

    claim_output(Path(path).parent, "analysis", command="twotower analyze")


def save_figure(fig, path: str | Path, *, dpi: int = 120) -> Path:
    """Write ``fig`` as PNG atomically and close it."""
    _claim(path)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


def write_json(path: str | Path, payload: dict) -> Path:
    _claim(path)
    atomic_write_json(path, payload)
    return Path(path)
