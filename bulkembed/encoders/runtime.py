"""How an encoder's batches run on its device: back to back, each copied in while the last
one runs and its outputs copied back while the next one runs (`embed_stream`); halved for
as long as the device runs out of memory; embedded again in float32 where their values are
not finite; and the batch budget that fills a GPU's memory (`measure_budget`).

`DeviceRuntime` does all of this in terms of four steps its subclass gives: `upload` a
batch, `launch` it, the `cost` of a batch in tokens, and a twin `in_dtype` another dtype.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from bulkembed.contracts import DeviceCounts, Embeddings, TokenBatch
from bulkembed.encoders.decisions import model_key, read_decision, record_decision
from bulkembed.errors import ModelError
from bulkembed.wording import counted

if TYPE_CHECKING:
    import torch

    from bulkembed.encoders.transfer import DeviceInputs, Landing
    from bulkembed.models.model_spec import ModelSpec

# What a caller tags each batch of a stream with (`embed_stream`), to know it when it lands.
Key = TypeVar("Key")


# `measure_budget` probes with about this many tokens, and fills this share of the
# memory free after it, leaving room for fragmentation and the outputs.
PROBE_TOKENS = 8192
TUNED_MEMORY_SHARE = 0.7
# Past this many tokens a batch's matrix multiplies (tokens × hidden by hidden × hidden,
# hidden 384 to 4096) already run at the device's peak: a larger batch only holds more
# memory and waits longer for its longest document. 65,536 tokens is 4× the size at which
# dense GEMMs of width 1024 reach their plateau on A100/H100-class GPUs (published cuBLAS
# curves; not measured here).
MAX_MEASURED_BUDGET = 1 << 16
# Where the memory a token takes is kept between runs (`decisions`).
BUDGET_KIND = "budget-probes"


def budget_for_memory(free_bytes: int, bytes_per_token: float, max_length: int) -> int:
    """The budget whose activations fill `TUNED_MEMORY_SHARE` of `free_bytes`, in whole
    documents at `max_length`, between one such document and `MAX_MEASURED_BUDGET`.

    >>> budget_for_memory(10 * 2**30, 200_000, 512)
    37376
    >>> budget_for_memory(80 * 2**30, 100_000, 512)
    65536
    """
    tokens = int(free_bytes * TUNED_MEMORY_SHARE / max(bytes_per_token, 1.0))
    tokens = min(tokens, MAX_MEASURED_BUDGET)
    return max(max_length, tokens // max_length * max_length)


def recorded_budget(spec: ModelSpec, device: str, dtype: str) -> int | None:
    """The budget an earlier run's probe found for `spec` on `device` in `dtype` (see
    `DeviceRuntime.measure_budget`), what a run reads ahead by before its own probe;
    None on a CPU, or where no run recorded one."""
    import torch

    if not device.startswith("cuda"):
        return None
    found = read_decision(BUDGET_KIND, _read_ahead_key(spec, device, getattr(torch, dtype)))
    budget = found.get("budget") if found else None
    return budget if isinstance(budget, int) and budget > 0 else None


def _read_ahead_key(spec: ModelSpec, device: str, dtype: torch.dtype) -> dict[str, Any] | None:
    """Where the budget a probe found is kept for reading ahead: under what a run knows
    before its model loads (`decisions.model_key`)."""
    key = model_key(spec, device, dtype)
    return None if key is None else {**key, "read_ahead": True}


def torch_out_of_memory() -> type[BaseException]:
    """CUDA's out-of-memory error: the only error a batch is retried on, in halves."""
    import torch

    return torch.cuda.OutOfMemoryError


