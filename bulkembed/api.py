"""The in-process encoder: `load` a model once, then embed texts in this process.

    encoder = bulkembed.load("e5-base-v2")
    encoder.encode_query(["how do I sort a list?"]).dense    # [1, 768], "query: " first
    encoder.embed_query("how do I sort a list?")             # the same row, as LangChain's list

`load` takes the settings of `bulkembed run` that concern the model, under the same names
and with the same checks (`RunConfig`), and resolves the model as a run does: recipe,
pooling, normalisation, maximum length, prompts, outputs. Texts are tokenized in the
calling process, packed into token-budget batches and embedded by the same encoder, and
their vectors shaped as the run writes them (`--dim`, `--dtype-out`, `--quantize`): an
`encode_document` vector equals the run's for the same text. No process is started unless
several devices are asked for, so a script without an `if __name__ == "__main__":` guard,
or one read from stdin, works.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from bulkembed.config import RUNTIME_SETTINGS, VECTOR_SETTINGS, RunConfig, refuse_int8_in_process
from bulkembed.contracts import Embeddings, SparseRows
from bulkembed.errors import ModelError, UsageError, one_line
from bulkembed.given_texts import text_list

if TYPE_CHECKING:
    from langchain_core.embeddings import Embeddings as _LangChainEmbeddings
else:
    try:
        from langchain_core.embeddings import Embeddings as _LangChainEmbeddings
    except ImportError:
        # LangChain takes any object with its methods: `TextEncoder` has them all.
        _LangChainEmbeddings = object

if TYPE_CHECKING:
    from bulkembed.batching.tokenize import TextTokenizer, TokenizedChunk
    from bulkembed.engine.session import DeviceSession, Unsettled
    from bulkembed.engine.stream import EmbeddedWindow
    from bulkembed.models.model_spec import ModelSpec
    from bulkembed.output.format import OutputFormat

# The settings of `RunConfig` that `load` takes: those that decide what a vector is, and
# where and how fast it is computed.
MODEL_SETTINGS = (*VECTOR_SETTINGS, "prompt_name", *RUNTIME_SETTINGS)
# The call that gives every output, for each of LangChain's dense-only calls.
_ENCODE = {
    "embed_documents": "encode_document",
    "embed_query": "encode_query",
    "embed_images": "encode_images",
}
# Texts tokenized at a time: a window gathers these into token-budget batches.
TEXTS_PER_CHUNK = 1024
# `RunConfig` wants inputs and an output; the in-process encoder reads and writes neither.
_NO_INPUTS = ("-",)
_NO_OUTPUT = "-"


def model_config(model: str | os.PathLike[str], settings: dict[str, Any]) -> RunConfig:
    """The `RunConfig` of `load(model, **settings)`, checked as a run's: `device` is a
    short name for `devices`, `max_batch_tokens` a number or "auto", `outputs` a list of
    names or one comma-separated string. An unknown setting is a one-line error."""
    values = dict(settings)
    if "device" in values:
        if "devices" in values:
            raise UsageError("load: pass device or devices, not both")
        values["devices"] = values.pop("device")
    unknown = sorted(set(values) - set(MODEL_SETTINGS))
    if unknown:
        raise UsageError(
            f"load: unknown {'setting' if len(unknown) == 1 else 'settings'} "
            f"{', '.join(unknown)} (known: device, "
            f"{', '.join(MODEL_SETTINGS)})"
        )
    budget = values.get("max_batch_tokens")
    if budget is not None and not isinstance(budget, (int, str)):
        raise UsageError(f"max_batch_tokens: expected a number of tokens or 'auto', not {budget!r}")
    outputs = values.get("outputs")
    if isinstance(outputs, str):
        values["outputs"] = tuple(n.strip() for n in outputs.split(",") if n.strip())
    return RunConfig(inputs=_NO_INPUTS, output=_NO_OUTPUT, model=os.fspath(model), **values)


def load(model: str | os.PathLike[str], /, **settings: Any) -> TextEncoder:
    """A `TextEncoder` for `model`: a recipe name, a hub id or a local folder, with the
    settings of `bulkembed run` that concern the model, as keyword arguments with the
    options' names and meanings: `recipe`, `revision`, `devices` or `device` (`auto`: the
    first GPU, else the CPU), `dtype`, `compile`, `pooling`, `normalize`, `prompt`,
    `prompt_name`, `outputs`, `sparse_top_k`, `dim`, `dtype_out`, `quantize`, `max_length`,
    `max_batch_tokens`.

    Or `model` is an output that `bulkembed run` wrote (a Parquet folder, local or on object
    storage, or `lancedb://PATH?table=NAME`): the encoder it was made with, every setting
    that shapes a vector read from it (`bulkembed.output.recorded`), int8/uint8 scale included.
    Those settings may not be given then; the others may, and `model` (where the model's
    files are now, if they moved) and `storage_options` (a dict, as `--storage-option`).
    Weights other than those the output was made with are refused.

    The model is loaded here, once; see `TextEncoder` for what each call does."""
    from bulkembed.output.recorded import names_output

    if names_output(model):
        return _made(os.fspath(model), settings)
    return TextEncoder(model_config(model, settings))


def _made(output: str, settings: dict[str, Any]) -> TextEncoder:
    """The encoder that made `output`, with `settings` of where and how fast it runs."""
    from bulkembed.output.recorded import output_encoder
    from bulkembed.storage import StorageOptions

    pairs = (settings.pop("storage_options", None) or {}).items()
    options = StorageOptions.parse([f"{k}={v}" for k, v in pairs]) if pairs else None
    made = output_encoder(output, options)
    # The revision may be named anew (a branch that moved): the weights are checked.
    recorded = sorted(set(settings) & ({*VECTOR_SETTINGS, "prompt_name"} - {"revision"}))
    if recorded:
        raise UsageError(
            f"load: {made.label} records the settings its vectors were made with: leave out "
            f"{', '.join(recorded)}"
        )
    return load_recorded(made.label, made.record, made.ranges, settings)


def load_recorded(
    label: str,
    record: dict[str, Any],
    ranges: list[list[float]] | None,
    settings: dict[str, Any],
) -> TextEncoder:
    """The encoder that `label` records (`bulkembed.output.recorded.encoder_record`), with its
    int8/uint8 `ranges`, `settings` of where and how fast it runs and, as `model` and
    `revision`, where the model's files are now; weights other than the recorded ones are
    refused. Its documents take the recorded prompt, and its queries the recorded query
    prompt."""
    from bulkembed.output.recorded import RECORDED

    version = str(record.get("version"))
    values = {**{k: record[k] for k in RECORDED}, **settings}
    model = values.pop("model")
    try:
        encoder = TextEncoder(model_config(model, values), ranges)
    except (ModelError, OSError) as e:
        raise ModelError(
            f"{label} was made with the model {model}, which cannot be loaded here "
            f"({one_line(e)}): pass model= where its files are"
        ) from None
    if encoder.spec.version != version:
        encoder.close()
        raise ModelError(
            f"{label} was made with the weights {version} of {model}, not these "
            f"({encoder.spec.version}): load those (model=..., revision=...)"
        )
    # As the output's documents were, whatever the model's defaults are now.
    query_prompt = record.get("query_prompt")
    encoder.spec = replace(
        encoder.spec, document_prompt=encoder.spec.prompt, query_prompt=query_prompt
    )
    return encoder


class TextEncoder(_LangChainEmbeddings):
    """A model loaded in this process, embedding texts as `bulkembed run` does.

    - `encode(texts)`: with the prompt the settings name (`prompt`, `prompt_name`), else the
      one a run gives corpus documents;
    - `encode_document(texts)`: with the document prompt a run gives by default (E5's
      `passage: `, nomic's `search_document: `), whatever `prompt` says;
    - `encode_query(texts)`: with the model's query prompt (E5's `query: `, the BGE
      instruction, nomic's `search_query: `), or none if the model names none.

    Each takes one text or a list of them and returns `Embeddings` with one row per text,
    in the order given (a single text gives one row): `dense` a [texts, D] array,
    `sparse` one `SparseVector` (ascending vocabulary ids, float32 weights) per text (in
    one `SparseRows`: index it, iterate it, or read its flat `indices`, `values` and
    `offsets`),
    `multivector` one [tokens, d] array per text; an output the model does not give, or
    the settings leave out, is None.

    With `dtype="auto"` and a half-precision candidate (CUDA; CPUs with bfloat16 units)
    the first call checks it, as a run does at start-up: its first 64 texts are embedded
    in float32 and in the candidate, and the candidate is kept only if they agree. With
    `quantize="int8"` or `"uint8"` the first call's texts (two at least) calibrate the
    ranges that every later call uses. Calls from several threads take turns: one embeds
    at a time.

    `embed_documents(texts)` and `embed_query(text)` are LangChain's `Embeddings`: the dense
    vectors of `encode_document` and `encode_query` as lists of floats, so the encoder can
    be given wherever LangChain takes an embedding model (with `langchain-core` installed,
    it is a subclass of its `Embeddings`). `aembed_documents` and `aembed_query` embed on a
    worker thread, so an event loop runs on while they do."""

    def __init__(self, config: RunConfig, ranges: list[list[float]] | None = None) -> None:
        from bulkembed.engine.session import start_session
        from bulkembed.models.devices import resolve_devices
        from bulkembed.models.model_spec import resolve_model
        from bulkembed.output.format import OutputFormat
        from bulkembed.reporting.progress import QuietReporter

        refuse_int8_in_process(config.batching.dtype)
        self.config = config
        self.spec: ModelSpec = resolve_model(config)
        self._format: OutputFormat = OutputFormat.for_run(config.model, self.spec)
        if ranges is not None:
            # An output's int8/uint8 scale: queries are quantized as its documents were.
            self._format = replace(self._format, ranges=np.asarray(ranges, dtype=np.float32))
        self._reporter = QuietReporter()
        devices = resolve_devices(config.batching.devices)
        if config.batching.devices.strip().lower() == "auto":
            # One device unless a list asks for more: no process is started.
            devices = devices[:1]
        self._session: DeviceSession | Unsettled = start_session(
            self.spec, devices, config.batching.dtype, None, self._reporter
        )
        self._tokenizers: dict[str, TextTokenizer] = {}
        # One call embeds at a time, whichever thread it comes from.
        self._turn = threading.Lock()

    @property
    def outputs(self) -> tuple[str, ...]:
        """The outputs each call returns: some of dense, sparse, multivector."""
        return self.spec.outputs

    @property
    def dim(self) -> int | None:
        """The width of a dense row (after `dim`; in bytes for binary quantization)."""
        model_dim = self._session.embedder.dense_dim
        if model_dim is None:
            return None
        kind = self._format.dense_type(model_dim)
        return int(kind.list_size)

    @property
    def dtype(self) -> str:
        """The dtype the model computes in (with `auto`, known for sure after the first call)."""
        return self._session.dtype

    @property
    def query_prompt(self) -> str:
        """The text put before each query (`encode_query`)."""
        return self.spec.query_prompt or ""

    @property
    def document_prompt(self) -> str:
        """The text put before each document (`encode_document`)."""
        return self.spec.document_prompt

    def encode(self, texts: str | Sequence[str]) -> Embeddings:
        """Embeddings of `texts` with the prompt of the settings (see `TextEncoder`)."""
        return self._embed(texts, self.spec.prompt)

    def encode_document(self, texts: str | Sequence[str]) -> Embeddings:
        """Embeddings of `texts` as documents: the model's document prompt first."""
        return self._embed(texts, self.spec.document_prompt)

    def encode_query(self, texts: str | Sequence[str]) -> Embeddings:
        """Embeddings of `texts` as queries: the model's query prompt first."""
        if self.spec.family == "colbert":
            raise ModelError(
                "encode_query: ColBERT queries take their own marker and length, which this "
                "version does not apply; encode_document gives document vectors"
            )
        return self._embed(texts, self.query_prompt)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """LangChain's `embed_documents`: the dense vector of each text as a document."""
        return self._dense(self.encode_document(texts), "embed_documents").tolist()

    def embed_query(self, text: str) -> list[float]:
        """LangChain's `embed_query`: the dense vector of `text` as a query."""
        row: list[float] = self._dense(self.encode_query([text]), "embed_query")[0].tolist()
        return row

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """LangChain's async `embed_documents`, embedded on a worker thread."""
        return await asyncio.to_thread(self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        """LangChain's async `embed_query`, embedded on a worker thread."""
        return await asyncio.to_thread(self.embed_query, text)

    def _dense(self, embedded: Embeddings, call: str) -> np.ndarray:
        if embedded.dense is None:
            raise UsageError(
                f"{call} returns dense vectors, and this encoder gives "
                f"{','.join(self.outputs)}: call {_ENCODE[call]} for them"
            )
        return embedded.dense

    def close(self) -> None:
        """Let the model go, and stop its device processes if it has any."""
        self._session.close()

    def __enter__(self) -> TextEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def encode_images(self, images: Any) -> Embeddings:
        """Embeddings of images (a path, bytes or a PIL image, or a sequence of them) by
        a two-tower model's image tower, in the order given: files are turned upright by
        their EXIF orientation, as a run turns them; a PIL image is taken as it is."""
        from bulkembed.batching.decode import image_chunks, image_list

        if self.spec.image is None:
            raise UsageError(
                f"encode_images: {self.spec.source} reads texts only; load a two-tower model "
                "(clip-vit-base-patch32, siglip2-base-patch16-224, ...)"
            )
        listed = image_list(images)
        if not listed:
            return self._empty()
        pixels = self.config.inputs.max_image_pixels
        return self._embedded(image_chunks(listed, self.spec.image, pixels))

    def embed_images(self, images: Any) -> list[list[float]]:
        """The dense vector of each image (`encode_images`), as lists of floats."""
        return self._dense(self.encode_images(images), "embed_images").tolist()

    def _embed(self, texts: str | Sequence[str], prompt: str) -> Embeddings:
        listed = text_list(texts)
        if not listed:
            return self._empty()
        return self._embedded(self._tokenized(listed, prompt))

    def _embedded(self, chunks: Iterator[TokenizedChunk]) -> Embeddings:
        """The vectors of `chunks` (one unit), in order."""
        from bulkembed.engine.stream import embed_windows, gather_windows
        from bulkembed.reporting.progress import RunStats

        stats = RunStats()
        found: list[Embeddings] = []

        def keep(window: EmbeddedWindow) -> None:
            found.append(window.vectors)

        with self._turn:
            session = self._session
            gathered = gather_windows(chunks, session.embedder, session.budget, stats)
            embed_windows(
                gathered, session, self._formatted, keep, stats, self._reporter, self._settled
            )
        return Embeddings.concatenate(found)

    def _settled(self, session: DeviceSession) -> None:
        """The session the first texts settled (`--dtype auto`): later calls run on it."""
        self._session = session

    def _formatted(self, embedded: Embeddings) -> Embeddings:
        """`embedded` as a run writes it; int8/uint8 ranges calibrated on the first texts."""
        if self._format.needs_ranges and embedded.dense is not None:
            self._format = self._format.calibrated(embedded.dense)
        return self._format.apply(embedded)

    def _tokenized(self, texts: list[str], prompt: str) -> Iterator[TokenizedChunk]:
        """`texts` tokenized with `prompt` in chunks of `TEXTS_PER_CHUNK`, as one unit."""
        from bulkembed.batching.tokenize import TextTokenizer, TokenizedChunk, TokenizerSettings
        from bulkembed.sources import Chunk

        tokenizer = self._tokenizers.get(prompt)
        if tokenizer is None:
            spec = self.spec
            settings = TokenizerSettings(
                spec.tokenizer_json, spec.max_length, prompt, spec.lowercase, spec.prefix_token_id
            )
            tokenizer = self._tokenizers[prompt] = TextTokenizer(settings)
        for start in range(0, len(texts), TEXTS_PER_CHUNK):
            end = min(start + TEXTS_PER_CHUNK, len(texts))
            positions = np.arange(start, end, dtype=np.int64)
            chunk = Chunk(0, 0, pa.array(positions), pa.array([], pa.string()), end == len(texts))
            chunk.positions = positions
            started = time.perf_counter()
            tokens = tokenizer(texts[start:end])
            yield TokenizedChunk(chunk, *tokens, seconds=time.perf_counter() - started)

    def _empty(self) -> Embeddings:
        """What a call with no text returns: each output with no row."""
        dense = None
        sparse: SparseRows | None = None
        multivector: list[np.ndarray] | None = None
        model_dim = self._session.embedder.dense_dim
        if model_dim is not None:
            kind = self._format.dense_type(model_dim)
            dense = np.empty((0, kind.list_size), dtype=kind.value_type.to_pandas_dtype())
        if "sparse" in self.spec.outputs:
            sparse = SparseRows.of([])
        if "multivector" in self.spec.outputs:
            multivector = []
        return Embeddings(dense, sparse, multivector)
