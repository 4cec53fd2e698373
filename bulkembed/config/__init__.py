"""A run's frozen configuration: its settings in five groups (`groups`), each checked by
itself, and the checks across groups in `RunConfig`.

Nothing here imports torch: the CLI builds a `RunConfig` before any heavy import.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from bulkembed.config.choices import (
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_MAX_DELETES,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_RECORDS_PER_UNIT,
    OUTPUTS,
    RESERVED_COLUMNS,
    TOKENIZERS_PER_GPU,
    Attention,
    Backend,
    DType,
    DTypeOut,
    Engine,
    IndexType,
    OnBadRecord,
    Pooling,
    Quantize,
    ShardSpec,
    StreamFormat,
    default_tokenize_workers,
    refuse_int8_in_process,
)
from bulkembed.config.groups import (
    BatchSettings,
    InputSettings,
    ModelSettings,
    OutputSettings,
    RunSettings,
    recorded_settings,
)
from bulkembed.errors import UsageError

__all__ = [
    "refuse_int8_in_process",
    "DEFAULT_MAX_BATCH_TOKENS",
    "DEFAULT_MAX_DELETES",
    "DEFAULT_MAX_IMAGE_PIXELS",
    "DEFAULT_RECORDS_PER_UNIT",
    "OUTPUTS",
    "RESERVED_COLUMNS",
    "RUNTIME_SETTINGS",
    "TOKENIZERS_PER_GPU",
    "VECTOR_SETTINGS",
    "Attention",
    "Backend",
    "BatchSettings",
    "DType",
    "DTypeOut",
    "Engine",
    "IndexType",
    "InputSettings",
    "ModelSettings",
    "OnBadRecord",
    "OutputSettings",
    "Pooling",
    "Quantize",
    "RunConfig",
    "RunSettings",
    "ShardSpec",
    "StreamFormat",
    "default_tokenize_workers",
]

# The model's settings that shape its vectors: what an output records of its encoder
# besides the model (`bulkembed.output.recorded`).
VECTOR_SETTINGS = recorded_settings(ModelSettings)
# Where and how fast a model runs: its vectors are the same but for rounding.
RUNTIME_SETTINGS = recorded_settings(BatchSettings)

_GROUPS: dict[str, Any] = {
    "inputs": InputSettings,
    "model": ModelSettings,
    "batching": BatchSettings,
    "output": OutputSettings,
    "run": RunSettings,
}
# The group each setting belongs to, by its name in the group.
_OWNER = {f.name: group for group, kind in _GROUPS.items() for f in fields(kind)}
# The first setting of three groups, named as the group where the run is one flat list of
# settings (`RunConfig(inputs=..., output=..., model=...)`, `RunConfig.changed`).
_FIRST = {"inputs": "paths", "model": "name", "output": "target"}


@dataclass(frozen=True, init=False)
class RunConfig:
    """Everything one `bulkembed run` needs, in five groups: `inputs`, `model`, `batching`,
    `output` and `run` (see `bulkembed.config.groups`).

    Built from the groups, or from one flat list of keywords with the options' names (the
    command line's, in snake case): `inputs`, `output` and `model` are then the paths, the
    target and the model, and every other keyword goes to the group that holds it. A group
    given whole takes the flat keywords of its settings as changes. Values are checked by
    their group, then across groups here, with the command line's one-line errors."""

    inputs: InputSettings
    model: ModelSettings
    batching: BatchSettings
    output: OutputSettings
    run: RunSettings

    def __init__(
        self,
        inputs: InputSettings | str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        output: OutputSettings | str | os.PathLike[str],
        model: ModelSettings | str | os.PathLike[str],
        batching: BatchSettings | None = None,
        run: RunSettings | None = None,
        **settings: Any,
    ) -> None:
        given: dict[str, Any] = {
            "inputs": inputs,
            "model": model,
            "batching": batching,
            "output": output,
            "run": run,
        }
        changes: dict[str, dict[str, Any]] = {group: {} for group in _GROUPS}
        for name, value in settings.items():
            if name not in _OWNER:
                raise TypeError(f"RunConfig got an unexpected setting {name!r}")
            changes[_OWNER[name]][name] = value
        for group, kind in _GROUPS.items():
            value, changed = given[group], changes[group]
            if not isinstance(value, kind):
                value = kind(**({} if value is None else {_FIRST[group]: value}), **changed)
            elif changed:
                value = replace(value, **changed)
            object.__setattr__(self, group, value)
        self._check_across()

    def changed(self, **settings: Any) -> RunConfig:
        """This configuration with `settings` changed, by their flat names."""
        renamed = {_FIRST.get(name, name): value for name, value in settings.items()}
        return RunConfig(**{group: getattr(self, group) for group in _GROUPS}, **renamed)

    def _check_across(self) -> None:
        """What one group alone cannot check. `--shard` and `--engine ray` commit units
        from several processes at once into one output: what needs the whole corpus in one
        process is refused (an output that takes rows from one process only is refused by
        the plan, which knows its kind)."""
        run, inputs, quantize = self.run, self.inputs, self.model.quantize
        if self.output.index and quantize is not None:
            raise UsageError("--index needs float vectors: leave out --quantize")
        if inputs.stdin and (run.since or run.distributed):
            raise UsageError(
                "input from stdin (-) is read once, by one process: it cannot be combined "
                "with --since, --shard or --engine ray; write it to a file first"
            )
        if not run.distributed:
            return
        what = "--shard" if run.engine is Engine.LOCAL else "--engine ray"
        refused = {
            "--limit": inputs.limit is not None,
            "--overwrite": run.overwrite and run.shard is not None,
            f"--quantize {getattr(quantize, 'value', '')}": quantize
            in (Quantize.INT8, Quantize.UINT8),
        }
        for option, given in refused.items():
            if given:
                raise UsageError(
                    f"{what} cannot be combined with {option}: it needs the whole corpus in "
                    "one run (run without it, or remove the output by hand to start over)"
                )
