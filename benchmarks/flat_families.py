"""Each flat family on a device: its flat module against transformers' padded model, and its
tokens/s flat, against the BERT family's at the same size.

For every architecture a bundled recipe names (BERT for the size class, ModernBERT with
local layers, NomicBERT, Qwen3, and Qwen2 and Mistral with sliding windows, Llama), a model
of random weights is built from its config: `SIZES["full"]` (hidden 768, 12 layers, 12
heads of 64, the decoders with 4 key-value heads) on a GPU, `SIZES["smoke"]` (hidden 64, 2
layers) on the CPU. On one batch of documents of 1 to 600 tokens (longer than the local and
sliding windows), the flat module (`bulkembed.encoders.flat`) and the model run padded on
the right with an attention mask give each document's mean-pooled last hidden state: the
lowest cosine between the two. Then the flat module runs batches of `budget` tokens of the
same lengths, twice (the first pass builds what a new shape needs), and the second pass
gives tokens/s; `of_bert` is that rate over the BERT model's.

Used by `gpu_check.py` (check 7, families); on its own:

    python benchmarks/flat_families.py [--smoke]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

# Config settings of each architecture beyond the size: a window shorter than the longest
# document where the architecture has one.
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "bert": ("bert", {}),
    "modernbert": (
        "modernbert",
        dict(
            local_attention=128,
            global_attn_every_n_layers=3,
            pad_token_id=0,
            **dict.fromkeys(("bos_token_id", "cls_token_id"), 1),
            **dict.fromkeys(("eos_token_id", "sep_token_id"), 2),
        ),
    ),
    "nomic_bert": ("nomic_bert", {}),
    "qwen3": ("qwen3", dict(head_dim=64)),
    "qwen2-sliding": (
        "qwen2",
        dict(use_sliding_window=True, sliding_window=256, max_window_layers=1),
    ),
    "mistral-sliding": ("mistral", dict(head_dim=64, sliding_window=256)),
    "llama": ("llama", dict(head_dim=64)),
}
DECODERS = frozenset({"qwen3", "qwen2", "mistral", "llama"})
SIZES = {
    "full": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, kv_heads=4),
    "smoke": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, kv_heads=2),
}
LENGTHS = (600, 513, 300, 257, 130, 64, 17, 2, 1)
VOCABULARY = 1000


def _config(name: str, size: str) -> Any:
    from transformers import AutoConfig

    model_type, extra = ARCHITECTURES[name]
    shape = dict(SIZES[size])
    kv_heads = shape.pop("kv_heads")
    if model_type in DECODERS:
        shape["num_key_value_heads"] = kv_heads
    return AutoConfig.for_model(
        model_type,
        vocab_size=VOCABULARY,
        intermediate_size=4 * shape["hidden_size"],
        max_position_embeddings=1024,
        **shape,
        **extra,
    )


def _model(name: str, size: str, device: str, dtype: Any) -> Any:
    import torch
    from transformers import AutoModel

    torch.manual_seed(0)
    model = AutoModel.from_config(_config(name, size), attn_implementation="sdpa")
    return model.to(device=device, dtype=dtype).eval()


def _pooled(hidden: Any, lengths: np.ndarray) -> np.ndarray:
    """Each document's mean token vector, in float32 on the host."""
    cu = np.concatenate([[0], np.cumsum(lengths)])
    bounds = zip(cu[:-1], cu[1:], strict=True)
    return np.stack([hidden[a:b].float().mean(0).cpu().numpy() for a, b in bounds])


def _padded_run(model: Any, ids: list[Any], lengths: np.ndarray, device: str) -> Any:
    """The model's last hidden state of each document's tokens, padded on the right."""
    import torch

    padded = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=0).to(device)
    mask = (torch.arange(padded.shape[1]) < torch.tensor(lengths).unsqueeze(1)).long()
    with torch.inference_mode():
        hidden = model(input_ids=padded, attention_mask=mask.to(device)).last_hidden_state
    return torch.cat([hidden[i, :n] for i, n in enumerate(lengths)])


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


def _rate(module: Any, lengths: np.ndarray, budget: int, device: str) -> float:
    """Tokens/s of `module` over batches of about `budget` tokens of `lengths`, the second
    of two passes."""
    import torch

    from bulkembed.encoders.varlen import Sequences

    per_batch = max(1, budget // int(lengths.sum()))
    batch = np.tile(lengths, per_batch)
    sequences = Sequences.on_host(batch).to(lambda t: t.to(device))
    ids = torch.randint(4, VOCABULARY, (int(batch.sum()),), device=device)
    seconds = 0.0
    with torch.inference_mode():
        for _ in range(2):
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            for _ in range(4):
                module(ids, sequences)
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - started
    return 4 * int(batch.sum()) / seconds


def family_figures(name: str, size: str, device: str, dtype: Any, budget: int) -> dict[str, Any]:
    """One architecture's figures (see the module's docstring)."""
    import torch

    from bulkembed.encoders.flat import flat_family, flat_module
    from bulkembed.encoders.varlen import Sequences

    model = _model(name, size, device, dtype)
    family = flat_family(model)
    if isinstance(family, str):
        return {"runs_flat": False, "why": family}
    module = flat_module(family, model)
    lengths = np.array(LENGTHS)
    rng = np.random.default_rng(0)
    ids = [torch.from_numpy(rng.integers(4, VOCABULARY, n)) for n in lengths]
    expected = _pooled(_padded_run(model, ids, lengths, device), lengths)
    sequences = Sequences.on_host(lengths).to(lambda t: t.to(device))
    with torch.inference_mode():
        hidden = module(torch.cat(ids).to(device), sequences)
    lowest = float(_cosines(_pooled(hidden, lengths), expected).min())
    return {
        "runs_flat": True,
        "family": family.name,
        "lowest_cosine": round(lowest, 7),
        "tokens_per_s": round(_rate(module, lengths, budget, device)),
    }


def measure(size: str, device: str, dtype: Any, budget: int) -> dict[str, Any]:
    """Every architecture's figures, and each one's tokens/s over the BERT model's."""
    figures = {name: family_figures(name, size, device, dtype, budget) for name in ARCHITECTURES}
    bert = figures["bert"].get("tokens_per_s")
    for found in figures.values():
        if bert and found.get("tokens_per_s"):
            found["of_bert"] = round(found["tokens_per_s"] / bert, 3)
    return figures


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    args = parser.parse_args()
    if args.smoke:
        print(json.dumps(measure("smoke", "cpu", torch.float32, 2048)))
    else:
        print(json.dumps(measure("full", "cuda:0", torch.bfloat16, 16384)))


if __name__ == "__main__":
    main()
