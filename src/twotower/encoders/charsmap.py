"""SentencePiece ``precompiled_charsmap`` blobs: a character-replacement table in the binary form that the
``Precompiled`` normalizer of Hugging Face ``tokenizers`` (and SentencePiece itself) reads.

The blob is ``u32 trie_bytes`` + a darts-clone double-array trie (little-endian u32 units) over the UTF-8
keys + a pool of NUL-terminated replacement strings; a key's trie value is the byte offset of its
replacement in the pool. :func:`build_charsmap` writes one from ``{key: replacement}``;
:func:`charsmap_lookup` reads one back (the first prefix match, as ``tokenizers`` does), for checks.

Unit layout (darts-clone): bits 0-7 the label byte, bit 8 "has a leaf", bits 10-30 the offset to the
node's children (the children of a node at ``p`` with offset ``o`` sit at ``p ^ o ^ byte``, its leaf at
``p ^ o``); a leaf unit has bit 31 set and the value in bits 0-30.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

_LEAF_BIT = 1 << 31
_HAS_LEAF = 1 << 8
_MAX_OFFSET = 1 << 21  # offsets are stored in bits 10..30 (bit 9, the "extended" flag, stays 0)


class _Node:
    __slots__ = ("children", "value")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.value: int | None = None


def _trie(entries: Mapping[bytes, int]) -> _Node:
    root = _Node()
    for key, value in entries.items():
        if not key or 0 in key:
            raise ValueError(f"charsmap key {key!r}: keys must be non-empty and hold no NUL byte")
        node = root
        for byte in key:
            node = node.children.setdefault(byte, _Node())
        node.value = value
    return root


def _double_array(root: _Node) -> list[int]:
    """Place the trie into a double array (first fit; every node gets its own base)."""
    units: list[int] = [0] * 512
    used = bytearray(512)
    used[0] = 1  # the root
    bases: set[int] = set()
    search_from = 256
    queue = [(root, 0)]
    while queue:
        node, pos = queue.pop()
        labels = sorted(node.children)
        slots = labels + ([0] if node.value is not None else [])
        if not slots:
            continue
        while search_from < len(used) and used[search_from]:
            search_from += 1
        free = search_from
        while True:  # the first free position whose base fits every slot
            if (free | 0xFF) + 1 > len(units):
                grow = (free | 0xFF) + 1 - len(units)  # keeps the length a multiple of 256
                units.extend([0] * grow)
                used.extend(bytes(grow))
            base = free ^ slots[0]
            if not used[free] and base not in bases and base != 0 and all(not used[base ^ s] for s in slots):
                break
            free += 1
        offset = pos ^ base
        if offset >= _MAX_OFFSET:
            raise ValueError("charsmap too large for a darts-clone double array")
        bases.add(base)
        units[pos] |= (offset << 10) | (_HAS_LEAF if node.value is not None else 0)
        if node.value is not None:
            units[base] = _LEAF_BIT | node.value
            used[base] = 1
        for label in labels:
            child_pos = base ^ label
            units[child_pos] = label
            used[child_pos] = 1
            queue.append((node.children[label], child_pos))
    return units  # whole 256-unit blocks: a lookup may probe any byte of a block it reaches, unchecked


def build_charsmap(table: Mapping[str, str]) -> bytes:
    """The ``precompiled_charsmap`` blob that replaces each key of ``table`` by its value ("" deletes it)."""
    pool = bytearray()
    where: dict[str, int] = {}
    entries: dict[bytes, int] = {}
    for key, replacement in sorted(table.items()):
        if "\0" in replacement:
            raise ValueError(f"charsmap replacement for {key!r} holds a NUL character")
        if replacement not in where:
            where[replacement] = len(pool)
            pool += replacement.encode("utf-8") + b"\0"
        entries[key.encode("utf-8")] = where[replacement]
    units = _double_array(_trie(entries))
    return struct.pack(f"<I{len(units)}I", 4 * len(units), *units) + bytes(pool)


def charsmap_lookup(blob: bytes, text: str) -> str | None:
    """The replacement of the shortest key that is a prefix of ``text`` in ``blob``, else None."""
    (size,) = struct.unpack_from("<I", blob)
    units = struct.unpack_from(f"<{size // 4}I", blob, 4)
    pool = blob[4 + size :]

    def offset(unit: int) -> int:
        return (unit >> 10) << ((unit & (1 << 9)) >> 6)

    pos = offset(units[0])
    for byte in text.encode("utf-8"):
        pos ^= byte
        if pos >= len(units) or units[pos] & (_LEAF_BIT | 0xFF) != byte:
            return None
        unit = units[pos]
        pos ^= offset(unit)
        if unit & _HAS_LEAF:
            start = units[pos] & (_LEAF_BIT - 1)
            return pool[start : pool.index(b"\0", start)].decode("utf-8")
    return None
