"""The options that say what a vector is (model, prompts, pooling, precision, output
shape), declared once and taken whole by `bulkembed run` and `bulkembed embed`: the
`ModelOptions` group, added to a command by `with_group`."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from bulkembed.cli.options import from_env
from bulkembed.config import Attention, Backend, DType, DTypeOut, Pooling, Quantize

Command = TypeVar("Command", bound=Callable[..., Any])

Recipe = Annotated[
    str | None,
    typer.Option(
        help="Apply this recipe's settings to the weights named by --model.", **from_env("RECIPE")
    ),
]
Revision = Annotated[
    str | None, typer.Option(help="Hub revision (branch, tag or commit).", **from_env("REVISION"))
]
MaxBatchTokens = Annotated[
    str | None,
    typer.Option(
        help="Token budget per batch (longest × count; the sum of lengths for flat "
        "batches), or auto: on CUDA, probe the free memory once at start and fill 70% of it "
        "(the default elsewhere). Default: the recipe's, else 16384.",
        **from_env("MAX_BATCH_TOKENS"),
    ),
]
MaxLength = Annotated[
    int | None,
    typer.Option(
        help="Truncate documents to this many tokens. Default: the model's.",
        **from_env("MAX_LENGTH"),
    ),
]
DTypeOption = Annotated[
    DType,
    typer.Option(
        "--dtype",
        help="Compute precision. auto: on CUDA bfloat16 on devices that have it (compute "
        "capability 8.0 on), else float16; on CPU bfloat16 where the CPU has bfloat16 "
        "units (AMX, AVX512-BF16), else int8-weights where it has int8 units (VNNI) and the "
        "model is a dense BERT/RoBERTa/XLM-R on OpenVINO (BULKEMBED_AUTO_INT8=0: never), "
        "else float32. A half-precision auto choice is checked against "
        "float32 on the first 64 documents and dropped, with a warning, below cosine 0.9999 "
        "(every dense vector; 99% of multi-vector and sparse ones); an int8 auto choice "
        "below cosine 0.995 or top-5 neighbour agreement 0.93. int8-weights (int8 "
        "weights) and int8 (weights and activations, calibrated on 300 documents) run on "
        "the CPU when asked, checked against float32 at 0.95 and 0.85.",
        **from_env("DTYPE"),
    ),
]
Compile = Annotated[
    bool | None,
    typer.Option(
        "--compile/--no-compile",
        help="Compile the model with torch.compile (any batch shape): a slower start, "
        "fused layers. Unset: on CUDA when the inputs hold about five minutes of work or "
        "more (2 x parameters x input bytes / 4 >= 1e17 FLOPs), else not.",
        show_default=False,
        **from_env("COMPILE"),
    ),
]
BackendOption = Annotated[
    Backend,
    typer.Option(
        "--backend",
        help="What runs the model. auto: OpenVINO on a CPU for BERT, RoBERTa and "
        "XLM-RoBERTa models (converted once and cached), else PyTorch. openvino: CPU only, "
        "float32 or bfloat16. torch: PyTorch eager (or --compile).",
        **from_env("BACKEND"),
    ),
]
AttentionOption = Annotated[
    Attention,
    typer.Option(
        "--attention",
        help="How batches run. flat: documents end to end, no padding, attention within "
        "each (BERT, RoBERTa, XLM-RoBERTa; PyTorch). padded: padded to the longest, with a "
        "mask. auto: flat on CUDA where a variable-length kernel runs the dtype, else padded.",
        **from_env("ATTENTION"),
    ),
]
PoolingOption = Annotated[
    Pooling | None,
    typer.Option(
        "--pooling", help="Override the pooling of the model or recipe.", **from_env("POOLING")
    ),
]
Normalize = Annotated[
    bool | None,
    typer.Option(
        "--normalize/--no-normalize",
        help="L2-normalize vectors. Default: as the model says.",
        **from_env("NORMALIZE"),
    ),
]
Prompt = Annotated[
    str | None,
    typer.Option(
        help="Text put before every document (counts toward max length).", **from_env("PROMPT")
    ),
]
PromptName = Annotated[
    str | None,
    typer.Option(
        help="Use the model's or recipe's prompt of this name.", **from_env("PROMPT_NAME")
    ),
]
Outputs = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated: dense, sparse, multivector. Default: all the model produces "
        "(or the recipe's list).",
        **from_env("OUTPUTS"),
    ),
]
SparseTopK = Annotated[
    int | None,
    typer.Option(
        help="Keep only the K largest weights of each SPLADE vector.", **from_env("SPARSE_TOP_K")
    ),
]
Dim = Annotated[
    int | None,
    typer.Option(
        help="Cut dense vectors to their first N dimensions (Matryoshka), then L2-normalize "
        "them again if the model normalizes.",
        **from_env("DIM"),
    ),
]
DTypeOutOption = Annotated[
    DTypeOut,
    typer.Option(
        "--dtype-out",
        help="Float type of the dense and multi-vector columns.",
        **from_env("DTYPE_OUT"),
    ),
]
QuantizeOption = Annotated[
    Quantize | None,
    typer.Option(
        help="Write dense vectors as int8, uint8 (ranges calibrated once per run), binary or "
        "ubinary (1 bit per dimension).",
        **from_env("QUANTIZE"),
    ),
]


def names(option: str | None) -> tuple[str, ...]:
    """A comma-separated option as a tuple of its names."""
    return tuple(n.strip() for n in (option or "").split(",") if n.strip())


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """The model options of a command, as given (see `settings`)."""

    recipe: Recipe = None
    revision: Revision = None
    max_batch_tokens: MaxBatchTokens = None
    max_length: MaxLength = None
    dtype: DTypeOption = DType.AUTO
    compile_model: Compile = None
    backend: BackendOption = Backend.AUTO
    attention: AttentionOption = Attention.AUTO
    pooling: PoolingOption = None
    normalize: Normalize = None
    prompt: Prompt = None
    prompt_name: PromptName = None
    outputs: Outputs = None
    sparse_top_k: SparseTopK = None
    dim: Dim = None
    dtype_out: DTypeOutOption = DTypeOut.FLOAT32
    quantize: QuantizeOption = None

    def settings(self) -> dict[str, Any]:
        """The settings of `RunConfig` these options give, by its field names."""
        return {
            "recipe": self.recipe,
            "revision": self.revision,
            "max_batch_tokens": self.max_batch_tokens,
            "max_length": self.max_length,
            "dtype": self.dtype,
            "compile": self.compile_model,
            "backend": self.backend,
            "attention": self.attention,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "prompt": self.prompt,
            "prompt_name": self.prompt_name,
            "outputs": None if self.outputs is None else names(self.outputs),
            "sparse_top_k": self.sparse_top_k,
            "dim": self.dim,
            "dtype_out": self.dtype_out,
            "quantize": self.quantize,
        }


def with_group(group: type[Any], name: str) -> Callable[[Command], Command]:
    """Give a command the options of `group` (a frozen dataclass whose fields carry their
    typer annotations and defaults) where its parameter `name` stands, and call it with the
    group built from them as that parameter (every parameter is passed by name)."""
    hints = typing.get_type_hints(group, include_extras=True)
    fields = dataclasses.fields(group)
    keyword = inspect.Parameter.KEYWORD_ONLY
    added = [
        inspect.Parameter(f.name, keyword, default=f.default, annotation=hints[f.name])
        for f in fields
    ]

    def decorate(command: Command) -> Command:
        parameters: list[inspect.Parameter] = []
        for parameter in inspect.signature(command, eval_str=True).parameters.values():
            parameters += added if parameter.name == name else [parameter.replace(kind=keyword)]

        @functools.wraps(command)
        def taking_group(**values: Any) -> Any:
            given = group(**{f.name: values.pop(f.name) for f in fields})
            return command(**values, **{name: given})

        del taking_group.__wrapped__
        taking_group.__annotations__ = {}
        taking_group.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        return typing.cast(Command, taking_group)

    return decorate
