"""The encoder interface: a flat batch of token ids in, embeddings out.

An encoder implements one method, `embed(inputs) -> DeviceOutputs`: the batch's outputs,
left on its device. The base class holds the shared plumbing: the device and dtype, the
backend and the batch layout (flat or padded), tensors copied in ahead of time, outputs
copied back and split by document (`transfer`), batches run back to back (`embed_stream`),
out-of-memory halving and the non-finite check.
"""

from __future__ import annotations

import contextlib
import copy
import pickle
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import numpy as np

from bulkembed.config import Attention, Backend
from bulkembed.contracts import DeviceCounts, Embeddings, TokenBatch
from bulkembed.errors import ModelError, UsageError
from bulkembed.wording import counted

if TYPE_CHECKING:
    import torch

    from bulkembed.encoders.flat import FlatFamily
    from bulkembed.encoders.transfer import DeviceInputs, DeviceOutputs, Landing
    from bulkembed.model_spec import ModelSpec

# What a caller tags each batch of a stream with (`embed_stream`), to know it when it lands.
Key = TypeVar("Key")


# `tune_batch_tokens` probes with about this many tokens, and fills this share of the
# memory free after it, leaving room for fragmentation and the outputs.
PROBE_TOKENS = 8192
TUNED_MEMORY_SHARE = 0.7
# Past this many tokens a batch's matrix multiplies (tokens × hidden by hidden × hidden,
# hidden 384 to 4096) already run at the device's peak: a larger batch only holds more
# memory and waits longer for its longest document. 65,536 tokens is 4× the size at which
# dense GEMMs of width 1024 reach their plateau on A100/H100-class GPUs (published cuBLAS
# curves; not measured here).
MAX_TUNED_BATCH_TOKENS = 1 << 16


def tuned_batch_tokens(free_bytes: int, bytes_per_token: float, max_length: int) -> int:
    """The budget whose activations fill `TUNED_MEMORY_SHARE` of `free_bytes`, in whole
    documents at `max_length`, between one such document and `MAX_TUNED_BATCH_TOKENS`.

    >>> tuned_batch_tokens(10 * 2**30, 200_000, 512)
    37376
    >>> tuned_batch_tokens(80 * 2**30, 100_000, 512)
    65536
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


def torch_out_of_memory() -> type[BaseException]:
    """CUDA's out-of-memory error: the only error a batch is retried on, in halves."""
    import torch

    return torch.cuda.OutOfMemoryError


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
    """The transformer of `spec` on `device` in eval mode, quietly; an error if weights it
    needs are missing from the checkpoint (they would otherwise be random)."""
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
    return model.eval().to(device)


def compiled(model: Any) -> Any:
    """`model` compiled by `torch.compile` for any shape: batch sizes and lengths change
    from batch to batch, so it compiles once rather than for each shape."""
    import torch

    return torch.compile(model, dynamic=True)


def choose_backend(spec: ModelSpec, device: str, dtype: torch.dtype) -> Backend:
    """What runs the transformer of `spec` on `device` in `dtype`: `--backend`, with `auto`
    as OpenVINO on a CPU for an architecture whose conversion is tested, in float32 or
    bfloat16, without `--compile`, when the `openvino` package is installed; else PyTorch.
    `--attention flat` runs in PyTorch. An explicit `--backend openvino` that cannot run is
    a one-line usage error."""
    from bulkembed.encoders.openvino import converts, openvino_installed

    backend = Backend(spec.backend)
    if backend is Backend.TORCH:
        return backend
    if backend is Backend.AUTO:
        flat = Attention(spec.attention) is Attention.FLAT
        usable = device == "cpu" and not (spec.compile or flat) and converts(spec.model_type, dtype)
        return Backend.OPENVINO if usable and openvino_installed() else Backend.TORCH
    if device != "cpu":
        raise UsageError(f"--backend openvino runs on the CPU, not {device}: pass --devices cpu")
    if str(dtype) not in ("torch.float32", "torch.bfloat16"):
        raise UsageError(
            "--backend openvino computes in float32 or bfloat16: pick one with --dtype"
        )
    if not openvino_installed():
        raise UsageError("--backend openvino needs the openvino package: pip install openvino")
    return backend


