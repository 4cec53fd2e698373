"""The start-up check of an int8 dtype (`bulkembed.encoders.int8`) against float32.

The run's first 64 documents are embedded in float32 and in int8, as `--dtype auto`'s
half-precision check embeds them (`bulkembed.engine.precision`), and int8 is kept when
the lowest dense cosine and the agreement of each document's 5 nearest neighbours in the
sample (`neighbour_agreement`) both reach a bar:

- `--dtype auto` tries `int8-weights` at the near-lossless bar, `NEAR_LOSSLESS`;
- `--dtype int8-weights` and `--dtype int8` are asked for: they are kept at the guard bar,
  `GUARD`, which rejects a model that is broken, not one that is a little off.

Otherwise the run goes on in float32, with one warning. Static int8 is calibrated on the
window's documents after the check's (`CALIBRATION_DOCUMENTS`; its first ones where the
window holds too few after them), so that the check does not judge it on what it saw.

What the check found, and the calibration's documents, are written in the run directory
(`int8.json`) before any vector is, by the first of a run's shards to decide: the others,
a resumed run, and a `--since` run on this output take the same decision with the same
calibration, so int8 and float32 vectors never mix in one output, whatever the export
cache holds. The check is also recorded in the export
cache (`int8-checks/`, keyed like the half-precision check's, with the mode and the
calibration's digest), so that a later run of the same model on the same device skips its
float32 half.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bulkembed.config import DType
from bulkembed.encoders.decisions import model_key, read_decision, record_decision
from bulkembed.encoders.int8 import CALIBRATION_DOCUMENTS, Calibration
from bulkembed.engine.precision import (
    SAMPLE_DOCUMENTS,
    Agreement,
    Bar,
    CheckedWindow,
    PrecisionCheck,
    Sample,
    agreement,
    embed_sample,
    neighbour_agreement,
    sample_sequences,
    window_sequences,
)
from bulkembed.errors import ModelError
from bulkembed.models.devices import exact_float32
from bulkembed.run_dir.files import read_json, write_json_atomically

if TYPE_CHECKING:
    from bulkembed.batching.tokenize import TokenizedChunk
    from bulkembed.batching.windows import EmbeddedHead
    from bulkembed.encoders import Encoder
    from bulkembed.models.model_spec import ModelSpec
    from bulkembed.run_dir import RunDirectory
    from bulkembed.storage import AnyPath

# Measured on all-MiniLM-L6-v2 (docs/int8.md): int8-weights passes the first in 500 of 500
# random 64-document samples, static int8 in 2%; every sane int8 model passes the second,
# and models quantized without the transformer model type fail it.
NEAR_LOSSLESS = Bar(0.995, 0.93)
GUARD = Bar(0.95, 0.85)
INT8_FILE = "int8.json"
# Bumped when a recorded check means something else.
_RECORD_FORMAT = 1
_KIND = "int8-checks"
_UNMADE = "install what made them, or start over with --overwrite"


def int8_bar(dtype: DType) -> Bar:
    """The bar an int8 dtype tried under `--dtype` must reach."""
    return NEAR_LOSSLESS if dtype is DType.AUTO else GUARD


def window_calibration(window: list[TokenizedChunk]) -> Calibration:
    """Static int8's calibration documents: those of `window` after the check's sample, up
    to `CALIBRATION_DOCUMENTS`, or its first ones where fewer than a third of that follow."""
    sequences = window_sequences(window, SAMPLE_DOCUMENTS + CALIBRATION_DOCUMENTS)
    after = sequences[SAMPLE_DOCUMENTS:]
    if len(after) >= CALIBRATION_DOCUMENTS // 3:
        return Calibration(tuple(after))
    return Calibration(tuple(sequences[:CALIBRATION_DOCUMENTS]))


@dataclass(frozen=True, slots=True)
class Int8Record:
    """What a run decided of int8, kept in its run directory (`INT8_FILE`)."""

    path: AnyPath

    @classmethod
    def of(cls, run: RunDirectory) -> Int8Record:
        return cls(run.meta / INT8_FILE)

    def read(self) -> tuple[dict[str, Any], Calibration | None] | None:
        """The check recorded, and the calibration's documents (None for int8-weights)."""
        if not self.path.exists():
            return None
        found = read_json(self.path)
        stored = found.pop("calibration", None)
        if stored is None:
            return found, None
        ids = np.frombuffer(base64.b64decode(stored["ids"]), dtype="<i4")
        ends = np.cumsum(stored["lengths"])
        return found, Calibration(tuple(np.split(ids, ends[:-1])))

    def write(self, check: PrecisionCheck, calibration: Calibration | None) -> bool:
        """Keep `check`, and the documents that calibrated the model it checked, unless a
        decision is kept already (a `--shard` beside this one made it first): False then."""
        found: dict[str, Any] = _as_record(check)
        if calibration is not None:
            # Token ids as little-endian int32, one document after another.
            ids = np.concatenate(calibration.sequences).astype("<i4").tobytes()
            lengths = [len(s) for s in calibration.sequences]
            found["calibration"] = {"lengths": lengths, "ids": base64.b64encode(ids).decode()}
        return write_json_atomically(self.path, found, exclusive=True)


