"""Flat (unpadded) execution: model families that run on batches laid end to end, by
registry (`registry`), one module per family (`bert`)."""

from bulkembed.encoders.flat.bert import BERT_FAMILY
from bulkembed.encoders.flat.registry import (
    FlatFamily,
    flat_family,
    flat_module,
    register_flat_family,
    unregister_flat_family,
)

register_flat_family(BERT_FAMILY)

__all__ = [
    "FlatFamily",
    "flat_family",
    "flat_module",
    "register_flat_family",
    "unregister_flat_family",
]
