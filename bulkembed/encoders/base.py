"""The encoder interface: a flat batch of token ids in, embeddings out.

An encoder implements one method, `embed`. The base class holds the shared plumbing: the
device and dtype, and turning a flat batch into padded tensors.
"""

from __future__ import annotations

import contextlib
import copy
import pickle
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from bulkembed.contracts import Embeddings, TokenBatch
from bulkembed.errors import ModelError

if TYPE_CHECKING:
    import torch

    from bulkembed.model_spec import ModelSpec


# `tune_batch_tokens` probes with about this many tokens, and fills this share of the
# memory free after it, leaving room for fragmentation and the outputs.
PROBE_TOKENS = 8192
TUNED_MEMORY_SHARE = 0.7
MAX_TUNED_BATCH_TOKENS = 1 << 20


def tuned_batch_tokens(free_bytes: int, bytes_per_token: float, max_length: int) -> int:
    """The budget whose activations fill `TUNED_MEMORY_SHARE` of `free_bytes`, in whole
    documents at `max_length`, between one such document and `MAX_TUNED_BATCH_TOKENS`.

    >>> tuned_batch_tokens(10 * 2**30, 100_000, 512)
    74752
    """
    tokens = int(free_bytes * TUNED_MEMORY_SHARE / max(bytes_per_token, 1.0))
    tokens = min(tokens, MAX_TUNED_BATCH_TOKENS)
    return max(max_length, tokens // max_length * max_length)


_NOT_TENSORS = (
    "its pickle holds more than tensors, and bulkembed runs no code from model files "
    "(torch.load with weights_only=True refused it); use safetensors weights"
)
# Weights a checkpoint may lack without harm: the pooler, which no encoder uses.
_UNUSED_WEIGHTS = ("pooler.",)


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a PyTorch weights file, unpickled with `weights_only`: a pickle that
    holds anything else (code to run) is refused."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ModelError(f"{path} is not a plain file of tensors: {_NOT_TENSORS}") from e


def attention_implementation(device: str, dtype: torch.dtype) -> str:
    """flash-attention 2 on CUDA in half precision when the `flash_attn` package is
    installed (it skips the padding), else PyTorch's fused scaled-dot-product attention."""
    import importlib.util

    import torch

    half = dtype in (torch.float16, torch.bfloat16)
    if device.startswith("cuda") and half and importlib.util.find_spec("flash_attn"):
        return "flash_attention_2"
    return "sdpa"


def load_model(spec: ModelSpec, device: str, dtype: torch.dtype, masked_lm: bool = False) -> Any:
    """The transformer of `spec` on `device` in eval mode, quietly, compiled with
    `torch.compile` if `spec.compile`; an error if weights it needs are missing from the
    checkpoint (they would otherwise be random)."""
    import torch
    from transformers import AutoModel, AutoModelForMaskedLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    kind = AutoModelForMaskedLM if masked_lm else AutoModel
    options = {"revision": spec.revision, "dtype": dtype, "output_loading_info": True}
    attention = attention_implementation(device, dtype)
    try:
        try:
            model, info = kind.from_pretrained(
                spec.source, attn_implementation=attention, **options
            )
        except ValueError:
            # An architecture without that attention: take its own default.
            model, info = kind.from_pretrained(spec.source, **options)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load the model {spec.source}: {e}") from e
    except pickle.UnpicklingError as e:
        raise ModelError(f"cannot load the model {spec.source}: {_NOT_TENSORS}") from e
    missing = [k for k in info.get("missing_keys", ()) if not k.startswith(_UNUSED_WEIGHTS)]
    if missing:
        shown = ", ".join(sorted(missing)[:3])
        what = "a masked-LM head" if masked_lm else "these weights"
        raise ModelError(
            f"{spec.source} lacks {what} ({len(missing)} missing, e.g. {shown}): "
            "is it the right kind of model for these outputs?"
        )
    model = model.eval().to(device)
    if spec.compile:
        # Batch sizes and lengths change from batch to batch: compile for any shape once.
        model = torch.compile(model, dynamic=True)
    return model


class Embedder(Protocol):
    """What embeds a window's batches: one `Encoder`, or a pool of them on several devices."""

    @property
    def dense_dim(self) -> int | None: ...

    @property
    def multivector_dim(self) -> int | None: ...

    def embed_batches(
        self, batches: list[TokenBatch], finished: Callable[[int, float], None]
    ) -> list[Embeddings]: ...

    def close(self) -> None: ...


class Encoder(ABC):
    """Embeds token batches on one device."""

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        import torch

        self.spec = spec
        self.device = device
        self.dtype = dtype
        # On a CPU, half precision runs as autocast over float32 weights: matrix multiplies
        # in the half dtype, layer norms, softmax and residual sums in float32. Casting the
        # weights instead ran no faster and lost parity (all-MiniLM-L6-v2 in bfloat16:
        # lowest cosine to float32 0.99988 cast, 0.99996 under autocast, on 1,000 documents).
        self.autocast = device == "cpu" and dtype != torch.float32
        self.weights_dtype = torch.float32 if self.autocast else dtype
        # Padded tokens of the smallest batch that ran out of memory (see
        # `embed_within_memory`).
        self.memory_limit: int | None = None

    def in_dtype(self, dtype: torch.dtype) -> Encoder:
        """This encoder computing in `dtype`: on a CPU the same float32 weights under
        autocast (no second copy of the model in memory), elsewhere a new encoder."""
        if self.device != "cpu":
            return type(self)(self.spec, self.device, dtype)
        twin = copy.copy(self)
        twin.dtype = dtype
        twin.autocast = str(dtype) != "torch.float32"
        return twin

    def compute(self) -> contextlib.AbstractContextManager:
        """The context a forward pass runs in: autocast for half precision on a CPU."""
        import torch

        if self.autocast:
            return torch.autocast("cpu", dtype=self.dtype)
        return contextlib.nullcontext()

    @property
    def outputs(self) -> tuple[str, ...]:
        """The outputs to compute: some of dense, sparse, multivector."""
        return self.spec.outputs

    @property
    def dense_dim(self) -> int | None:
        """Size of the dense vectors, when this encoder makes them."""
        return None

    @property
    def multivector_dim(self) -> int | None:
        """Size of each multi-vector token vector, when this encoder makes them."""
        return None

    @abstractmethod
    def embed(self, batch: TokenBatch) -> Embeddings:
        """Embeddings for every document of `batch`, in batch order."""

    def embed_within_memory(self, batch: TokenBatch) -> Embeddings:
        """`embed`, halving the batch for as long as the GPU runs out of memory; a batch
        whose vectors are not all finite is embedded again in float32 (`_finite`).

        Only CUDA's out-of-memory error is caught, and a single document that does not fit
        is an error: the budget and max length are then too large for this device. The
        smallest batch that ran out of memory (in padded tokens) is remembered for the rest
        of the run: a batch as large is halved before it runs, not after it fails again."""
        import torch

        limit = self.memory_limit
        if len(batch) > 1 and limit is not None and batch.padded_tokens >= limit:
            return self._in_halves(batch)
        try:
            with self.compute():
                embeddings = self.embed(batch)
        except torch.cuda.OutOfMemoryError as e:
            # Keep only the message: the exception holds the frames and their tensors.
            message = str(e).splitlines()[0]
        else:
            return embeddings if embeddings.finite() else self._finite(batch)
        if len(batch) == 1:
            raise ModelError(
                f"one document of {int(batch.lengths[0])} tokens does not fit in {self.device} "
                f"memory ({message}): lower --max-length"
            )
        self.memory_limit = min(limit or batch.padded_tokens, batch.padded_tokens)
        torch.cuda.empty_cache()
        return self._in_halves(batch)

    def _in_halves(self, batch: TokenBatch) -> Embeddings:
        first, second = batch.halves()
        return Embeddings.concatenate(
            [self.embed_within_memory(first), self.embed_within_memory(second)]
        )

    def _finite(self, batch: TokenBatch) -> Embeddings:
        """The embeddings of a batch that gave NaN or infinite values: on a CPU computed
        again in float32 (the same weights without autocast); elsewhere, or in float32
        already, a one-line error, since no vector may be written that is not finite."""
        import torch

        if not self.autocast:
            dtype = str(self.dtype).removeprefix("torch.")
            advice = "check the model's weights" if dtype == "float32" else "run --dtype float32"
            raise ModelError(
                f"the model gave values that are not finite (NaN or infinity) for a batch of "
                f"{len(batch)} document(s) on {self.device} in {dtype}: {advice}"
            )
        return self.in_dtype(torch.float32).embed_within_memory(batch)

    def embed_batches(
        self, batches: list[TokenBatch], finished: Callable[[int, float], None]
    ) -> list[Embeddings]:
        """Embeddings of each batch, in order; `finished(i, seconds)` after each one."""
        outputs = []
        for number, batch in enumerate(batches):
            started = time.perf_counter()
            outputs.append(self.embed_within_memory(batch))
            finished(number, time.perf_counter() - started)
        return outputs

    def close(self) -> None:  # noqa: B027 (an encoder in this process has nothing to stop)
        """Nothing to stop: the model goes with this object."""

    def padded(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """`input_ids` and `attention_mask` on the device, padded on the right to the longest."""
        import torch

        lengths = torch.from_numpy(batch.lengths.astype(np.int64))
        longest = int(lengths.max()) if len(lengths) else 0
        positions = torch.arange(longest)
        mask = positions.unsqueeze(0) < lengths.unsqueeze(1)
        input_ids = torch.full((len(lengths), longest), self.spec.pad_token_id, dtype=torch.long)
        input_ids[mask] = torch.from_numpy(batch.token_ids.astype(np.int64))
        mask = mask.long()
        if self.device.startswith("cuda"):
            # From pinned memory the copies run asynchronously, queued before the forward.
            input_ids, mask = input_ids.pin_memory(), mask.pin_memory()
        return input_ids.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True)

    def tune_batch_tokens(self) -> int | None:
        """A token budget that fills this GPU's free memory, from one probe: a batch of
        documents at the maximum length is embedded, and the peak memory it took per token
        scales to the memory free. None on the CPU, where memory does not bound batches."""
        import torch

        if not self.device.startswith("cuda"):
            return None
        length = self.spec.max_length
        documents = max(1, PROBE_TOKENS // length)
        probe = TokenBatch(
            np.full(documents * length, self.spec.pad_token_id, dtype=np.int32),
            np.full(documents, length, dtype=np.int32),
        )
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.embed(probe)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.device)
        return tuned_batch_tokens(free, peak / (documents * length), length)
