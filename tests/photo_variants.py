"""Real photographs in the forms image corpora hold them: JPEG as taken, turned by an EXIF
orientation, with alpha or a transparent palette colour, grey, CMYK, 16-bit, WebP, GIF,
TIFF, BMP, small and very wide. Each variant is written from a photo, once per test."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

# EXIF tag 0x0112: Orientation, 2 to 8 (1 is upright).
ORIENTATION = 0x0112


def _exif(image, path: Path, number: int) -> Path:
    exif = image.getexif()
    exif[ORIENTATION] = 2 + number % 7
    image.save(path.with_suffix(".jpg"), exif=exif, quality=90)
    return path.with_suffix(".jpg")


def _alpha(image, path: Path, number: int) -> Path:
    rgba = image.convert("RGBA")
    alpha = np.linspace(0, 255, rgba.width, dtype=np.uint8)[None, :].repeat(rgba.height, 0)
    rgba.putalpha(_from_array(alpha))
    rgba.save(path.with_suffix(".png"))
    return path.with_suffix(".png")


def _palette(image, path: Path, number: int) -> Path:
    palette = image.convert("P", palette=1, colors=64)
    palette.info["transparency"] = 0
    palette.save(path.with_suffix(".png"), transparency=0)
    return path.with_suffix(".png")


def _grey(image, path: Path, number: int) -> Path:
    image.convert("L").save(path.with_suffix(".jpg"))
    return path.with_suffix(".jpg")


def _cmyk(image, path: Path, number: int) -> Path:
    image.convert("CMYK").save(path.with_suffix(".jpg"))
    return path.with_suffix(".jpg")


def _sixteen_bits(image, path: Path, number: int) -> Path:
    grey = np.asarray(image.convert("L"), dtype=np.uint16) * 257
    _from_array(grey).save(path.with_suffix(".png"))
    return path.with_suffix(".png")


def _webp(image, path: Path, number: int) -> Path:
    image.save(path.with_suffix(".webp"), quality=80)
    return path.with_suffix(".webp")


def _gif(image, path: Path, number: int) -> Path:
    frames = [image, image.transpose(0)]
    frames[0].save(path.with_suffix(".gif"), save_all=True, append_images=frames[1:])
    return path.with_suffix(".gif")


def _tiff_or_bmp(image, path: Path, number: int) -> Path:
    suffix = ".tiff" if number % 2 else ".bmp"
    image.save(path.with_suffix(suffix))
    return path.with_suffix(suffix)


def _small_or_wide(image, path: Path, number: int) -> Path:
    size = (90, 60) if number % 2 else (image.width, max(8, image.height // 6))
    image.resize(size).save(path.with_suffix(".jpg"))
    return path.with_suffix(".jpg")


def _from_array(array: np.ndarray):
    from PIL import Image

    return Image.fromarray(array)


# Photo `number` is written as taken where `number % (len(VARIANTS) + 1)` is 0, else in
# that variant.
VARIANTS: list[Callable] = [
    _exif,
    _alpha,
    _palette,
    _grey,
    _cmyk,
    _sixteen_bits,
    _webp,
    _gif,
    _tiff_or_bmp,
    _small_or_wide,
]


def photo_folder(photos: list[Path], folder: Path, count: int) -> list[Path]:
    """`count` photos written into `folder` (made), in their variants (`VARIANTS`); their
    paths, in order."""
    import shutil

    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for number, photo in enumerate(photos[:count]):
        target = folder / f"{number:04d}{photo.suffix}"
        shutil.copyfile(photo, target)
        kind = number % (len(VARIANTS) + 1)
        if kind:
            with Image.open(target) as image:
                image.load()
                made = VARIANTS[kind - 1](image, folder / f"{number:04d}", number)
            if made != target:
                target.unlink()
            target = made
        written.append(target)
    return written
