"""The encoder interface: a flat batch of token ids in, embeddings out.

An encoder implements one method, `embed(inputs) -> DeviceOutputs`: the batch's outputs,
left on its device. The base class holds what every family shares: the device and dtype,
the backend and the batch layout (flat or padded: `backend`, `flat`), and tensors copied in
ahead of time and outputs copied back and split by document (`transfer`). How batches run
on the device (back to back, halved on out-of-memory, embedded again in float32 where not
finite, the budget probe) is `runtime.DeviceRuntime`'s; the heads per output are the
families' own modules (`dense`, `sparse`, `colbert`, ...).
"""

from __future__ import annotations

import contextlib
import copy
import os
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from bulkembed.config import Attention, Backend
from bulkembed.contracts import DeviceCounts, Embeddings, TokenBatch
from bulkembed.encoders.backend import choose_attention, choose_backend, load_model
from bulkembed.encoders.compiling import compiled
from bulkembed.encoders.runtime import DeviceRuntime, Key
from bulkembed.errors import ModelError

if TYPE_CHECKING:
    import torch

    from bulkembed.encoders.flat import FlatFamily
    from bulkembed.encoders.int8 import Calibration
    from bulkembed.encoders.transfer import DeviceInputs, DeviceOutputs, Landing
    from bulkembed.models.model_spec import ModelSpec


class VectorSizes(Protocol):
    """The sizes of the vectors a model gives: dense, and per token (None: not given)."""

    @property
    def dense_dim(self) -> int | None: ...

    @property
    def multivector_dim(self) -> int | None: ...


class Embedder(VectorSizes, Protocol):
    """What embeds a window's batches: one `Encoder`, or a pool of them on several devices.
    `unpadded`: its batches run flat, so that a batch costs the sum of its lengths;
    `attention_kernel`: the kernel that attends in them (`kernels`; None: padded batches);
    `counts`: what it counted so far (batches embedded again in float32, device seconds)."""

    @property
    def unpadded(self) -> bool: ...

    @property
    def attention_kernel(self) -> str | None: ...

    @property
    def counts(self) -> DeviceCounts: ...

    def embed_stream(
        self,
        batches: Iterable[tuple[Key, TokenBatch | None]],
        finished: Callable[[Key, float, float], None],
    ) -> Iterator[tuple[Key, Embeddings | None]]: ...

    def close(self) -> None: ...


class Encoder(DeviceRuntime):
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
        # The kernel that attends in flat batches (`kernels`), None for padded ones.
        self.attention_kernel: str | None = None
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

        from bulkembed.encoders.flat import FlatFamily, flat_module

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
            model = flat_module(family, model)
            self._choose_kernel(model)
        elif attention is Attention.FLAT:
            told = self.notices if self.spec.attention == Attention.FLAT.value else self.remarks
            told.append(f"{self.spec.source} runs padded batches: {family}")
        elif why_padded is not None and isinstance(family, FlatFamily):
            self.remarks.append(why_padded)
        return compiled(model) if self.spec.compile else model

    def _choose_kernel(self, model: Any) -> None:
        """Take the attention kernel of a flat `model` on this device (`kernel_choice`),
        and say how it was chosen where a check measured it."""
        from bulkembed.encoders.kernel_choice import (
            FORMER_KERNEL_VARIABLE,
            KERNEL_VARIABLE,
            AttentionShape,
            choose_kernel,
        )

        shape = AttentionShape.of(model, self.spec.max_length)
        choice = choose_kernel(self.device, self.dtype, shape)
        self.attention_kernel = choice.name
        if choice.how == "measured":
            self.remarks.append(choice.describe())
        if os.environ.get(FORMER_KERNEL_VARIABLE):
            self.notices.append(
                f"{FORMER_KERNEL_VARIABLE} is no longer read: set {KERNEL_VARIABLE} "
                "(flash-attention-3, varlen_attn, flash-attn-2, cudnn-jagged or reference)"
            )

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

    def in_int8(self, mode: str, calibration: Calibration | None) -> Encoder:
        """This encoder's OpenVINO graph quantized to `mode` (`bulkembed.encoders.int8`,
        `calibration` for static int8), from the export cache or quantized now; a
        `ModelError` where it cannot be."""
        from bulkembed.encoders.int8 import quantized_graph
        from bulkembed.encoders.openvino import Quantized, conversion_key

        if self.backend is not Backend.OPENVINO:
            raise ModelError(f"{self.spec.source} does not run on OpenVINO here, nor in int8")
        conversion = conversion_key(self.spec, "base")
        graph = self.model.graph
        told = self.notices.append
        quantized = quantized_graph(self.spec.source, conversion, graph, mode, calibration, told)
        twin = copy.copy(self)
        twin.counts, twin._float32 = DeviceCounts(), None
        twin.model = self.model.in_int8(Quantized(mode, quantized))
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
        """The tokens `batch` computes: its own, or with padding (`padded_width`)."""
        if self.unpadded:
            return int(batch.lengths.sum())
        return len(batch.lengths) * self.padded_width(int(batch.lengths.max(initial=0)))

    def upload(self, batch: TokenBatch) -> DeviceInputs:
        """`batch` laid out (flat or padded) and on its way to the device: on CUDA copied
        from pinned memory on the copy stream, without waiting; on a CPU the tensors
        themselves."""
        import torch

        from bulkembed.encoders.kernels import AUTO
        from bulkembed.encoders.transfer import DeviceInputs

        if batch.pixels is not None:
            inputs = DeviceInputs.images(batch)
        elif self.unpadded:
            inputs = DeviceInputs.flat(batch, self.attention_kernel or AUTO)
        else:
            width = self.padded_width(int(batch.lengths.max(initial=0)))
            inputs = DeviceInputs.padded(batch, self.spec.pad_token_id, width)
        if self._copies is None:
            return inputs
        with torch.cuda.stream(self._copies):
            inputs = inputs.moved(self.device)
            inputs.copied = torch.cuda.Event()
            inputs.copied.record()
        return inputs

    def padded_width(self, longest: int) -> int:
        """The length a padded batch whose longest document has `longest` tokens is padded
        to: on CUDA its bucket (`transfer.bucketed_width`: a few shapes, each prepared once
        by the attention kernels), elsewhere `longest` itself (a CPU prepares nothing per
        shape, and its vectors stay what they were)."""
        from bulkembed.encoders.transfer import bucketed_width

        if not self.device.startswith("cuda"):
            return longest
        return bucketed_width(longest, self.spec.max_length)

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

    def budget_key(self) -> dict[str, Any] | None:
        """`DeviceRuntime.budget_key`, with what runs the batches: the backend, the layout
        and the attention kernel."""
        key = super().budget_key()
        if key is None:
            return None
        ran = {"backend": self.backend.value, "flat": self.unpadded}
        return key | ran | {"kernel": self.attention_kernel}

    def close(self) -> None:  # noqa: B027 (an encoder in this process has nothing to stop)
        """Nothing to stop: the model goes with this object."""

    def release(self) -> None:
        """Let the model go now, not when the last reference to this encoder does: another
        encoder took its place (the `--dtype auto` check's). It embeds nothing after."""
        self.model, self._float32 = None, None
