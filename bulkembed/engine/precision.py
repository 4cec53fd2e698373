"""The start-up parity check of a fast dtype picked by `--dtype auto`.

A sample of the corpus (the first documents of the first window) is embedded in float32 and
in the fast dtype. The fast dtype is kept only if every dense vector stays at cosine
`PARITY_THRESHOLD` or more to its float32 twin, and so do `100 - PERCENTILE` % of the
multi-vector token vectors and sparse vectors (one stray token among thousands, a weight
that crosses zero, does not decide the run's dtype; a shifted model does). Otherwise the
run goes on in float32, and says so in a warning, the log and the summary. The sample's
vectors in the dtype kept are the run's own for those documents: they are not embedded
again.

What a check found is recorded in the export cache (`dtype-checks/`), keyed by the model's
settings and exact files (the whole `ModelSpec`), the device (the CPU's model name and
flags, or the GPU's name and compute capability), the dtype tried and the versions of
bulkembed, PyTorch, OpenVINO and transformers. A later run with the same key takes the
recorded decision without embedding its sample twice; a change of any part of the key
checks again, and so does removing the folder. That run still embeds the sample first, in
the batches and dtype the check embedded it in (`replay_on_window`): its output is the one
the run that made the check wrote.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bulkembed.batching.packing import input_order, pack_batches
from bulkembed.batching.windows import EmbeddedHead
from bulkembed.encoders import Embeddings, Encoder, TokenBatch
from bulkembed.encoders.decisions import model_key, read_decision, record_decision
from bulkembed.models.devices import exact_float32
from bulkembed.wording import counted

if TYPE_CHECKING:
    import torch

    from bulkembed.batching.tokenize import TokenizedChunk
    from bulkembed.models.model_spec import ModelSpec

PARITY_THRESHOLD = 0.9999
# Multi-vector and sparse cosines are judged at this percentile (the 1st: 99% must pass).
PERCENTILE = 1
SAMPLE_DOCUMENTS = 64
# The nearest neighbours an int8 check compares (`neighbour_agreement`).
NEIGHBOURS = 5
# Bumped when a recorded check means something else.
_RECORD_FORMAT = 1
_KIND = "dtype-checks"


@dataclass(frozen=True, slots=True)
class Sample:
    """A window's first documents: their token ids, one array each, and for images their
    pixels (one image each)."""

    sequences: list[np.ndarray]
    pixels: np.ndarray | None

    def __len__(self) -> int:
        return len(self.sequences)

    def batch(self, indices: np.ndarray) -> TokenBatch:
        """The documents at `indices` as a batch."""
        pixels = None if self.pixels is None else self.pixels[indices]
        return TokenBatch.from_sequences([self.sequences[i] for i in indices], pixels)


def window_sequences(window: list[TokenizedChunk], count: int) -> list[np.ndarray]:
    """The token ids of the window's first `count` documents, one array each."""
    sequences: list[np.ndarray] = []
    for tokenized in window:
        if len(sequences) >= count:
            break
        ends = np.cumsum(tokenized.lengths)
        sequences += np.split(tokenized.token_ids, ends[:-1]) if len(ends) else []
    return sequences[:count]


def sample_sequences(window: list[TokenizedChunk]) -> Sample:
    """The window's first `SAMPLE_DOCUMENTS` documents."""
    pixels: list[np.ndarray] = []
    held = 0
    for tokenized in window:
        if held >= SAMPLE_DOCUMENTS:
            break
        held += len(tokenized.lengths)
        if tokenized.pixels is not None:
            pixels.append(tokenized.pixels)
    images = np.concatenate(pixels)[:SAMPLE_DOCUMENTS] if pixels else None
    return Sample(window_sequences(window, SAMPLE_DOCUMENTS), images)


@dataclass(frozen=True, slots=True)
class Agreement:
    """How far a fast dtype's vectors are from float32's: the lowest cosine of the dense
    vectors, and the lower of the `PERCENTILE`th percentiles of the multi-vector token
    vectors' cosines and of the sparse vectors' (None for outputs the run does not write)."""

    dense: float | None
    others: float | None
    # The mean share of each document's nearest neighbours in the sample that the fast
    # dtype finds too (`neighbour_agreement`; int8 checks only).
    neighbours: float | None = None

    @property
    def worst(self) -> float:
        return min(v for v in (self.dense, self.others, 1.0) if v is not None)


