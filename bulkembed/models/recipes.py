"""Recipes: what bulkembed needs to know about a model beyond its weights (family, pooling,
prompts, outputs, ...), one YAML file per model, bundled in `recipes/`."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from bulkembed.config import Pooling
from bulkembed.errors import ModelError


@dataclass(frozen=True)
class Recipe:
    """What bulkembed needs to know about a model beyond its weights."""

    name: str
    model: str
    description: str = ""
    revision: str | None = None
    family: str = "dense"
    model_type: str | None = None
    pooling: Pooling | None = None
    normalize: bool | None = None
    max_length: int | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    corpus_prompt: str | None = None
    outputs: tuple[str, ...] = ("dense",)
    dims: tuple[int, ...] = ()
    matryoshka_layer_norm: bool = False
    max_batch_tokens: int | None = None
    path: Path | None = None


def _recipe_dirs() -> list[Path]:
    """Recipes ship inside the wheel; in a source checkout they live at the repository root."""
    packaged = Path(str(resources.files("bulkembed"))) / "recipes"
    checkout = Path(__file__).resolve().parents[2] / "recipes"
    return [d for d in (packaged, checkout) if d.is_dir()]


def _recipe_from_dict(name: str, data: dict[str, Any], path: Path) -> Recipe:
    known = {f for f in Recipe.__dataclass_fields__ if f not in ("name", "path")}
    unknown = sorted(set(data) - known)
    if unknown:
        which = "key" if len(unknown) == 1 else "keys"
        raise ModelError(f"recipe {path}: unknown {which} {', '.join(unknown)}")
    if "model" not in data:
        raise ModelError(f"recipe {path}: 'model' (a hub id) is required")
    values = dict(data)
    if values.get("pooling") is not None:
        values["pooling"] = Pooling(values["pooling"])
    values["outputs"] = tuple(values.get("outputs", ("dense",)))
    values["dims"] = tuple(values.get("dims", ()))
    values["prompts"] = dict(values.get("prompts") or {})
    corpus_prompt = values.get("corpus_prompt")
    if corpus_prompt is not None and corpus_prompt not in values["prompts"]:
        raise ModelError(f"recipe {path}: corpus_prompt '{corpus_prompt}' is not in its prompts")
    return Recipe(name=name, path=path, **values)


def load_recipe_file(path: Path) -> Recipe:
    """Parse one recipe YAML file."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ModelError(f"cannot read recipe {path}: {e}") from e
    if not isinstance(data, dict):
        raise ModelError(f"recipe {path} must be a mapping of settings")
    return _recipe_from_dict(path.stem, data, path)


def list_recipes() -> list[Recipe]:
    """All bundled recipes, sorted by name."""
    found: dict[str, Path] = {}
    for directory in _recipe_dirs():
        for path in sorted(directory.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return [load_recipe_file(found[name]) for name in sorted(found)]


def recipe_reference(recipe: Recipe) -> str:
    """How `recipe` is found again (`--recipe`): its name if it is the bundled one, else
    its file's absolute path."""
    if recipe.path is None or recipe.path == _bundled_path(recipe.name):
        return recipe.name
    return str(recipe.path.resolve())


def _bundled_path(name: str) -> Path | None:
    """The file of the bundled recipe called `name`, if there is one."""
    return next((p for d in _recipe_dirs() if (p := d / f"{name}.yaml").is_file()), None)


def find_recipe(name: str) -> Recipe | None:
    """The bundled recipe called `name`, or None."""
    path = _bundled_path(name)
    return None if path is None else load_recipe_file(path)
