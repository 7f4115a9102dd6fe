"""Fast batched inference: tokenize once, sort by token length, pad per batch, no autograd.

Texts are tokenized without padding in large chunks, sorted by their real token count (not
character count), cut into batches padded only to the longest member, and encoded under
``torch.inference_mode``. With ``precision="bf16"`` the matmuls run in bfloat16 (AMX / AVX-512
bf16 on recent x86 CPUs, tensor cores on GPUs); ``"auto"`` picks bf16 where the hardware has it.
With ``compile=True`` the forward pass goes through ``torch.compile`` (Inductor, dynamic shapes):
it fuses the elementwise work around the matmuls (GELU, bias, LayerNorm, residual adds), and on the
bf16 path also freezes the weights (oneDNN pre-packing). It pays for its one-off compile time
(15-25 s on 2 cores with a cold cache, less when Inductor's on-disk cache is warm) on corpora of thousands of
documents, not on a handful of queries: benchmarks/results/compile_speed.md.
"""

from __future__ import annotations

import contextlib
import functools
from copy import deepcopy
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from twotower.progress import progress_bar

from twotower.encoders.device import attention_kernels
from twotower.encoders.encoder import TextEncoder
from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16")
TOKENIZE_CHUNK = 16384
# Texts per encoding batch when none is asked for. CPU: batch 128 ran 8-18% slower than 32 (DESIGN.md). GPU: the
# forward pass alone (all-MiniLM-L6-v2, bf16 weights, SciFact) ran 34.4k docs/s at 128 and 38.0k at 512 on an H200
# (issue #47), where the tokenizer gives ~11-16k: big batches keep the GPU's share of the time small.
DEFAULT_BATCH_SIZE = {"cpu": 32, "cuda": 512}
# On a GPU, tokenization runs ahead of the model in background threads (TOKENIZE_WORKERS chunks at a time: one
# thread in the fast tokenizer, which releases the GIL and fans out over every core, while another turns the
# previous chunk's encodings into padded, pinned batches), up to PREFETCH_BATCHES batches ahead; chunks of
# GPU_TOKENIZE_CHUNK texts (the first batch waits only for the first chunk); embeddings come back to the host
# HOST_COPY_EVERY batches at a time (one synchronisation each, not one per batch).
PREFETCH_BATCHES = 8
GPU_TOKENIZE_CHUNK = 2048
TOKENIZE_WORKERS = 2
HOST_COPY_EVERY = 32


def default_batch_size(device: torch.device) -> int:
    return DEFAULT_BATCH_SIZE.get(device.type, 32)


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """True when the CPU has AMX-BF16 or AVX512-BF16 (bf16 matmuls well above fp32 speed)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def check_precision(precision: str, what: str = "precision") -> None:
    """A :class:`TwoTowerError` naming ``what`` unless ``precision`` is one of :data:`PRECISIONS`."""
    if precision not in PRECISIONS:
        raise TwoTowerError(f"{what} '{precision}': choose one of {', '.join(PRECISIONS)}")


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision '{precision}': choose one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_has_fast_bf16() else "fp32"


def autocast_context(precision: str, device: torch.device):
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _weights_key(module: torch.nn.Module) -> tuple:
    """Changes whenever a parameter is replaced or updated in place (optimizer steps bump ``_version``)."""
    return tuple((id(p), p._version) for p in module.parameters())


def bf16_copy(encoder: TextEncoder) -> TextEncoder:
    """A bfloat16 copy of ``encoder`` for inference, cached on it until its weights change.

    Running bf16 weights directly is ~15-20% faster on CPU than fp32 weights under autocast
    (no per-op casts of the weights); pooling and normalisation still end in float32.
    """
    key = _weights_key(encoder)
    cached = getattr(encoder, "_bf16_cache", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    tokenizer, encoder.tokenizer = encoder.tokenizer, None  # share, don't deep-copy, the tokenizer
    try:
        fast = deepcopy(encoder)
    finally:
        encoder.tokenizer = tokenizer
    fast.tokenizer = tokenizer
    fast.to(torch.bfloat16).eval()
    encoder.__dict__["_bf16_cache"] = (key, fast)  # a plain attribute, not a registered submodule
    return fast


def compiled_forward(encoder: TextEncoder, *, freeze: bool = False):
    """``torch.compile(encoder, dynamic=True)``, cached on ``encoder``. Shapes are dynamic: length-sorted
    batches change width every batch.

    Unfrozen, the compiled module reads the live weights, so training steps in between need no recompile.
    ``freeze=True`` (Inductor's freezing) folds the weights into the graph as constants and pre-packs them
    for oneDNN, fusing bias and GELU into the matmuls: only for modules whose weights never change, such
    as the inference copy :func:`bf16_copy` makes (a new copy, hence a new compile, follows weight updates)."""
    fwd = encoder.__dict__.get("_compiled_forward")
    if fwd is None:
        fwd = torch.compile(encoder, dynamic=True, options={"freezing": freeze})
        encoder.__dict__["_compiled_forward"] = fwd  # a plain attribute, not a registered submodule
    return fwd


def length_sorted_rows(
    tokenizer, texts: Sequence[str], max_length: int, batch_size: int, chunk: int = TOKENIZE_CHUNK
) -> Iterator[tuple[np.ndarray, list[list[int]]]]:
    """``(rows, token_ids)`` batches of ``texts``, longest first; ``rows`` are the batch's positions in
    ``texts``. Tokenizes in chunks of ``chunk`` texts (one fast-tokenizer call each) and sorts
    each chunk by real token count, so a batch padded to its longest member wastes little."""
    for start in range(0, len(texts), chunk):
        yield from _sorted_chunk(tokenizer, texts, start, chunk, max_length, batch_size)


def _sorted_chunk(tokenizer, texts: Sequence[str], start: int, chunk: int, max_length: int,
                  batch_size: int) -> list[tuple[np.ndarray, list[list[int]]]]:
    ids = token_ids(tokenizer, list(texts[start : start + chunk]), max_length)
    order = np.argsort([-len(x) for x in ids], kind="stable")
    return [(start + order[b : b + batch_size], [ids[i] for i in order[b : b + batch_size]])
            for b in range(0, len(order), batch_size)]


def token_ids(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    """Each text's token ids (special tokens added, cut to ``max_length``, no padding): what
    ``tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]`` returns, through the fast
    tokenizer's own ``encode_batch_fast`` where it gives the same ids (no offsets, no ``BatchEncoding``:
    1.1x the HF call on 2 CPU cores, 1.4x on 16, issue #47), else through the HF call."""
    backend = _fast_backend(tokenizer, max_length, texts)
    if backend is None:
        return tokenizer(texts, truncation=True, max_length=max_length, padding=False,
                         return_attention_mask=False, return_token_type_ids=False)["input_ids"]
    return [e.ids for e in backend.encode_batch_fast(texts)]


