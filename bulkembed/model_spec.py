"""Turn `--model` (a recipe name, a hub id or a local folder) into a `ModelSpec`.

Settings are taken, first found wins, from: the command line, the recipe, the model's
sentence-transformers files (`modules.json`, `1_Pooling/config.json`,
`sentence_bert_config.json`, `config_sentence_transformers.json`), the tokenizer and the
model config.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bulkembed.config import (
    DEFAULT_MAX_BATCH_TOKENS,
    Pooling,
    Recipe,
    RunConfig,
    find_recipe,
    load_recipe_file,
)
from bulkembed.errors import ModelError

_ST_POOLING_KEYS = {
    "pooling_mode_cls_token": Pooling.CLS,
    "pooling_mode_mean_tokens": Pooling.MEAN,
    "pooling_mode_lasttoken": Pooling.LAST_TOKEN,
}
_ST_POOLING_NAMES = {"cls": Pooling.CLS, "mean": Pooling.MEAN, "lasttoken": Pooling.LAST_TOKEN}
_ST_SUPPORTED_MODULES = {"Transformer", "Pooling", "Normalize", "MLMTransformer", "SpladePooling"}
# What each family of encoder can produce; with no `--outputs`, all of it.
FAMILY_OUTPUTS = {
    "dense": ("dense",),
    "bge-m3": ("dense", "sparse", "multivector"),
    "splade": ("sparse",),
}
# Tokenizers report "no limit" as a huge sentinel number.
_NO_LIMIT = 1_000_000
_DIGEST_SPAN = 1 << 20


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
    dims: tuple[int, ...]
    max_batch_tokens: int
    sparse_top_k: int | None
    tokenizer_json: str


@dataclass(frozen=True)
class _SentenceTransformersInfo:
    pooling: Pooling | None = None
    normalize: bool | None = None
    max_length: int | None = None
    lowercase: bool = False
    prompts: dict[str, str] | None = None
    default_prompt_name: str | None = None
    splade: bool = False


def _is_local(source: str) -> bool:
    return Path(source).expanduser().is_dir()


def model_file(source: str, revision: str | None, filename: str) -> Path | None:
    """A model file from its folder or the Hugging Face Hub (or its cache); None if absent."""
    if _is_local(source):
        path = Path(source).expanduser() / filename
        return path if path.is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RemoteEntryNotFoundError

    try:
        return Path(hf_hub_download(source, filename, revision=revision))
    except RemoteEntryNotFoundError:
        return None
    except LocalEntryNotFoundError:
        # Offline, and the file was never cached: optional files are then taken as absent;
        # `_find_model_config` has already failed if the model itself is not cached.
        if filename == "config.json":
            raise
        return None


def _model_version(source: str, revision: str | None, config_file: Path) -> str:
    """What identifies these exact weights: the hub commit, or a digest of the local folder.

    The folder digest covers every file's name and size and, for each, the first and last
    MiB of its content, so retrained weights of the same shape are told apart without
    reading gigabytes at every start. Hidden files and READMEs do not count."""
    if not _is_local(source):
        if config_file.parent.parent.name == "snapshots":
            return config_file.parent.name
        return revision or "main"
    digest = hashlib.sha256()
    folder = Path(source)
    files = [
        p
        for p in folder.rglob("*")
        if p.is_file()
        and not p.name.upper().startswith("README")
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]
    for path in sorted(files):
        size = path.stat().st_size
        digest.update(f"{path.relative_to(folder)}\0{size}\0".encode())
        with open(path, "rb") as f:
            digest.update(f.read(_DIGEST_SPAN))
            if size > _DIGEST_SPAN:
                f.seek(max(_DIGEST_SPAN, size - _DIGEST_SPAN))
                digest.update(f.read(_DIGEST_SPAN))
    return f"sha256:{digest.hexdigest()[:16]}"


def _read_json(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"cannot read {path}: {e}") from e


def _find_model_config(source: str, revision: str | None) -> Path:
    """The model's config.json; a clear error when the model cannot be found."""
    if _is_local(source):
        found = model_file(source, revision, "config.json")
        if found is None:
            raise ModelError(
                f"model folder {source} has no config.json: is it a transformers model?"
            )
        return found
    if Path(source).expanduser().exists():
        raise ModelError(f"--model {source} is a file; pass a model folder, a hub id or a recipe")
    try:
        found = model_file(source, revision, "config.json")
    except (OSError, ValueError) as e:
        raise ModelError(
            f"unknown model '{source}': not a bundled recipe (see `bulkembed recipes`), "
            f"not a local folder, and not found on the Hugging Face Hub or in its cache "
            f"({type(e).__name__})"
        ) from e
    if found is None:
        raise ModelError(f"model {source} on the Hugging Face Hub has no config.json")
    return found