def choose_attention(
    spec: ModelSpec, device: str, dtype: torch.dtype
) -> tuple[Attention, str | None]:
    """The batch layout asked for, flat or padded (the model may still be unable to run
    flat), and a remark for the log when `auto` cannot take flat on CUDA: `--attention`, with
    `auto` flat where a variable-length flash kernel runs attention (CUDA in half
    precision), else padded (on a CPU the padded OpenVINO graph runs faster than the flat
    PyTorch path; see the README)."""
    from bulkembed.encoders.varlen import kernel_runs

    attention = Attention(spec.attention)
    if attention is not Attention.AUTO:
        return attention, None
    if kernel_runs(device, dtype):
        return Attention.FLAT, None
    if device.startswith("cuda") and str(dtype) != "torch.float32":
        return Attention.PADDED, (
            f"no variable-length attention kernel runs here (it needs a GPU of compute "
            f"capability 8.0 or later and PyTorch 2.10 with flash attention, or flash-attn): "
            f"batches run padded on {device}"
        )
    return Attention.PADDED, None


class VectorSizes(Protocol):
    """The sizes of the vectors a model gives: dense, and per token (None: not given)."""

    @property
    def dense_dim(self) -> int | None: ...

    @property
    def multivector_dim(self) -> int | None: ...


class Embedder(VectorSizes, Protocol):
    """What embeds a window's batches: one `Encoder`, or a pool of them on several devices.
    `unpadded`: its batches run flat, so that a batch costs the sum of its lengths;
    `counts`: what it counted so far (batches embedded again in float32, device seconds)."""

    @property
    def unpadded(self) -> bool: ...

    @property
    def counts(self) -> DeviceCounts: ...

    def embed_stream(
        self,
        batches: Iterable[tuple[Key, TokenBatch | None]],
        finished: Callable[[Key, float, float], None],
    ) -> Iterator[tuple[Key, Embeddings | None]]: ...

    def close(self) -> None: ...


