"""Turn `--model` (a recipe name, a hub id or a local folder) into a `ModelSpec`.

Settings are taken, first found wins, from: the command line, the recipe, the model's
sentence-transformers files (`modules.json`, `1_Pooling/config.json`,
`sentence_bert_config.json`, `config_sentence_transformers.json`), the tokenizer and the
model config.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulkembed.config import DEFAULT_MAX_BATCH_TOKENS, ModelSettings, Pooling, RunConfig
from bulkembed.errors import ModelError, UsageError
from bulkembed.models.model_files import (
    BGE_M3_HEAD_FILES,
    find_model_config,
    is_local,
    model_file,
    model_version,
    read_json,
)
from bulkembed.models.recipes import (
    Recipe,
    find_recipe,
    list_recipes,
    load_recipe_file,
    recipe_reference,
)
from bulkembed.models.st_folder import SentenceTransformersInfo, read_sentence_transformers_info
from bulkembed.models.tokenizer_facts import TokenizerFacts, tokenizer_facts

if TYPE_CHECKING:
    from bulkembed.models.image_processing import ImageProcessing

# What each family of encoder can produce; with no `--outputs`, all of it.
FAMILY_OUTPUTS = {
    "dense": ("dense",),
    "bge-m3": ("dense", "sparse", "multivector"),
    "splade": ("sparse",),
    "colbert": ("multivector",),
    "clip": ("dense",),
}
# Architectures (config.json `model_type`) of two towers, images and texts into one space.
TWO_TOWERS = {"clip": "clip", "siglip": "siglip"}


@dataclass(frozen=True)
class ModelSpec:
    """A model with every setting bulkembed needs to tokenize and embed with it."""

    source: str
    local: bool
    revision: str | None
    version: str
    recipe: str | None
    family: str
    outputs: tuple[str, ...]
    pooling: Pooling | None
    normalize: bool
    max_length: int
    prompt: str
    lowercase: bool
    pad_token_id: int
    special_token_ids: tuple[int, ...]
    prefix_token_id: int | None
    skip_token_ids: tuple[int, ...]
    projection: str | None
    dense_dim: int | None
    dims: tuple[int, ...]
    matryoshka_layer_norm: bool
    budget: int
    sparse_top_k: int | None
    tokenizer_json: str
    compile: bool = False
    # The int8 dtype the run tries (`int8-weights`, `int8`; `encoders.int8.int8_mode`), set
    # when the run is planned: None, it computes in a float dtype.
    int8: str | None = None
    # Whether the budget was given (option, environment, `embed()`), not taken
    # from the recipe or the default: flat batches on CUDA probe a larger budget only
    # where it was not (`encoders.registry.tunes_budget`).
    budget_given: bool = False
    # `--max-batch-tokens auto`: each device probes the budget that fills its memory.
    probe_budget: bool = False
    # `--backend` and `--attention`, and the architecture they depend on (config.json
    # `model_type`).
    backend: str = "auto"
    attention: str = "auto"
    model_type: str | None = None
    # What multi-vector rows are stored as (`--dtype-out`): the cast happens on the device.
    multivector_dtype: str = "float32"
    # The prompt of documents when none is asked for (the recipe's corpus prompt, or the
    # model's default one), and the model's prompt named `query` (None: it has none).
    document_prompt: str = ""
    query_prompt: str | None = None
    # A two-tower model's image preprocessing (None: the model reads texts only).
    image: ImageProcessing | None = None


def _family(
    config: RunConfig,
    recipe: Recipe | None,
    st: SentenceTransformersInfo,
    source: str,
    revision: str | None,
) -> str:
    """The encoder family: from the recipe, else from what the model folder holds."""
    if recipe is not None:
        return recipe.family
    model_type = (read_json(model_file(source, revision, "config.json")) or {}).get("model_type")
    if model_type in TWO_TOWERS:
        return "clip"
    if st.splade:
        return "splade"
    if st.colbert is not None:
        return "colbert"
    if all(model_file(source, revision, name) for name in BGE_M3_HEAD_FILES):
        return "bge-m3"
    architectures = (read_json(model_file(source, revision, "config.json")) or {}).get(
        "architectures"
    ) or []
    if config.model.outputs == ("sparse",) and any(
        a.endswith("ForMaskedLM") for a in architectures
    ):
        return "splade"
    return "dense"


def _outputs(config: RunConfig, recipe: Recipe | None, family: str) -> tuple[str, ...]:
    possible = FAMILY_OUTPUTS.get(family)
    if possible is None:
        return config.model.outputs or (recipe.outputs if recipe else ("dense",))
    wanted = config.model.outputs or (recipe.outputs if recipe else possible)
    missing = [name for name in wanted if name not in possible]
    if missing:
        raise UsageError(
            f"--outputs {','.join(missing)}: a {family} model produces only {', '.join(possible)}"
        )
    return tuple(name for name in possible if name in wanted)


def _pick_recipe(config: RunConfig) -> tuple[Recipe | None, str]:
    """The recipe in force and the model source (hub id or folder) to load weights from."""
    if config.model.recipe is not None:
        return find_recipe(config.model.recipe) or _recipe_from_path(
            config.model.recipe
        ), config.model.name
    named = find_recipe(config.model.name) or _recipe_for_hub_id(config.model.name)
    if named is not None:
        return named, named.model
    if config.model.name.endswith((".yaml", ".yml")) and Path(config.model.name).is_file():
        recipe = load_recipe_file(Path(config.model.name))
        return recipe, recipe.model
    return None, config.model.name


def _recipe_for_hub_id(model: str) -> Recipe | None:
    """The bundled recipe of a hub id, so `--model BAAI/bge-m3` gets the bge-m3 settings."""
    if is_local(model):
        return None
    return next((r for r in list_recipes() if r.model == model), None)


def _recipe_from_path(name: str) -> Recipe:
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return load_recipe_file(path)
    raise UsageError(f"unknown recipe '{name}': see `bulkembed recipes` for the bundled ones")


def _prompt(model: ModelSettings, recipe: Recipe | None, st: SentenceTransformersInfo) -> str:
    prompts = {**(st.prompts or {}), **(recipe.prompts if recipe else {})}
    if model.prompt is not None:
        return model.prompt
    name = model.prompt_name
    if name is None:
        name = recipe.corpus_prompt if recipe and recipe.corpus_prompt else st.default_prompt_name
    if name is None:
        return ""
    if name not in prompts:
        known = ", ".join(sorted(prompts)) or "none"
        raise UsageError(f"unknown prompt name '{name}' for this model (known: {known})")
    return prompts[name]


def _query_prompt(recipe: Recipe | None, st: SentenceTransformersInfo) -> str | None:
    """The prompt named `query` by the recipe or the model's own settings, if any."""
    prompts = {**(st.prompts or {}), **(recipe.prompts if recipe else {})}
    return prompts.get("query")