def _pooling_from_st_config(config: dict[str, Any], where: str) -> Pooling:
    if config.get("include_prompt") is False:
        raise ModelError(f"{where}: pooling that excludes the prompt is not supported")
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        if mode not in _ST_POOLING_NAMES:
            raise ModelError(
                f"{where}: pooling mode {mode!r} is not supported (cls, mean, lasttoken)"
            )
        return _ST_POOLING_NAMES[mode]
    active = [key for key, value in config.items() if key.startswith("pooling_mode") and value]
    if len(active) != 1 or active[0] not in _ST_POOLING_KEYS:
        raise ModelError(
            f"{where}: pooling {active} is not supported (one of cls, mean, lasttoken)"
        )
    return _ST_POOLING_KEYS[active[0]]


def _sentence_transformers_info(source: str, revision: str | None) -> _SentenceTransformersInfo:
    modules = _read_json(model_file(source, revision, "modules.json"))
    if modules is None:
        return _SentenceTransformersInfo()
    pooling = None
    normalize = False
    for module in modules:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind not in _ST_SUPPORTED_MODULES:
            raise ModelError(
                f"{source}: sentence-transformers module {kind} is not supported "
                f"(supported: {', '.join(sorted(_ST_SUPPORTED_MODULES))})"
            )
        where = f"{source}/{module['path']}/config.json"
        if kind == "Pooling":
            config = _read_json(model_file(source, revision, f"{module['path']}/config.json"))
            pooling = _pooling_from_st_config(config or {}, where)
        if kind == "SpladePooling":
            config = _read_json(model_file(source, revision, f"{module['path']}/config.json"))
            _check_splade_config(config or {}, where)
        normalize = normalize or kind == "Normalize"
    bert_config = _read_json(model_file(source, revision, "sentence_bert_config.json")) or {}
    st_config = _read_json(model_file(source, revision, "config_sentence_transformers.json")) or {}
    return _SentenceTransformersInfo(
        pooling=pooling,
        normalize=normalize,
        max_length=bert_config.get("max_seq_length"),
        lowercase=bool(bert_config.get("do_lower_case", False)),
        prompts=st_config.get("prompts") or {},
        default_prompt_name=st_config.get("default_prompt_name"),
        splade=any(m.get("type", "").endswith(".SpladePooling") for m in modules),
    )


def _check_splade_config(config: dict[str, Any], where: str) -> None:
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if (strategy, activation) != ("max", "relu"):
        raise ModelError(
            f"{where}: SPLADE pooling {strategy} with {activation} is not supported (max, relu)"
        )


def _family(
    config: RunConfig,
    recipe: Recipe | None,
    st: _SentenceTransformersInfo,
    source: str,
    revision: str | None,
) -> str:
    """The encoder family: from the recipe, else from what the model folder holds."""
    if recipe is not None:
        return recipe.family
    if st.splade:
        return "splade"
    from bulkembed.encoders.bge_m3 import HEAD_FILES

    if all(model_file(source, revision, name) for name in HEAD_FILES):
        return "bge-m3"
    if config.outputs == ("sparse",):
        return "splade"
    return "dense"


def _outputs(config: RunConfig, recipe: Recipe | None, family: str) -> tuple[str, ...]:
    possible = FAMILY_OUTPUTS.get(family)
    if possible is None:
        return config.outputs or (recipe.outputs if recipe else ("dense",))
    wanted = config.outputs or (recipe.outputs if recipe else possible)
    missing = [name for name in wanted if name not in possible]
    if missing:
        raise ModelError(
            f"--outputs {','.join(missing)}: a {family} model produces only {', '.join(possible)}"
        )
    return tuple(name for name in possible if name in wanted)


def _special_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """Ids of the cls, eos, pad and unk tokens, which carry no lexical weight."""
    ids = set()
    for name in ("cls_token", "eos_token", "pad_token", "unk_token"):
        token = getattr(tokenizer, name, None)
        if token is not None:
            ids.add(int(tokenizer.convert_tokens_to_ids(token)))
    return tuple(sorted(ids))


