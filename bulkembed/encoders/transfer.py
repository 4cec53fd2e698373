"""A batch's way to the device and its outputs' way back.

`DeviceInputs` is a batch as tensors, in one of two layouts: flat (the documents' tokens end
to end) or padded (each document padded on the right to the longest, on CUDA to the
longest's bucket: `bucketed_width`). Either way the
encoders read the model's hidden states as [tokens, hidden], real tokens only, documents end
to end (`DeviceInputs.hidden_states`), so pooling and the heads are one code for both.

`DeviceOutputs` is what a forward pass leaves on the device; `Landing` copies it back without
waiting (CUDA) and splits it by document on the host, and says how long the device computed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bulkembed.contracts import Embeddings, SparseRows, TokenBatch
from bulkembed.encoders.kernels import AUTO
from bulkembed.encoders.varlen import Sequences

# Padded lengths step by an eighth of the power of two below them, and by 8 tokens at least.
WIDTH_STEPS_PER_OCTAVE = 8
SMALLEST_WIDTH_STEP = 8


def bucketed_width(longest: int, limit: int) -> int:
    """The length a padded batch whose longest document has `longest` tokens is padded to
    on CUDA: rounded up to a multiple of an eighth of the power of two below it (8 at
    least), at most `limit` (the model's maximum length) and never below `longest`. Batches
    then take about eight lengths an octave rather than one per length, so that a kernel
    that prepares itself for each new shape (cuDNN attention builds a graph, tens of
    milliseconds) does so a few dozen times a run, for at most an eighth more tokens.

    >>> [bucketed_width(n, 8192) for n in (1, 9, 100, 130, 300, 513, 5000, 8190)]
    [8, 16, 104, 144, 320, 576, 5120, 8192]
    >>> bucketed_width(500, 512), bucketed_width(510, 512), bucketed_width(600, 512)
    (512, 512, 600)
    """
    octave = 1 << max(0, longest.bit_length() - 1)
    step = max(SMALLEST_WIDTH_STEP, octave // WIDTH_STEPS_PER_OCTAVE)
    return max(longest, min(-(-longest // step) * step, limit))


@dataclass(slots=True)
class DeviceInputs:
    """A batch on its way to the device (or there), in one of two layouts:

    - flat: `input_ids` [tokens], the documents end to end; no `attention_mask`;
    - padded: `input_ids` and `attention_mask` [documents, width], padded on the right to
      the longest document or further (`bucketed_width`), and `token_index` [tokens]: where
      each real token is in `input_ids` flattened.

    `sequences` says where each document's tokens are in the flat order, in both layouts;
    `copied` is, on CUDA, the event that marks the end of the copy (see `Encoder.upload`).
    A batch of images has its `pixels` (uint8 [images, height, width, 3]) and no tokens."""

    batch: TokenBatch
    input_ids: torch.Tensor
    sequences: Sequences
    attention_mask: torch.Tensor | None = None
    token_index: torch.Tensor | None = None
    copied: Any = None
    pixels: torch.Tensor | None = None

    @classmethod
    def images(cls, batch: TokenBatch) -> DeviceInputs:
        """A batch of images, on the host: their pixels, as the worker decoded them."""
        assert batch.pixels is not None, "a batch of images holds their pixels"
        pixels = torch.from_numpy(batch.pixels)
        empty = torch.empty(0, dtype=torch.long)
        return cls(batch, empty, Sequences.on_host(batch.lengths), pixels=pixels)

    @classmethod
    def flat(cls, batch: TokenBatch, kernel: str = AUTO) -> DeviceInputs:
        """`batch` laid out flat, on the host, attended by `kernel` (`kernels`)."""
        input_ids = torch.from_numpy(batch.token_ids.astype(np.int64))
        return cls(batch, input_ids, Sequences.on_host(batch.lengths, kernel))

    @classmethod
    def padded(cls, batch: TokenBatch, pad_token_id: int, width: int | None = None) -> DeviceInputs:
        """`batch` padded on the right with `pad_token_id` to its longest document, or to
        `width` (`bucketed_width`), on the host."""
        sequences = Sequences.on_host(batch.lengths)
        lengths = torch.from_numpy(batch.lengths.astype(np.int64))
        longest = max(sequences.longest, width or 0)
        mask = torch.arange(longest).unsqueeze(0) < lengths.unsqueeze(1)
        input_ids = torch.full((len(lengths), longest), pad_token_id, dtype=torch.long)
        input_ids[mask] = torch.from_numpy(batch.token_ids.astype(np.int64))
        documents = sequences.token_documents
        within = torch.arange(len(documents)) - sequences.cu_seqlens[:-1].long()[documents]
        index = documents * longest + within
        return cls(batch, input_ids, sequences, mask.long(), index)

    @property
    def is_flat(self) -> bool:
        return self.attention_mask is None

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the batch."""
        found = [self.input_ids, self.sequences.cu_seqlens, self.sequences.token_documents]
        optional = (self.attention_mask, self.token_index, self.pixels)
        return found + [t for t in optional if t is not None]

    def moved(self, device: str) -> DeviceInputs:
        """These inputs copied to CUDA `device` from pinned memory, without waiting: call
        on the stream that should make the copies."""

        def move(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.pin_memory().to(device, non_blocking=True)

        mask, index, pixels = self.attention_mask, self.token_index, self.pixels
        return DeviceInputs(
            self.batch,
            move(self.input_ids),
            self.sequences.to(move),
            None if mask is None else move(mask),
            None if index is None else move(index),
            pixels=None if pixels is None else move(pixels),
        )

    @property
    def token_ids(self) -> torch.Tensor:
        """The ids of the real tokens [tokens], documents end to end."""
        if self.token_index is None:
            return self.input_ids
        return self.input_ids.reshape(-1).index_select(0, self.token_index)

    def hidden_states(self, model: Any) -> torch.Tensor:
        """`model`'s last hidden state of each real token [tokens, hidden], documents end
        to end: a flat model's own output, or a padded model's with the padding left out."""
        if self.attention_mask is None:
            return model(self.input_ids, self.sequences)
        output = model(input_ids=self.input_ids, attention_mask=self.attention_mask)
        hidden = output.last_hidden_state
        assert self.token_index is not None
        return hidden.reshape(-1, hidden.shape[-1]).index_select(0, self.token_index)


@dataclass(slots=True)
class DeviceOutputs:
    """What a forward pass leaves on the device for a batch, in shapes fixed by the batch
    (nothing that would make the host wait for the device to learn a size):

    - `dense`: [documents, D] float32;
    - `sparse_weights` with `sparse_ids` and `sparse_documents`: [entries] each, a
      document's entries those with a weight > 0, by document then ascending id; or
      `sparse_weights` alone, [documents, vocabulary] (the column is the id);
    - `multivector`: [tokens, d] in the stored dtype, a row per real token of the batch,
      documents end to end; a document's rows are those where `multivector_keep` [tokens]
      (host, bool) is true."""

    dense: torch.Tensor | None = None
    sparse_weights: torch.Tensor | None = None
    sparse_ids: torch.Tensor | None = None
    sparse_documents: torch.Tensor | None = None
    multivector: torch.Tensor | None = None
    multivector_keep: np.ndarray | None = None
    # What the sparse weights were reduced from (a NaN there may vanish from them): checked
    # to be finite with the outputs.
    reduced_from: tuple[torch.Tensor, ...] = ()


COPY_BACK_VARIABLE = "BULKEMBED_COPY_BACK"


def side_copy_back() -> bool:
    """Whether a batch's outputs are copied back on a stream of their own (the default),
    so that the next batch's forward pass does not queue behind the copies; with
    `BULKEMBED_COPY_BACK=compute` they queue on the compute stream."""
    return os.environ.get(COPY_BACK_VARIABLE, "side").lower() != "compute"


_COPIED = ("dense", "sparse_weights", "sparse_ids", "sparse_documents", "multivector")


class Landing:
    """A batch's outputs on their way back to the host: copied into pinned memory without
    waiting (CUDA), with a flag saying whether every value is finite; `embeddings()`
    waits for the copies (one synchronisation per batch) and splits them by document.

    Given a `copy_stream`, the copies wait for the forward pass there instead of queueing
    on the compute stream, so the next batch's forward pass runs while they do."""

    def __init__(
        self,
        outputs: DeviceOutputs,
        lengths: np.ndarray,
        timed: tuple[Any, Any] | None = None,
        copy_stream: Any = None,
    ) -> None:
        self.lengths = lengths
        # CUDA events recorded before and after the forward pass on the compute stream.
        self.timed = timed
        self.keep = outputs.multivector_keep
        written = (outputs.dense, outputs.sparse_weights, outputs.multivector)
        floats = [t for t in written if t is not None] + list(outputs.reduced_from)
        # One pass over each output: a sum (in float64, which no sum of these outputs
        # overflows) is finite exactly when every value is.
        finite = [torch.isfinite(t.sum(dtype=torch.float64)) for t in floats]
        tensors = {name: getattr(outputs, name) for name in _COPIED}
        tensors["finite"] = torch.stack(finite).all() if finite else None
        self.event = None
        on_device = [t for t in tensors.values() if t is not None and t.is_cuda]
        if not on_device:
            self.host = {name: None if t is None else _to_host(t) for name, t in tensors.items()}
            return
        # The stream of the outputs' device, whichever device is current.
        stream = torch.cuda.current_stream(on_device[0].device)
        if copy_stream is not None:
            copy_stream.wait_stream(stream)
            stream = copy_stream
        with torch.cuda.stream(stream):
            self.host = {name: None if t is None else _to_host(t) for name, t in tensors.items()}
            self.event = torch.cuda.Event()
            self.event.record(stream)
        if copy_stream is not None:
            # Made on the compute stream, read on the copy stream: their memory is not
            # reused before the copies are done.
            for tensor in on_device:
                tensor.record_stream(copy_stream)

    def busy_seconds(self) -> float:
        """Seconds the device computed the batch (0 without CUDA events); once landed."""
        if self.timed is None:
            return 0.0
        started, ended = self.timed
        return float(started.elapsed_time(ended)) / 1000

    def embeddings(self) -> tuple[Embeddings, bool]:
        """The batch's embeddings, and whether every value is finite."""
        if self.event is not None:
            self.event.synchronize()
        host = {name: None if t is None else t.numpy() for name, t in self.host.items()}
        sparse = multivector = None
        if host["sparse_weights"] is not None:
            sparse = _sparse_rows(
                host["sparse_weights"], host["sparse_ids"], host["sparse_documents"], self.lengths
            )
        if host["multivector"] is not None:
            assert self.keep is not None
            multivector = _kept_rows(host["multivector"], self.keep, self.lengths)
        finite = host["finite"] is None or bool(host["finite"])
        return Embeddings(host["dense"], sparse, multivector), finite


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the host: from CUDA into pinned memory, queued without waiting."""
    if not tensor.is_cuda:
        return tensor.detach()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)


def _kept_rows(vectors: np.ndarray, keep: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """Each document's rows of `vectors` [tokens, d] where `keep` is true."""
    kept_before = np.concatenate([[0], np.cumsum(keep)])
    ends = np.cumsum(lengths.astype(np.int64))
    return np.split(vectors[keep], kept_before[ends][:-1])


def _sparse_rows(
    weights: np.ndarray, ids: np.ndarray | None, documents: np.ndarray | None, lengths: np.ndarray
) -> SparseRows:
    """Each document's entries of weight > 0, in the order they come (ascending id)."""
    keep = weights > 0
    if documents is None:
        rows, found = np.nonzero(keep)
    else:
        assert ids is not None
        rows, found = documents[keep], ids[keep]
    values = weights[keep].astype(np.float32, copy=False)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=len(lengths)), out=offsets[1:])
    return SparseRows(found.astype(np.int32), values, offsets)
