"""The hashes that ids are found by: keyed, 128 bits, computed on whole Arrow arrays.

A run finds ids by hash where it would otherwise hold them all: repeated ids (`SeenIds`), the
previous output's rows of an incremental run (`bulkembed.incremental.lookup`), the ids it may delete
(`bulkembed.incremental.deletions`). Ids come from users' data, which may come from anyone, so a
hash that anyone can compute would let two ids be made to collide, and one of them be dropped as a
repeat or take the other's row. These hashes are SipHash-1-3 with 128-bit output, keyed by a secret
drawn for each run (`IdKey.fresh`): without the key, no collision can be crafted, and by chance two
of n ids share a hash with odds of about n² / 2¹²⁹.

A hash is two uint64 words, a row of an [ids, 2] array: the first indexes (sorted arrays
are searched by it), the second confirms.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_TEXT_TYPES = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())
# SipHash's initial words ("somepseudorandomlygeneratedbytes"), and the rounds per 8-byte
# block and at the end (SipHash-1-3, the variant Python's own str hash uses).
_INITIAL = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)
_BLOCK_ROUNDS, _FINAL_ROUNDS = 1, 3
_SHIFTS = {bits: np.uint64(bits) for bits in (13, 16, 17, 21, 32, 51, 48, 47, 43)}


@dataclass(frozen=True, slots=True)
class IdKey:
    """The 16-byte secret that a run's id hashes are keyed by; every process of the run
    hashes with the same one. It is not written anywhere: no hash outlives its run."""

    secret: bytes

    @classmethod
    def fresh(cls) -> IdKey:
        return cls(os.urandom(16))

    def __repr__(self) -> str:
        return "IdKey(…)"

    def hashes(self, ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Each id's hash, as a row of an [ids, 2] uint64 array: the id's UTF-8 bytes
        (integers in decimal, a missing id as `None`) through SipHash-1-3-128. A chunked
        array is hashed a chunk at a time.

        >>> key = IdKey(bytes(16))
        >>> a, b = key.hashes(pa.array(["doc-1", "doc-2"]))
        >>> a.shape, bool((a == key.hashes(pa.array(["doc-1"]))[0]).all()), bool((a == b).all())
        ((2,), True, False)
        """
        if isinstance(ids, pa.ChunkedArray):
            hashed = [self._array_hashes(chunk) for chunk in ids.chunks]
            return np.concatenate(hashed) if hashed else np.empty((0, 2), np.uint64)
        return self._array_hashes(ids)

    def hash(self, doc_id: Any) -> np.ndarray:
        """One id's hash (its decimal form for an integer)."""
        return self.hashes(pa.array([str(doc_id)]))[0]

    def _array_hashes(self, ids: pa.Array) -> np.ndarray:
        if ids.type not in _TEXT_TYPES:
            ids = pc.cast(ids, pa.string())
        if ids.null_count:
            ids = pc.fill_null(ids, "None")
        return siphash13_128(pc.cast(ids, pa.large_binary()), self.secret)


class _State:
    """SipHash's four words for many messages at once, changed in place."""

    def __init__(self, key: bytes, count: int) -> None:
        k0 = np.uint64(int.from_bytes(key[:8], "little"))
        k1 = np.uint64(int.from_bytes(key[8:], "little"))
        # The 128-bit variant marks its first word with 0xee.
        start = (k0 ^ _INITIAL[0], k1 ^ _INITIAL[1] ^ 0xEE, k0 ^ _INITIAL[2], k1 ^ _INITIAL[3])
        self.words = [np.full(count, np.uint64(w)) for w in start]
        self._spare = np.empty(count, np.uint64)

    def absorb(self, block: np.ndarray, which: np.ndarray | None = None) -> None:
        """Mix one 8-byte block of each message in (of the messages at `which` only)."""
        if which is None:
            words = self.words
            words[3] ^= block
            self._rounds(words, _BLOCK_ROUNDS, self._spare)
            words[0] ^= block
            return
        words = [w[which] for w in self.words]
        words[3] ^= block
        self._rounds(words, _BLOCK_ROUNDS, np.empty(len(which), np.uint64))
        words[0] ^= block
        for mine, changed in zip(self.words, words, strict=True):
            mine[which] = changed

    def finish(self) -> np.ndarray:
        """The two output words of each message, as [messages, 2]."""
        v0, v1, v2, v3 = self.words
        v2 ^= np.uint64(0xEE)
        out = np.empty((len(v0), 2), np.uint64)
        for column, mark in ((0, 0), (1, 0xDD)):
            v1 ^= np.uint64(mark)
            self._rounds(self.words, _FINAL_ROUNDS, self._spare)
            out[:, column] = v0 ^ v1 ^ v2 ^ v3
        return out

    @staticmethod
    def _rounds(words: list[np.ndarray], count: int, spare: np.ndarray) -> None:
        v0, v1, v2, v3 = words

        def rotate(x: np.ndarray, bits: int) -> None:
            np.right_shift(x, _SHIFTS[64 - bits], out=spare)
            np.left_shift(x, _SHIFTS[bits], out=x)
            np.bitwise_or(x, spare, out=x)

        for _ in range(count):
            v0 += v1
            rotate(v1, 13)
            v1 ^= v0
            rotate(v0, 32)
            v2 += v3
            rotate(v3, 16)
            v3 ^= v2
            v0 += v3
            rotate(v3, 21)
            v3 ^= v0
            v2 += v1
            rotate(v1, 17)
            v1 ^= v2
            rotate(v2, 32)


def siphash13_128(messages: pa.Array, key: bytes) -> np.ndarray:
    """SipHash-1-3 with 128-bit output of each of `messages` (a large_binary array), keyed
    by 16 bytes, as [messages, 2] uint64 (the output's two little-endian halves). No
    Python object is made per message: the 8-byte blocks of every message are mixed in
    one numpy pass per block position."""
    count = len(messages)
    buffers = messages.buffers()
    offsets = np.frombuffer(buffers[1], np.int64, count + 1, messages.offset * 8)
    data = buffers[2]
    raw = np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8)
    # The bytes of these messages only (a slice's buffer is its parent's), then eight zero
    # bytes, so that the last block of the last message reads no further; each position's
    # next 8 bytes, as a row of a strided view (no copy).
    raw = np.concatenate([raw[offsets[0] : offsets[-1]], np.zeros(8, np.uint8)])
    offsets = offsets - offsets[0]
    windows = np.lib.stride_tricks.as_strided(raw, (len(raw) - 7, 8), (1, 1), writeable=False)
    starts, lengths = offsets[:-1], np.diff(offsets)
    blocks = lengths // 8
    state = _State(key, count)
    with np.errstate(over="ignore"):
        for block in range(int(blocks.max()) if count else 0):
            longer = blocks > block
            which = None if longer.all() else np.flatnonzero(longer)
            at = starts + 8 * block if which is None else starts[which] + 8 * block
            state.absorb(windows[at].view("<u8")[:, 0], which)
        # The last block: the bytes left over, and the length's low byte on top.
        tail = windows[starts + 8 * blocks].view("<u8")[:, 0]
        left = (8 * (lengths % 8)).astype(np.uint64)
        tail = tail & ((np.uint64(1) << left) - np.uint64(1))
        tail |= (lengths.astype(np.uint64) & np.uint64(0xFF)) << np.uint64(56)
        state.absorb(tail)
        return state.finish()
