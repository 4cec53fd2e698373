"""From records to batches: tokenizer processes, units of work, admission of long texts, token-
budget packing, and windows embedded as one stream of batches."""