def _pick_recipe(config: RunConfig) -> tuple[Recipe | None, str]:
    """The recipe in force and the model source (hub id or folder) to load weights from."""
    if config.recipe is not None:
        recipe = find_recipe(config.recipe) or _recipe_from_path(config.recipe)
        return recipe, config.model
    recipe = find_recipe(config.model)
    if recipe is not None:
        return recipe, recipe.model
    if config.model.endswith((".yaml", ".yml")) and Path(config.model).is_file():
        recipe = load_recipe_file(Path(config.model))
        return recipe, recipe.model
    return None, config.model


def _recipe_from_path(name: str) -> Recipe:
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return load_recipe_file(path)
    raise ModelError(f"unknown recipe '{name}': see `bulkembed recipes` for the bundled ones")


def _prompt(config: RunConfig, recipe: Recipe | None, st: _SentenceTransformersInfo) -> str:
    prompts = {**(st.prompts or {}), **(recipe.prompts if recipe else {})}
    if config.prompt is not None:
        return config.prompt
    name = config.prompt_name
    if name is None:
        name = recipe.corpus_prompt if recipe and recipe.corpus_prompt else st.default_prompt_name
    if name is None:
        return ""
    if name not in prompts:
        known = ", ".join(sorted(prompts)) or "none"
        raise ModelError(f"unknown prompt name '{name}' for this model (known: {known})")
    return prompts[name]


def _model_limit(tokenizer: Any, model_config: dict[str, Any]) -> int | None:
    """Longest input the model accepts, in tokens, or None if neither file says."""
    limit = getattr(tokenizer, "model_max_length", None)
    if limit is not None and limit < _NO_LIMIT:
        return int(limit)
    positions = model_config.get("max_position_embeddings")
    if positions is None:
        return None
    # RoBERTa-style position ids start after the padding index.
    if model_config.get("model_type") in ("roberta", "xlm-roberta", "camembert"):
        positions -= model_config.get("pad_token_id", 1) + 1
    return int(positions)


def _max_length(
    config: RunConfig, recipe: Recipe | None, st: _SentenceTransformersInfo, limit: int | None
) -> int:
    if config.max_length is not None:
        if limit is not None and config.max_length > limit:
            raise ModelError(
                f"--max-length {config.max_length} exceeds the model's limit of {limit} tokens"
            )
        return config.max_length
    for candidate in (recipe.max_length if recipe else None, st.max_length, limit):
        if candidate is not None:
            return int(candidate)
    raise ModelError("the model does not say how long its inputs may be: pass --max-length")


def resolve_model(config: RunConfig) -> ModelSpec:
    """Find the model, read its settings and tokenizer, and merge them with the options."""
    recipe, source = _pick_recipe(config)
    if _is_local(source):
        source = str(Path(source).expanduser().resolve())
    revision = config.revision or (recipe.revision if recipe else None)
    config_file = _find_model_config(source, revision)
    st = _sentence_transformers_info(source, revision)
    model_config = _read_json(config_file) or {}

    family = _family(config, recipe, st, source, revision)
    pooling = config.pooling or (recipe.pooling if recipe else None) or st.pooling
    if family == "bge-m3":
        pooling = Pooling.CLS
    if pooling is None and family == "dense":
        raise ModelError(
            f"no pooling is known for {source}: pass --pooling cls|mean|last-token or --recipe NAME"
        )
    normalize = config.normalize
    for candidate in (recipe.normalize if recipe else None, st.normalize, False):
        if normalize is None:
            normalize = candidate

    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load the tokenizer of {source}: {e}") from e
    if not tokenizer.is_fast:
        raise ModelError(f"{source} has no fast tokenizer (tokenizer.json); bulkembed needs one")
    pad_token_id = tokenizer.pad_token_id
    if pad_token_id is None:
        pad_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0

    return ModelSpec(
        source=source,
        local=_is_local(source),
        revision=revision,
        version=_model_version(source, revision, config_file),
        recipe=recipe.name if recipe else None,
        family=family,
        outputs=_outputs(config, recipe, family),
        pooling=pooling if family != "splade" else None,
        normalize=bool(normalize),
        max_length=_max_length(config, recipe, st, _model_limit(tokenizer, model_config)),
        prompt=_prompt(config, recipe, st),
        lowercase=st.lowercase,
        pad_token_id=int(pad_token_id),
        special_token_ids=_special_token_ids(tokenizer),
        dims=recipe.dims if recipe else (),
        sparse_top_k=config.sparse_top_k,
        max_batch_tokens=config.max_batch_tokens
        or (recipe.max_batch_tokens if recipe else None)
        or DEFAULT_MAX_BATCH_TOKENS,
        tokenizer_json=tokenizer.backend_tokenizer.to_str(),
    )
