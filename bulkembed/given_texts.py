"""Texts handed to the in-process encoder (`bulkembed.load(...).encode(texts)`), checked
before any is tokenized: one string, or strings, each valid Unicode."""

from __future__ import annotations

from collections.abc import Iterable

from bulkembed.errors import UsageError


def text_list(texts: str | Iterable[str]) -> list[str]:
    """`texts` as a list: one string is one text; anything but strings is an error."""
    if isinstance(texts, str):
        return [texts]
    if texts is None or not isinstance(texts, Iterable):
        raise UsageError(f"expected a text or a list of texts, not {type(texts).__name__}")
    listed = list(texts)
    for number, text in enumerate(listed):
        if not isinstance(text, str):
            raise UsageError(
                f"text {number} is a {type(text).__name__}, not a string: pass strings only"
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise UsageError(
                f"text {number} holds an unpaired surrogate (U+{ord(text[e.start]):04X}) at "
                f"character {e.start}, which is not valid Unicode: pass valid text"
            ) from None
    return listed