@dataclass(frozen=True, slots=True)
class Bar:
    """What an int8 check must reach: the lowest dense cosine, and the neighbours' agreement."""

    cosine: float
    neighbours: float

    def __str__(self) -> str:
        return f"cosine {self.cosine}, top-{NEIGHBOURS} agreement {self.neighbours}"


@dataclass(frozen=True, slots=True)
class PrecisionCheck:
    """What the check found: the dtype tried, the agreement, on how many documents; whether
    an earlier run found it (`recorded_check`)."""

    tried: str
    agreement: Agreement
    documents: int
    recorded: bool = False
    # The token budget the sample was embedded in batches of (a recorded check's).
    budget: int | None = None
    # An int8 check's bar (None: a half-precision one, at `PARITY_THRESHOLD`).
    bar: Bar | None = None
    # Why the int8 model could not be made, where it could not (the check then fails).
    failure: str | None = None

    @property
    def passed(self) -> bool:
        found = self.agreement
        if self.bar is None:
            return found.worst >= PARITY_THRESHOLD
        cosine, neighbours = found.dense or 0.0, found.neighbours or 0.0
        return cosine >= self.bar.cosine and neighbours >= self.bar.neighbours

    def describe(self) -> str:
        if self.failure is not None:
            return f"{self.tried}: {self.failure}; running in float32"
        found = []
        if self.agreement.dense is not None:
            found.append(f"lowest dense cosine {self.agreement.dense:.7f}")
        if self.agreement.others is not None:
            found.append(
                f"multi-vector/sparse cosine at the {PERCENTILE}st percentile "
                f"{self.agreement.others:.7f}"
            )
        if self.agreement.neighbours is not None:
            found.append(f"top-{NEIGHBOURS} neighbour agreement {self.agreement.neighbours:.3f}")
        if self.passed:
            verdict = "kept"
        elif self.bar is not None:
            verdict = f"below {self.bar}: running in float32"
        else:
            verdict = (
                f"below {PARITY_THRESHOLD}: running in float32, several times slower "
                f"(--dtype {self.tried} keeps {self.tried} without the check)"
            )
        earlier = " (recorded by an earlier run of this model on this device)"
        return (
            f"{self.tried} against float32 on {counted(self.documents, 'document')}: "
            f"{', '.join(found) or 'no vectors'}; {verdict}{earlier if self.recorded else ''}"
        )


def _check_key(spec: ModelSpec, device: str, dtype: torch.dtype) -> dict[str, Any] | None:
    """The key of the check of `spec` in `dtype` on `device` (see the module's docstring)."""
    key = model_key(spec, device, dtype)
    return None if key is None else {"format": _RECORD_FORMAT, **key}


def recorded_check(spec: ModelSpec, device: str, dtype: torch.dtype) -> PrecisionCheck | None:
    """The check an earlier run recorded for `spec` in `dtype` on `device`, if any."""
    found = read_decision(_KIND, _check_key(spec, device, dtype))
    if found is None:
        return None
    try:
        agreement = Agreement(found["dense"], found["others"])
        documents, budget = int(found["documents"]), int(found["budget"])
        return PrecisionCheck(found["tried"], agreement, documents, True, budget)
    except (ValueError, KeyError, TypeError):
        return None


def record_check(
    spec: ModelSpec, device: str, dtype: torch.dtype, check: PrecisionCheck, budget: int
) -> None:
    """Record `check`, made in batches of `budget` tokens, for later runs; where the cache
    cannot be written, nothing is."""
    found = {"tried": check.tried, "documents": check.documents, **asdict(check.agreement)}
    record_decision(_KIND, _check_key(spec, device, dtype), {**found, "budget": budget})


def _row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = (a * b).sum(axis=1)
    # Two zero vectors agree; one zero vector against another does not.
    return np.where(norms > 0, dots / np.maximum(norms, 1e-30), np.where(dots == 0, 1.0, 0.0))


def agreement(reference: Embeddings, candidate: Embeddings) -> Agreement:
    """How closely `candidate` matches `reference`, two embeddings of the same documents:
    dense rows; multi-vector tokens and sparse vectors (over the union of their terms)."""
    dense = None
    if reference.dense is not None and candidate.dense is not None:
        dense = float(_row_cosines(reference.dense, candidate.dense).min(initial=1.0))
    # Each output judged on its own: thousands of agreeing token vectors must not hide 64
    # sparse vectors that disagree.
    percentiles = []
    if reference.multivector is not None and candidate.multivector is not None:
        tokens = [
            _row_cosines(a, b) if len(a) == len(b) else np.zeros(max(len(a), 1))
            for a, b in zip(reference.multivector, candidate.multivector, strict=True)
        ]
        percentiles.append(_percentile(tokens))
    if reference.sparse is not None and candidate.sparse is not None:
        vectors = []
        for left, right in zip(reference.sparse, candidate.sparse, strict=True):
            terms = np.union1d(left.indices, right.indices)
            dense_a, dense_b = np.zeros((1, len(terms))), np.zeros((1, len(terms)))
            dense_a[0, np.searchsorted(terms, left.indices)] = left.values
            dense_b[0, np.searchsorted(terms, right.indices)] = right.values
            vectors.append(_row_cosines(dense_a, dense_b))
        percentiles.append(_percentile(vectors))
    found = [p for p in percentiles if p is not None]
    return Agreement(dense, min(found) if found else None)