class Encoder(ABC):
    """Embeds token batches on one device. A family implements `embed`; the base moves
    batches to the device and outputs back, runs batches back to back, halves those that
    run out of memory and embeds again those whose values are not finite."""

    # The transformer: a PyTorch module (a `FlatTransformer` when batches run flat), or an
    # `OpenVINOModel` called as the padded PyTorch one is.
    model: Any
    # Whether the family's `embed` reads hidden states through `DeviceInputs.hidden_states`
    # (so that batches may run flat); a family that reads the padded tensors does not.
    runs_flat: ClassVar[bool] = False

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        import torch

        from bulkembed.encoders.transfer import side_copy_back

        self.spec = spec
        self.device = device
        self.dtype = dtype
        # On a CPU, half precision runs as autocast over float32 weights: matrix multiplies
        # in the half dtype, layer norms, softmax and residual sums in float32. Casting the
        # weights instead ran no faster and lost parity (all-MiniLM-L6-v2 in bfloat16:
        # lowest cosine to float32 0.99988 cast, 0.99996 under autocast, on 1,000 documents).
        # Warnings and remarks for the run's log, from loading the model.
        self.notices: list[str] = []
        self.remarks: list[str] = []
        # PyTorch until `load_transformer` finds that OpenVINO runs the model; padded
        # batches until it finds that they run flat.
        self.backend = Backend.TORCH
        self.unpadded = False
        self.autocast = device == "cpu" and dtype != torch.float32
        self.weights_dtype = torch.float32 if self.autocast else dtype
        self.multivector_dtype = getattr(torch, spec.multivector_dtype)
        # Tokens (`cost`) of the smallest batch that ran out of memory (see
        # `embed_within_memory`).
        self.memory_limit: int | None = None
        # Batches embedded again in float32 (their values not finite in this dtype) and the
        # device's busy seconds; the float32 twin that embeds such batches, made at the first.
        self.counts = DeviceCounts()
        self._float32: Encoder | None = None
        # Inputs are copied to a CUDA device on their own stream, while the last batch runs;
        # outputs come back on another, while the next batch runs (`side_copy_back`).
        cuda = device.startswith("cuda")
        self._copies = torch.cuda.Stream(device) if cuda else None
        self._landings = torch.cuda.Stream(device) if cuda and side_copy_back() else None

    def load_transformer(self, masked_lm: bool = False) -> Any:
        """The transformer this encoder runs: compiled by OpenVINO (which then takes the
        compute precision, without autocast) or loaded in PyTorch (`choose_backend`), and
        in PyTorch for flat batches where asked and the model can (`choose_attention`).
        With `--backend auto`, a model OpenVINO fails to convert runs in PyTorch, with one
        warning; a model that cannot run flat runs padded, with one warning where flat was
        asked for and one remark where `auto` would have taken it."""
        import torch

        from bulkembed.encoders.flat import FlatFamily

        attention, why_padded = choose_attention(self.spec, self.device, self.dtype)
        if choose_backend(self.spec, self.device, self.dtype) is Backend.OPENVINO:
            from bulkembed.encoders.openvino import load_openvino

            def load() -> Any:
                return load_model(self.spec, "cpu", torch.float32, masked_lm)

            threads = torch.get_num_threads()
            try:
                converted = load_openvino(
                    self.spec, self.dtype, masked_lm, threads, load, self.notices.append
                )
            except ModelError as e:
                if self.spec.backend != Backend.AUTO.value:
                    raise
                self.notices.append(f"{e}; running it in PyTorch instead")
            else:
                self.backend, self.autocast = Backend.OPENVINO, False
                return converted
        model = load_model(self.spec, self.device, self.weights_dtype, masked_lm)
        family = self._flat_family(model)
        if attention is Attention.FLAT and isinstance(family, FlatFamily):
            self.unpadded = True
            model = family.build(model).eval()
        elif attention is Attention.FLAT:
            told = self.notices if self.spec.attention == Attention.FLAT.value else self.remarks
            told.append(f"{self.spec.source} runs padded batches: {family}")
        elif why_padded is not None and isinstance(family, FlatFamily):
            self.remarks.append(why_padded)
        return compiled(model) if self.spec.compile else model

    def _flat_family(self, model: Any) -> FlatFamily | str:
        """The family that runs `model` on flat batches for this encoder, or why none can."""
        from bulkembed.encoders.flat import flat_family

        if not self.runs_flat:
            return f"the {self.spec.family} family reads padded batches"
        return flat_family(model)

    def in_dtype(self, dtype: torch.dtype) -> Encoder:
        """This encoder computing in `dtype`: on a CPU the same float32 weights under
        autocast, or the same OpenVINO graph compiled in `dtype` (no second load of the
        model), elsewhere a new encoder."""
        if self.device != "cpu":
            return type(self)(self.spec, self.device, dtype)
        twin = copy.copy(self)
        twin.dtype = dtype
        twin.counts, twin._float32 = DeviceCounts(), None
        if self.backend is Backend.OPENVINO:
            twin.model = self.model.in_dtype(dtype)
        else:
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
    def embed(self, inputs: DeviceInputs) -> DeviceOutputs:
        """The outputs of a batch, left on the device (see `DeviceOutputs`)."""

    def cost(self, batch: TokenBatch) -> int:
        """The tokens `batch` computes: its own, or with padding."""
        return int(batch.lengths.sum()) if self.unpadded else batch.padded_tokens

    def upload(self, batch: TokenBatch) -> DeviceInputs:
        """`batch` laid out (flat or padded) and on its way to the device: on CUDA copied
        from pinned memory on the copy stream, without waiting; on a CPU the tensors
        themselves."""
        import torch

        from bulkembed.encoders.transfer import DeviceInputs

        if self.unpadded:
            inputs = DeviceInputs.flat(batch)
        else:
            inputs = DeviceInputs.padded(batch, self.spec.pad_token_id)
        if self._copies is None:
            return inputs
        with torch.cuda.stream(self._copies):
            inputs = inputs.moved(self.device)
            inputs.copied = torch.cuda.Event()
            inputs.copied.record()
        return inputs

    def launch(self, inputs: DeviceInputs) -> Landing:
        """Run `inputs` and start copying their outputs back; on CUDA nothing waits here."""
        import torch

        from bulkembed.encoders.transfer import Landing

        timed = None
        if inputs.copied is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(inputs.copied)
            # The inputs were made on the copy stream and are used on this one.
            for tensor in inputs.tensors():
                tensor.record_stream(compute)
            timed = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            timed[0].record(compute)
        with torch.inference_mode(), self.compute():
            outputs = self.embed(inputs)
            if timed is not None:
                timed[1].record(compute)
            return Landing(outputs, inputs.batch.lengths, timed, self._landings)

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

    def close(self) -> None:  # noqa: B027 (an encoder in this process has nothing to stop)
        """Nothing to stop: the model goes with this object."""

    def probe_batch(self) -> TokenBatch:
        """The batch `tune_batch_tokens` measures: at least two documents, at the maximum
        length but the last one token shorter, so that the batch is padded and its
        attention mask takes the memory a real batch's does."""
        length = self.spec.max_length
        documents = max(2, PROBE_TOKENS // length)
        lengths = np.full(documents, length, dtype=np.int32)
        lengths[-1] = max(1, length - 1)
        return TokenBatch(np.full(int(lengths.sum()), self.spec.pad_token_id, np.int32), lengths)

    def tune_batch_tokens(self) -> int | None:
        """A token budget that fills this GPU's free memory, from one probe in this
        encoder's dtype (`probe_batch`): the peak memory it took per padded token scales to
        the memory free. None on the CPU, where memory does not bound batches."""
        import torch

        if not self.device.startswith("cuda"):
            return None
        probe = self.probe_batch()
        length = self.spec.max_length
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.embed_batch(probe)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.device)
        return tuned_batch_tokens(free, peak / self.cost(probe), length)
