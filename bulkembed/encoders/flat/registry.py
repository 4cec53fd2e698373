"""Model families that run on flat batches, by registry.

A family (`FlatFamily`) names the architectures it covers (config.json `model_type`), says
whether its attention is causal (a decoder: each token attends to the tokens before it in
its document), and builds, from a loaded Hugging Face model and that flag, a module that
takes a flat batch, `module(input_ids, sequences)` with `input_ids` [tokens], and gives the
last hidden state [tokens, hidden]; the module keeps the model's `config` as its own, and
its layers pass the flag to `varlen.varlen_attention`. The kernel that attends is chosen
from the module's attention shape (`kernel_choice.AttentionShape.of`): the config's heads,
and the `causal`, `window` and `head_size` attributes of its submodules where they have
them. A family of another file is added
with `register_flat_family`; built in are the BERT family (BERT, RoBERTa, XLM-RoBERTa),
ModernBERT, NomicBERT and the causal rotary decoders (Qwen3, Qwen2, Llama, Mistral), one
module each in `bulkembed.encoders.flat`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _no_reason(model: Any) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class FlatFamily:
    """Architectures that run flat: `model_types`, `build` (a loaded model and `causal` to
    its flat module: see `flat_module`), `causal` attention or not, and `support`, which
    says why a model of the family still cannot run flat (None: it can)."""

    name: str
    model_types: frozenset[str]
    build: Callable[[Any, bool], Any]
    causal: bool = False
    support: Callable[[Any], str | None] = _no_reason


# Families by model type.
_FAMILIES: dict[str, FlatFamily] = {}


def register_flat_family(family: FlatFamily) -> None:
    """Run the model types of `family` flat (replacing a family that covered them)."""
    for model_type in family.model_types:
        _FAMILIES[model_type] = family


def unregister_flat_family(family: FlatFamily) -> None:
    """Run the model types of `family` padded again."""
    for model_type in family.model_types:
        if _FAMILIES.get(model_type) is family:
            del _FAMILIES[model_type]


def flat_family(model: Any) -> FlatFamily | str:
    """The family that runs `model` (a loaded transformers model) flat, or why none can."""
    config = model.config
    family = _FAMILIES.get(config.model_type)
    if family is None:
        covered = ", ".join(sorted(_FAMILIES))
        return f"flat execution covers {covered}, not {config.model_type}"
    if getattr(config, "add_cross_attention", False):
        return "it has cross-attention"
    if getattr(config, "is_decoder", False) and not family.causal:
        return "it is configured as a decoder"
    return family.support(model) or family


def flat_module(family: FlatFamily, model: Any) -> Any:
    """The flat module of `model`, in eval mode, attending as its family says."""
    return family.build(model, family.causal).eval()
