"""A run's start-up, step by step, for one model on one device: the start-up check of
`gpu_check.py` (check 8).

Each step is timed on its own, in this order:

- `import_s`: importing torch and transformers' model classes, in a fresh interpreter;
- `load_s`: the model's weights from its folder onto the device in the run's dtype
  (`load_model`), then `flat_s`: its flat module (where it runs flat);
- `kernel_first_s`, `kernel_recorded_s`: the choice of the attention kernel
  (`kernel_choice`), measured, then replayed from the record the first one left;
- `probe_first_s`, `probe_recorded_s`: the token budget (`measure_budget`), probed,
  then replayed (None on a CPU, where no budget is probed);
- `first_batch_s`: the first batch of `budget` tokens;
- `run_first_startup_s`, `run_second_startup_s`: `startup_seconds` of two `bulkembed run`s
  of a small corpus with `--dtype auto` (from the command's start to its first batch): the
  first with an empty cache folder, the second after it (the dtype check, the probe and
  the kernel recorded), with their `seconds` in all.

The cache folder (`BULKEMBED_CACHE_DIR`) is a fresh one, so that the first of each pair
decides anew. Used by `gpu_check.py`; on its own, on a model folder:

    python benchmarks/startup.py MODEL_FOLDER --recipe bge-m3 [--device cuda:0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_IMPORT = (
    "import time; started = time.perf_counter(); import torch; "
    "from transformers import AutoModel; print(time.perf_counter() - started)"
)


def _timed(step: Callable[[], Any], device: str) -> tuple[Any, float]:
    """What `step` returns and its seconds, the device's queue drained after it."""
    import torch

    started = time.perf_counter()
    found = step()
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return found, round(time.perf_counter() - started, 3)


def _loaded(spec: Any, device: str, dtype: Any) -> dict[str, Any]:
    """The load, flat module and kernel choice steps; the model is let go after."""
    from bulkembed.encoders.backend import load_model
    from bulkembed.encoders.flat import flat_family, flat_module
    from bulkembed.encoders.kernel_choice import AttentionShape, choose_kernel

    found: dict[str, Any] = {}
    loaded, found["load_s"] = _timed(lambda: load_model(spec, device, dtype), device)
    family = flat_family(loaded)
    if isinstance(family, str):
        return found | {"flat_s": None}
    module, found["flat_s"] = _timed(lambda: flat_module(family, loaded), device)
    shape = AttentionShape.of(module, spec.max_length)
    for when in ("first", "recorded"):
        choice, seconds = _timed(lambda: choose_kernel(device, dtype, shape), device)
        found[f"kernel_{when}_s"] = seconds
    return found | {"kernel": choice.describe()}


def _steps(model: Path, recipe: str, device: str, dtype: Any) -> dict[str, Any]:
    """The in-process steps of the module's docstring."""
    import numpy as np

    from bulkembed.config import RunConfig
    from bulkembed.contracts import TokenBatch
    from bulkembed.encoders import build_encoder
    from bulkembed.models.model_spec import resolve_model

    config = RunConfig(inputs=("-",), output="-", model=str(model), recipe=recipe)
    spec = resolve_model(config)
    found = _loaded(spec, device, dtype)
    encoder = build_encoder(spec, device, dtype)
    for when in ("first", "recorded"):
        budget, seconds = _timed(encoder.measure_budget, device)
        found[f"probe_{when}_s"] = seconds if budget is not None else None
    budget = budget or spec.budget
    length = min(spec.max_length, 512)
    lengths = np.full(max(1, budget // length), length, dtype=np.int32)
    batch = TokenBatch(np.full(int(lengths.sum()), 5, dtype=np.int32), lengths)
    _, found["first_batch_s"] = _timed(lambda: encoder.embed_batch(batch), device)
    return found | {"budget": budget}


def _runs(model: Path, recipe: str, device: str, corpus: Path, folder: Path) -> dict[str, Any]:
    """Two `bulkembed run`s of `corpus`, the second after the first (see the docstring)."""
    from bulkembed import embed_corpus
    from bulkembed.config import RunConfig

    found: dict[str, Any] = {}
    for when in ("first", "second"):
        config = RunConfig(
            inputs=(str(corpus),),
            output=str(folder / f"run-{when}"),
            model=str(model),
            recipe=recipe,
            devices=device,
            dtype="auto",
            overwrite=True,
        )
        summary = embed_corpus(config)
        found[f"run_{when}_startup_s"] = summary.startup_seconds
        found[f"run_{when}_s"] = summary.seconds
    found["run_dtype"] = summary.run["dtype"]
    found["run_kernel"] = summary.run["attention_kernel"]
    return found


def measure(model: Path, recipe: str, device: str, dtype: Any, corpus: Path) -> dict[str, Any]:
    """Every step of the module's docstring, in a fresh cache folder."""
    imported = subprocess.run(
        [sys.executable, "-c", _IMPORT], capture_output=True, text=True, check=True
    )
    found: dict[str, Any] = {"import_s": round(float(imported.stdout.split()[-1]), 3)}
    before = os.environ.get("BULKEMBED_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="bulkembed-startup-") as folder:
        os.environ["BULKEMBED_CACHE_DIR"] = str(Path(folder) / "cache")
        try:
            found |= _steps(model, recipe, device, dtype)
            os.environ["BULKEMBED_CACHE_DIR"] = str(Path(folder) / "cache-runs")
            found |= _runs(model, recipe, device, corpus, Path(folder))
        finally:
            if before is None:
                os.environ.pop("BULKEMBED_CACHE_DIR", None)
            else:
                os.environ["BULKEMBED_CACHE_DIR"] = before
    return found


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--recipe", default=None)
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--corpus", type=Path, default=Path("samples/python-docs.jsonl"))
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    found = measure(args.model, args.recipe, args.device, dtype, args.corpus)
    print(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