def neighbour_agreement(reference: np.ndarray, candidate: np.ndarray) -> float:
    """The mean share of each row's `NEIGHBOURS` nearest other rows by cosine in
    `reference` that are among its nearest in `candidate` (1.0 with too few rows)."""
    rows = len(reference)
    k = min(NEIGHBOURS, rows - 1)
    if k < 1:
        return 1.0

    def nearest(vectors: np.ndarray) -> np.ndarray:
        unit = vectors.astype(np.float64)
        unit /= np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-30)
        similarity = unit @ unit.T
        np.fill_diagonal(similarity, -np.inf)
        # Ties broken by row number, the same way in both.
        return np.argsort(-similarity, axis=1, kind="stable")[:, :k]

    found, expected = nearest(candidate), nearest(reference)
    shared = [len(np.intersect1d(a, b)) for a, b in zip(expected, found, strict=True)]
    return float(np.mean(shared) / k)


def _percentile(cosines: list[np.ndarray]) -> float | None:
    """The `PERCENTILE`th percentile of some cosines; None if there are none."""
    joined = np.concatenate(cosines) if cosines else np.empty(0)
    return float(np.percentile(joined, PERCENTILE)) if len(joined) else None


def embed_sample(encoder: Encoder, sample: Sample, budget: int) -> EmbeddedHead:
    """A few documents embedded in token-budget batches, packed as a window's are; their
    vectors in the sample's order."""
    lengths = np.array([len(s) for s in sample.sequences], dtype=np.int32)
    batches = pack_batches(lengths, budget, padded=not encoder.unpadded)
    started = time.perf_counter()
    outputs = [encoder.embed_within_memory(sample.batch(b.indices)) for b in batches]
    vectors = Embeddings.concatenate(outputs).take(input_order(batches))
    return EmbeddedHead(vectors, batches, time.perf_counter() - started)


@dataclass(frozen=True, slots=True)
class CheckedWindow:
    """The check made on a window: the encoder to go on with, what was found, and the
    window's first documents as that encoder embedded them (`sample`)."""

    encoder: Encoder
    check: PrecisionCheck
    sample: EmbeddedHead


def check_on_window(
    reference: Encoder, window: list[TokenizedChunk], dtype: torch.dtype, budget: int
) -> CheckedWindow | None:
    """Embed the window's first documents with `reference` (float32, its matrix
    multiplies in full float32 even where the run allows TF32) and with it in
    `dtype` (`Encoder.in_dtype`), in batches of `budget` tokens; go on with the new
    encoder if every vector agrees, else with `reference`, and keep the sample as the
    encoder gone on with embedded it. None when the window holds no document to embed:
    the next one decides."""
    sample = sample_sequences(window)
    if not sample:
        return None
    fast = reference.in_dtype(dtype)
    with exact_float32():
        expected = embed_sample(reference, sample, budget)
    found = embed_sample(fast, sample, budget)
    tried = str(dtype).removeprefix("torch.")
    check = PrecisionCheck(tried, agreement(expected.vectors, found.vectors), len(sample))
    if check.passed:
        return CheckedWindow(fast, check, found)
    return CheckedWindow(reference, check, expected)


def replay_on_window(
    encoder: Encoder,
    window: list[TokenizedChunk],
    budget: int,
    check: PrecisionCheck,
    embedding: Callable[[], None],
) -> EmbeddedHead | None:
    """The window's first documents embedded by `encoder` (in the dtype `check`, recorded
    by an earlier run, kept) as the check embedded them, `embedding` told first; None when
    the window holds no document to embed."""
    sample = sample_sequences(window)
    if not sample:
        return None
    embedding()
    if check.passed:
        return embed_sample(encoder, sample, check.budget or budget)
    with exact_float32():
        return embed_sample(encoder, sample, check.budget or budget)