class DeviceRuntime(ABC):
    """Runs batches on `device` in `dtype` (see the module's docstring); `counts` keeps the
    float32 retries and the device's busy seconds, `memory_limit` the tokens of the
    smallest batch that ran out of memory."""

    spec: ModelSpec
    device: str
    dtype: torch.dtype
    counts: DeviceCounts
    memory_limit: int | None
    # The float32 twin that embeds batches not finite in `dtype`, made at the first.
    _float32: DeviceRuntime | None

    @abstractmethod
    def upload(self, batch: TokenBatch) -> DeviceInputs:
        """`batch` on its way to the device, without waiting."""

    @abstractmethod
    def launch(self, inputs: DeviceInputs) -> Landing:
        """Run `inputs` and start copying their outputs back, without waiting."""

    @abstractmethod
    def cost(self, batch: TokenBatch) -> int:
        """The tokens `batch` computes."""

    @abstractmethod
    def in_dtype(self, dtype: torch.dtype) -> DeviceRuntime:
        """This runtime's twin computing in `dtype`."""

    def embed_batch(self, batch: TokenBatch) -> Embeddings:
        """Embeddings for every document of `batch`, in batch order; checked by
        `embed_within_memory`, not here."""
        embeddings, _ = self._land(self.launch(self.upload(batch)))
        return embeddings

    def _land(self, landing: Landing) -> tuple[Embeddings, bool]:
        """A launched batch's embeddings and whether they are finite, its device seconds
        counted."""
        embeddings, finite = landing.embeddings()
        self.counts.busy_seconds += landing.busy_seconds()
        return embeddings, finite

    def embed_within_memory(self, batch: TokenBatch) -> Embeddings:
        """`embed_batch`, halving the batch for as long as the GPU runs out of memory; a batch
        whose vectors are not all finite is embedded again in float32 (`_finite`).

        Only CUDA's out-of-memory error is caught, and a single document that does not fit
        is an error: the budget and max length are then too large for this device. The
        smallest batch that ran out of memory (in tokens computed) is remembered for the rest
        of the run: a batch as large is halved before it runs, not after it fails again."""
        if self._must_halve(batch):
            return self._in_halves(batch)
        try:
            embeddings, finite = self._land(self.launch(self.upload(batch)))
        except torch_out_of_memory() as e:
            # Keep only the message, and leave the handler before retrying: the exception
            # holds the frames of the failed pass, and with them its tensors.
            message = str(e).splitlines()[0]
        else:
            return embeddings if finite else self._finite(batch)
        return self._after_out_of_memory(batch, message)

    def _must_halve(self, batch: TokenBatch) -> bool:
        limit = self.memory_limit
        return len(batch) > 1 and limit is not None and self.cost(batch) >= limit

    def _after_out_of_memory(self, batch: TokenBatch, message: str) -> Embeddings:
        """Remember the batch's size and embed it in halves; one document is an error."""
        import torch

        if len(batch) == 1:
            raise ModelError(
                f"one document of {int(batch.lengths[0])} tokens does not fit in {self.device} "
                f"memory ({message}): lower --max-length"
            )
        limit = self.memory_limit
        cost = self.cost(batch)
        self.memory_limit = min(limit or cost, cost)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return self._in_halves(batch)

    def _in_halves(self, batch: TokenBatch) -> Embeddings:
        first, second = batch.halves()
        return Embeddings.concatenate(
            [self.embed_within_memory(first), self.embed_within_memory(second)]
        )

    def _finite(self, batch: TokenBatch) -> Embeddings:
        """The embeddings of a batch that gave NaN or infinite values, computed again in
        float32 (`in_dtype`: on a CPU the same weights without autocast, or the OpenVINO
        graph compiled in float32; on a GPU the model loaded once more, in float32, kept for
        the next such batch) and counted in `counts`; in float32 already, a
        one-line error, since no vector may be written that is not finite."""
        import torch

        if self.dtype == torch.float32:
            raise ModelError(
                f"the model gave values that are not finite (NaN or infinity) for a batch of "
                f"{counted(len(batch), 'document')} on {self.device} in float32: check the "
                "model's weights"
            )
        self.counts.float32_retries += 1
        if self._float32 is None:
            self._float32 = self.in_dtype(torch.float32)
        twin = self._float32
        before = twin.counts.copy()
        embeddings = twin.embed_within_memory(batch)
        self.counts.add(twin.counts.since(before))
        return embeddings

    def embed_stream(
        self,
        batches: Iterable[tuple[Key, TokenBatch | None]],
        finished: Callable[[Key, float, float], None],
    ) -> Iterator[tuple[Key, Embeddings | None]]:
        """Each `(key, batch)` of `batches` with its embeddings, in order;
        `finished(key, model_seconds, host_seconds)` as each one lands. A `(key, None)`
        marker comes back as it went in, in its place, without `finished`.

        Batches run back to back: batch i+1 is taken from `batches`, padded and copied to
        the device while batch i runs, and batch i's outputs come back to the host (and are
        split by document) while batch i+1 runs; so taking the next batch (packing the next
        window) happens while the device is busy. On a CPU the same steps run one after the
        other. A batch that runs out of memory, or must be halved, or gives values that are
        not finite, goes through `embed_within_memory` on its own."""
        pending = iter(batches)
        landing: tuple[Key, TokenBatch | None, Landing | Embeddings | None, float] | None = None
        upcoming = self._upload_next(pending)
        while upcoming is not None:
            key, batch, inputs = upcoming
            started = time.perf_counter()
            launched = None if batch is None else self._launch_within_memory(batch, inputs)
            seconds = time.perf_counter() - started
            upcoming = self._upload_next(pending)
            if landing is not None:
                yield landing[0], self._landed(*landing, finished)
            landing = (key, batch, launched, seconds)
        if landing is not None:
            yield landing[0], self._landed(*landing, finished)

    def _upload_next(
        self, batches: Iterator[tuple[Key, TokenBatch | None]]
    ) -> tuple[Key, TokenBatch | None, DeviceInputs | None] | None:
        """The next item with its batch copied in; None at the end. A marker (no batch), or
        a batch whose copy ran out of memory, comes without inputs."""
        import torch

        found = next(batches, None)
        if found is None:
            return None
        key, batch = found
        if batch is None:
            return key, None, None
        try:
            return key, batch, self.upload(batch)
        except torch_out_of_memory():
            pass
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return key, batch, None

    def _launch_within_memory(
        self, batch: TokenBatch, inputs: DeviceInputs | None
    ) -> Landing | Embeddings:
        """`launch`, or the embeddings themselves where the batch went the careful way
        (its inputs could not be copied in ahead: None)."""
        if inputs is None or self._must_halve(batch):
            return self.embed_within_memory(batch)
        try:
            return self.launch(inputs)
        except torch_out_of_memory() as e:
            message = str(e).splitlines()[0]
        return self._after_out_of_memory(batch, message)

    def _landed(
        self,
        key: Key,
        batch: TokenBatch | None,
        launched: Landing | Embeddings | None,
        seconds: float,
        finished: Callable[[Key, float, float], None],
    ) -> Embeddings | None:
        """A launched batch's embeddings, once back on the host; report its times. None
        for a marker."""
        if batch is None or launched is None:
            return None
        if isinstance(launched, Embeddings):
            finished(key, seconds, 0.0)
            return launched
        started = time.perf_counter()
        if launched.event is not None:
            launched.event.synchronize()
        waited = time.perf_counter() - started
        embeddings, finite = self._land(launched)
        if not finite:
            embeddings = self._finite(batch)
        finished(key, seconds + waited, time.perf_counter() - started - waited)
        return embeddings

    def probe_batch(self) -> TokenBatch:
        """The batch `measure_budget` measures: at least two documents, at the maximum
        length but the last one token shorter, so that the batch is padded and its
        attention mask takes the memory a real batch's does."""
        length = self.spec.max_length
        documents = max(2, PROBE_TOKENS // length)
        lengths = np.full(documents, length, dtype=np.int32)
        lengths[-1] = max(1, length - 1)
        return TokenBatch(np.full(int(lengths.sum()), self.spec.pad_token_id, np.int32), lengths)

    def measure_budget(self) -> int | None:
        """A token budget that fills this GPU's free memory: the memory a token of a batch
        takes, in this encoder's dtype, scaled to the memory free now. That memory is
        measured by one probe (`probe_batch`: the peak it took per token), or taken from an
        earlier run's probe under the same key (`budget_key`). None on the CPU, where
        memory does not bound batches."""
        import torch

        if not self.device.startswith("cuda"):
            return None
        key = self.budget_key()
        recorded = read_decision(BUDGET_KIND, key)
        per_token = recorded.get("bytes_per_token") if recorded else None
        torch.cuda.synchronize(self.device)
        if not isinstance(per_token, (int, float)) or per_token <= 0:
            per_token = self._probe_bytes_per_token()
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.device)
        budget = budget_for_memory(free, per_token, self.spec.max_length)
        record_decision(BUDGET_KIND, key, {"bytes_per_token": per_token})
        read_ahead = _read_ahead_key(self.spec, self.device, self.dtype)
        record_decision(BUDGET_KIND, read_ahead, {"budget": budget})
        return budget

    def _probe_bytes_per_token(self) -> float:
        """The peak memory one probe (`probe_batch`) took, per token it computed."""
        import torch

        probe = self.probe_batch()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.embed_batch(probe)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        return peak / self.cost(probe)

    def budget_key(self) -> dict[str, Any] | None:
        """What the memory a token takes depends on: the model's settings and exact files,
        the device, the dtype and the libraries' versions (`decisions.model_key`); None
        where the model's files are not pinned."""
        return model_key(self.spec, self.device, self.dtype)
