"""Texts much longer than a model reads (a web page of megabytes in a crawl): cut before
they cost memory and time in proportion to their size, without changing a vector.

A model reads the first `--max-length` tokens of a text; a tokenizer given a whole text of
50 MB tokenizes all of it first (gigabytes of tokens and offsets) and truncates after. So:

- the reader cuts a text longer than `reader_bound` characters to that many (`TextCut`),
  right after its chunk is read, and computes its content hash there, over the whole text
  (BLAKE2b-128 of the prompt and the text, as the tokenizer processes compute it for the
  others), streamed from the text's bytes: the content hash, `--since` and the change set
  see every byte of it;
- the tokenizer is given the first `tokenizer_bound` characters of a longer text, then 4
  times as many, and so on, until the tokens it keeps end `MARGIN` characters before where
  the text was cut (`tokenize.TextTokenizer`): the word cut in two, and anything after it,
  then lies past the kept tokens, so they are the whole text's. A text that the reader cut
  and whose kept tokens never end so far before the cut (megabytes of spaces, say) is set
  aside as a bad record, never embedded from a prefix that may differ.

Both bounds grow with `--max-length`: `CHARS_PER_TOKEN` characters a token, far more than a
token of any text takes (about 4 in English), and a margin.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bulkembed.sources.records import Chunk

CHARS_PER_TOKEN = 32
MARGIN = 1024
# How many times the tokenizer's first bound the reader keeps.
_READER_FACTOR = 16
# The pieces of a long text lowercased at a time, for its content hash.
_PIECE = 1 << 20
_SPACES = (b" ", b"\n", b"\t", b"\r")


def tokenizer_bound(max_length: int) -> int:
    """The characters of a longer text that the tokenizer is given first.

    >>> tokenizer_bound(512)
    20480
    """
    return max_length * CHARS_PER_TOKEN + 4 * MARGIN


def reader_bound(max_length: int) -> int:
    """The characters the reader keeps of a text (`TextCut`)."""
    return _READER_FACTOR * tokenizer_bound(max_length)


@dataclass(frozen=True, slots=True)
class TextCut:
    """How the reader cuts a chunk's long texts: to `chars` characters, their content hash
    taken first over the prompt and the whole text (lowercased with `lowercase`)."""

    chars: int
    prompt: str = ""
    lowercase: bool = False

    def apply(self, chunk: Chunk) -> None:
        """Cut the texts of `chunk` longer than `chars`; their content hashes go into
        `chunk.hashes` (zero for the others, which the tokenizer processes hash)."""
        texts = chunk.texts
        if not len(texts):
            return
        sizes = pc.binary_length(texts).to_numpy(zero_copy_only=False)
        candidates = np.flatnonzero(np.nan_to_num(sizes) > self.chars).tolist()
        # More bytes than `chars` may still be fewer characters; a slice is no copy.
        long = [r for r in candidates if pc.utf8_length(texts.slice(r, 1))[0].as_py() > self.chars]
        if not long:
            return
        hashes = np.zeros(len(texts), "S16")
        for row in long:
            hashes[row] = self.digest(_value_bytes(texts, row))
        pieces, start = [], 0
        for row in long:
            cut = _prefix(_value_bytes(texts, row), self.chars)
            pieces += [texts.slice(start, row - start), pa.array([cut], texts.type)]
            start = row + 1
        pieces.append(texts.slice(start))
        chunk.texts = pa.concat_arrays(pieces)
        chunk.hashes = hashes

    def text_of(self, value: memoryview) -> tuple[str, bytes]:
        """The text of UTF-8 bytes `value`, and its content hash where it is cut (else
        empty bytes); raises ValueError for bytes that are not UTF-8."""
        if len(value) > self.chars and not valid_utf8(value):
            raise ValueError("not UTF-8")
        if len(value) > 4 * self.chars:
            return _prefix(value, self.chars), self.digest(value)
        text = bytes(value).decode("utf-8")
        if len(text) > self.chars:
            return text[: self.chars], self.digest(value)
        return text, b""

    def content_hash(self) -> ContentHash:
        """A content hash to stream a text into."""
        return ContentHash(self.prompt, self.lowercase)

    def digest(self, text: memoryview) -> bytes:
        """The content hash of a text of UTF-8 bytes `text`, as `tokenize.content_digest`
        gives it for the text as the model reads it, streamed: no copy of the whole text."""
        found = self.content_hash()
        if not self.lowercase:
            found.update_bytes(text)
            return found.digest()
        start = 0
        while start < len(text):
            end = _piece_end(text, start)
            found.update(bytes(text[start:end]).decode("utf-8"))
            start = end
        return found.digest()


class ContentHash:
    """BLAKE2b-128 of the prompt and a text, as the model reads them (lowercased with
    `lowercase`), the text given a piece at a time."""

    def __init__(self, prompt: str, lowercase: bool) -> None:
        self.lowercase = lowercase
        self._hash = hashlib.blake2b(digest_size=16)
        self.update(prompt)

    def update(self, piece: str) -> None:
        """Add the next piece of the text (raises UnicodeEncodeError for an unpaired
        surrogate)."""
        self._hash.update((piece.lower() if self.lowercase else piece).encode("utf-8"))

    def update_bytes(self, piece: memoryview) -> None:
        """Add the next piece of the text as UTF-8 bytes (not lowercased)."""
        self._hash.update(piece)

    def digest(self) -> bytes:
        return self._hash.digest()


def _value_bytes(texts: pa.Array, row: int) -> memoryview:
    """The UTF-8 bytes of value `row` of a string array, without a copy."""
    offsets_type = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    _, offsets, data = texts.buffers()
    at = np.frombuffer(offsets, offsets_type, 2, (texts.offset + row) * offsets_type().itemsize)
    return memoryview(data)[int(at[0]) : int(at[1])]


def valid_utf8(data: bytes | bytearray | memoryview) -> bool:
    """Whether `data` is valid UTF-8, all of it, checked in place (no copy) by Arrow."""
    offsets = pa.py_buffer(np.array([0, len(data)], np.int64).tobytes())
    try:
        pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(data)]).validate(
            full=True
        )
    except pa.ArrowInvalid:
        return False
    return True


def _prefix(text: memoryview, chars: int) -> str:
    """The first `chars` characters of the UTF-8 text `text`, read from no more of its
    bytes than they can take (4 a character; a character cut there is left out)."""
    return bytes(text[: 4 * chars]).decode("utf-8", "ignore")[:chars]


def _piece_end(text: memoryview, start: int) -> int:
    """Where the piece of `text` from `start` ends: about `_PIECE` bytes on, after a space
    where one is near (lowercasing a piece alone then gives what the whole text gives:
    Greek final sigma looks no further than a space), else on a character boundary."""
    end = start + _PIECE
    if end >= len(text):
        return len(text)
    window = bytes(text[end - 4096 : end])
    space = max(window.rfind(s) for s in _SPACES)
    if space >= 0:
        return end - 4096 + space + 1
    while text[end] & 0xC0 == 0x80:  # a continuation byte: back to where its character starts
        end -= 1
    return end