# Architectures whose position ids start after the padding index (transformers'
# `create_position_ids_from_input_ids`): two positions fewer than the table holds.
_POSITIONS_AFTER_PADDING = frozenset(
    {
        "roberta",
        "xlm-roberta",
        "xlm-roberta-xl",
        "camembert",
        "mpnet",
        "roberta-prelayernorm",
        "data2vec-text",
        "xmod",
        "longformer",
        "ibert",
        "luke",
    }
)


def _position_limit(model_config: dict[str, Any]) -> int | None:
    """Longest input the model's position embeddings take, in tokens, if it has them."""
    positions = model_config.get("max_position_embeddings")
    if positions is None:
        return None
    # RoBERTa-style position ids start after the padding index.
    if model_config.get("model_type") in _POSITIONS_AFTER_PADDING:
        positions -= (model_config.get("pad_token_id") or 1) + 1
    return int(positions)


def _max_length(
    config: RunConfig,
    recipe: Recipe | None,
    st: SentenceTransformersInfo,
    facts: TokenizerFacts,
    positions: int | None,
) -> int:
    """The longest input in tokens: the option, else the recipe's, the ColBERT document
    length, sentence-transformers' or the tokenizer's, held to the model's `positions`."""
    limit = facts.model_max_length if facts.model_max_length is not None else positions
    if config.model.max_length is not None:
        # Past its position embeddings a model cannot go; a tokenizer's own limit is where
        # the model has no such table (a length that a recipe may take past it is allowed).
        hard = positions if positions is not None else limit
        if hard is not None and config.model.max_length > hard:
            raise UsageError(
                f"--max-length {config.model.max_length} exceeds the model's limit of {hard} tokens"
            )
        return config.model.max_length
    document_length = st.colbert.document_length if st.colbert else None
    for candidate in (recipe.max_length if recipe else None, document_length, st.max_length, limit):
        if candidate is not None:
            # A recipe written for the published weights, applied to a model with fewer
            # positions (a smaller variant, a fine-tune), is held to what that model takes.
            return int(candidate) if positions is None else min(int(candidate), positions)
    raise ModelError("the model does not say how long its inputs may be: pass --max-length")


