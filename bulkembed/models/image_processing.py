"""A model's image preprocessing, as its Hugging Face image processor does it with PIL.

Decoding, resizing and cropping run on CPU worker processes and give uint8 pixels
[height, width, 3]; rescaling and normalizing run on the device, from a table of the 256
values each channel can take (`ImageProcessing.table`), computed as the processor computes
them (a float64 product cast to float32, then float32 arithmetic): the device's pixel
values are the processor's, bit for bit. The steps, in the processor's order:

1. open the image, its first frame, turned upright by its EXIF orientation (as
   `transformers.image_utils.load_image` and the `datasets` `Image` feature do);
2. RGB: an image with an alpha band or a transparent colour is composited onto white, any
   other mode converted (`convert_to_rgb`);
3. resize with PIL's filter of the processor (`resample`): the shortest edge to a size,
   keeping the aspect ratio (CLIP), or to an exact height and width (SigLIP);
4. center crop (CLIP), padding with zeros an image smaller than the crop.
"""

from __future__ import annotations

import io
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from bulkembed.config import DEFAULT_MAX_IMAGE_PIXELS
from bulkembed.errors import ModelError

# Pillow's limit is a global of its module: it is lifted for one decoding at a time.
_PILLOW_LIMIT = threading.Lock()

# Each processor's defaults, for what its preprocessor_config.json leaves out.
_OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
_DEFAULTS: dict[str, dict[str, Any]] = {
    "CLIPImageProcessor": {
        "size": {"shortest_edge": 224},
        "crop_size": {"height": 224, "width": 224},
        "do_center_crop": True,
        "resample": 3,
        "image_mean": _OPENAI_MEAN,
        "image_std": _OPENAI_STD,
    },
    "SiglipImageProcessor": {
        "size": {"height": 224, "width": 224},
        "do_center_crop": False,
        "resample": 3,
        "image_mean": (0.5, 0.5, 0.5),
        "image_std": (0.5, 0.5, 0.5),
    },
}


class BadImage(ValueError):
    """An image that cannot be embedded, with the reason a quarantine record gives."""


