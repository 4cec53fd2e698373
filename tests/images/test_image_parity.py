"""Images through the real run against the references: the processor's pixel values and
the towers' `get_image_features` / `get_text_features`, on 220 real photographs in every
form `photo_variants` writes."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import cosines, read_output, run_cli
from photo_variants import photo_folder

PHOTOS = 220


@pytest.fixture(scope="module")
def photo_files(photos, tmp_path_factory):
    return photo_folder(photos, tmp_path_factory.mktemp("photos"), PHOTOS)


def _reference_processor(model):
    from transformers import AutoConfig, CLIPImageProcessorPil, SiglipImageProcessorPil

    kind = AutoConfig.from_pretrained(model).model_type
    return (CLIPImageProcessorPil if kind == "clip" else SiglipImageProcessorPil).from_pretrained(
        model
    )


def _opened(path):
    """An image as a user hands it to the processor: opened, turned upright."""
    from PIL import Image, ImageOps

    with Image.open(path) as image:
        return ImageOps.exif_transpose(image)


@pytest.mark.parametrize("model", ["tiny_clip", "tiny_siglip"])
def test_preprocessing_gives_the_processors_pixel_values(model, photo_files, request):
    from bulkembed.config import RunConfig
    from bulkembed.models.model_spec import resolve_model

    folder = request.getfixturevalue(model)
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(folder)))
    assert spec.image is not None
    processor = _reference_processor(folder)
    table = spec.image.table()
    worst = 0.0
    for path in photo_files:
        pixels = spec.image.pixels(path.read_bytes())
        mine = table[np.arange(3), pixels.astype(np.int64)].transpose(2, 0, 1)
        expected = processor(images=[_opened(path)], return_tensors="np")["pixel_values"][0]
        assert mine.shape == expected.shape, path.name
        worst = max(worst, float(np.abs(mine - expected).max()))
    assert worst <= 1e-6


@pytest.mark.parametrize("model", ["tiny_clip", "tiny_siglip"])
def test_image_vectors_of_a_run_are_the_image_towers(model, photo_files, tmp_path, request):
    import torch
    from transformers import AutoModel

    folder = request.getfixturevalue(model)
    out = tmp_path / "out"
    result = run_cli(photo_files[0].parent, folder, out, "--dtype", "float32", workers=2)
    assert result.exit_code == 0, result.output
    by_id = read_output(out)
    assert sorted(by_id) == sorted(p.name for p in photo_files)
    found = np.array([by_id[p.name] for p in photo_files], dtype=np.float32)

    reference = AutoModel.from_pretrained(folder).eval()
    processor = _reference_processor(folder)
    expected = []
    for start in range(0, len(photo_files), 32):
        images = [_opened(p) for p in photo_files[start : start + 32]]
        values = processor(images=images, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            expected.append(reference.get_image_features(pixel_values=values).pooler_output)
    expected_vectors = torch.nn.functional.normalize(torch.cat(expected), dim=1).numpy()
    assert cosines(found, expected_vectors).min() >= 0.9999
    assert np.allclose(np.linalg.norm(found, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("model", ["tiny_clip", "tiny_siglip"])
def test_text_vectors_are_the_text_towers(model, request):
    import torch
    from helpers import sample_texts
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    import bulkembed

    folder = request.getfixturevalue(model)
    texts = ["a red bicycle", "two dogs in the snow", *sample_texts(30)]
    found = np.array(bulkembed.load(str(folder)).embed_documents(texts), dtype=np.float32)

    tokenizer = AutoTokenizer.from_pretrained(folder)
    siglip = AutoConfig.from_pretrained(folder).model_type == "siglip"
    # SigLIP reads its texts padded to their full length, without a mask, as its card says.
    padding = "max_length" if siglip else True
    inputs = tokenizer(texts, truncation=True, max_length=64 if siglip else 77, padding=padding)
    inputs = {k: torch.tensor(v) for k, v in inputs.items() if k == "input_ids" or not siglip}
    inputs.pop("token_type_ids", None)
    with torch.no_grad():
        expected = AutoModel.from_pretrained(folder).eval().get_text_features(**inputs)
    expected_vectors = torch.nn.functional.normalize(expected.pooler_output, dim=1).numpy()
    assert cosines(found, expected_vectors).min() >= 0.9999
