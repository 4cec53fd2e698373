"""The image tower of a two-tower model (CLIP, SigLIP), and its OpenVINO conversion.

`TwoTowers` is what a `ClipEncoder` runs: the transformers model, whose text tower runs in
PyTorch (queries: a few texts at a time), and its image tower (a run's images), run by
PyTorch or, on a CPU, by OpenVINO: `get_image_features` traced on pixel values of the
model's image size, with a dynamic batch, saved in the export cache (`cached_graph`) and
compiled in the run's precision. On an AMD EPYC (2 cores, AVX512-BF16), CLIP ViT-B/32's
image tower on batches of 64 images ran at 21.0 images/s in OpenVINO float32 against 13.2
in PyTorch, and at 42.6 in OpenVINO bfloat16 against 32.9 under PyTorch's autocast.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from bulkembed.encoders.openvino import cached_graph, compiled_for_cpu, converted_graph

if TYPE_CHECKING:
    from bulkembed.models.model_spec import ModelSpec


class TwoTowers:
    """A two-tower transformers `model` and what runs its image tower (`images`; None:
    the model itself, in PyTorch)."""

    def __init__(self, model: Any, images: OpenVINOImageTower | None = None) -> None:
        self.model = model
        self.images = images

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[images, D]: the image tower's output, projected where the model projects."""
        if self.images is not None:
            return self.images(pixel_values)
        return _features(self.model.get_image_features(pixel_values=pixel_values))

    def text_features(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """[texts, D]: the text tower's output, projected where the model projects."""
        found = self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
        return _features(found)

    def in_dtype(self, dtype: torch.dtype) -> TwoTowers:
        """The same towers, the OpenVINO image tower compiled to compute in `dtype`."""
        images = None if self.images is None else self.images.in_dtype(dtype)
        return TwoTowers(self.model, images)


class _ImageFeatures(torch.nn.Module):
    """`get_image_features` as a module of pixel values alone: what is traced."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return _features(self.model.get_image_features(pixel_values=pixel_values))


class OpenVINOImageTower:
    """The image tower's graph compiled for the CPU in one precision: float32 pixel values
    [images, 3, height, width] in, float32 features [images, D] out."""

    def __init__(self, graph: Any, dtype: torch.dtype, threads: int) -> None:
        self.graph = graph
        self.threads = threads
        self.request = compiled_for_cpu(graph, dtype, threads).create_infer_request()

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        values = pixel_values.float().contiguous().numpy()
        found = self.request.infer({0: values}, share_inputs=True)[0]
        return torch.from_numpy(found.copy())

    def in_dtype(self, dtype: torch.dtype) -> OpenVINOImageTower:
        return OpenVINOImageTower(self.graph, dtype, self.threads)


def openvino_image_tower(
    spec: ModelSpec, model: Any, dtype: torch.dtype, threads: int, tell: Callable[[str], None]
) -> OpenVINOImageTower:
    """The image tower of `model` (float32, on the CPU) converted by OpenVINO into the
    export cache unless a valid conversion is there, compiled in `dtype`."""
    from bulkembed.encoders.openvino_import import import_openvino

    ov = import_openvino()

    assert spec.image is not None, "a two-tower model's spec has its image preprocessing"
    height, width = spec.image.shape

    def build(into: Path) -> None:
        example = torch.zeros(2, 3, height, width)
        shapes = [("pixel_values", [-1, 3, height, width], ov.Type.f32)]
        graph = converted_graph(spec.source, _ImageFeatures(model), example, shapes)
        ov.save_model(graph, into / "model.xml", compress_to_fp16=False)

    return OpenVINOImageTower(cached_graph(spec, "image-tower", build, tell), dtype, threads)


def _features(found: Any) -> torch.Tensor:
    """The features `get_image_features` or `get_text_features` return: a tensor (before
    transformers 5) or an output whose `pooler_output` holds them."""
    return found if isinstance(found, torch.Tensor) else found.pooler_output