@dataclass(frozen=True, slots=True)
class ImageProcessing:
    """What a model's image processor does to an image, and how many tokens an image is to
    the model (its patches, and a class token where the model has one): a batch of images
    costs that many tokens each against the token budget.

    `resize` is `shortest_edge` (the short side to `size[0]`) or `exact` (to `size`,
    height and width); `crop` the center crop's height and width (None: none)."""

    resize: str
    size: tuple[int, int]
    crop: tuple[int, int] | None
    resample: int
    rescale: float | None
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None
    tokens: int

    @property
    def shape(self) -> tuple[int, int]:
        """Height and width of the pixels that reach the model."""
        return self.crop if self.crop is not None else self.size

    @classmethod
    def of(cls, processor: dict[str, Any], vision: dict[str, Any], kind: str) -> ImageProcessing:
        """The preprocessing of a `preprocessor_config.json` (`processor`), for a vision
        tower configured by `vision` (its `image_size`, `patch_size`) of `kind` (`clip`:
        one class token before the patches; `siglip`: the patches alone)."""
        name = str(processor.get("image_processor_type", "")).removesuffix("Fast")
        name = name.removesuffix("Pil")
        if name not in _DEFAULTS:
            known = ", ".join(_DEFAULTS)
            raise ModelError(
                f"image processor '{name or 'none'}' is not supported (known: {known})"
            )
        settings = _DEFAULTS[name] | {k: v for k, v in processor.items() if v is not None}
        if not settings.get("do_convert_rgb", True):
            raise ModelError("an image processor that does not convert to RGB is not supported")
        resize, size = _size(settings["size"], shortest=name == "CLIPImageProcessor")
        crop = _hw(settings["crop_size"]) if settings.get("do_center_crop") else None
        shape = crop if crop is not None else size
        if resize == "shortest_edge" and crop is None:
            raise ModelError(
                "a shortest-edge resize without a center crop gives images of any size"
            )
        if not settings.get("do_resize", True):
            raise ModelError("an image processor that does not resize is not supported")
        # The vision configs' own defaults: CLIP's patches are 32 pixels, SigLIP's 16.
        patch = int(vision.get("patch_size", 32 if kind == "clip" else 16))
        patches = (shape[0] // patch) * (shape[1] // patch)
        return cls(
            resize=resize,
            size=size,
            crop=crop,
            resample=int(settings["resample"]),
            rescale=float(settings.get("rescale_factor", 1 / 255))
            if settings.get("do_rescale", True)
            else None,
            mean=_channels(settings["image_mean"]) if settings.get("do_normalize", True) else None,
            std=_channels(settings["image_std"]) if settings.get("do_normalize", True) else None,
            tokens=patches + (kind == "clip"),
        )

    def table(self) -> np.ndarray:
        """[3, 256] float32: the value of each uint8 of each channel after rescaling and
        normalizing, computed as the processor computes it."""
        values = np.arange(256, dtype=np.uint8)[None, :].repeat(3, axis=0)
        scaled = values.astype(np.float32)
        if self.rescale is not None:
            scaled = (values.astype(np.float64) * self.rescale).astype(np.float32)
        if self.mean is not None and self.std is not None:
            mean = np.array(self.mean, dtype=np.float32)[:, None]
            std = np.array(self.std, dtype=np.float32)[:, None]
            scaled = (scaled - mean) / std
        return np.ascontiguousarray(scaled, dtype=np.float32)

    def pixels(self, data: bytes, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> np.ndarray:
        """An image file's bytes, decoded, upright, RGB, resized and cropped: uint8
        [height, width, 3]. A `BadImage` says why an image cannot be: not an image,
        truncated, more than `max_pixels` pixels."""
        from PIL import Image

        if not data:
            raise BadImage("the image is empty (0 bytes)")
        with _PILLOW_LIMIT:
            limit = Image.MAX_IMAGE_PIXELS
            # The limit is this function's own: Pillow's warns, or fails at twice it.
            Image.MAX_IMAGE_PIXELS = None
            try:
                return self._pixels(data, max_pixels)
            finally:
                Image.MAX_IMAGE_PIXELS = limit

    def _pixels(self, data: bytes, max_pixels: int) -> np.ndarray:
        from PIL import Image, ImageOps, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as opened:
                width, height = opened.size
                if width * height > max_pixels:
                    raise BadImage(
                        f"the image has {width}x{height} pixels, more than the limit of "
                        f"{max_pixels} (--max-image-pixels)"
                    )
                upright = ImageOps.exif_transpose(opened)
                rgb = _rgb(upright)
            return self.prepared(rgb)
        except BadImage:
            raise
        except UnidentifiedImageError:
            raise BadImage("not an image of a format Pillow reads") from None
        except (OSError, SyntaxError, ValueError) as e:
            raise BadImage(f"cannot decode the image: {e}") from None
        except Exception as e:  # noqa: BLE001 (a user's bytes: any failure of Pillow's is theirs)
            raise BadImage(f"cannot decode the image: {type(e).__name__}: {e}") from None

    def prepared(self, image: Any) -> np.ndarray:
        """A PIL image as it is (no EXIF turn: the processor, given an image, makes
        none), in RGB, resized and cropped: uint8 [height, width, 3]."""
        try:
            rgb = _rgb(image) if image.mode != "RGB" else image
            size = self._resized_size(rgb.height, rgb.width)
            array = np.asarray(rgb.resize(size, resample=self.resample), dtype=np.uint8)
        except Exception as e:  # noqa: BLE001 (a user's image: any failure of Pillow's is theirs)
            raise BadImage(f"cannot convert the image: {type(e).__name__}: {e}") from None
        if self.crop is not None:
            array = _center_crop(array, self.crop)
        return np.ascontiguousarray(array)

    def _resized_size(self, height: int, width: int) -> tuple[int, int]:
        """PIL's (width, height) of the resized image."""
        if self.resize == "exact":
            return self.size[1], self.size[0]
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.size[0], int(self.size[0] * long / short)
        return (new_short, new_long) if width <= height else (new_long, new_short)


def _rgb(image: Any) -> Any:
    """`image` in RGB: composited onto white where it has an alpha band or a transparent
    colour, else converted."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _center_crop(array: np.ndarray, crop: tuple[int, int]) -> np.ndarray:
    """The center `crop` (height, width) of an [height, width, 3] array, zero-padded where
    the array is smaller."""
    height, width = array.shape[:2]
    top, left = (height - crop[0]) // 2, (width - crop[1]) // 2
    if top >= 0 and left >= 0:
        return array[top : top + crop[0], left : left + crop[1]]
    padded_height, padded_width = max(crop[0], height), max(crop[1], width)
    padded = np.zeros((padded_height, padded_width, 3), dtype=array.dtype)
    top_pad = math.ceil((padded_height - height) / 2)
    left_pad = math.ceil((padded_width - width) / 2)
    padded[top_pad : top_pad + height, left_pad : left_pad + width] = array
    top, left = (padded_height - crop[0]) // 2, (padded_width - crop[1]) // 2
    return padded[top : top + crop[0], left : left + crop[1]]


def _channels(value: Any) -> tuple[float, float, float]:
    """A mean or a standard deviation per channel: one number stands for all three."""
    if isinstance(value, (int, float)):
        return float(value), float(value), float(value)
    first, second, third = (float(v) for v in value)
    return first, second, third


def _hw(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    return int(value["height"]), int(value["width"])


def _size(value: Any, shortest: bool) -> tuple[str, tuple[int, int]]:
    """The resize rule and size of a processor's `size` (an int: the shortest edge for a
    CLIP processor, a square for the others)."""
    if isinstance(value, int):
        return ("shortest_edge", (value, value)) if shortest else ("exact", (value, value))
    if "shortest_edge" in value:
        edge = int(value["shortest_edge"])
        return "shortest_edge", (edge, edge)
    return "exact", _hw(value)