def _fast_backend(tokenizer, max_length: int, texts: list[str]):
    """A copy of ``tokenizer``'s backend (``tokenizers.Tokenizer``) truncating at ``max_length``, cached on the
    tokenizer; None for a slow tokenizer, an old ``tokenizers``, or one whose ids differ from the HF call's on the
    first texts it meets (checked once per tokenizer and length)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "encode_batch_fast") or not texts:
        return None
    cache = tokenizer.__dict__.setdefault("_twotower_fast_backends", {})
    if max_length in cache:
        return cache[max_length]
    from tokenizers import Tokenizer

    fast = None
    try:
        fast = Tokenizer.from_str(backend.to_str())
        fast.no_padding()
        fast.enable_truncation(max_length, strategy="longest_first",
                               direction=getattr(tokenizer, "truncation_side", "right"))
        probe = texts[:8]
        same = [e.ids for e in fast.encode_batch_fast(probe)] == tokenizer(
            probe, truncation=True, max_length=max_length, padding=False, return_attention_mask=False,
            return_token_type_ids=False)["input_ids"]
    except Exception as exc:  # noqa: BLE001 - any backend that cannot be copied or configured: the HF call
        log.info("tokenizing through the HF call (the fast backend could not be used: %s)", exc)
        same = False
    cache[max_length] = fast if same else None
    return cache[max_length]


def length_sorted_batches(
    tokenizer, texts: Sequence[str], max_length: int, batch_size: int, chunk: int = TOKENIZE_CHUNK,
    pin_memory: bool = False, workers: int = 1,
) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
    """``(rows, input_ids, attention_mask)``: :func:`length_sorted_rows`, each batch padded only to its
    own longest member (in page-locked memory with ``pin_memory``, for asynchronous copies to a GPU).

    ``workers`` > 1 prepares that many chunks at once in threads (in order: the batches come out as with one),
    so one chunk's tokenization (the fast tokenizer releases the GIL) overlaps the previous chunk's padding."""
    pad_id = pad_id_of(tokenizer)

    def padded(start: int) -> list[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
        out = []
        for rows, ids in _sorted_chunk(tokenizer, texts, start, chunk, max_length, batch_size):
            input_ids, mask = pad_token_ids(ids, pad_id)
            if pin_memory:
                input_ids, mask = input_ids.pin_memory(), mask.pin_memory()
            out.append((rows, input_ids, mask))
        return out

    starts = range(0, len(texts), chunk)
    if workers <= 1 or len(starts) <= 1:
        for start in starts:
            yield from padded(start)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="twotower-tokenize") as pool:
        ahead: deque = deque()
        try:
            for start in starts:
                ahead.append(pool.submit(padded, start))
                if len(ahead) >= workers:
                    yield from ahead.popleft().result()
            while ahead:
                yield from ahead.popleft().result()
        finally:  # a consumer that stops early: drop what has not started
            for future in ahead:
                future.cancel()


def pad_id_of(tokenizer) -> int:
    """The id ``tokenizer`` pads with (0 for a tokenizer without a pad token)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def pad_token_ids(ids: list[list[int]], pad_id: int, multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of ``ids`` padded on the right to the longest, rounded up to a ``multiple``
    of tokens (what ``tokenizer(..., padding=True, pad_to_multiple_of=multiple)`` returns)."""
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    width = -(-int(lengths.max(initial=0)) // multiple) * multiple
    mask = np.arange(width)[None, :] < lengths[:, None]
    input_ids = np.full(mask.shape, pad_id, dtype=np.int64)
    for row, seq in zip(input_ids, ids):  # one C-level copy per text, not a Python step per token
        row[: len(seq)] = seq
    return torch.from_numpy(input_ids), torch.from_numpy(mask.astype(np.int64))


def prefetched(items: Iterator, depth: int) -> Iterator:
    """``items``, produced by a background thread up to ``depth`` ahead of the consumer (tokenization ahead of
    the GPU: the fast tokenizer releases the GIL). An error in the producer is raised in the consumer; a
    consumer that stops early stops the producer."""
    import queue
    import threading

    buffer: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        buffer.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            buffer.put((done, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            buffer.put((done, exc))

    thread = threading.Thread(target=produce, name="twotower-tokenize", daemon=True)
    thread.start()
    try:
        while True:
            item, error = buffer.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


def encode_texts(
    encoder: TextEncoder,
    texts: Sequence[str],
    *,
    max_length: int | None = None,
    batch_size: int | None = None,
    precision: str = "auto",
    show_progress: bool = True,
    desc: str = "encoding",
    compile: bool = False,
    prefetch: bool | None = None,
    unit: str = "text",
) -> np.ndarray:
    """Encode ``texts`` into a float32 array (len(texts), dim), in input order, on the encoder's device.

    ``batch_size``: None = the device's default (``DEFAULT_BATCH_SIZE``). ``prefetch``: tokenize in a
    background thread ahead of the model, into pinned memory (None = on a GPU only; on a CPU the tokenizer
    would take cores from the encoder). Under bf16 the model runs as a bf16 copy of its weights (:func:`bf16_copy`:
    no per-operation casts, on a GPU 1.3x the forward rate of autocast). ``compile``: run the forward pass through
    :func:`compiled_forward`;
    if compilation fails (no C++ compiler, an unsupported operator) the error is logged and encoding goes on
    eagerly."""
    device = next(encoder.parameters()).device
    precision = resolve_precision(precision, device)
    batch_size = batch_size or default_batch_size(device)
    gpu = device.type == "cuda"
    prefetch = gpu if prefetch is None else prefetch
    frozen_copy = precision == "bf16"
    if frozen_copy:  # bf16 weights beat autocast (CPU: ~15-20%; H200: 34.4k against 25.8k docs/s, issue #47)
        encoder, precision = bf16_copy(encoder), "fp32"
    max_length = max_length or encoder.max_length
    out = np.empty((len(texts), encoder.dim), dtype=np.float32)
    was_training = encoder.training
    encoder.eval()
    bar = progress_bar(total=len(texts), desc=desc, unit=unit, disable=not show_progress or len(texts) == 0)
    pending: list[tuple[np.ndarray, torch.Tensor]] = []  # batches whose embeddings are still on the device

    def to_host() -> None:
        rows = np.concatenate([r for r, _ in pending])
        out[rows] = torch.cat([e for _, e in pending]).float().cpu().numpy()
        bar.update(len(rows))
        pending.clear()

    batches = length_sorted_batches(encoder.tokenizer, texts, max_length, batch_size,
                                    chunk=GPU_TOKENIZE_CHUNK if prefetch else TOKENIZE_CHUNK, pin_memory=gpu,
                                    workers=TOKENIZE_WORKERS if prefetch else 1)
    if prefetch:
        batches = prefetched(batches, PREFETCH_BATCHES)
    try:
        forward = compiled_forward(encoder, freeze=frozen_copy) if compile else encoder
        with torch.inference_mode(), autocast_context(precision, device), attention_kernels(device):
            for rows, input_ids, mask in batches:
                input_ids, mask = input_ids.to(device, non_blocking=gpu), mask.to(device, non_blocking=gpu)
                try:
                    emb = forward(input_ids, mask)
                except Exception as exc:  # noqa: BLE001 - any compiler failure: fall back, don't lose the run
                    if forward is encoder:
                        raise
                    log.warning("torch.compile failed (%s: %s); encoding without it", type(exc).__name__,
                                str(exc).splitlines()[0] if str(exc) else "")
                    forward = encoder
                    emb = forward(input_ids, mask)
                pending.append((rows, emb))
                if not gpu or len(pending) >= HOST_COPY_EVERY:
                    to_host()
            if pending:
                to_host()
    finally:
        if hasattr(batches, "close"):
            batches.close()
        bar.close()
        encoder.train(was_training)
    return out
