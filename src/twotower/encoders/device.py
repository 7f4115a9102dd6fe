"""Which device a model runs on: ``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``, checked before any work.

``auto`` is the current CUDA device where torch sees one (under ``torchrun`` the process's LOCAL_RANK GPU,
set by ``maybe_init_distributed``), else the CPU. Everything a model computes with follows the device of
its parameters (``device_of``), so one ``--device`` choice moves a whole command.
"""

from __future__ import annotations

import re

import torch

from twotower.checks import given, option_name
from twotower.errors import TwoTowerError

DEVICE_CHOICES = "auto | cpu | cuda | cuda:N"
_PATTERN = re.compile(r"^(auto|cpu|cuda)(?::(\d+))?$")


def resolve_device(spec: str | torch.device | None = "auto", *, option: str | None = None) -> torch.device:
    """The torch device named by ``spec``; a clear error (naming the parameter as the caller knows it: ``device=``
    from Python, ``--device`` or ``option`` from the command line) for an unknown name, a GPU that torch cannot see,
    or a GPU index past the last one."""
    if isinstance(spec, torch.device):
        return spec
    text = (spec or "auto").strip().lower()
    match = _PATTERN.match(text)
    if not match or (match.group(1) != "cuda" and match.group(2) is not None):
        where = option_name("device", option)
        named = f"{where}{spec!r}" if where.endswith("=") and not where.endswith(" =") else f"{where} '{spec}'"
        raise TwoTowerError(f"{named}: not a device name; choose {DEVICE_CHOICES}")
    kind, index = match.group(1), match.group(2)
    if kind == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise TwoTowerError(f"{given('device', text, option)}: torch sees no CUDA GPU here (torch "
                            f"{torch.__version__}, built with CUDA {torch.version.cuda or 'none'}); use "
                            f"{given('device', 'cpu', option)} or auto")
    count = torch.cuda.device_count()
    if index is not None and int(index) >= count:
        raise TwoTowerError(f"{given('device', text, option)}: this machine has {count} CUDA device(s), cuda:0 to "
                            f"cuda:{count - 1}")
    return torch.device("cuda", int(index) if index is not None else torch.cuda.current_device())


def device_of(module: torch.nn.Module) -> torch.device:
    """The device of a module's first parameter (CPU for a module without parameters)."""
    param = next(module.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def describe(device: torch.device) -> str:
    """``cpu`` or ``cuda:0 (NVIDIA H100 80GB HBM3)``: what results JSON and train logs record."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


# scaled_dot_product_attention's backends on a GPU, cuDNN's left out: torch 2.11 sends attention with a padding mask
# to cuDNN first on recent GPUs, and cuDNN builds an execution plan for every new (batch, length) shape, hundreds of
# milliseconds each (pytorch/pytorch#155958; FunASR #3704 measured 0.44 s forward + 0.55 s backward per new shape).
# Text batches change length every batch, so training paid it on most steps of its first epoch (issue #47: ~11 s of
# "fixed" cost on an H200). Flash and memory-efficient attention build nothing per shape.
GPU_ATTENTION_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def attention_kernels(device: torch.device):
    """A context in which ``scaled_dot_product_attention`` uses :data:`GPU_ATTENTION_BACKENDS` on a CUDA device
    (no cuDNN); on other devices it changes nothing."""
    import contextlib

    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, name) for name in GPU_ATTENTION_BACKENDS])
