"""A model on a run's devices, ready to embed windows: the encoder started on the first
device (`start_encoder`: CPU threads, memory settings, model load, token-budget probe), the
start-up precision check of `--dtype auto`, and with several devices the pool of workers
that start theirs the same way. The local engine and each Ray actor hold one session.

Sessions are frozen. `start_session` is the one step that starts the model: where `--dtype
auto` still awaits its check it gives an `Unsettled` start, which the first window with a
document settles (`Unsettled.settle`) into a new `DeviceSession`; a probe that finds
another token budget gives a new `BatchPolicy`. Nothing is changed after it is made.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bulkembed.batching.packing import BatchPolicy
from bulkembed.config import Attention, DType
from bulkembed.contracts import DeviceCounts
from bulkembed.reporting.progress import Reporter

if TYPE_CHECKING:
    import torch

    from bulkembed.batching.tokenize import TokenizedChunk
    from bulkembed.batching.windows import EmbeddedHead
    from bulkembed.encoders import Embedder, Encoder
    from bulkembed.engine.int8_check import Int8Record
    from bulkembed.engine.precision import PrecisionCheck
    from bulkembed.models.model_spec import ModelSpec


def dtype_name(dtype: torch.dtype) -> str:
    """`bfloat16` for `torch.bfloat16`."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Start:
    """What a session starts from: the model (with how its budget is found:
    `BatchPolicy.of`, `tunes_budget`), its devices, the CPU threads each encoder may use,
    and where it reports. `told` holds the encoders' warnings and remarks said so far: each
    is said once."""

    spec: ModelSpec
    devices: list[str]
    threads: int | None
    reporter: Reporter
    told: set[str] = field(default_factory=set)

    def tell(self, notices: Iterable[str], remarks: Iterable[str]) -> None:
        """Warn of `notices` and remark `remarks`, those not said before."""
        tell(self.reporter, notices, remarks, self.told)

    def probed(
        self, policy: BatchPolicy, tokens: int | None, lower_only: bool = True
    ) -> BatchPolicy:
        """`policy` after a probe that found `tokens` (`BatchPolicy.probed`), said."""
        after = policy.probed(tokens, lower_only)
        if tokens is not None:
            self.reporter.info(f"token budget probed: {after.tokens} tokens per batch")
        return after

    def pool(self, dtype: str, policy: BatchPolicy) -> tuple[Embedder, BatchPolicy]:
        """One encoder process per device, in `dtype`, and the policy their probes leave."""
        from bulkembed.engine.pool import EncoderPool
        from bulkembed.models.devices import cpu_threads_per_worker

        threads = cpu_threads_per_worker(self.devices)
        pool = EncoderPool(self.spec, self.devices, dtype, threads, self.reporter.warn)
        self.tell(pool.ready.notices, pool.ready.remarks)
        return pool, self.probed(policy, pool.budget)


class _Started:
    """What a started model tells, its dtype settled or not."""

    embedder: Embedder
    policy: BatchPolicy

    @property
    def budget(self) -> int:
        """The token budget of a batch."""
        return self.policy.tokens

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

    def close(self) -> None:
        """Stop the device workers, if any."""
        self.embedder.close()


@dataclass(frozen=True)
class DeviceSession(_Started):
    """The model of a run on its devices, in the dtype it computes in (`dtype`), batched
    by `policy`; `precision` is the `--dtype auto` check that chose the dtype, if any, and
    `retired` what embedders let go before (the check's) counted."""

    start: Start
    embedder: Embedder
    dtype: str
    policy: BatchPolicy
    precision: PrecisionCheck | None = None
    retired: DeviceCounts = field(default_factory=DeviceCounts)

    @property
    def counts(self) -> DeviceCounts:
        """What this session's embedders counted: batches embedded again in float32, their
        values not finite in its dtype (`Encoder._finite`), and device seconds."""
        counts = self.retired.copy()
        counts.add(self.embedder.counts)
        return counts


@dataclass(frozen=True)
class Settled:
    """A session whose dtype the first window settled, and the check's sample: that
    window's first documents, embedded already in the dtype kept."""

    session: DeviceSession
    sample: EmbeddedHead


