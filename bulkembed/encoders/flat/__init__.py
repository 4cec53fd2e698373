"""Flat (unpadded) execution: model families that run on batches laid end to end, by
registry (`registry`), one module per family (`bert`, `modernbert`, `nomic_bert`,
`decoder`: Qwen3, Qwen2, Llama, Mistral), the rotary positions they share in `rotary`."""

from bulkembed.encoders.flat.bert import BERT_FAMILY
from bulkembed.encoders.flat.decoder import DECODER_FAMILY
from bulkembed.encoders.flat.modernbert import MODERNBERT_FAMILY
from bulkembed.encoders.flat.nomic_bert import NOMIC_BERT_FAMILY
from bulkembed.encoders.flat.registry import (
    FlatFamily,
    flat_family,
    flat_module,
    register_flat_family,
    unregister_flat_family,
)

register_flat_family(BERT_FAMILY)
register_flat_family(DECODER_FAMILY)
register_flat_family(MODERNBERT_FAMILY)
register_flat_family(NOMIC_BERT_FAMILY)

__all__ = [
    "FlatFamily",
    "flat_family",
    "flat_module",
    "register_flat_family",
    "unregister_flat_family",
]
