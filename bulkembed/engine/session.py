"""A model on a run's devices, ready to embed windows: the encoder started on the first
device (`start_encoder`: CPU threads, memory settings, model load, token-budget probe), the
start-up precision check of `--dtype auto`, and with several devices the pool of workers
that start theirs the same way. The local engine and each Ray actor hold one session.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from bulkembed.config import Attention, DType
from bulkembed.contracts import DeviceCounts
from bulkembed.reporting.progress import Reporter

if TYPE_CHECKING:
    import torch

    from bulkembed.batching.tokenize import TokenizedChunk
    from bulkembed.batching.windows import EmbeddedHead
    from bulkembed.encoders import Embedder
    from bulkembed.engine.precision import PrecisionCheck
    from bulkembed.models.model_spec import ModelSpec


def dtype_name(dtype: torch.dtype) -> str:
    """`bfloat16` for `torch.bfloat16`."""
    return str(dtype).removeprefix("torch.")


class DeviceSession:
    """The model of a run on its devices, in the dtype it computes in.

    With `--dtype auto` and a half-precision candidate the model starts in float32 on the
    first device, and the first window with a document settles the dtype (`settle`): its
    first documents are embedded both ways and the candidate is kept only if they agree.
    With several devices one worker process per device (`EncoderPool`) starts once the dtype
    is known. `budget` is the token budget of a batch; `--max-batch-tokens auto` probes it
    at start, again in the dtype the check keeps (before the first batch), and the pool's
    workers only ever lower it, so that batches packed before still fit. The check's
    sample, embedded in the dtype kept, waits in `sample` for its window's output."""

    def __init__(
        self,
        spec: ModelSpec,
        devices: list[str],
        dtype: DType,
        threads: int | None,
        tune: bool,
        reporter: Reporter,
    ) -> None:
        import torch

        from bulkembed.encoders import start_encoder
        from bulkembed.engine.precision import recorded_check
        from bulkembed.models.devices import resolve_dtype

        self.spec = spec
        self.devices = devices
        self.threads = threads
        self.tune = tune
        self.reporter = reporter
        self.candidate = resolve_dtype(dtype, devices[0])
        self.checking = dtype is DType.AUTO and self.candidate != torch.float32
        self.budget = spec.max_batch_tokens
        self.tuned = False
        self.precision: PrecisionCheck | None = None
        self.sample: EmbeddedHead | None = None
        self.embedder: Embedder
        # What an embedder let go (the check's) counted.
        self._retired = DeviceCounts()
        # Warnings and remarks of the encoders' loads said so far: each is said once.
        self._told: set[str] = set()
        if self.checking:
            # A check recorded by an earlier run: the model starts in the dtype it kept, and
            # `settle` embeds the sample as that check did, so that the output is the same.
            self.precision = recorded_check(spec, devices[0], self.candidate)
        reporter.phase(f"loading the model on {', '.join(devices)}")
        if len(devices) > 1 and not self.checking:
            self.embedder = self._start_pool()
            return
        unchecked = self.checking and self.precision is None
        start_dtype = torch.float32 if unchecked or self.dtype == "float32" else self.candidate
        encoder, budget = start_encoder(spec, devices[0], start_dtype, threads, tune)
        self._tell(encoder.notices, encoder.remarks)
        self.embedder = encoder
        self._use_budget(budget)

    @property
    def dtype(self) -> str:
        """The dtype the run computes in: the candidate, unless its check failed."""
        if self.precision is not None and not self.precision.passed:
            return "float32"
        return dtype_name(self.candidate)

    @property
    def counts(self) -> DeviceCounts:
        """What this session's embedders counted: batches embedded again in float32, their
        values not finite in its dtype (`Encoder._finite`), and device seconds."""
        counts = self._retired.copy()
        counts.add(self.embedder.counts)
        return counts

    @property
    def backend(self) -> str | None:
        """What runs the model in this process (None: device processes run it)."""
        from bulkembed.encoders import Encoder

        embedder = self.embedder
        return embedder.backend.value if isinstance(embedder, Encoder) else None

    @property
    def attention(self) -> str:
        """How batches run: `flat` or `padded`."""
        return Attention.ran(self.embedder.unpadded).value

    def _start_pool(self) -> Embedder:
        """One encoder process per device, in the run's dtype."""
        from bulkembed.engine.pool import EncoderPool
        from bulkembed.models.devices import cpu_threads_per_worker

        threads = cpu_threads_per_worker(self.devices)
        pool = EncoderPool(
            self.spec, self.devices, self.dtype, threads, self.tune, self.reporter.warn
        )
        self._tell(pool.ready.notices, pool.ready.remarks)
        self._use_budget(pool.batch_tokens)
        return pool

    def _tell(self, notices: Iterable[str], remarks: Iterable[str]) -> None:
        """Warn of `notices` and remark `remarks`, those not said before."""
        tell(self.reporter, notices, remarks, self._told)

    def _use_budget(self, budget: int | None, lower_only: bool = True) -> None:
        """Batch by `budget` tokens from now on (a probed budget: `--max-batch-tokens auto`,
        or flat batches on CUDA, `tunes_budget`); unless told otherwise, never more than a
        budget found before (batches packed by it must fit)."""
        if budget is None:
            return
        if self.tuned and lower_only:
            budget = min(budget, self.budget)
        self.tuned = True
        self.budget = budget
        self.reporter.info(f"token budget probed: {budget} tokens per batch")

    def settle(
        self, window: list[TokenizedChunk], embedding: Callable[[], None] = lambda: None
    ) -> bool:
        """While `--dtype auto` awaits its check, make it on `window`'s first documents
        (their vectors in the dtype kept go to `sample`), or embed them as a check recorded
        before did (`embedding` is told as that begins: the run's first batch); a window
        with no document to embed leaves it to the next one. Whether the dtype is settled
        now."""
        import torch

        from bulkembed.encoders import Encoder
        from bulkembed.encoders.registry import tunes_budget
        from bulkembed.engine.precision import check_on_window, record_check, replay_on_window

        if not self.checking:
            return True
        assert isinstance(self.embedder, Encoder)
        fresh = self.precision is None
        if self.precision is None:
            self.reporter.phase(f"checking {dtype_name(self.candidate)} against float32")
            budget = self.budget
            checked = check_on_window(self.embedder, window, self.candidate, budget)
            if checked is None:
                return False
            encoder, self.precision, self.sample = checked.encoder, checked.check, checked.sample
            record_check(self.spec, self.devices[0], self.candidate, self.precision, budget)
        else:
            self.sample = replay_on_window(
                self.embedder, window, self.budget, self.precision, embedding
            )
            if self.sample is None:
                return False
            encoder = self.embedder
        self.checking = False
        self._say_check()
        if encoder is not self.embedder:
            # The float32 start's device seconds stay counted: the run's counts only grow.
            self._retired.add(self.embedder.counts)
        if len(self.devices) == 1:
            self.embedder = encoder
            self._tell(encoder.notices, encoder.remarks)
            if fresh and self.precision.passed and tunes_budget(encoder, self.tune):
                # The probe at start ran in float32: the chosen dtype takes less memory.
                self._use_budget(encoder.tune_batch_tokens(), lower_only=False)
            return True
        # The check ran on the first device in this process: free it for its worker. The
        # sample's batches it embedded again in float32, if any, still count.
        self._retired.add(encoder.counts)
        del encoder
        if self.devices[0].startswith("cuda"):
            torch.cuda.empty_cache()
        self.embedder = self._start_pool()
        return True

    def _say_check(self) -> None:
        """Say what the check found: a warning when the run falls back to float32."""
        assert self.precision is not None
        say = self.reporter.info if self.precision.passed else self.reporter.warn
        say(f"--dtype auto: {self.precision.describe()}")

    def take_sample(self) -> EmbeddedHead | None:
        """The check's sample, embedded (once: the caller writes it)."""
        sample, self.sample = self.sample, None
        return sample

    def close(self) -> None:
        """Stop the device workers, if any."""
        self.embedder.close()