@dataclass(frozen=True)
class Unsettled(_Started):
    """`--dtype auto` with a half-precision `candidate`, awaiting its check: the model
    started on the first device in float32, or in the dtype that a check recorded by an
    earlier run kept (`recorded`: replayed, so that the output is the same), batched by
    `policy`."""

    start: Start
    embedder: Encoder
    candidate: torch.dtype
    policy: BatchPolicy
    recorded: PrecisionCheck | None
    # `--dtype` as given, and where the run keeps its int8 decision (`ModelSpec.int8`).
    asked: DType = DType.AUTO
    int8_record: Int8Record | None = None

    @property
    def dtype(self) -> str:
        """The dtype the run computes in: the candidate, unless a recorded check failed."""
        if self.start.spec.int8 is not None:
            return self.start.spec.int8
        if self.recorded is not None and not self.recorded.passed:
            return "float32"
        return dtype_name(self.candidate)

    @property
    def precision(self) -> PrecisionCheck | None:
        """The check recorded before, if any: the one the run replays."""
        return self.recorded

    @property
    def counts(self) -> DeviceCounts:
        """What the encoder counted so far (`DeviceSession.counts`)."""
        return self.embedder.counts.copy()

    def settle(
        self, window: list[TokenizedChunk], embedding: Callable[[], None] = lambda: None
    ) -> Settled | None:
        """Make the check on `window`'s first documents (their vectors in the dtype kept
        are the sample), or embed them as the recorded check did (`embedding` is told as
        that begins: the run's first batch). None where `window` has no document to embed:
        the next one settles it. Once settled, the session returned takes this start's
        place: a float32 start that the check replaced embeds nothing more."""
        from bulkembed.encoders.registry import tunes_budget
        from bulkembed.engine.precision import check_on_window, record_check, replay_on_window

        start, recorded = self.start, self.recorded
        int8 = start.spec.int8
        if int8 is not None:
            from bulkembed.engine.int8_check import int8_bar, int8_on_window

            start.reporter.phase(f"checking {int8} against float32")
            bar, budget = int8_bar(self.asked), self.budget
            checked = int8_on_window(
                self.embedder, window, bar, budget, self.int8_record, embedding
            )
            if checked is None:
                return None
            encoder, precision, sample = checked.encoder, checked.check, checked.sample
        elif recorded is None:
            start.reporter.phase(f"checking {dtype_name(self.candidate)} against float32")
            checked = check_on_window(self.embedder, window, self.candidate, self.budget)
            if checked is None:
                return None
            encoder, precision, sample = checked.encoder, checked.check, checked.sample
            record_check(start.spec, start.devices[0], self.candidate, precision, self.budget)
        else:
            replayed = replay_on_window(self.embedder, window, self.budget, recorded, embedding)
            if replayed is None:
                return None
            encoder, precision, sample = self.embedder, recorded, replayed
        say = start.reporter.info if precision.passed else start.reporter.warn
        say(f"--dtype {self.asked.value}: {precision.describe()}")
        dtype = (int8 or dtype_name(self.candidate)) if precision.passed else "float32"
        retired = DeviceCounts()
        if encoder is not self.embedder:
            # The float32 start's device seconds stay counted: the run's counts only grow.
            # Its memory goes before the budget is probed again.
            retired.add(self.embedder.counts)
            self.embedder.release()
        if len(start.devices) == 1:
            start.tell(encoder.notices, encoder.remarks)
            policy = self.policy
            if not precision.recorded and precision.passed and tunes_budget(encoder):
                # The probe at start ran in float32: the chosen dtype takes less memory.
                found = encoder.measure_budget()
                policy = start.probed(policy, found, lower_only=False)
            session = DeviceSession(start, encoder, dtype, policy, precision, retired)
            return Settled(session, sample)
        # The check ran on the first device in this process: free it for its worker. The
        # sample's batches it embedded again in float32, if any, still count.
        retired.add(encoder.counts)
        encoder.release()
        _free(start.devices[0])
        pool, policy = start.pool(dtype, self.policy)
        return Settled(DeviceSession(start, pool, dtype, policy, precision, retired), sample)


def start_session(
    spec: ModelSpec,
    devices: list[str],
    dtype: DType,
    threads: int | None,
    reporter: Reporter,
    int8_record: Int8Record | None = None,
) -> DeviceSession | Unsettled:
    """The model of `spec` started on `devices`: a session in `dtype`, or, where `--dtype
    auto` has a half-precision candidate to check, the start that the first window with a
    document settles. With several devices one worker process per device (`EncoderPool`)
    starts once the dtype is known. An `auto` budget (`ModelSpec.probe_budget`) is probed
    at start, and again in the dtype the check keeps (before the first batch); the pool's
    workers only ever lower it, so that batches packed before still fit. A run that tries
    int8 (`ModelSpec.int8`) starts in float32 and settles it on its first window too,
    keeping its decision in `int8_record` (`bulkembed.engine.int8_check`)."""
    import torch

    from bulkembed.encoders import start_encoder
    from bulkembed.engine.precision import recorded_check
    from bulkembed.models.devices import resolve_dtype

    start = Start(spec, devices, threads, reporter)
    policy = BatchPolicy.of(spec)
    candidate = resolve_dtype(dtype, devices[0])
    half = dtype is DType.AUTO and candidate != torch.float32 and spec.int8 is None
    checking = half or spec.int8 is not None
    # A check recorded by an earlier run: the model starts in the dtype it kept.
    recorded = recorded_check(spec, devices[0], candidate) if half else None
    reporter.phase(f"loading the model on {', '.join(devices)}")
    if len(devices) > 1 and not checking:
        pool, policy = start.pool(dtype_name(candidate), policy)
        return DeviceSession(start, pool, dtype_name(candidate), policy)
    kept = recorded is not None and recorded.passed
    start_dtype = candidate if kept or not checking else torch.float32
    encoder, found = start_encoder(spec, devices[0], start_dtype, threads)
    start.tell(encoder.notices, encoder.remarks)
    policy = start.probed(policy, found)
    if checking:
        return Unsettled(start, encoder, candidate, policy, recorded, dtype, int8_record)
    return DeviceSession(start, encoder, dtype_name(candidate), policy)


def _free(device: str) -> None:
    """Give back the cached memory of a CUDA device whose model was let go."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()


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
                from bulkembed.encoders.openvino_import import import_openvino

                import_openvino()
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
    with a half-precision candidate is checked here on `device` (`Unsettled.settle`)
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
        held += share_of_window(chunk, BatchPolicy.of(spec).tokens)
    if not documents:
        reporter.info(
            f"--dtype auto: no document to check {dtype_name(candidate)} on in the first "
            "window: float32"
        )
        return DType.FLOAT32, None, read
    started = start_session(spec, [device], dtype, None, reporter)
    assert isinstance(started, Unsettled)
    settled = None
    try:
        settled = started.settle(read)
        if settled is None:
            return DType.FLOAT32, None, read
        return DType(settled.session.dtype), settled.session.precision, read
    finally:
        started.close()
        if settled is not None:
            settled.session.close()
        del started, settled
        _free(device)


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