def _pooling(
    config: RunConfig,
    recipe: Recipe | None,
    st: SentenceTransformersInfo,
    family: str,
    source: str,
) -> tuple[Pooling | None, bool]:
    """How a model of `family` pools its token vectors, and whether it normalizes: the
    options, else the recipe, else the sentence-transformers folder."""
    if family != "dense" and (
        config.model.pooling is not None
        or (config.model.normalize is not None and family != "clip")
    ):
        raise UsageError(
            f"--pooling and --normalize apply to dense models; a {family} model has its own"
        )
    pooling = config.model.pooling or (recipe.pooling if recipe else None) or st.pooling
    if family == "bge-m3":
        pooling = Pooling.CLS
    if family == "clip":
        # Each tower pools as it was trained; the vectors are compared normalized.
        return None, config.model.normalize is not False and (
            recipe is None or recipe.normalize is not False
        )
    if pooling is None and family == "dense":
        raise ModelError(
            f"no pooling is known for {source}: pass --pooling cls|mean|last-token or --recipe NAME"
        )
    normalize = config.model.normalize
    for candidate in (recipe.normalize if recipe else None, st.normalize, False):
        if normalize is None:
            normalize = candidate
    # BGE-M3 and ColBERT vectors are always normalized; SPLADE weights never are.
    return pooling, family in ("bge-m3", "colbert") or (family == "dense" and bool(normalize))


def resolve_model(config: RunConfig) -> ModelSpec:
    """Find the model, read its settings and tokenizer, and merge them with the options."""
    recipe, source = _pick_recipe(config)
    if is_local(source):
        source = str(Path(source).expanduser().resolve())
    revision = config.model.revision or (recipe.revision if recipe else None)
    config_file = find_model_config(source, revision, recipe.name if recipe else None)
    st = read_sentence_transformers_info(source, revision)
    model_config = read_json(config_file) or {}

    family = _family(config, recipe, st, source, revision)
    if family == "colbert" and st.colbert is None:
        raise ModelError(
            f"{source} is not a ColBERT model in the PyLate layout (modules.json with a "
            "Dense module, document_prefix in config_sentence_transformers.json)"
        )
    pooling, normalize = _pooling(config, recipe, st, family, source)
    outputs = _outputs(config, recipe, family)
    version = model_version(source, revision, config_file)
    tokenizer = tokenizer_facts(source, revision, version, st)
    image = _image_processing(source, revision, model_config) if family == "clip" else None
    text_config = model_config.get("text_config") or {}

    return ModelSpec(
        source=source,
        local=is_local(source),
        revision=revision,
        version=version,
        recipe=recipe_reference(recipe) if recipe else None,
        family=family,
        outputs=outputs,
        pooling=pooling if family != "splade" else None,
        normalize=normalize,
        max_length=_max_length(
            config, recipe, st, tokenizer, _position_limit(text_config or model_config)
        ),
        prompt=_prompt(config.model, recipe, st),
        lowercase=st.lowercase,
        pad_token_id=tokenizer.pad_token_id,
        special_token_ids=tokenizer.special_token_ids,
        prefix_token_id=tokenizer.prefix_token_id,
        skip_token_ids=tokenizer.skip_token_ids,
        projection=st.colbert.projection if st.colbert else None,
        dense_dim=_dense_dim(model_config) if "dense" in outputs else None,
        dims=recipe.dims if recipe else (),
        matryoshka_layer_norm=bool(recipe and recipe.matryoshka_layer_norm),
        sparse_top_k=config.model.sparse_top_k,
        budget=config.batching.max_batch_tokens
        or (recipe.max_batch_tokens if recipe else None)
        or DEFAULT_MAX_BATCH_TOKENS,
        budget_given=config.batching.max_batch_tokens is not None,
        probe_budget=config.batching.probe_budget,
        tokenizer_json=tokenizer.tokenizer_json,
        compile=bool(config.batching.compile),
        backend=config.batching.backend.value,
        attention=config.batching.attention.value,
        model_type=model_config.get("model_type"),
        multivector_dtype=config.model.dtype_out.value,
        document_prompt=_prompt(replace(config.model, prompt=None, prompt_name=None), recipe, st),
        query_prompt=_query_prompt(recipe, st),
        image=image,
    )


def _dense_dim(model_config: dict[str, Any]) -> int | None:
    """The size of the dense vectors: a two-tower model's projection (CLIP) or its image
    tower's width (SigLIP), else the transformer's width."""
    if model_config.get("model_type") in TWO_TOWERS:
        vision = model_config.get("vision_config") or {}
        width = model_config.get("projection_dim") or vision.get("hidden_size")
        return None if width is None else int(width)
    width = model_config.get("hidden_size")
    return None if width is None else int(width)


def _image_processing(
    source: str, revision: str | None, model_config: dict[str, Any]
) -> ImageProcessing:
    """A two-tower model's image preprocessing, from its `preprocessor_config.json`."""
    from bulkembed.models.image_processing import ImageProcessing

    processor = read_json(model_file(source, revision, "preprocessor_config.json"))
    if processor is None:
        raise ModelError(f"{source} has no preprocessor_config.json: how its images are prepared")
    kind = TWO_TOWERS[model_config["model_type"]]
    return ImageProcessing.of(processor, model_config.get("vision_config") or {}, kind)