def load_ahead(openvino: bool) -> None:
    """Import the libraries a model runs on (PyTorch; OpenVINO where it may run the model,
    else transformers' model classes) on a thread of their own, while this one starts the
    tokenizer processes and reads: the import is most of loading a converted model, and
    seconds of loading one in PyTorch. A library that fails to import here fails again,
    with its message, where the model loads."""

    def load() -> None:
        with contextlib.suppress(Exception):
            import torch  # noqa: F401
        with contextlib.suppress(Exception):
            if openvino:
                import openvino as ov  # noqa: F401
            else:
                from transformers import AutoModel  # noqa: F401

    threading.Thread(target=load, name="bulkembed-load-ahead", daemon=True).start()


def settle_dtype(
    spec: ModelSpec,
    device: str,
    dtype: DType,
    tokenized: Iterator[TokenizedChunk],
    reporter: Reporter,
) -> tuple[DType, PrecisionCheck | None, list[TokenizedChunk]]:
    """The dtype that device processes start in, settled before they start: `--dtype auto`
    with a half-precision candidate is checked here on `device` (`DeviceSession.settle`)
    on the first documents of `tokenized` (float32 when the first window's worth holds
    none), and the model is let go again. Returns the dtype, the check, and the chunks read
    for it (still to embed: the device processes embed and commit whole units, the
    sample's documents included)."""
    import torch

    from bulkembed.batching.windows import share_of_window
    from bulkembed.engine.precision import SAMPLE_DOCUMENTS, recorded_check
    from bulkembed.models.devices import resolve_dtype

    candidate = resolve_dtype(dtype, device)
    if dtype is not DType.AUTO or candidate == torch.float32:
        return DType(dtype_name(candidate)), None, []
    recorded = recorded_check(spec, device, candidate)
    if recorded is not None:
        kept = DType(recorded.tried) if recorded.passed else DType.FLOAT32
        say = reporter.info if recorded.passed else reporter.warn
        say(f"--dtype auto: {recorded.describe()}")
        return kept, recorded, []
    # Read until the check has its documents, or a window's worth is held (a --since run
    # whose first documents to embed lie far in): then float32, unchecked half precision never.
    read: list[TokenizedChunk] = []
    documents, held = 0, 0.0
    while documents < SAMPLE_DOCUMENTS and held < 1:
        chunk = next(tokenized, None)
        if chunk is None:
            break
        read.append(chunk)
        documents += len(chunk.lengths)
        held += share_of_window(chunk, spec.max_batch_tokens)
    if not documents:
        reporter.info(
            f"--dtype auto: no document to check {dtype_name(candidate)} on in the first "
            "window: float32"
        )
        return DType.FLOAT32, None, read
    session = DeviceSession(spec, [device], dtype, None, False, reporter)
    try:
        session.settle(read)
        return DType(session.dtype), session.precision, read
    finally:
        session.close()
        del session
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def tell(
    reporter: Reporter,
    notices: Iterable[str],
    remarks: Iterable[str],
    told: set[str] | None = None,
) -> None:
    """Warn of the `notices` of encoders' loads and remark their `remarks`, each once: those
    in `told` were said before, and `told` keeps what is said now."""
    said = set() if told is None else told
    for messages, say in ((notices, reporter.warn), (remarks, reporter.info)):
        for message in messages:
            if message not in said:
                said.add(message)
                say(message)
