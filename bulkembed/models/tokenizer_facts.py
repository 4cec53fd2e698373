"""What bulkembed reads off a model's tokenizer, kept in the export cache.

Loading a tokenizer through `transformers.AutoTokenizer` imports transformers and PyTorch,
about 1.5 s of a run's start, only to learn a few facts: the fast tokenizer's JSON, the
padding and special token ids, a ColBERT model's marker and skip list, and the length
limit. They are read once per model and kept (`export_cache`, kind `tokenizers`), keyed by
the model's exact files (`model_files.model_version`: the hub commit, or the digest of a
local folder) and the versions of bulkembed, transformers and tokenizers; a change of any
of them reads the tokenizer again. A hub model named by a branch rather than found in a
snapshot is read every time (its files may change under the same name).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bulkembed.errors import ModelError
from bulkembed.models.export_cache import converted, installed_version
from bulkembed.models.model_files import exact_files
from bulkembed.models.st_folder import SentenceTransformersInfo
from bulkembed.version import __version__

# Bumped when what is kept changes.
FACTS_FORMAT = 1
_FACTS = "facts.json"
_TOKENIZER = "tokenizer.json"
# Tokenizers report "no limit" as a huge sentinel number.
_NO_LIMIT = 1_000_000


@dataclass(frozen=True, slots=True)
class TokenizerFacts:
    """The facts of a model's tokenizer that a run needs; `model_max_length` is None where
    the tokenizer sets no limit."""

    tokenizer_json: str
    pad_token_id: int
    special_token_ids: tuple[int, ...]
    prefix_token_id: int | None
    skip_token_ids: tuple[int, ...]
    model_max_length: int | None


def tokenizer_facts(
    source: str, revision: str | None, version: str, st: SentenceTransformersInfo
) -> TokenizerFacts:
    """The facts of the tokenizer of `source` at `version` (its exact files), from the
    export cache where they were read before."""
    if not exact_files(source, version):
        return _read(source, revision, st)
    key = {
        "format": FACTS_FORMAT,
        "source": source,
        "revision": revision,
        "files": version,
        "bulkembed": __version__,
        "transformers": installed_version("transformers"),
        "tokenizers": installed_version("tokenizers"),
    }

    def build(folder: Path) -> None:
        facts = asdict(_read(source, revision, st))
        (folder / _TOKENIZER).write_text(facts.pop("tokenizer_json"), encoding="utf-8")
        (folder / _FACTS).write_text(json.dumps(facts), encoding="utf-8")

    with converted("tokenizers", key, build) as folder:
        facts = json.loads((folder / _FACTS).read_text(encoding="utf-8"))
        return TokenizerFacts(
            tokenizer_json=(folder / _TOKENIZER).read_text(encoding="utf-8"),
            pad_token_id=facts["pad_token_id"],
            special_token_ids=tuple(facts["special_token_ids"]),
            prefix_token_id=facts["prefix_token_id"],
            skip_token_ids=tuple(facts["skip_token_ids"]),
            model_max_length=facts["model_max_length"],
        )


def _read(source: str, revision: str | None, st: SentenceTransformersInfo) -> TokenizerFacts:
    """The facts, read off the model's fast tokenizer."""
    tokenizer = _fast_tokenizer(source, revision)
    pad_token_id = tokenizer.pad_token_id
    if pad_token_id is None:
        pad_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    limit = getattr(tokenizer, "model_max_length", None)
    return TokenizerFacts(
        tokenizer_json=tokenizer.backend_tokenizer.to_str(),
        pad_token_id=int(pad_token_id),
        special_token_ids=_special_token_ids(tokenizer),
        prefix_token_id=_prefix_token_id(tokenizer, st),
        skip_token_ids=_skip_token_ids(tokenizer, st),
        model_max_length=int(limit) if limit is not None and limit < _NO_LIMIT else None,
    )


def _fast_tokenizer(source: str, revision: str | None) -> Any:
    """The model's fast tokenizer (from its tokenizer.json); an error if it has none."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load the tokenizer of {source}: {e}") from e
    if not tokenizer.is_fast:
        raise ModelError(f"{source} has no fast tokenizer (tokenizer.json); bulkembed needs one")
    return tokenizer


def _skip_token_ids(tokenizer: Any, st: SentenceTransformersInfo) -> tuple[int, ...]:
    """Ids of a ColBERT model's skip list (punctuation); words that are no token drop out."""
    if st.colbert is None:
        return ()
    ids = (tokenizer.convert_tokens_to_ids(word) for word in st.colbert.skiplist_words)
    return tuple(sorted({int(i) for i in ids if i is not None}))


def _prefix_token_id(tokenizer: Any, st: SentenceTransformersInfo) -> int | None:
    """The id of a ColBERT model's document marker, put after the first token."""
    if st.colbert is None or not st.colbert.document_prefix:
        return None
    prefix = st.colbert.document_prefix
    token_id = tokenizer.convert_tokens_to_ids(prefix)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ModelError(f"the document marker {prefix!r} is not a token of this tokenizer")
    return int(token_id)


def _special_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """Ids of the cls, eos, pad and unk tokens, which carry no lexical weight."""
    ids = set()
    for name in ("cls_token", "eos_token", "pad_token", "unk_token"):
        token = getattr(tokenizer, name, None)
        if token is not None:
            ids.add(int(tokenizer.convert_tokens_to_ids(token)))
    return tuple(sorted(ids))
