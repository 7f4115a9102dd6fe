"""The keywords :meth:`Index.build <twotower.Index.build>` takes beyond its signature: the settings kept as keywords
(:data:`KEPT`: ``language``, ``device``, …) and the old keywords of the option groups (:data:`OLD`: ``hnsw_m``,
``ray_address``, ``passage_window``, …), which still work for one release with a ``DeprecationWarning`` naming the
spec that replaces them (:mod:`twotower.api.build_specs`). An old keyword beside the spec that covers it is an error
naming both.

Example::

    from twotower.api.build_keywords import new_form

    options = {"hnsw_m": 48}
    specs = new_form(options, ann=None, compression=None, passages=None, ray=False, backend="faiss", warn=False)
    assert specs["ann"].m == 48 and options == {}
"""

from __future__ import annotations

import sys
import warnings

from twotower.api.build_specs import ANN, Compression, Milvus, Passages, Ray, keyword_names
from twotower.checks import check_bool, flag, naming, switch
from twotower.errors import TwoTowerError

# keywords Index.build takes beside its signature, with their defaults (documented in its docstring)
KEPT = {"language": None, "bigrams": False, "multivector": None, "project": None, "device": "auto",
        "precision": "auto", "compile": False, "runtime": None, "max_file_bytes": None}

# the parameter each group's spec goes to: (spec class, {old keyword: field})
GROUPS = {
    "ann": (ANN, {v: k for k, v in ANN._keywords.items()}),
    "compression": (Compression, {v: k for k, v in Compression._keywords.items()}),
    "passages": (Passages, {v: k for k, v in Passages._keywords.items()}),
    "ray": (Ray, {v: k for k, v in Ray._keywords.items()}),
    "backend": (Milvus, {v: k for k, v in Milvus._keywords.items()}),
}
OLD = {old: group for group, (_, names) in GROUPS.items() for old in names}


def kept(options: dict) -> dict:
    """The kept keywords of ``options`` (popped), with the defaults of those not given; ``bigrams`` and ``compile``
    checked to be bools."""
    out = {name: options.pop(name, default) for name, default in KEPT.items()}
    for name in ("bigrams", "compile"):
        check_bool(out[name], name)
    return out


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside twotower (the caller's line, in the warning)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "twotower":
        frame, level = frame.f_back, level + 1
    return level


def _new_call(group: str, old: dict) -> str:
    cls, names = GROUPS[group]
    return f"{group}=tt.{cls.__name__}({', '.join(f'{names[k]}=…' for k in old)})"


def new_form(options: dict, *, ann, compression, passages, ray, backend, warn: bool = True) -> dict:
    """``{"ann", "compression", "passages", "ray", "backend"}`` as specs (``passages``: None, False or a
    :class:`Passages`; ``ray``: None or a :class:`Ray`; ``backend``: ``"faiss"``, ``"milvus"`` or a
    :class:`Milvus`), the old keywords popped from ``options`` and turned into them (``warn``: with a
    ``DeprecationWarning`` each group)."""
    given = {"ann": ann, "compression": compression, "passages": passages, "ray": ray, "backend": backend}
    for group, (cls, names) in GROUPS.items():
        old = {k: options.pop(k) for k in names if k in options}  # in the spec's order
        value = given[group]
        if group == "passages":
            value = _passages(value, old)
        elif group == "ray":
            value = _ray(value, old)
        elif group == "backend":
            value = _backend(value, old)
        elif old and value is not None:
            _both(group, old)
        elif old:
            with keyword_names():
                value = cls(**{names[k]: v for k, v in old.items()})
        elif value is not None and not isinstance(value, cls):
            raise TwoTowerError(f"{group}: a tt.{cls.__name__}(...), not {type(value).__name__}")
        if old and warn:
            shown = ", ".join(f"{k}=…" for k in old)
            warnings.warn(f"Index.build({shown}) is deprecated: pass {_new_call(group, old)}", DeprecationWarning,
                          stacklevel=_caller_level())
        given[group] = value
    return given


def _both(group: str, old: dict) -> None:
    raise TwoTowerError(f"{', '.join(flag(k) for k in old)} and {group}= both set {GROUPS[group][0].__name__}: pass "
                        f"{_new_call(group, old)} alone")


def _passages(value, old: dict):
    """None (the backend's default), False (first window only) or a :class:`Passages`."""
    from twotower.encoders.passages import PassageSpec

    if isinstance(value, PassageSpec):
        value = Passages(window=value.window, overlap=value.overlap, max_passages=value.max_passages,
                         score=value.score)
    if isinstance(value, Passages):
        if old:
            _both("passages", old)
        return value
    if value is not None and not isinstance(value, bool):
        raise TwoTowerError(f"{flag('passages')}: True, False or a tt.Passages(...), not {value!r}")
    old = {k: v for k, v in old.items() if v is not None}
    if value is False:
        if old:
            off = switch("passages", "--no-passages").replace("True", "False")
            raise TwoTowerError(f"{', '.join(flag(k) for k in old)} tune passages, which {off} turns off: drop "
                                "one of them")
        return False
    if old:
        with keyword_names():
            return Passages(**{GROUPS["passages"][1][k]: v for k, v in old.items()})
    return Passages() if value else None


def _ray(value, old: dict):
    """None (a build here) or a :class:`Ray`."""
    if isinstance(value, Ray):
        if old:
            _both("ray", old)
        return value
    if not isinstance(value, bool):
        raise TwoTowerError(f"{flag('ray')}: True, False or a tt.Ray(...), not {value!r}")
    with keyword_names():
        spec = Ray(**{GROUPS["ray"][1][k]: v for k, v in old.items()})
    if value:
        return spec
    unused = [flag(k) for k, v in (("ray_address", spec.address), ("workers", spec.workers),
                                   ("gpus_per_worker", spec.gpus_per_worker or None)) if v is not None]
    if unused:
        raise TwoTowerError(f"{', '.join(unused)} set how Ray encodes; without {flag('ray')} the build runs here and "
                            "would ignore them: drop them or turn Ray on")
    return None


def _backend(value, old: dict):
    """``"faiss"``, ``"milvus"`` (no uri: refused when the build checks it) or a :class:`Milvus`."""
    if isinstance(value, Milvus):
        if old:
            _both("backend", old)
        return value
    old = {k: v for k, v in old.items() if v is not None}
    if value == "milvus" and old:
        if "uri" not in old:
            return value  # refused by the build: backend="milvus" needs its uri
        with keyword_names():
            return Milvus(**old)
    if old and value == "faiss":
        where = ("--backend milvus" if naming() == "cli"
                 else f"backend=tt.Milvus({', '.join(f'{k}=…' for k in old)})")
        raise TwoTowerError(f"{' / '.join(flag(k) for k in old)} name a Milvus location: pass {where}")
    return value