def share_int8(run: RunDirectory, previous: RunDirectory) -> None:
    """A `--since` run takes the int8 decision and calibration of the output it updates,
    where it made one, so that the vectors it writes are those of the vectors it keeps."""
    made = Int8Record.of(previous).path
    if made.exists():
        write_json_atomically(Int8Record.of(run).path, read_json(made), exclusive=True)


def _as_record(check: PrecisionCheck) -> dict[str, Any]:
    return {
        "tried": check.tried,
        "documents": check.documents,
        "budget": check.budget,
        **asdict(check.agreement),
    }


def _from_record(found: dict[str, Any], bar: Bar) -> PrecisionCheck | None:
    try:
        agreement = Agreement(found["dense"], found["others"], found["neighbours"])
        documents, budget = int(found["documents"]), int(found["budget"])
        return PrecisionCheck(str(found["tried"]), agreement, documents, True, budget, bar)
    except (ValueError, KeyError, TypeError):
        return None


def _check_key(
    spec: ModelSpec, device: str, calibration: Calibration | None
) -> dict[str, Any] | None:
    import torch

    key = model_key(spec, device, torch.float32)
    if key is None:
        return None
    digest = None if calibration is None else calibration.digest
    return {"format": _RECORD_FORMAT, "calibration": digest, **key}


def int8_on_window(
    reference: Encoder,
    window: list[TokenizedChunk],
    bar: Bar,
    budget: int,
    record: Int8Record | None,
    embedding: Callable[[], None],
) -> CheckedWindow | None:
    """The int8 dtype of `reference.spec` (`ModelSpec.int8`) checked, or its check
    replayed, on `window`'s first documents; `reference` runs float32. Goes on with the
    int8 encoder where it passes `bar`, else with `reference`; the sample is kept as the
    encoder gone on with embedded it. Where `record` holds the run's decision, that one is
    replayed (`embedding` told as the run's first batch begins). None when the window holds
    no document to embed."""
    spec = reference.spec
    mode = spec.int8
    assert mode is not None, "the run tries int8"
    sample = sample_sequences(window)
    if not sample:
        return None
    kept = record.read() if record is not None else None
    calibration = kept[1] if kept is not None else None
    if mode == DType.INT8.value and calibration is None:
        calibration = window_calibration(window)
    key = _check_key(spec, reference.device, calibration)
    found = kept[0] if kept is not None else read_decision(_KIND, key)
    recorded = None if found is None else _from_record(found, bar)
    if recorded is not None:
        embedding()
    try:
        fast = None
        if recorded is None or recorded.passed:
            fast = reference.in_int8(mode, calibration)
    except ModelError as e:
        if recorded is not None and recorded.passed:
            # The run's parts so far are int8: float32 ones must not join them.
            raise ModelError(f"{e}; the run's vectors so far are {mode}: {_UNMADE}") from e
        failed = PrecisionCheck(mode, Agreement(None, None), 0, False, budget, bar, str(e))
        checked = CheckedWindow(reference, failed, _embed_exact(reference, sample, budget))
    else:
        if recorded is not None:
            checked = _replayed(reference, fast, recorded, sample, budget)
        else:
            assert fast is not None
            checked = _checked(reference, fast, sample, budget, bar)
            record_decision(_KIND, key, _as_record(checked.check))
    if record is not None and kept is None and not record.write(checked.check, calibration):
        # Another shard of the run decided first: its decision is the run's (the run's first
        # batch began already where this one replayed a check).
        told = (lambda: None) if recorded is not None else embedding
        return int8_on_window(reference, window, bar, budget, record, told)
    return checked


def _checked(
    reference: Encoder, fast: Encoder, sample: Sample, budget: int, bar: Bar
) -> CheckedWindow:
    """`fast` checked against `reference` on `sample` (see the module's docstring)."""
    expected = _embed_exact(reference, sample, budget)
    head = embed_sample(fast, sample, budget)
    found = agreement(expected.vectors, head.vectors)
    neighbours = None
    if expected.vectors.dense is not None and head.vectors.dense is not None:
        neighbours = neighbour_agreement(expected.vectors.dense, head.vectors.dense)
    agreed = Agreement(found.dense, found.others, neighbours)
    check = PrecisionCheck(str(fast.spec.int8), agreed, len(sample), False, budget, bar)
    if check.passed:
        return CheckedWindow(fast, check, head)
    return CheckedWindow(reference, check, expected)


def _replayed(
    reference: Encoder, fast: Encoder | None, recorded: PrecisionCheck, sample: Sample, budget: int
) -> CheckedWindow:
    """The sample embedded as the `recorded` check left it: by `fast` where int8 passed."""
    batches = recorded.budget or budget
    if fast is None:
        return CheckedWindow(reference, recorded, _embed_exact(reference, sample, batches))
    return CheckedWindow(fast, recorded, embed_sample(fast, sample, batches))


def _embed_exact(encoder: Encoder, sample: Sample, budget: int) -> EmbeddedHead:
    """`sample` embedded by a float32 `encoder` in full float32."""
    with exact_float32():
        return embed_sample(encoder, sample, budget)
